package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"cairn/checkpoint"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/app/statetool"
	"cairn/recovery"
)

// cmdStateTool runs the offline state tools (package statetool):
//
//	cairn state export [--checkpoint ID|savepoint:NAME] [--stage S] [--out FILE]
//	cairn state import --savepoint NAME [--in FILE] [--key-groups N] [--slots N] [--source-seq N]
//	cairn state migrate --from savepoint:OLD --to NEW [--stage S --with M.wasm] [--rename A=B] [--drop S]
//	cairn state diff A B
//
// with the store and job from --store/--job or --job-file.
func cmdStateTool(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub := args[0]
	switch sub {
	case "export":
		return cmdStateExport(ctx, args[1:], stdout, stderr)
	case "import":
		return cmdStateImport(ctx, args[1:], stdout, stderr)
	case "migrate":
		return cmdStateMigrate(ctx, args[1:], stdout, stderr)
	case "diff":
		return cmdStateDiff(ctx, args[1:], stdout, stderr)
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
	const usage = "cairn state export [--checkpoint latest|ID|savepoint:NAME] [--stage S] [--json-values] [--out FILE] (--store URL --job NAME | --job-file FILE)"
	fs := cmdline.NewFlagSet("state export", usage, stderr)
	sf := addStoreFlags(fs)
	which := fs.String("checkpoint", "latest", "the checkpoint: latest, an id, or savepoint:NAME")
	stage := fs.String("stage", "", "only this stage's entries")
	out := fs.String("out", "", "write to this file (default stdout)")
	jsonValues := fs.Bool("json-values", false, "write values that are JSON as JSON (value_json) instead of base64")
	if _, err := cmdline.ParseInterspersed(fs, args); err != nil {
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
	st, err := statetool.Export(ctx, w, statetool.ExportOptions{Store: store, Manifest: m, From: *which, Stages: stagesFor(j, *sf.job), Stage: *stage, ValueJSON: *jsonValues})
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
	fs := cmdline.NewFlagSet("state import", usage, stderr)
	sf := addStoreFlags(fs)
	name := fs.String("savepoint", "", "the savepoint to write (it must not exist)")
	in := fs.String("in", "", "read this file (default stdin)")
	keyGroups := fs.Int("key-groups", 0, "the job's key_groups (default: the export header's, the job file's, else 128)")
	slots := fs.Int("slots", 0, "the savepoint's slot count (default: the header's, else 1; a restore rescales)")
	seq := fs.Int64("source-seq", -1, "the input stream sequence the state is as of: the job resumes after it (default: the header's, else 0)")
	if _, err := cmdline.ParseInterspersed(fs, args); err != nil {
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

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func cmdStateMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "cairn state migrate --from savepoint:OLD|ID --to NEW [--stage S --with MIGRATION.wasm [--config JSON] [--state-version N]] [--rename OLD=NEW]... [--drop S]... (--store URL --job NAME | --job-file FILE)"
	fs := cmdline.NewFlagSet("state migrate", usage, stderr)
	sf := addStoreFlags(fs)
	from := fs.String("from", "", "the savepoint (savepoint:NAME) or checkpoint id to read")
	to := fs.String("to", "", "the savepoint to write (it must not exist)")
	stage := fs.String("stage", "", "the stage whose state the migration module converts")
	with := fs.String("with", "", "the migration module (.wasm exporting cairn_migrate: sdk/upgrade.RegisterMigration); the new operator's own module may be it")
	config := fs.String("config", "", "JSON handed to the migration module as its config")
	version := fs.Int("state-version", 0, "record this state version for the stage (default: the one the module declares)")
	var renames, drops multiFlag
	fs.Var(&renames, "rename", "rename a stage's state: OLD=NEW (repeatable)")
	fs.Var(&drops, "drop", "drop a stage's state (repeatable)")
	if _, err := cmdline.ParseInterspersed(fs, args); err != nil {
		return err
	}
	j, err := sf.resolve(fs)
	if err != nil {
		return err
	}
	if *from == "" || *to == "" {
		fs.Usage()
		return errors.New("state migrate: --from and --to are required")
	}
	if (*with == "") != (*stage == "") {
		fs.Usage()
		return errors.New("state migrate: --with and --stage go together")
	}
	o := statetool.MigrateOptions{Job: *sf.job, To: *to, FromSpec: *from, Stages: stagesFor(j, *sf.job), Stage: *stage, StateVersion: *version,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if *with != "" {
		if j != nil {
			// The job's compilation cache: a module compiled for the job
			// (or for an earlier migration) compiles in milliseconds.
			if o.Runtime, err = runtime.NewWasmRuntime(ctx, j.DataDir); err != nil {
				return err
			}
			defer o.Runtime.Close(ctx)
		}
		if o.Module, err = os.ReadFile(*with); err != nil {
			return fmt.Errorf("state migrate: %w", err)
		}
		o.ModuleName = filepath.Base(*with)
		if *config != "" {
			o.Config = []byte(*config)
		}
	}
	for _, r := range renames {
		old, nu, ok := strings.Cut(r, "=")
		if !ok || old == "" || nu == "" {
			return fmt.Errorf("state migrate: --rename %q: want OLD=NEW", r)
		}
		if o.Rename == nil {
			o.Rename = map[string]string{}
		}
		o.Rename[old] = nu
	}
	o.Drop = drops
	store, err := checkpoint.OpenStore(ctx, *sf.store)
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	o.Store = store
	if o.From, err = recovery.Select(ctx, store, *sf.job, *from); err != nil {
		return fmt.Errorf("state migrate: %w", err)
	}
	if o.From == nil {
		return fmt.Errorf("state migrate: job %s has no checkpoint %s", *sf.job, *from)
	}
	m, st, err := statetool.Migrate(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "savepoint %s of job %s: read %d entries, migrated %d, wrote %d; ", *to, *sf.job, st.Read.Entries, st.Migrated, st.Written.Entries)
	if *stage != "" {
		fmt.Fprintf(stdout, "stage %s at state version %d; ", *stage, st.StateVersion)
	}
	fmt.Fprintf(stdout, "start the new job with: cairn run --restore savepoint:%s\n", *to)
	_ = m
	return nil
}

func cmdStateDiff(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "cairn state diff A B (each savepoint:NAME, an id or latest) (--store URL --job NAME | --job-file FILE)"
	fs := cmdline.NewFlagSet("state diff", usage, stderr)
	sf := addStoreFlags(fs)
	pos, err := cmdline.ParseInterspersed(fs, args)
	if err != nil {
		return err
	}
	j, err := sf.resolve(fs)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		fs.Usage()
		return errors.New("state diff: name two checkpoints or savepoints")
	}
	store, err := checkpoint.OpenStore(ctx, *sf.store)
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	var ms [2]*checkpoint.Manifest
	for i, spec := range pos {
		if ms[i], err = recovery.Select(ctx, store, *sf.job, spec); err != nil {
			return fmt.Errorf("state diff: %w", err)
		}
		if ms[i] == nil {
			return fmt.Errorf("state diff: job %s has no checkpoint %s", *sf.job, spec)
		}
	}
	ds, err := statetool.Diff(ctx, store, ms[0], ms[1], stagesFor(j, *sf.job), "")
	if err != nil {
		return err
	}
	return statetool.PrintDiff(stdout, pos[0], pos[1], ds)
}
