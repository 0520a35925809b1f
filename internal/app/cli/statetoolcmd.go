package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"cairn/checkpoint"
	"cairn/engine"
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
//	cairn state migrate --from savepoint:OLD --to NEW --into S [--move-outputs] [--with M.wasm]
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

// stateCmd is what every state tool starts with: its flags, with the
// store's (--store/--job or --job-file), the job file when there is one,
// and the store once open.
type stateCmd struct {
	name   string
	fs     *flag.FlagSet
	sf     storeFlags
	j      *job.Job
	store  checkpoint.Store
	stderr io.Writer
}

func newStateCmd(name, usage string, stderr io.Writer) *stateCmd {
	fs := cmdline.NewFlagSet(name, usage, stderr)
	return &stateCmd{name: name, fs: fs, sf: addStoreFlags(fs), stderr: stderr}
}

// parse parses the flags, resolves the job and the store, and returns the
// positional arguments.
func (c *stateCmd) parse(args []string) ([]string, error) {
	pos, err := cmdline.ParseInterspersed(c.fs, args)
	if err != nil {
		return nil, err
	}
	c.j, err = c.sf.resolve(c.fs)
	return pos, err
}

// usageError prints the usage and returns msg as the command's error.
func (c *stateCmd) usageError(msg string) error {
	c.fs.Usage()
	return fmt.Errorf("%s: %s", c.name, msg)
}

func (c *stateCmd) open(ctx context.Context) error {
	var err error
	c.store, err = checkpoint.OpenStore(ctx, *c.sf.store)
	return err
}

func (c *stateCmd) close(ctx context.Context) {
	if c.store != nil {
		c.store.Close(ctx)
	}
}

func (c *stateCmd) jobName() string { return *c.sf.job }

// manifest is the checkpoint or savepoint spec names (recovery.Select).
func (c *stateCmd) manifest(ctx context.Context, spec string) (*checkpoint.Manifest, error) {
	m, err := recovery.Select(ctx, c.store, c.jobName(), spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.name, err)
	}
	if m == nil {
		return nil, fmt.Errorf("%s: job %s has no checkpoint %s", c.name, c.jobName(), spec)
	}
	return m, nil
}

// stages names the chain's stages after the job file, when there is one.
func (c *stateCmd) stages() statetool.Stages {
	if c.j == nil {
		return nil
	}
	return statetool.StagesOf(c.j, c.jobName())
}

func (c *stateCmd) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func cmdStateExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newStateCmd("state export", "cairn state export [--checkpoint latest|ID|savepoint:NAME] [--stage S] [--json-values] [--out FILE] (--store URL --job NAME | --job-file FILE)", stderr)
	which := c.fs.String("checkpoint", "latest", "the checkpoint: latest, an id, or savepoint:NAME")
	stage := c.fs.String("stage", "", "only this stage's entries")
	out := c.fs.String("out", "", "write to this file (default stdout)")
	jsonValues := c.fs.Bool("json-values", false, "write values that are JSON as JSON (value_json) instead of base64")
	if _, err := c.parse(args); err != nil {
		return err
	}
	if err := c.open(ctx); err != nil {
		return err
	}
	defer c.close(ctx)
	m, err := c.manifest(ctx, *which)
	if err != nil {
		return err
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
	st, err := statetool.Export(ctx, w, statetool.ExportOptions{Store: c.store, Manifest: m, From: *which, Stages: c.stages(), Stage: *stage, ValueJSON: *jsonValues})
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
	fmt.Fprintf(stderr, "exported %d entries (%d bytes of state) of %s of job %s\n", st.Entries, st.Bytes, *which, c.jobName())
	return nil
}

