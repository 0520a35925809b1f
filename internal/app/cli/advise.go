package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"cairn/checkpoint"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/runtime"
	"cairn/recovery/model"
)

// The checkpoint mode advisor, which tells a user from measured numbers
// whether incremental checkpoints buy anything for the job: `cairn checkpoints
// advise` and the dashboard's card gather the inputs — the retained
// checkpoints' figures, the newest savepoint when no full checkpoint is
// retained, the restore model's prediction for each, the job's checkpoint
// settings — and print model.Advise's answer, which holds the decision.

const adviseUsage = "cairn checkpoints advise (--store URL --job NAME | --job-file FILE) [--data-dir DIR] [--json]: whether incremental checkpoints buy anything for this job, from its retained checkpoints' measured figures and the restore model (each sub-topology's, for a job graph)"

func cmdCheckpointsAdvise(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("checkpoints advise", adviseUsage, stderr)
	sf := addStoreFlags(fs)
	asJSON := fs.Bool("json", false, "JSON output: the advice with its figures")
	dataDir := fs.String("data-dir", "", "the job's data directory, whose restore model (restore-model.json) predicts restores (default: the job file's data_dir, else ./cairn-data)")
	pos, err := cmdline.ParseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected argument %q", pos[0])
	}
	j, err := sf.resolve(fs)
	if err != nil {
		return err
	}
	if *dataDir == "" {
		*dataDir = "./cairn-data"
		if j != nil && j.DataDir != "" {
			*dataDir = j.DataDir
		}
	}
	store, err := checkpoint.OpenStore(ctx, *sf.store)
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	chains, err := graphChains(ctx, store, *sf.job)
	if err != nil {
		return err
	}
	// One model for every chain, as `checkpoints ls` reads it: the same
	// predictions for the same checkpoints.
	mod := model.Load(*dataDir)
	var all []adviseJSON
	for k, name := range chains {
		in, err := runtime.AdviseGather(ctx, store, name, mod, j)
		if err != nil {
			return err
		}
		a := model.Advise(in)
		if *asJSON {
			all = append(all, newAdviseJSON(name, a))
			continue
		}
		if k > 0 {
			fmt.Fprintln(stdout)
		}
		if len(chains) > 1 {
			fmt.Fprintf(stdout, "SUB-TOPOLOGY %d: %s\n", k, name)
		}
		if err := printAdvice(stdout, name, in, a); err != nil {
			return err
		}
	}
	if *asJSON {
		if len(all) == 1 {
			return json.NewEncoder(stdout).Encode(all[0])
		}
		return json.NewEncoder(stdout).Encode(struct {
			SubTopologies []adviseJSON `json:"sub_topologies"`
		}{all})
	}
	return nil
}

// printAdvice prints the two modes' figures, their predicted restores and
// the advice.
func printAdvice(w io.Writer, name string, in model.AdviseInput, a model.Advice) error {
	var nInc, nFull int
	for _, c := range in.Checkpoints {
		switch {
		case c.Savepoint != "":
		case c.Mode == model.Incremental:
			nInc++
		case c.Mode == model.Full:
			nFull++
		}
	}
	interval := "interval unknown"
	if a.Interval > 0 {
		interval = "interval " + a.Interval.String()
		if in.Interval <= 0 {
			interval += " (measured between checkpoints)"
		}
	}
	fmt.Fprintf(w, "job %s: %d retained checkpoints (%d incremental, %d full), %s\n", name, nInc+nFull, nInc, nFull, interval)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODE\tCHECKPOINTS\tNEWEST\tSTATE\tTOOK_P50\tSYNC_P50\tUPLOADED_P50\tCHAIN\tPREDICTED_RESTORE\t")
	for _, row := range []struct {
		mode string
		f    *model.ModeFigures
	}{{model.Incremental, a.Incremental}, {model.Full, a.Full}} {
		f := row.f
		if f == nil {
			fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t-\t-\t-\t\n", row.mode)
			continue
		}
		newest := fmt.Sprintf("#%d", f.Newest)
		if f.Savepoint != "" {
			newest = "savepoint:" + f.Savepoint
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t\n", f.Mode, f.N, newest, model.Bytes(f.State), model.Seconds(f.Took.Seconds()),
			model.Seconds(f.Sync.Seconds()), model.Bytes(f.Uploaded), f.Chain, f.Restore.Short())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range []*model.ModeFigures{a.Incremental, a.Full} {
		if f != nil {
			fmt.Fprintf(w, "restore of the newest %s one from the store: %s\n", f.Mode, f.Restore.Text())
		}
	}
	_, err := fmt.Fprintf(w, "\nADVICE: %s\n%s\n", a.Recommend, a.Text)
	return err
}

// adviseJSON is the advice of one chain for --json.
type adviseJSON struct {
	Job                  string          `json:"job"`
	Recommend            string          `json:"recommend"`
	Text                 string          `json:"text"`
	Reason               string          `json:"reason,omitempty"`
	Missing              []string        `json:"missing,omitempty"`
	Incremental          *adviseModeJSON `json:"incremental"`
	Full                 *adviseModeJSON `json:"full"`
	SavesSeconds         *float64        `json:"incremental_saves_seconds"`
	SavesBytes           *int64          `json:"incremental_saves_bytes"`
	AddsToRestoreSeconds *float64        `json:"incremental_adds_to_restore_seconds"`
	IntervalSeconds      float64         `json:"interval_seconds,omitempty"`
}

type adviseModeJSON struct {
	Checkpoints      int      `json:"checkpoints"`
	Newest           uint64   `json:"newest_id"`
	Savepoint        string   `json:"savepoint,omitempty"`
	NoLongerRetained bool     `json:"no_longer_retained,omitempty"`
	TookSeconds      float64  `json:"took_p50_seconds"`
	SyncSeconds      float64  `json:"sync_p50_seconds"`
	UploadedBytes    int64    `json:"uploaded_p50_bytes"`
	StateBytes       int64    `json:"state_bytes"`
	ChainLength      int      `json:"chain_length"`
	RestoreSeconds   *float64 `json:"predicted_restore_seconds"` // null while calibrating
	Prediction       string   `json:"prediction"`
}

func newAdviseJSON(name string, a model.Advice) adviseJSON {
	mode := func(f *model.ModeFigures) *adviseModeJSON {
		if f == nil {
			return nil
		}
		m := &adviseModeJSON{Checkpoints: f.N, Newest: f.Newest, Savepoint: f.Savepoint, NoLongerRetained: f.Gone, TookSeconds: f.Took.Seconds(),
			SyncSeconds: f.Sync.Seconds(), UploadedBytes: f.Uploaded, StateBytes: f.State, ChainLength: f.Chain, Prediction: f.Restore.Text()}
		if f.Restore.OK {
			s := f.Restore.Seconds
			m.RestoreSeconds = &s
		}
		return m
	}
	out := adviseJSON{Job: name, Recommend: a.Recommend, Text: a.Text, Reason: a.Reason, Missing: a.Missing,
		Incremental: mode(a.Incremental), Full: mode(a.Full), IntervalSeconds: a.Interval.Seconds()}
	if a.Incremental != nil && a.Full != nil {
		s, b := a.Saves.Seconds(), a.SavesBytes
		out.SavesSeconds, out.SavesBytes = &s, &b
	}
	if a.RestoreKnown {
		s := a.AddsToRestore.Seconds()
		out.AddsToRestoreSeconds = &s
	}
	return out
}
