package state

// The due-time index: per (stage, domain) and key group, a lower bound on
// the key group's earliest timer, kept in memory so that DueTimersFrom
// seeks only the key groups that may hold a due timer. Without it every
// walk seeks each of the range's key groups, a memtable seek over the
// deleted timers each time; with timers spread over many expiry times (an
// auction's closing) the walk runs at almost every watermark advance, and
// most key groups have nothing due.
//
// The index is never persisted: Pebble holds the timers, and the index is
// only a hint that a seek would find nothing. Each entry starts unknown
// (seek), becomes known when a walk has seen the key group, and is only
// ever lowered by a write: a timer set lowers it to the timer's time, a
// deletion leaves it (still a lower bound, maybe early: the next walk
// that reaches it seeks and tightens it). Writes that bypass the batches
// (an ingest, an excise) reset it to unknown, and a DB opened (a start, a
// restore, a rescale) starts with it unknown.

import "math"

// timerEntry is what the index knows of one key group's timers of one
// stage and domain.
type timerEntry struct {
	// low is a lower bound on the key group's timers later than firedUpTo;
	// math.MinInt64: unknown.
	low int64
	// firedUpTo is the upTo of the walk that last handed this key group's
	// timers out, math.MinInt64 if it handed none out. Those timers are
	// the caller's to delete (DueTimersFrom), so low does not cover them;
	// a later walk may skip the key group only if its from says none of
	// them remain (from > firedUpTo).
	firedUpTo int64
}

// timerIndex is the DB's due-time index; writer-owned, as the DB's timer
// methods and batches are.
type timerIndex struct {
	stages []timerStage
	// gen counts the lowerings: a walk that saw a write during it does not
	// trust its own view (its iterator may not see the write) for the key
	// groups it records afterwards.
	gen uint64
}

type timerStage struct {
	stage, domain uint8
	// kgs is indexed by key group - the DB's Range.First.
	kgs []timerEntry
}

// entries returns the entries of (stage, domain), nil if none exist yet
// (every key group unknown).
func (x *timerIndex) entries(stage, domain uint8) []timerEntry {
	for i := range x.stages {
		if s := &x.stages[i]; s.stage == stage && s.domain == domain {
			return s.kgs
		}
	}
	return nil
}

// entriesFor is entries, creating them (unknown) for n key groups.
func (x *timerIndex) entriesFor(stage, domain uint8, n int) []timerEntry {
	if e := x.entries(stage, domain); e != nil {
		return e
	}
	kgs := make([]timerEntry, n)
	for i := range kgs {
		kgs[i] = timerEntry{low: math.MinInt64, firedUpTo: math.MinInt64}
	}
	x.stages = append(x.stages, timerStage{stage: stage, domain: domain, kgs: kgs})
	return kgs
}

// lower records a timer at ts in key group i (relative to the range's
// first) of (stage, domain).
func (x *timerIndex) lower(stage, domain uint8, i int, ts int64) {
	x.gen++
	if e := x.entries(stage, domain); e != nil && ts < e[i].low {
		e[i].low = ts
	}
}

// reset forgets everything: a write bypassed the batches.
func (x *timerIndex) reset() {
	x.stages = nil
	x.gen++
}

// skip reports whether a walk of (from, upTo] may pass the entry without a
// seek, and the lower bound it then contributes to the walk's next timer.
func (e timerEntry) skip(from, upTo int64) bool {
	return e.low != math.MinInt64 && e.low > upTo && from > e.firedUpTo
}

// walked records what a walk from `from` up to upTo saw of a key group:
// whether it handed timers out, and its first timer after upTo (ok false:
// none). gen is the index's generation when the walk's iterator was made:
// if writes came since, the entry becomes unknown instead (the iterator
// may have missed them).
func (x *timerIndex) walked(e []timerEntry, i int, gen uint64, fired bool, upTo, after int64, ok bool) {
	if gen != x.gen {
		e[i] = timerEntry{low: math.MinInt64, firedUpTo: math.MinInt64}
		return
	}
	n := timerEntry{low: math.MaxInt64, firedUpTo: math.MinInt64}
	if ok {
		n.low = after
	}
	if fired {
		n.firedUpTo = upTo
	}
	e[i] = n
}
