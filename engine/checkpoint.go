package engine

// Checkpoints, the engine's side: a trigger becomes a barrier the pipeline
// injects after the last routed record; every slot snapshots on it; the
// asynchronous part waits for the snapshots and the outputs published
// before the barrier, then hands them to the Committer. At most one
// checkpoint is in flight; waiters are signalled through mu.changed.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"cairn/internal/base/datadir"
	"cairn/state"
)

// changedLocked wakes everyone waiting for a checkpoint.
func (e *Engine) changedLocked() {
	close(e.mu.changed)
	e.mu.changed = make(chan struct{})
}

func (e *Engine) localCheckpointDir(id uint64) string {
	return datadir.Checkpoint(datadir.Checkpoints(e.cfg.DataDir), id)
}

// sweepLocal removes the local checkpoint copies whose id drop selects.
//
// At start it drops the ids from the next one on: they are left by a
// process killed between the snapshot and the commit (ids are never reused,
// so such a copy was never committed), and a Pebble checkpoint refuses an
// existing directory: without the sweep, every checkpoint after a restart
// with the same next id would abort. After a commit it drops every older
// id, including the copy a restore kept, so local recovery keeps exactly
// the newest committed checkpoint however many restarts came before.
func (e *Engine) sweepLocal(drop func(id uint64) bool) error {
	root := datadir.Checkpoints(e.cfg.DataDir)
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("engine: local checkpoints: %w", err)
	}
	for _, ent := range entries {
		id, ok := datadir.ParseCheckpointName(ent.Name())
		if !ok || !ent.IsDir() || !drop(id) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, ent.Name())); err != nil {
			return fmt.Errorf("engine: remove local checkpoint copy %s: %w", ent.Name(), err)
		}
	}
	return nil
}

// TriggerCheckpoint asks for a checkpoint now (or a savepoint, as r says).
// It returns the checkpoint's id, or ok=false when one is already in
// flight or the engine takes no checkpoints.
func (e *Engine) TriggerCheckpoint(ctx context.Context, r CheckpointRequest) (id uint64, ok bool) {
	if e.cfg.Checkpoint == nil {
		return 0, false
	}
	return e.trigger(ctx, barrierReq{req: r})
}

func (e *Engine) trigger(ctx context.Context, req barrierReq) (id uint64, ok bool) {
	e.mu.Lock()
	if e.mu.inFlight {
		e.mu.Unlock()
		return 0, false
	}
	e.mu.inFlight = true
	e.mu.Unlock()
	req.id = e.nextID.Load()
	select {
	case e.barriers <- req:
		return req.id, true
	case <-ctx.Done():
	case <-e.failed:
	}
	e.mu.Lock()
	e.mu.inFlight = false
	e.changedLocked()
	e.mu.Unlock()
	return 0, false
}

// WaitCheckpoint waits until checkpoint id has finished and returns its event.
func (e *Engine) WaitCheckpoint(ctx context.Context, id uint64) (CheckpointEvent, error) {
	for {
		e.mu.Lock()
		for _, c := range e.mu.checkpoints {
			if c.ID == id {
				e.mu.Unlock()
				return c, nil
			}
		}
		changed := e.mu.changed
		e.mu.Unlock()
		select {
		case <-ctx.Done():
			return CheckpointEvent{}, ctx.Err()
		case <-changed:
		}
	}
}

// waitCheckpoint waits until no checkpoint is in flight.
func (e *Engine) waitCheckpoint() {
	for {
		e.mu.Lock()
		busy, changed := e.mu.inFlight, e.mu.changed
		e.mu.Unlock()
		if !busy {
			return
		}
		<-changed
	}
}

func (e *Engine) checkpointLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.Checkpoint.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.TriggerCheckpoint(ctx, CheckpointRequest{})
		}
	}
}

