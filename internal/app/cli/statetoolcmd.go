package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"cairn/checkpoint"
	"cairn/internal/app/job"
	"cairn/internal/app/statetool"
	"cairn/recovery"
)

// cmdStateTool runs the offline state tools (package statetool):
//
//	cairn state export [--checkpoint ID|savepoint:NAME] [--stage S] [--out FILE]
//	cairn state import --savepoint NAME [--in FILE] [--key-groups N] [--slots N] [--source-seq N]
//
// with the store and job from --store/--job or --job-file.
func cmdStateTool(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub := args[0]
	switch sub {
	case "export":
		return cmdStateExport(ctx, args[1:], stdout, stderr)
	case "import":
		return cmdStateImport(ctx, args[1:], stdout, stderr)
	}
	return fmt.Errorf("state %s: unknown", sub)
}

func isStateTool(sub string) bool {
	switch sub {
	case "export", "import", "migrate", "diff":
		return true
	}
	return false
}

// stagesFor names the chain's stages after the job file, when there is one.
func stagesFor(j *job.Job, chain string) statetool.Stages {
	if j == nil {
		return nil
	}
	return statetool.StagesOf(j, chain)
}

func cmdStateExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "cairn state export [--checkpoint latest|ID|savepoint:NAME] [--stage S] [--out FILE] (--store URL --job NAME | --job-file FILE)"
	fs := newFlagSet("state export", usage, stderr)
	sf := addStoreFlags(fs)
	which := fs.String("checkpoint", "latest", "the checkpoint: latest, an id, or savepoint:NAME")
	stage := fs.String("stage", "", "only this stage's entries")
	out := fs.String("out", "", "write to this file (default stdout)")
	if _, err := parseInterspersed(fs, args); err != nil {
		return err
	}
	j, err := sf.resolve(fs)
	if err != nil {
		return err
	}
	store, err := checkpoint.OpenStore(ctx, *sf.store)
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	m, err := recovery.Select(ctx, store, *sf.job, *which)
	if err != nil {
		return fmt.Errorf("state export: %w", err)
	}
	if m == nil {
		return fmt.Errorf("state export: job %s has no checkpoint", *sf.job)
	}
	w := stdout
	var f *os.File
	if *out != "" {
		if f, err = os.Create(*out); err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	st, err := statetool.Export(ctx, w, statetool.ExportOptions{Store: store, Manifest: m, From: *which, Stages: stagesFor(j, *sf.job), Stage: *stage})
	if err != nil {
		return err
	}
	if f != nil {
		if err := f.Sync(); err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "exported %d entries (%d bytes of state) of %s of job %s\n", st.Entries, st.Bytes, *which, *sf.job)
	return nil
}

func cmdStateImport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "cairn state import --savepoint NAME [--in FILE] [--key-groups N] [--slots N] [--source-seq N] (--store URL --job NAME | --job-file FILE)"
	fs := newFlagSet("state import", usage, stderr)
	sf := addStoreFlags(fs)
	name := fs.String("savepoint", "", "the savepoint to write (it must not exist)")
	in := fs.String("in", "", "read this file (default stdin)")
	keyGroups := fs.Int("key-groups", 0, "the job's key_groups (default: the export header's, the job file's, else 128)")
	slots := fs.Int("slots", 0, "the savepoint's slot count (default: the header's, else 1; a restore rescales)")
	seq := fs.Int64("source-seq", -1, "the input stream sequence the state is as of: the job resumes after it (default: the header's, else 0)")
	if _, err := parseInterspersed(fs, args); err != nil {
		return err
	}
	j, err := sf.resolve(fs)
	if err != nil {
		return err
	}
	if *name == "" {
		fs.Usage()
		return errors.New("state import: --savepoint NAME is required")
	}
	store, err := checkpoint.OpenStore(ctx, *sf.store)
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	o := statetool.ImportOptions{Store: store, Job: *sf.job, Name: *name, File: *in, KeyGroups: *keyGroups, Slots: *slots,
		Stages: stagesFor(j, *sf.job), Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if j != nil {
		if o.KeyGroups == 0 {
			o.KeyGroups = j.KeyGroups
		}
		o.MaxKeyBytes = j.MaxKeyBytes
		o.SourceStream = j.Input.Stream
	}
	if *seq >= 0 {
		o.SourceSeq, o.SetSourceSeq = uint64(*seq), true
	}
	r := io.Reader(os.Stdin)
	if *in != "" {
		f, err := os.Open(*in)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	m, st, err := statetool.Import(ctx, r, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "savepoint %s of job %s: %d entries, %d slots, key_groups %d, resumes after source_seq %d: cairn run --restore savepoint:%s\n",
		*name, *sf.job, st.Entries, len(m.Slots), m.KeyGroups, m.SourceSeq, *name)
	return nil
}
