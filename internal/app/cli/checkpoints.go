package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/job"
)

// ErrBroken is returned by `checkpoints verify` when an object is broken.
var ErrBroken = errors.New("checkpoint has broken objects")

func cmdCheckpoints(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "cairn checkpoints ls|show ID|verify [ID]|gc [--dry-run] (--store URL --job NAME | --job-file FILE)"
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(stderr, "Usage:", usage)
		if len(args) == 0 {
			return errors.New("a subcommand is required")
		}
		return nil
	}
	sub := args[0]
	fs := newFlagSet("checkpoints "+sub, usage, stderr)
	sf := addStoreFlags(fs)
	dryRun := fs.Bool("dry-run", false, "gc: list what would be deleted, delete nothing")
	retain := fs.Int("retain", 0, "gc: checkpoints to keep (default: the job's checkpoint.retain, else 3)")
	grace := fs.Duration("grace", time.Hour, fmt.Sprintf("gc: orphan grace period, at least %v: it must exceed the longest upload of a running job's checkpoint", checkpoint.MinGCGrace))
	asJSON := fs.Bool("json", false, "ls/show: JSON output")
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	j, err := sf.resolve(fs)
	if err != nil {
		return err
	}
	if *retain == 0 && j != nil && j.Checkpoint != nil {
		*retain = j.Checkpoint.Retain
	}
	storeFlag, jobName := sf.store, sf.job
	if *retain == 0 {
		*retain = 3
	}
	store, err := checkpoint.OpenStore(ctx, *storeFlag)
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	id := func() (uint64, error) {
		if len(pos) < 1 {
			// The newest manifest, whether it decodes or not: verify
			// names a corrupt one instead of failing to pick it.
			ids, err := checkpoint.ManifestIDs(ctx, store, *jobName)
			if err != nil {
				return 0, err
			}
			if len(ids) == 0 {
				return 0, fmt.Errorf("checkpoint: job %s: no committed checkpoint: %w", *jobName, checkpoint.ErrNotFound)
			}
			return ids[len(ids)-1], nil
		}
		n, err := strconv.ParseUint(pos[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("checkpoint id %q is not a number", pos[0])
		}
		return n, nil
	}
	switch sub {
	case "ls":
		list, err := checkpoint.List(ctx, store, *jobName)
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(list)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "ID\tMODE\tTIME\tSOURCE_SEQ\tSYNC\tASYNC\tUPLOADED\tSTATE\tFILES_UP\tFILES_REUSED\tCHAIN\tEXCLUSIVE\tSHARED\tPREDICTED_RESTORE\t")
		var corrupt []checkpoint.ListEntry
		for _, e := range list {
			if e.Corrupt != "" {
				corrupt = append(corrupt, e)
				fmt.Fprintf(tw, "%d\tCORRUPT\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\n", e.ID)
				continue
			}
			f := e.Figures
			predicted := "-"
			if f.PredictedRestore > 0 {
				predicted = f.PredictedRestore.Round(time.Millisecond).String()
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t\n", e.ID, e.Mode, e.Time.Format(time.DateTime), e.SourceSeq,
				f.SyncMax.Round(time.Millisecond), f.Async.Round(time.Millisecond), fmtBytes(uint64(f.BytesUploaded)), fmtBytes(uint64(f.FullStateSize)),
				f.FilesUploaded, f.FilesReused, e.ChainLength, fmtBytes(uint64(e.RetainedExclusive)), fmtBytes(uint64(e.RetainedShared)), predicted)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, e := range corrupt {
			fmt.Fprintf(stdout, "checkpoint %d is CORRUPT and cannot be restored: %s (`cairn checkpoints verify %d` names the object)\n", e.ID, e.Corrupt, e.ID)
		}
		return nil
	case "show":
		n, err := id()
		if err != nil {
			return err
		}
		m, err := checkpoint.Load(ctx, store, *jobName, n)
		if err != nil {
			return err
		}
		b, err := json.MarshalIndent(m, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, string(b))
		return err
	case "verify":
		n, err := id()
		if err != nil {
			return err
		}
		problems, err := checkpoint.Verify(ctx, store, *jobName, n)
		if err != nil {
			return err
		}
		for _, p := range problems {
			fmt.Fprintf(stdout, "BROKEN %s: %v\n", p.Object, p.Err)
		}
		// Junk anywhere under the job's prefix: reported, not a failure of
		// this checkpoint (gc removes it once older than its grace period).
		junk, err := checkpoint.FindUnreferenced(ctx, store, *jobName)
		if err != nil {
			return err
		}
		now := time.Now()
		for _, o := range junk.Objects {
			fmt.Fprintf(stdout, "UNREFERENCED %s (%s, written %s ago): no manifest references it\n", o.Name, fmtBytes(uint64(o.Size)), now.Sub(o.ModTime).Round(time.Second))
		}
		if len(junk.Corrupt) > 0 && len(junk.Objects) > 0 {
			fmt.Fprintf(stdout, "(%d corrupt manifests: an object listed as unreferenced may be one of theirs)\n", len(junk.Corrupt))
		}
		if len(problems) > 0 {
			return fmt.Errorf("checkpoint %d: %d broken objects: %w", n, len(problems), ErrBroken)
		}
		fmt.Fprintf(stdout, "checkpoint %d: every object present with the right size and checksum\n", n)
		return nil
	case "gc":
		// INVARIANT: never below the floor. gc runs beside the job, which
		// uploads a checkpoint's files before the manifest that references
		// them: a shorter grace deletes files of a checkpoint in flight.
		if err := checkpoint.CheckGCGrace(*grace); err != nil {
			return err
		}
		rep, err := checkpoint.GC(ctx, store, *jobName, *retain, *grace, *dryRun)
		if err != nil {
			return err
		}
		verb := "deleted"
		if rep.DryRun {
			verb = "would delete"
		}
		for _, o := range rep.Deleted {
			fmt.Fprintf(stdout, "%s %s (%s)\n", verb, o.Name, fmtBytes(uint64(o.Size)))
		}
		fmt.Fprintf(stdout, "%s %d objects, %s; checkpoints dropped %v, kept %v\n", verb, len(rep.Deleted), fmtBytes(uint64(rep.BytesFreed)), rep.Dropped, rep.Kept)
		return nil
	}
	return fmt.Errorf("unknown subcommand %q (%s)", sub, usage)
}