func cmdStateImport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newStateCmd("state import", "cairn state import --savepoint NAME [--in FILE] [--key-groups N] [--slots N] [--source-seq N] (--store URL --job NAME | --job-file FILE)", stderr)
	name := c.fs.String("savepoint", "", "the savepoint to write (it must not exist)")
	in := c.fs.String("in", "", "read this file (default stdin)")
	keyGroups := c.fs.Int("key-groups", 0, "the job's key_groups (default: the export header's, the job file's, else 128)")
	slots := c.fs.Int("slots", 0, "the savepoint's slot count (default: the header's, else 1; a restore rescales)")
	seq := c.fs.Int64("source-seq", -1, "the input stream sequence the state is as of: the job resumes after it (default: the header's, else 0)")
	if _, err := c.parse(args); err != nil {
		return err
	}
	if *name == "" {
		return c.usageError("--savepoint NAME is required")
	}
	o := statetool.ImportOptions{Job: c.jobName(), Name: *name, File: *in, KeyGroups: *keyGroups, Slots: *slots, Stages: c.stages(), Logger: c.logger()}
	if j := c.j; j != nil {
		if o.KeyGroups == 0 {
			o.KeyGroups = j.KeyGroups
		}
		o.MaxKeyBytes = j.MaxKeyBytes
		o.SourceStream = j.Input.Stream
	}
	if *seq >= 0 {
		o.SourceSeq, o.SetSourceSeq = uint64(*seq), true
	}
	if err := c.open(ctx); err != nil {
		return err
	}
	defer c.close(ctx)
	o.Store = c.store
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
		*name, c.jobName(), st.Entries, len(m.Slots), m.KeyGroups, m.SourceSeq, *name)
	return nil
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func cmdStateMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newStateCmd("state migrate", "cairn state migrate --from savepoint:OLD|ID --to NEW [--stage S --with MIGRATION.wasm [--config JSON] [--state-version N]] [--rename OLD=NEW]... [--drop S]... "+
		"[--reset-outputs] | --into S [--move-outputs] [--with MIGRATION.wasm ...] (--store URL --job NAME | --job-file FILE)", stderr)
	fs := c.fs
	from := fs.String("from", "", "the savepoint (savepoint:NAME) or checkpoint id to read")
	to := fs.String("to", "", "the savepoint to write (it must not exist)")
	stage := fs.String("stage", "", "the stage whose state the migration module converts")
	with := fs.String("with", "", "the migration module (.wasm exporting cairn_migrate: sdk/upgrade.RegisterMigration); the new operator's own module may be it")
	config := fs.String("config", "", "JSON handed to the migration module as its config")
	version := fs.Int("state-version", 0, "record this state version for the stage (default: the one the module declares)")
	into := fs.String("into", "", "copy the state of the keyed stage read into this keyed stage of another sub-topology of the job file (through --with when given): writes that sub-topology's savepoint")
	moveOutputs := fs.Bool("move-outputs", false, "with --into: the stage written into now writes the output the one read wrote: carry its output counts along")
	resetOutputs := fs.Bool("reset-outputs", false, "reset the output counts: the sub-topology's output moved behind a repartition stream (--into --move-outputs)")
	var renames, drops multiFlag
	fs.Var(&renames, "rename", "rename a stage's state: OLD=NEW (repeatable)")
	fs.Var(&drops, "drop", "drop a stage's state (repeatable)")
	if _, err := c.parse(args); err != nil {
		return err
	}
	j := c.j
	switch {
	case *from == "" || *to == "":
		return c.usageError("--from and --to are required")
	case *into != "" && *stage != "":
		return c.usageError("--into takes the keyed stage of the savepoint read: no --stage")
	case *into == "" && (*with == "") != (*stage == ""):
		return c.usageError("--with and --stage go together")
	case *into != "" && j == nil:
		return c.usageError("--into needs --job-file: the stage's sub-topology is found in it")
	case *moveOutputs && *into == "":
		return c.usageError("--move-outputs goes with --into")
	}
	o := statetool.MigrateOptions{Job: c.jobName(), To: *to, FromSpec: *from, Stages: c.stages(), Stage: *stage, StateVersion: *version,
		ResetOutputs: *resetOutputs, Logger: c.logger()}
	if *into != "" {
		var err error
		if o.Into, err = intoTarget(j, *into); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		o.Into.MoveOutputs = *moveOutputs
	}
	if *with != "" {
		var err error
		if j != nil {
			// The job's compilation cache: a module compiled for the job
			// (or for an earlier migration) compiles in milliseconds.
			if o.Runtime, err = runtime.NewWasmRuntime(ctx, j.DataDir); err != nil {
				return err
			}
			defer o.Runtime.Close(ctx)
		}
		if o.Module, err = os.ReadFile(*with); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		o.ModuleName = filepath.Base(*with)
		if *config != "" {
			o.Config = []byte(*config)
		}
	}
	for _, r := range renames {
		old, nu, ok := strings.Cut(r, "=")
		if !ok || old == "" || nu == "" {
			return fmt.Errorf("%s: --rename %q: want OLD=NEW", c.name, r)
		}
		if o.Rename == nil {
			o.Rename = map[string]string{}
		}
		o.Rename[old] = nu
	}
	o.Drop = drops
	if err := c.open(ctx); err != nil {
		return err
	}
	defer c.close(ctx)
	o.Store = c.store
	var err error
	if o.From, err = c.manifest(ctx, *from); err != nil {
		return err
	}
	_, st, err := statetool.Migrate(ctx, o)
	if err != nil {
		return err
	}
	job, what := c.jobName(), *stage
	if o.Into != nil {
		job, what = o.Into.Job, o.Into.Stage
	}
	fmt.Fprintf(stdout, "savepoint %s of job %s: read %d entries, migrated %d, wrote %d; ", *to, job, st.Read.Entries, st.Migrated, st.Written.Entries)
	if what != "" {
		fmt.Fprintf(stdout, "stage %s at state version %d; ", what, st.StateVersion)
	}
	if o.Into != nil {
		fmt.Fprintf(stdout, "every sub-topology of the job needs its savepoint %s; then ", *to)
	}
	fmt.Fprintf(stdout, "start the new job with: cairn run --restore savepoint:%s\n", *to)
	return nil
}

