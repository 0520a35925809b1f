package engine

import "sync/atomic"

// StageStats is one stage's record counts since the engine started.
type StageStats struct {
	// Stage is the stage's name; Keyed reports whether it runs in the
	// slots (the sub-topology's keyed stage).
	Stage string
	Keyed bool
	// RecordsIn are the records the stage was given: the first stateless
	// stage's are the records decoded from the input, a later one's what
	// the stage before it emitted, the keyed stage's the records routed
	// to the slots (late records the router dead-lettered are not).
	RecordsIn uint64
	// RecordsOut are the records the stage emitted: a stateless stage's
	// go to the next stage (or the router), the keyed stage's are its
	// outputs, once per place its port feeds (Stats.RecordsOut).
	RecordsOut uint64
	// DeadLetters are the records the stage dead-lettered: a stateless
	// stage's records that failed in it; the keyed stage's records that
	// failed in it and its outputs that could not be published.
	DeadLetters uint64
}

// stageCounters count records per stage. The pipeline adds to them once
// per batch (one atomic add per stage and batch; nothing per record), the
// dead letters once per dead letter, which is off the hot path.
type stageCounters struct {
	stages []stageCounter // by Config.Stages index
	// pipelineDead are the dead letters of the pipeline (source, router
	// and stateless stages). The slots add only to Engine.deadLettered, so
	// the keyed stage's are the engine's total less these.
	//
	// INVARIANT: the pipeline adds to pipelineDead after it added the same
	// dead letter to Engine.deadLettered, so reading pipelineDead first
	// never finds more than the total holds.
	pipelineDead atomic.Uint64
}

type stageCounter struct {
	in, out, dead atomic.Uint64
}

func (c *stageCounters) init(stages int) { c.stages = make([]stageCounter, stages) }

// batch counts one batch of stateless stage i: in records given, out
// emitted.
func (c *stageCounters) batch(i, in, out int) {
	if in == 0 && out == 0 {
		return
	}
	s := &c.stages[i]
	s.in.Add(uint64(in))
	s.out.Add(uint64(out))
}

// routed counts the records of one batch routed to the slots: the keyed
// stage's input (none without one).
func (e *Engine) routed(perSlot [][]rec) {
	k := e.cfg.keyedStage()
	if k < 0 {
		return
	}
	n := 0
	for _, recs := range perSlot {
		n += len(recs)
	}
	if n > 0 {
		e.stageCounts.stages[k].in.Add(uint64(n))
	}
}

// deadLetter counts a dead letter of the pipeline: stateless stage i's,
// or the source's or the router's (i < 0).
func (c *stageCounters) deadLetter(i int) {
	if i >= 0 {
		c.stages[i].dead.Add(1)
	}
	c.pipelineDead.Add(1)
}

// StageStats returns every stage's record counts, in the order of the
// job's stages. Safe from any goroutine.
func (e *Engine) StageStats() []StageStats {
	c := &e.stageCounts
	pipelineDead := c.pipelineDead.Load() // before the total: see the INVARIANT
	dead := e.deadLettered.Load()
	out := make([]StageStats, len(e.cfg.Stages))
	for i, st := range e.cfg.Stages {
		s := &c.stages[i]
		out[i] = StageStats{Stage: st.Name, Keyed: st.Keyed, RecordsIn: s.in.Load(), RecordsOut: s.out.Load(), DeadLetters: s.dead.Load()}
		if !st.Keyed {
			continue
		}
		for _, sl := range e.slots {
			out[i].RecordsOut += sl.recordsOut.Load()
		}
		out[i].DeadLetters = dead - pipelineDead
	}
	return out
}
