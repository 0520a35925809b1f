package runtime

import (
	"context"
	"errors"
	"sync"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
	"cairn/recovery"
	"cairn/recovery/model"
)

// AdviseGather reads what model.Advise decides from: the chain's retained
// checkpoints (corrupt ones left out), the newest savepoint when no full
// checkpoint is retained (a savepoint is one), each with the model's
// prediction of its restore from the store — recovery.StoreInput, the
// number `checkpoints ls` prints — and the job's checkpoint settings (j may
// be nil: --store and --job only).
func AdviseGather(ctx context.Context, store checkpoint.Store, name string, mod *model.Model, j *job.Job) (model.AdviseInput, error) {
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
		in, err := AdviseGather(ctx, s.Store, s.Job.Name, mod, s.Job)
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