// completeCheckpoint is the asynchronous part: wait for every slot's local
// snapshot and for the outputs published before the barrier to be
// acknowledged, then hand the snapshots to the committer.
func (e *Engine) completeCheckpoint(ctx context.Context, req barrierReq, t0 time.Time, done <-chan slotBarrierDone, fences []<-chan struct{}) {
	ev := CheckpointEvent{ID: req.id, SourceSeq: req.sourceSeq, Time: time.Now()}
	b := Barrier{ID: req.id, SourceSeq: req.sourceSeq, Mode: req.req.Mode, Savepoint: req.req.Savepoint}
	var errs []error
	for range e.slots {
		var d slotBarrierDone
		select {
		case d = <-done:
		case <-e.failed:
			// A failed slot never answers its barrier.
			d.err = fmt.Errorf("engine: checkpoint %d: the engine failed", req.id)
		}
		if d.err != nil {
			errs = append(errs, d.err)
			continue
		}
		b.Slots = append(b.Slots, d.snap)
		fences = append(fences, d.fence)
		ev.SyncMax = max(ev.SyncMax, d.snap.SyncDuration)
	}
	err := errors.Join(errs...)
	cctx, cancel := context.WithTimeout(ctx, e.cfg.Checkpoint.Timeout)
	defer cancel()
	for _, f := range fences {
		if err != nil {
			break
		}
		select {
		case <-f:
		case <-cctx.Done():
			err = fmt.Errorf("engine: checkpoint %d: outputs not acknowledged: %w", req.id, cctx.Err())
		}
	}
	if err == nil {
		sortSnapshots(b.Slots)
		err = e.cfg.Checkpoint.Committer.Commit(cctx, b)
	}
	ev.Duration = time.Since(t0)
	ev.Err = err
	if err == nil {
		// INVARIANT: sent before inFlight is cleared, so a stop that waits
		// for the checkpoint also sees its outputs published.
		for _, s := range e.slots {
			if s.txn {
				select {
				case s.commits <- req.id:
				default: // a later commit publishes these too
				}
			}
		}
	}
	// Local copies are settled before inFlight is cleared, so whoever waits
	// for the checkpoint finds the data dir as it stays.
	if err != nil {
		_ = os.RemoveAll(e.localCheckpointDir(req.id))
	} else if serr := e.sweepLocal(func(id uint64) bool { return id < req.id }); serr != nil {
		// Keep only the newest committed checkpoint's local copy (local recovery).
		e.log.Warn("older local checkpoint copies stay on disk", "job", e.cfg.Job, "err", serr)
	}
	e.mu.Lock()
	// INVARIANT: ids are never reused, not even after a failed attempt: its
	// uploads may still be in the store until the orphan sweep.
	e.nextID.Store(req.id + 1)
	e.mu.checkpoints = append(e.mu.checkpoints, ev)
	if n := len(e.mu.checkpoints); n > 1000 {
		e.mu.checkpoints = e.mu.checkpoints[n-1000:]
	}
	e.mu.inFlight = false
	e.changedLocked()
	e.mu.Unlock()
	if err != nil {
		e.log.Error("checkpoint aborted", "job", e.cfg.Job, "id", req.id, "err", err)
		return
	}
	e.log.Debug("checkpoint complete", "job", e.cfg.Job, "id", req.id, "source_seq", req.sourceSeq,
		"sync_max_ms", ev.SyncMax.Milliseconds(), "duration_ms", ev.Duration.Milliseconds())
}

func sortSnapshots(s []state.SlotSnapshot) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].Slot < s[j-1].Slot; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// ErrFinalCheckpoint is returned by Run when a graceful stop could not take
// its final checkpoint: nothing is lost, but a restart replays the input
// from the last committed checkpoint (and, with transactional delivery, the
// outputs since then are published only after that restart).
var ErrFinalCheckpoint = errors.New("engine: the final checkpoint on stop failed")

// finalAttempts is how many times a graceful stop tries its checkpoint.
const finalAttempts = 2

// finalCheckpoint takes a checkpoint and waits for it to finish; a failed
// one (a store that failed beyond its retries) is tried once more, with a
// new id.
func (e *Engine) finalCheckpoint(ctx context.Context) error {
	var last error
	for attempt := 1; attempt <= finalAttempts; attempt++ {
		e.waitCheckpoint()
		var id uint64
		for {
			e.mu.Lock()
			changed := e.mu.changed
			e.mu.Unlock()
			var ok bool
			if id, ok = e.trigger(ctx, barrierReq{req: e.cfg.Checkpoint.OnStop, drain: true}); ok {
				break
			}
			select {
			case <-e.failed:
				return nil // Run reports the failure
			case <-changed:
			}
		}
		e.waitCheckpoint()
		for _, c := range e.Checkpoints() {
			if c.ID != id {
				continue
			}
			if c.Err == nil {
				e.log.Info("final checkpoint on stop", "job", e.cfg.Job, "id", c.ID, "source_seq", c.SourceSeq)
				return nil
			}
			last = c.Err
			e.log.Warn("final checkpoint on stop failed", "job", e.cfg.Job, "id", c.ID, "attempt", attempt, "of", finalAttempts, "err", c.Err)
		}
		select {
		case <-e.failed:
			return nil
		default:
		}
	}
	if last == nil {
		last = errors.New("no checkpoint event recorded")
	}
	return fmt.Errorf("%w (a restart replays from the last committed checkpoint): %w", ErrFinalCheckpoint, last)
}
