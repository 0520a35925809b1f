package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
	"cairn/recovery"
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
	fs := newFlagSet("checkpoints advise", adviseUsage, stderr)
	sf := addStoreFlags(fs)
	asJSON := fs.Bool("json", false, "JSON output: the advice with its figures")
	dataDir := fs.String("data-dir", "", "the job's data directory, whose restore model (restore-model.json) predicts restores (default: the job file's data_dir, else ./cairn-data)")
	pos, err := parseInterspersed(fs, args)
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
		in, err := adviseGather(ctx, store, name, mod, j)
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

// adviseGather reads what model.Advise decides from: the chain's retained
// checkpoints (corrupt ones left out), the newest savepoint when no full
// checkpoint is retained (a savepoint is one), each with the model's
// prediction of its restore from the store — recovery.StoreInput, the
// number `checkpoints ls` prints — and the job's checkpoint settings (j may
// be nil: --store and --job only).
func adviseGather(ctx context.Context, store checkpoint.Store, name string, mod *model.Model, j *job.Job) (model.AdviseInput, error) {
	var in model.AdviseInput
	if j != nil && j.Checkpoint != nil {
		c := j.Checkpoint
		in.Interval, in.Budget, in.Mode, in.FullEvery, in.Retain = c.Interval, c.RestoreBudget, c.Mode, c.FullEvery, c.Retain
	}
	list, err := checkpoint.List(ctx, store, name)
	if err != nil {
		return in, err
	}
	full := false
	for _, e := range list {
		if e.Corrupt != "" {
			continue
		}
		in.Checkpoints = append(in.Checkpoints, adviseEntry(e.ID, e.Mode, e.Time, e.ChainLength, e.KeyGroups, e.Figures, mod))
		full = full || e.Mode == checkpoint.ModeFull
	}
	if full {
		return in, nil
	}
	sps, err := checkpoint.ListSavepoints(ctx, store, name)
	if err != nil {
		return in, err
	}
	var newest *checkpoint.Manifest
	var newestName string
	for _, sp := range sps {
		m, err := checkpoint.LoadSavepoint(ctx, store, name, sp)
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return in, err
			}
			continue // a corrupt savepoint measures nothing
		}
		if m.Mode == checkpoint.ModeFull && (newest == nil || m.Time.After(newest.Time)) {
			newest, newestName = m, sp
		}
	}
	if newest != nil {
		c := adviseEntry(newest.ID, newest.Mode, newest.Time, newest.ChainLength, newest.KeyGroups, newest.Figures, mod)
		c.Savepoint = newestName
		in.Checkpoints = append([]model.AdviseCheckpoint{c}, in.Checkpoints...)
	}
	return in, nil
}

// adviseEntry is one checkpoint's figures and predicted restore from the
// store, as `checkpoints ls` predicts it.
func adviseEntry(id uint64, mode checkpoint.Mode, at time.Time, chain, keyGroups int, f checkpoint.Figures, mod *model.Model) model.AdviseCheckpoint {
	return model.AdviseCheckpoint{ID: id, Mode: string(mode), Time: at, Sync: f.SyncMax, Async: f.Async, BytesUploaded: f.BytesUploaded,
		FullStateSize: f.FullStateSize, ChainLength: chain, Restore: mod.Predict(recovery.StoreInput(mode, 0, keyGroups, f))}
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

// adviser is the dashboard's mode advice: recomputed by the observer after
// each checkpoint, from the same inputs as `cairn checkpoints advise`, and
// remembering the newest checkpoint of each mode it has seen retained, so
// that a full checkpoint that retention dropped still counts (marked "no
// longer retained") until a newer one is retained.
type adviser struct {
	mu     sync.Mutex
	advice []dashboard.Advice
	// seen is the newest checkpoint of each mode seen retained, by chain
	// and mode.
	seen map[string]map[string]model.AdviseCheckpoint
}

// update recomputes the advice of every sub-topology that has checkpoints.
// It reads the store: call it outside the observer's lock.
func (a *adviser) update(ctx context.Context, r *Running, mod *model.Model) {
	if a == nil || mod == nil {
		return
	}
	var out []dashboard.Advice
	for _, s := range r.SubTopologies() {
		if s.Store == nil {
			continue
		}
		in, err := adviseGather(ctx, s.Store, s.Job.Name, mod, s.Job)
		if err != nil {
			continue // the next checkpoint tries again
		}
		in.Checkpoints = a.remember(s.Job.Name, in.Checkpoints)
		adv := model.Advise(in)
		d := dashboard.Advice{Name: s.Job.Name, Recommend: adv.Recommend, Text: adv.Text}
		if f := adv.Incremental; f != nil {
			d.IncrementalTook, d.IncrementalUploaded, d.StateBytes = f.Took, f.Uploaded, f.State
			if f.Restore.OK {
				d.IncrementalRestore = f.Restore.Duration()
			}
		}
		if f := adv.Full; f != nil {
			d.FullTook, d.FullUploaded = f.Took, f.Uploaded
			if d.StateBytes == 0 {
				d.StateBytes = f.State
			}
			if f.Restore.OK {
				d.FullRestore = f.Restore.Duration()
			}
		}
		out = append(out, d)
	}
	a.mu.Lock()
	a.advice = out
	a.mu.Unlock()
}

// remember records the newest retained checkpoint of each mode and adds the
// remembered one (Gone) of a mode that has none retained.
func (a *adviser) remember(chain string, cks []model.AdviseCheckpoint) []model.AdviseCheckpoint {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen = map[string]map[string]model.AdviseCheckpoint{}
	}
	seen := a.seen[chain]
	if seen == nil {
		seen = map[string]model.AdviseCheckpoint{}
		a.seen[chain] = seen
	}
	have := map[string]bool{}
	for _, c := range cks {
		if c.Savepoint != "" {
			continue
		}
		have[c.Mode] = true
		if old, ok := seen[c.Mode]; !ok || c.ID >= old.ID {
			seen[c.Mode] = c
		}
	}
	for _, mode := range []string{model.Incremental, model.Full} {
		if c, ok := seen[mode]; ok && !have[mode] {
			c.Gone = true
			cks = append([]model.AdviseCheckpoint{c}, cks...)
		}
	}
	return cks
}

// snapshot is the advice for the dashboard.
func (a *adviser) snapshot() []dashboard.Advice {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]dashboard.Advice(nil), a.advice...)
}
