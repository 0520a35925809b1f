package runtime

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime/growth"
	"cairn/recovery/model"
)

// The unbounded-state detector (package growth) on a running job: the
// engine reports each slot's state size (engine.Stats.StateBytes: Pebble's
// disk usage) and the records a sub-topology read (engine.Stats.RecordsIn);
// a sub-topology holds at most one keyed stage, last, and only the keyed
// stage has state, so a sub-topology's state is its keyed stage's. It is
// flagged on the dashboard, in /metrics (cairn_state_unbounded{stage},
// cairn_state_growth_bytes_per_second{stage}) and in the log, once per
// onset, naming the stage.

// stateWatch feeds the detector from a running job: one tracker per keyed
// stage (one per sub-topology that has one), sampled once per checkpoint
// interval by the dashboard's observer.
type stateWatch struct {
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	next   time.Time
	stages []*watchedStage
}

type watchedStage struct {
	sub   *Running
	stage job.Stage
	t     growth.Tracker
}

func newStateWatch(r *Running, log *slog.Logger) *stateWatch {
	w := &stateWatch{log: log, every: growth.DefaultEvery}
	if c := r.Job.Checkpoint; c != nil && c.Interval > 0 {
		w.every = c.Interval
	}
	for _, s := range r.SubTopologies() {
		if n := len(s.Job.Stages); n > 0 && s.Job.Stages[n-1].Keyed && s.Engine != nil {
			w.stages = append(w.stages, &watchedStage{sub: s, stage: s.Job.Stages[n-1]})
		}
	}
	return w
}

// observerLog is the job's logger (the checkpoint committer's), else
// slog's default.
func observerLog(r *Running) *slog.Logger {
	if r.committer != nil && r.committer.log != nil {
		return r.committer.log
	}
	return slog.Default()
}

// tick samples every stage once per interval; the observer calls it every
// second.
func (w *stateWatch) tick(now time.Time) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if now.Before(w.next) {
		return
	}
	w.next = now.Add(w.every)
	for _, s := range w.stages {
		st := s.sub.Engine.Stats()
		var state uint64
		for _, b := range st.StateBytes {
			state += b
		}
		onset, ended := s.t.Observe(now, state, st.RecordsIn)
		v := s.t.Verdict()
		attrs := []any{"stage", s.stage.Name, "sub_topology", s.sub.Job.Name, "growth_bytes_per_s", math.Round(v.BytesPerSecond),
			"records_per_s", math.Round(v.WrittenPerSecond), "state_bytes", state, "intervals", v.Samples}
		switch {
		case onset:
			w.log.Warn(growthMessage(s.stage, v, state), attrs...)
		case ended:
			w.log.Info(fmt.Sprintf("state of stage %s no longer grows without bound", s.stage.Name), attrs...)
		}
	}
}

// growthMessage is the flag's sentence: "state of stage count grows
// without bound: missing TTL? (...)".
func growthMessage(stage job.Stage, v growth.Verdict, state uint64) string {
	what := "missing TTL?"
	if stage.TTL > 0 {
		what = fmt.Sprintf("its ttl %s has not bounded it yet", stage.TTL)
	}
	return fmt.Sprintf("state of stage %s grows without bound: %s (+%s/s over the last %d intervals, %s now, while the input stays at %.0f records/s)",
		stage.Name, what, model.Bytes(int64(v.BytesPerSecond)), v.Samples, model.Bytes(int64(state)), v.WrittenPerSecond)
}

// snapshot is the detector's state for the dashboard.
func (w *stateWatch) snapshot() []dashboard.StateGrowth {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]dashboard.StateGrowth, 0, len(w.stages))
	for _, s := range w.stages {
		v := s.t.Verdict()
		flagged, since := s.t.Flagged()
		g := dashboard.StateGrowth{Stage: s.stage.Name, SubTopology: s.sub.Job.Name, Unbounded: flagged, Since: since,
			BytesPerSecond: v.BytesPerSecond, RecordsPerSecond: v.WrittenPerSecond, Intervals: v.Samples, StateBytes: s.t.LastState()}
		if g.Unbounded {
			g.Message = growthMessage(s.stage, v, g.StateBytes)
		}
		out = append(out, g)
	}
	return out
}
