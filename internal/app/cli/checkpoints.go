package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/base/datadir"
	"cairn/recovery"
	"cairn/recovery/model"
)

// ErrBroken is returned by `checkpoints verify` when an object is broken.
var ErrBroken = errors.New("checkpoint has broken objects")

// checkpointsUsage is each subcommand's usage line.
var checkpointsUsage = map[string]string{
	"ls":     "cairn checkpoints ls (--store URL --job NAME | --job-file FILE) [--data-dir DIR] [--json]: the job's checkpoints and savepoints (a job graph's: each sub-topology's, NAME.s1 ... after NAME)",
	"show":   "cairn checkpoints show [ID|savepoint:NAME] (--store URL --job NAME | --job-file FILE) [--data-dir DIR] [--rescale-to N] [--json]: one checkpoint (default the newest), a summary or the manifest; --rescale-to previews a restore onto N slots",
	"verify": "cairn checkpoints verify [ID] (--store URL --job NAME | --job-file FILE): read every object of a checkpoint back and check it",
	"gc":     "cairn checkpoints gc [--dry-run] [--retain N] [--grace D] (--store URL --job NAME | --job-file FILE): delete what retention and no manifest keep (every sub-topology's of a job graph)",
	"advise": adviseUsage,
}

func cmdCheckpoints(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(stderr, "Usage: cairn checkpoints ls|show|verify|gc|advise [flags]; cairn checkpoints SUBCOMMAND --help for each")
		for _, sub := range []string{"ls", "show", "verify", "gc", "advise"} {
			fmt.Fprintln(stderr, "  "+checkpointsUsage[sub])
		}
		if len(args) == 0 {
			return errors.New("a subcommand is required")
		}
		return nil
	}
	sub := args[0]
	if sub == "advise" {
		return cmdCheckpointsAdvise(ctx, args[1:], stdout, stderr)
	}
	usage, ok := checkpointsUsage[sub]
	if !ok {
		return fmt.Errorf("unknown subcommand %q: use ls, show, verify, gc or advise", sub)
	}
	fs := cmdline.NewFlagSet("checkpoints "+sub, usage, stderr)
	sf := addStoreFlags(fs)
	var dryRun *bool
	var retain *int
	var grace *time.Duration
	var asJSON *bool
	if sub == "gc" {
		dryRun = fs.Bool("dry-run", false, "list what would be deleted, delete nothing")
		retain = fs.Int("retain", 0, "checkpoints to keep (default: the job's checkpoint.retain, else 3)")
		grace = fs.Duration("grace", time.Hour, fmt.Sprintf("orphan grace period, at least %v: it must exceed the longest upload of a running job's checkpoint", checkpoint.MinGCGrace))
	} else {
		retain = new(int)
	}
	var dataDir *string
	var rescaleTo *int
	if sub == "ls" || sub == "show" {
		asJSON = fs.Bool("json", false, "JSON output (show: the manifest)")
		dataDir = fs.String("data-dir", "", "the job's data directory, whose restore model (restore-model.json) predicts restores (default: the job file's data_dir, else ./cairn-data)")
	}
	if sub == "show" {
		rescaleTo = fs.Int("rescale-to", 0, "preview a restore onto N slots: per new slot the objects and bytes it fetches, the key groups that move and the predicted time")
	}
	pos, err := cmdline.ParseInterspersed(fs, args[1:])
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
	if dataDir != nil && *dataDir == "" {
		*dataDir = "./cairn-data"
		if j != nil && j.DataDir != "" {
			*dataDir = j.DataDir
		}
	}
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
			return 0, fmt.Errorf("checkpoint id %q is not a number (a savepoint is savepoint:NAME)", pos[0])
		}
		return n, nil
	}
	switch sub {
	case "ls":
		chains, err := graphChains(ctx, store, *jobName)
		if err != nil {
			return err
		}
		mod := model.Load(*dataDir)
		if len(chains) == 1 {
			list, sps, err := listChain(ctx, store, *jobName)
			if err != nil {
				return err
			}
			return lsChain(ctx, stdout, store, *jobName, *storeFlag, mod, list, sps, *asJSON)
		}
		// A job graph: one chain per sub-topology, each with the stream it
		// reads (the job's input, or the repartition stream before it).
		if *asJSON {
			type subJSON struct {
				Name        string                 `json:"name"`
				Stream      string                 `json:"input_stream"`
				Checkpoints []checkpoint.ListEntry `json:"checkpoints"`
				Savepoints  []string               `json:"savepoints"`
			}
			var out struct {
				GraphCheckpoints []*checkpoint.GraphManifest `json:"graph_checkpoints"`
				SubTopologies    []subJSON                   `json:"sub_topologies"`
			}
			if out.GraphCheckpoints, _, err = checkpoint.ListGraphs(ctx, store, *jobName); err != nil {
				return err
			}
			for k, name := range chains {
				list, sps, err := listChain(ctx, store, name)
				if err != nil {
					return err
				}
				out.SubTopologies = append(out.SubTopologies, subJSON{name, chainInput(ctx, store, list, *jobName, name, k), list, sps})
			}
			return json.NewEncoder(stdout).Encode(out)
		}
		// Each chain is listed once, for the graph table and its own.
		lists := map[string][]checkpoint.ListEntry{}
		savepoints := map[string][]string{}
		for _, name := range chains {
			if lists[name], savepoints[name], err = listChain(ctx, store, name); err != nil {
				return err
			}
		}
		if err := lsGraph(ctx, stdout, store, *jobName, mod, lists); err != nil {
			return err
		}
		for k, name := range chains {
			list := lists[name]
			fmt.Fprintln(stdout)
			fmt.Fprintf(stdout, "SUB-TOPOLOGY %d: %s (reads %s; --job %s for show, verify and gc of this one)\n", k, name, chainInput(ctx, store, list, *jobName, name, k), name)
			if err := lsChain(ctx, stdout, store, name, *storeFlag, mod, list, savepoints[name], false); err != nil {
				return err
			}
		}
		return nil
	case "show":
		var m *checkpoint.Manifest
		var sp string
		if len(pos) > 0 && strings.HasPrefix(pos[0], "savepoint:") {
			sp = strings.TrimPrefix(pos[0], "savepoint:")
			m, err = checkpoint.LoadSavepoint(ctx, store, *jobName, sp)
		} else {
			var n uint64
			if n, err = id(); err == nil {
				m, err = checkpoint.Load(ctx, store, *jobName, n)
			}
		}
		if err != nil {
			return err
		}
		if *asJSON {
			b, err := json.MarshalIndent(m, "", "  ")
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(stdout, string(b))
			return err
		}
		if err := showManifest(stdout, m, sp, model.Load(*dataDir)); err != nil {
			return err
		}
		if err := showRestorePlan(stdout, m, store, *dataDir, *rescaleTo); err != nil {
			return err
		}
		if sp != "" {
			return showGraph(ctx, stdout, store, *jobName, 0)
		}
		return showGraph(ctx, stdout, store, *jobName, m.ID)
	case "verify":
		n, err := id()
		if err != nil {
			return err
		}
		problems, err := checkpoint.Verify(ctx, store, *jobName, n)
		if err != nil {
			return err
		}
		// A job graph's checkpoint n: every part of graph checkpoint n.
		g, err := checkpoint.LoadGraph(ctx, store, *jobName, n)
		switch {
		case errors.Is(err, checkpoint.ErrNotFound):
		case err != nil:
			problems = append(problems, checkpoint.Problem{Object: checkpoint.GraphPath(*jobName, n), Err: err})
		default:
			for _, p := range g.Parts[1:] {
				ps, err := checkpoint.Verify(ctx, store, p.Name, p.Checkpoint)
				if err != nil {
					ps = []checkpoint.Problem{{Object: checkpoint.ManifestPath(p.Name, p.Checkpoint), Err: err}}
				}
				problems = append(problems, ps...)
			}
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
			fmt.Fprintf(stdout, "UNREFERENCED %s (%s, written %s ago): no manifest references it\n", o.Name, runtime.FormatBytes(uint64(o.Size)), now.Sub(o.ModTime).Round(time.Second))
		}
		if len(junk.Corrupt) > 0 && len(junk.Objects) > 0 {
			fmt.Fprintf(stdout, "(%d corrupt manifests: an object listed as unreferenced may be one of theirs)\n", len(junk.Corrupt))
		}
		if len(problems) > 0 {
			return fmt.Errorf("checkpoint %d: %d broken objects: %w", n, len(problems), ErrBroken)
		}
		if g != nil {
			fmt.Fprintf(stdout, "graph checkpoint %d (%s): every object of every part present with the right size and checksum\n", n, runtime.GraphPartsText(g))
			return nil
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
		// A job graph's sub-topologies each have a chain: gc covers all.
		chains, err := graphChains(ctx, store, *jobName)
		if err != nil {
			return err
		}
		kept := map[string][]uint64{} // each chain's checkpoints after gc
		// The graph checkpoints naming a checkpoint go before it does, so
		// that none names a checkpoint that is gone, even if gc stops
		// half-way (read once, when the first chain drops one).
		var graphs []*checkpoint.GraphManifest
		graphsRead := false
		for _, name := range chains {
			var beforeDrop func(context.Context, []uint64) error
			if len(chains) > 1 {
				beforeDrop = func(ctx context.Context, ids []uint64) error {
					if !graphsRead {
						gs, _, err := checkpoint.ListGraphs(ctx, store, *jobName)
						if err != nil {
							return err
						}
						graphs, graphsRead = gs, true
					}
					left, removed, err := checkpoint.RemoveGraphsNaming(ctx, store, graphs, name, ids)
					graphs = left
					if len(removed) > 0 {
						fmt.Fprintf(stdout, "%s: graph checkpoints removed (they name checkpoints dropped below) %v\n", name, removed)
					}
					return err
				}
			}
			rep, err := checkpoint.GCBeforeDrop(ctx, store, name, *retain, *grace, *dryRun, beforeDrop)
			if err != nil {
				return err
			}
			kept[name] = rep.Kept
			verb := "deleted"
			if rep.DryRun {
				verb = "would delete"
			}
			for _, o := range rep.Deleted {
				fmt.Fprintf(stdout, "%s %s (%s)\n", verb, o.Name, runtime.FormatBytes(uint64(o.Size)))
			}
			prefix := ""
			if len(chains) > 1 {
				prefix = name + ": "
			}
			fmt.Fprintf(stdout, "%s%s %d objects, %s; checkpoints dropped %v, kept %v\n", prefix, verb, len(rep.Deleted), runtime.FormatBytes(uint64(rep.BytesFreed)), rep.Dropped, rep.Kept)
			if rep.KeptByLease > 0 || rep.LeasesExpired > 0 {
				fmt.Fprintf(stdout, "%s%d objects kept for a node that still reads them remotely (a lease); %d expired leases removed\n", prefix, rep.KeptByLease, rep.LeasesExpired)
			}
		}
		if len(chains) == 1 {
			return nil
		}
		// A graph checkpoint goes before the first checkpoint it names
		// (beforeDrop above); here, those that name one already gone.
		exists := func(name string, id uint64) bool { return slices.Contains(kept[name], id) }
		if *dryRun {
			gs, _, err := checkpoint.ListGraphs(ctx, store, *jobName)
			if err != nil {
				return err
			}
			var would []uint64
			for _, g := range gs {
				if g.Stale(exists) {
					would = append(would, g.ID)
				}
			}
			fmt.Fprintf(stdout, "graph checkpoints that would be removed (a checkpoint they name would be dropped): %v\n", would)
			return nil
		}
		pruned, err := checkpoint.PruneGraphs(ctx, store, *jobName, exists)
		if err != nil {
			return err
		}
		if len(pruned) > 0 {
			// Left by an earlier version, which removed them after the
			// drop, or by a gc that stopped half-way.
			fmt.Fprintf(stdout, "graph checkpoints removed (a checkpoint they name was already gone): %v\n", pruned)
		}
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
			if *f.store, err = runtime.StoreURL(&c); err != nil {
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

// showManifest prints a checkpoint or savepoint for a person: what it is,
// where the input stands, its slots, its cost, and what a restore costs.
func showManifest(w io.Writer, m *checkpoint.Manifest, savepoint string, mod *model.Model) error {
	f := m.Figures
	kinds := map[checkpoint.Kind]int{}
	var bytesByKind = map[checkpoint.Kind]int64{}
	for _, o := range m.Objects {
		kinds[o.Kind]++
		bytesByKind[o.Kind] += o.Size
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	what := fmt.Sprintf("checkpoint %d", m.ID)
	if savepoint != "" {
		what = fmt.Sprintf("savepoint %s (from barrier %d)", savepoint, m.ID)
	}
	fmt.Fprintf(tw, "%s\tof job %s, %s, taken %s\t\n", what, m.Job, m.Mode, m.Time.Format(time.DateTime))
	if m.Parent != 0 {
		fmt.Fprintf(tw, "chain\t%d checkpoints (parent %d): a restore needs the objects of every one of them it still references\t\n", m.ChainLength, m.Parent)
	} else {
		fmt.Fprintf(tw, "chain\t%d (self-contained)\t\n", m.ChainLength)
	}
	fmt.Fprintf(tw, "input\tstream %s through sequence %d (a restore resumes at %d)\t\n", m.SourceStream, m.SourceSeq, m.SourceSeq+1)
	fmt.Fprintf(tw, "slots\t%d over %d key groups:", len(m.Slots), m.KeyGroups)
	for _, s := range m.Slots {
		fmt.Fprintf(tw, " %d%v", s.Slot, s.Range)
	}
	fmt.Fprintln(tw, "\t")
	fmt.Fprintf(tw, "took\tsync %s (slowest slot), async %s\t\n", f.SyncMax.Round(time.Millisecond), f.Async.Round(time.Millisecond))
	fmt.Fprintf(tw, "uploaded\t%s in %d files; reused %s in %d files\t\n", runtime.FormatBytes(uint64(f.BytesUploaded)), f.FilesUploaded, runtime.FormatBytes(uint64(f.BytesReused)), f.FilesReused)
	fmt.Fprintf(tw, "state\t%s in %d objects (%d sst, %d other native, %d full data, %d index)\t\n", runtime.FormatBytes(uint64(f.FullStateSize)), len(m.Objects),
		kinds[checkpoint.KindSST], kinds[checkpoint.KindMeta], kinds[checkpoint.KindFullData], kinds[checkpoint.KindIndex])
	p := mod.Predict(recovery.StoreInput(m.Mode, len(m.Slots), m.KeyGroups, f))
	fmt.Fprintf(tw, "restore\tfrom the store onto %d slots: %s\t\n", len(m.Slots), p.Text())
	if t := p.OnlineText(); t != "" {
		fmt.Fprintf(tw, "\t%s (restore.mode: online)\t\n", t)
	}
	for stage, h := range m.Modules {
		fmt.Fprintf(tw, "module\t%s sha256 %s\t\n", stage, runtime.ShortHash(h))
	}
	for stage, v := range m.StateVersions {
		fmt.Fprintf(tw, "state version\t%s: %d\t\n", stage, v)
	}
	if o := m.Origin; o != nil {
		fmt.Fprintf(tw, "origin\tcairn state %s from %s\t\n", o.Tool, o.From)
		for _, s := range o.Steps {
			fmt.Fprintf(tw, "\t%s\t\n", s)
		}
	}
	fmt.Fprintln(tw, "\t(--json for the manifest)\t")
	return tw.Flush()
}

// showRestorePlan prints what a restore of m onto this node would read, by
// recovery.PlanRestore (the local copies in dataDir count), and its
// predicted time; with rescaleTo > 0, per new slot of a restore onto that
// many slots: the old slots it takes, the objects and bytes it fetches, the
// key groups that move, and the slot's predicted time.
func showRestorePlan(w io.Writer, m *checkpoint.Manifest, store checkpoint.Store, dataDir string, rescaleTo int) error {
	mod := model.Load(dataDir)
	o := recovery.Options{Store: store, Job: m.Job, KeyGroups: m.KeyGroups, Slots: rescaleTo, DataDir: dataDir, LocalDir: datadir.Checkpoints(dataDir)}
	p, err := recovery.PlanRestore(m, o)
	if err != nil {
		return err
	}
	what := "here"
	if p.Rescaled {
		what = fmt.Sprintf("here onto %d slots (from %d)", p.ToSlots, p.FromSlots)
	}
	pred := mod.Predict(p.Input())
	fmt.Fprintf(w, "restore %s: %s local, %s in %d objects from the store: %s\n", what, runtime.FormatBytes(uint64(p.BytesLocal)), runtime.FormatBytes(uint64(p.BytesDownload)),
		p.ObjectsDownload, pred.Text())
	if t := pred.OnlineText(); t != "" && p.BytesDownload > 0 {
		fmt.Fprintf(w, "  %s (restore.mode: online)\n", t)
	}
	if rescaleTo <= 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "NEW_SLOT\tKEY_GROUPS\tFROM_OLD\tOBJECTS\tBYTES\tTO_FETCH\tKEY_GROUPS_MOVED\tREBUILD\tPREDICTED\t")
	for _, s := range p.Slots {
		from := make([]string, len(s.From))
		for i, f := range s.From {
			from[i] = strconv.Itoa(f)
		}
		fmt.Fprintf(tw, "%d\t%v\t%s\t%d\t%s\t%s in %d\t%d\t%s\t%s\t\n", s.Slot, s.Range, strings.Join(from, ","), s.Objects, runtime.FormatBytes(uint64(s.Bytes)),
			runtime.FormatBytes(uint64(s.BytesDownload)), s.ObjectsDownload, s.KeyGroupsMoved, runtime.FormatBytes(uint64(s.BytesRebuild)), mod.Predict(s.Input(p)).Short())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "(each slot's time as if it restored alone; the restore fetches the slots' objects once, in parallel)")
	return nil
}

// lsChain prints one chain's checkpoints and savepoints (the whole job's,
// or one sub-topology's of a job graph), as listChain listed them.
func lsChain(ctx context.Context, stdout io.Writer, store checkpoint.Store, name, storeURL string, mod *model.Model, list []checkpoint.ListEntry, sps []string, asJSON bool) error {
	if len(list) == 0 && len(sps) == 0 {
		return fmt.Errorf("no checkpoint or savepoint of job %q in %s: is the job name right? (a job's name is its job file's name:)", name, runtime.RedactURL(storeURL))
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(struct {
			Checkpoints []checkpoint.ListEntry `json:"checkpoints"`
			Savepoints  []string               `json:"savepoints"`
		}{list, sps})
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
		// The restore model's prediction from the store, as the
		// dashboard shows it for the same checkpoint.
		predicted := mod.Predict(recovery.StoreInput(e.Mode, e.Slots, e.KeyGroups, f)).Short()
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t\n", e.ID, e.Mode, e.Time.Format(time.DateTime), e.SourceSeq,
			f.SyncMax.Round(time.Millisecond), f.Async.Round(time.Millisecond), runtime.FormatBytes(uint64(f.BytesUploaded)), runtime.FormatBytes(uint64(f.FullStateSize)),
			f.FilesUploaded, f.FilesReused, e.ChainLength, runtime.FormatBytes(uint64(e.RetainedExclusive)), runtime.FormatBytes(uint64(e.RetainedShared)), predicted)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, e := range corrupt {
		fmt.Fprintf(stdout, "checkpoint %d is CORRUPT and cannot be restored: %s (`cairn checkpoints verify %d` names the object)\n", e.ID, e.Corrupt, e.ID)
	}
	if len(sps) > 0 {
		fmt.Fprintln(stdout, "\nSAVEPOINTS (cairn checkpoints show savepoint:NAME; restore with --restore savepoint:NAME)")
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tID\tTIME\tSOURCE_SEQ\tSTATE\t")
		for _, sp := range sps {
			m, err := checkpoint.LoadSavepoint(ctx, store, name, sp)
			if err != nil {
				fmt.Fprintf(tw, "%s\tCORRUPT\t-\t-\t%v\t\n", sp, err)
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t\n", sp, m.ID, m.Time.Format(time.DateTime), m.SourceSeq, runtime.FormatBytes(uint64(m.Figures.FullStateSize)))
		}
		return tw.Flush()
	}
	return nil
}

// lsGraph prints a job graph's graph checkpoints: each names one
// checkpoint of every sub-topology. Its predicted restore is the sum of
// the parts' (the sub-topologies restore one after the other). lists are
// the sub-topologies' checkpoints, by chain, as the caller listed them.
func lsGraph(ctx context.Context, stdout io.Writer, store checkpoint.Store, jobName string, mod *model.Model, lists map[string][]checkpoint.ListEntry) error {
	gs, bad, err := checkpoint.ListGraphs(ctx, store, jobName)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "GRAPH CHECKPOINTS (each names one checkpoint of every sub-topology; restore the whole graph to one with --restore ID)")
	if len(gs) == 0 && len(bad) == 0 {
		fmt.Fprintln(stdout, "  none yet: one is written once every sub-topology has committed a checkpoint")
		return nil
	}
	figures := map[string]map[uint64]checkpoint.ListEntry{}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTIME\tPARTS\tSTATE\tPREDICTED_RESTORE\t")
	for _, g := range gs {
		var parts []string
		var state int64
		var seconds float64
		known := true
		var unusable []string // parts gone or corrupt: not restorable
		for _, p := range g.Parts {
			parts = append(parts, fmt.Sprintf("%s:%d (%s, %d slots)", p.Name, p.Checkpoint, p.Mode, p.Slots))
			state += p.FullStateSize
			if figures[p.Name] == nil {
				figures[p.Name] = map[uint64]checkpoint.ListEntry{}
				for _, e := range lists[p.Name] {
					figures[p.Name][e.ID] = e
				}
			}
			e, ok := figures[p.Name][p.Checkpoint]
			if !ok || e.Corrupt != "" {
				what := "gone"
				if ok {
					what = "corrupt"
				}
				unusable = append(unusable, fmt.Sprintf("%s:%d %s", p.Name, p.Checkpoint, what))
				continue
			}
			pr := mod.Predict(recovery.StoreInput(e.Mode, e.Slots, e.KeyGroups, e.Figures))
			known = known && pr.OK
			seconds += pr.Seconds
		}
		predicted := "calibrating"
		switch {
		case len(unusable) > 0:
			// Left by a version that dropped checkpoints before their
			// graph checkpoint, or a corrupt part: `checkpoints gc` removes
			// the first kind.
			predicted = "not restorable (" + strings.Join(unusable, ", ") + ")"
		case known:
			predicted = time.Duration(seconds * float64(time.Second)).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t\n", g.ID, g.Time.Format(time.DateTime), strings.Join(parts, " + "), runtime.FormatBytes(uint64(state)), predicted)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, err := range bad {
		fmt.Fprintf(stdout, "  unreadable: %v\n", err)
	}
	return nil
}

// listChain lists one chain's checkpoints and savepoint names.
func listChain(ctx context.Context, store checkpoint.Store, name string) ([]checkpoint.ListEntry, []string, error) {
	list, err := checkpoint.List(ctx, store, name)
	if err != nil {
		return nil, nil, err
	}
	sps, err := checkpoint.ListSavepoints(ctx, store, name)
	return list, sps, err
}

// showGraph follows `checkpoints show` of a job graph's first sub-topology
// with graph checkpoint id, when there is one (its parts), and with every
// sub-topology: the stream it reads, its newest checkpoint and the input
// position that checkpoint holds. Nothing for a one-chain job.
func showGraph(ctx context.Context, w io.Writer, store checkpoint.Store, jobName string, id uint64) error {
	chains, err := graphChains(ctx, store, jobName)
	if err != nil || len(chains) == 1 {
		return err
	}
	if id > 0 {
		g, err := checkpoint.LoadGraph(ctx, store, jobName, id)
		switch {
		case errors.Is(err, checkpoint.ErrNotFound):
			fmt.Fprintf(w, "\nno graph checkpoint %d: checkpoint %d of %s is not part of one (cairn checkpoints ls lists the graph checkpoints)\n", id, id, jobName)
		case err != nil:
			fmt.Fprintf(w, "\ngraph checkpoint %d cannot be read: %v\n", id, err)
		default:
			fmt.Fprintf(w, "\ngraph checkpoint %d (%s; restore the whole graph to it with --restore %d):\n", id, g.Time.Format(time.DateTime), id)
			for _, p := range g.Parts {
				fmt.Fprintf(w, "  %s: checkpoint %d (%s, %d slots, %s) reads %s through sequence %d\n", p.Name, p.Checkpoint, p.Mode, p.Slots, runtime.FormatBytes(uint64(p.FullStateSize)), p.SourceStream, p.SourceSeq)
			}
		}
	}
	fmt.Fprintf(w, "\njob graph %s: %d sub-topologies, each with its own checkpoints (--job NAME shows one)\n", jobName, len(chains))
	for k, name := range chains {
		list, _, err := listChain(ctx, store, name)
		if err != nil {
			return err
		}
		newest := "no readable checkpoint"
		for i := len(list) - 1; i >= 0; i-- {
			if e := list[i]; e.Corrupt == "" {
				newest = fmt.Sprintf("newest checkpoint %d (%s, %d slots) through sequence %d", e.ID, e.Mode, e.Slots, e.SourceSeq)
				break
			}
		}
		fmt.Fprintf(w, "  %d %s: reads %s; %s\n", k, name, chainInput(ctx, store, list, jobName, name, k), newest)
	}
	return nil
}

// graphChains returns the checkpoint chains of a job: its own, then, for a
// job graph, each later sub-topology's (<job>.s1, <job>.s2, ...) that has
// checkpoints in the store.
func graphChains(ctx context.Context, store checkpoint.Store, jobName string) ([]string, error) {
	chains := []string{jobName}
	for k := 1; ; k++ {
		name := fmt.Sprintf("%s.s%d", jobName, k)
		ids, err := checkpoint.ManifestIDs(ctx, store, name)
		if err != nil {
			return nil, err
		}
		if len(ids) == 0 {
			// A sub-topology may hold a savepoint before its first
			// checkpoint (a group's savepoint soon after a start).
			sps, err := checkpoint.ListSavepoints(ctx, store, name)
			if err != nil {
				return nil, err
			}
			if len(sps) == 0 {
				return chains, nil
			}
		}
		chains = append(chains, name)
	}
}

// chainInput names the stream sub-topology k reads: the source stream its
// newest checkpoint records, else (no readable manifest) the repartition
// stream before it.
func chainInput(ctx context.Context, store checkpoint.Store, list []checkpoint.ListEntry, jobName, name string, k int) string {
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].Corrupt != "" {
			continue
		}
		if m, err := checkpoint.Load(ctx, store, name, list[i].ID); err == nil && m.SourceStream != "" {
			return m.SourceStream
		}
		break
	}
	if k == 0 {
		return "the job's input"
	}
	stream, _ := runtime.RepartitionStream(jobName, k)
	return stream
}