// intoTarget is the sub-topology of job j whose keyed stage is stage, for
// `migrate --into`.
func intoTarget(j *job.Job, stage string) (*statetool.Into, error) {
	var keyed []string
	for _, sub := range j.Graph() {
		st, ok := sub.Keyed()
		if !ok {
			continue
		}
		keyed = append(keyed, st.Name)
		if st.Name != stage {
			continue
		}
		in := &statetool.Into{Job: j.Name, Stage: stage, KeyGroups: j.KeyGroups}
		if sub.Index > 0 {
			in.Job = j.Name + ".s" + strconv.Itoa(sub.Index)
		}
		if sub.Input == "" {
			in.SourceStream, _ = runtime.RepartitionStream(j.Name, sub.Index)
		} else if input, ok := j.InputNamed(sub.Input); ok {
			in.SourceStream = input.Stream
			if input.Table != "" {
				in.SourceStream, _ = engine.TableStream(input.Table)
			}
		}
		return in, nil
	}
	return nil, fmt.Errorf("--into %s: %w: job %s has no keyed stage %q (its keyed stages: %s)", stage, statetool.ErrUnknownStage, j.Name, stage, strings.Join(keyed, ", "))
}

func cmdStateDiff(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newStateCmd("state diff", "cairn state diff A B (each savepoint:NAME, an id or latest) (--store URL --job NAME | --job-file FILE)", stderr)
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return c.usageError("name two checkpoints or savepoints")
	}
	if err := c.open(ctx); err != nil {
		return err
	}
	defer c.close(ctx)
	var ms [2]*checkpoint.Manifest
	for i, spec := range pos {
		if ms[i], err = c.manifest(ctx, spec); err != nil {
			return err
		}
	}
	ds, err := statetool.Diff(ctx, c.store, ms[0], ms[1], c.stages(), "")
	if err != nil {
		return err
	}
	return statetool.PrintDiff(stdout, pos[0], pos[1], ds)
}