// storeFlags are the flags of the commands that work on a job's checkpoint
// store (cairn checkpoints, cairn savepoint ls|rm).
type storeFlags struct{ store, job, jobFile *string }

func addStoreFlags(fs *flag.FlagSet) storeFlags {
	return storeFlags{
		store:   fs.String("store", "", "checkpoint store URL (file:///path or s3://bucket/prefix?endpoint=...)"),
		job:     fs.String("job", "", "job name"),
		jobFile: fs.String("job-file", "", "job file: take the store and job name from it"),
	}
}

// resolve takes the job name and the store from --job-file where the flags
// leave them out (a job without a checkpoint section: its default store in
// the data directory), and requires both. It returns the job file's job
// (nil without --job-file).
func (f storeFlags) resolve(fs *flag.FlagSet) (*job.Job, error) {
	var j *job.Job
	if *f.jobFile != "" {
		var err error
		if j, err = job.Load(*f.jobFile); err != nil {
			return nil, err
		}
		if *f.job == "" {
			*f.job = j.Name
		}
		if *f.store == "" {
			c := *j
			if c.Checkpoint == nil {
				c.Checkpoint = &job.Checkpoint{}
			}
			if *f.store, err = storeURL(&c); err != nil {
				return nil, err
			}
		}
	}
	if *f.store == "" || *f.job == "" {
		fs.Usage()
		return nil, errors.New("--store and --job (or --job-file) are required")
	}
	return j, nil
}
