// Package growth detects a keyed stage's state that grows without bound: a
// per-key state without a TTL, or one whose keys never repeat. It is a pure
// function of samples (state bytes, records read, per interval), tested
// without I/O; the runtime feeds it from a running job.
package growth

import (
	"fmt"
	"math"
	"time"
)

// The unbounded-state detector: state bytes rising over
// many intervals while the number of keys written per interval stays flat
// is a state that only gains keys — a per-key state without a TTL, or one
// whose keys never repeat. It is flagged on the dashboard, in /metrics
// (cairn_state_unbounded{stage}, cairn_state_growth_bytes_per_second{stage})
// and in the log, once per onset, naming the stage.
//
// The signals, and what stands in for a missing one: the engine reports
// each slot's state size (engine.Stats.StateBytes: Pebble's disk usage) and
// the records a sub-topology read (engine.Stats.RecordsIn). It counts
// neither state per stage nor keys written. A sub-topology holds at most
// one keyed stage, last (job.Job.SubTopologies), and only the keyed stage
// has state (engine.KeyedStageID), so a sub-topology's state is its keyed
// stage's. The records read per interval stand in for the keys written:
// each record reaches the keyed stage once (less what a stateless stage
// before it drops or dead-letters) and writes the state of its key. A
// flat record rate over growing state means the records keep bringing new
// keys instead of updating old ones.

// Thresholds of Detect.
const (
	// growthWindowSpan and growthWindow: the fit covers the samples (one per
	// checkpoint interval) of the last 10 minutes, and at least the last 30
	// of them (5 min at the default 10 s interval; 30 min at 1 min):
	// long enough to span many compaction teeth. growthMaxSamples bounds
	// the memory at very short intervals.
	growthWindowSpan = 10 * time.Minute
	growthWindow     = 30
	growthMaxSamples = 600
	// growthMinSamples and growthMinSpan: no verdict before 10 samples
	// covering 5 minutes. A job's first minutes (its keys seen for the
	// first time) look like growth; a leak is slow and can wait.
	growthMinSamples = 10
	growthMinSpan    = 5 * time.Minute
	// growthWriteTolerance: the write rate is flat when its linear fit
	// changes by at most ±20% of its mean over the window. Growth with a
	// growing input is more load, not a missing TTL.
	growthWriteTolerance = 0.20
	// growthMinRiseBytes and growthMinRiseRelative: the fitted rise over
	// the window must be at least 1 MiB and 1% of the mean state: below
	// that, Pebble's flushes and compactions move the disk usage as much.
	growthMinRiseBytes    = 1 << 20
	growthMinRiseRelative = 0.01
	// growthMinR2: the rise must be a trend, not noise: the linear fit
	// explains at least half of the variance of the state (Pebble's disk
	// usage jumps with every flush and compaction; short compaction teeth
	// fail here, long ones at the trough rule).
	growthMinR2 = 0.5
	// growthTroughShare: compactions make a sawtooth, whose teeth rise
	// between drops while the level stays. A state that grows raises its
	// troughs too: the minimum of the window's last third must exceed the
	// minimum of its first third by at least half of what the fit rises
	// between the two. (A tooth longer than the window is not told from
	// growth: it is flagged, and cleared after the drop.)
	growthTroughShare = 0.5
	// growthMinSlopeRatio: a state levelling off (a key space being
	// covered for the first time, new keys ever rarer) is bounded: the
	// slope fitted over the window's second half must be at least half the
	// slope over its first half.
	growthMinSlopeRatio = 0.5
	// growthClearAfter: a flagged stage is cleared after 5 samples in a
	// row without the verdict, so that one noisy sample neither ends nor
	// restarts an onset (and its log line).
	growthClearAfter = 5
	// DefaultEvery is the sampling interval of a job without
	// checkpoints (the default checkpoint.interval).
	DefaultEvery = 10 * time.Second
)

// Sample is one interval of a stage.
type Sample struct {
	At time.Time // the end of the interval
	// Dur is the interval's length.
	Dur time.Duration
	// State is the stage's state bytes at At.
	State float64
	// Written is the records read during the interval: the proxy for keys
	// written.
	Written float64
}

// Verdict is Detect's answer.
type Verdict struct {
	// Samples is the number of samples the fit is over.
	Samples int
	// BytesPerSecond is the fitted growth of the state (negative when it
	// shrinks), WrittenPerSecond the mean write rate; both set from two
	// samples on.
	BytesPerSecond, WrittenPerSecond float64
	// Unbounded is the verdict (never before growthMinSamples and
	// growthMinSpan).
	Unbounded bool
	// Why says why not (for tests and debugging).
	Why string
}

// Trim returns the window of samples (oldest first) the fit covers:
// those of the last growthWindowSpan, at least the last growthWindow, at
// most growthMaxSamples.
func Trim(s []Sample) []Sample {
	if len(s) > growthMaxSamples {
		s = s[len(s)-growthMaxSamples:]
	}
	for len(s) > growthWindow && s[len(s)-1].At.Sub(s[0].At) >= growthWindowSpan {
		s = s[1:]
	}
	return s
}

// Detect judges a stage's samples (oldest first, trimmed by
// Trim): unbounded when, over at least growthMinSamples intervals
// spanning growthMinSpan, the write rate is flat (growthWriteTolerance) and
// not zero, and the state rises by growthMinRiseBytes and
// growthMinRiseRelative, as a trend (growthMinR2) that lifts its troughs
// (growthTroughShare) and does not level off (growthMinSlopeRatio).
func Detect(all []Sample) Verdict {
	s := Trim(all)
	v := Verdict{Samples: len(s)}
	if len(s) < 2 {
		v.Why = "too few samples"
		return v
	}
	x := make([]float64, len(s))
	state := make([]float64, len(s))
	rate := make([]float64, len(s))
	for i, p := range s {
		x[i] = p.At.Sub(s[0].At).Seconds()
		state[i] = p.State
		if p.Dur > 0 {
			rate[i] = p.Written / p.Dur.Seconds()
		}
	}
	span := x[len(x)-1] - x[0]
	sb, _, r2, ms := fitLine(x, state)
	wb, _, _, mw := fitLine(x, rate)
	v.BytesPerSecond, v.WrittenPerSecond = sb, mw
	switch covered := s[len(s)-1].At.Sub(s[0].At) + s[0].Dur; {
	case len(s) < growthMinSamples:
		v.Why = fmt.Sprintf("%d of %d samples", len(s), growthMinSamples)
		return v
	case covered < growthMinSpan:
		v.Why = fmt.Sprintf("%s of %s observed", covered, growthMinSpan)
		return v
	case mw <= 0:
		v.Why = "nothing written"
		return v
	case math.Abs(wb*span) > growthWriteTolerance*mw:
		v.Why = fmt.Sprintf("the write rate changed by %.0f%%", 100*wb*span/mw)
		return v
	}
	rise := sb * span
	if rise < growthMinRiseBytes || rise < growthMinRiseRelative*ms {
		v.Why = fmt.Sprintf("the state rose by %.0f bytes", rise)
		return v
	}
	if r2 < growthMinR2 {
		v.Why = fmt.Sprintf("no trend (R² %.2f)", r2)
		return v
	}
	k := len(s) / 3
	lo := func(xs []float64) float64 {
		m := xs[0]
		for _, v := range xs {
			m = min(m, v)
		}
		return m
	}
	if lifted, want := lo(state[len(s)-k:])-lo(state[:k]), growthTroughShare*sb*(x[len(s)-k]-x[0]); lifted < want {
		v.Why = fmt.Sprintf("a sawtooth: the troughs rose %.0f bytes, want %.0f", lifted, want)
		return v
	}
	h := len(s) / 2
	s1, _, _, _ := fitLine(x[:h], state[:h])
	s2, _, _, _ := fitLine(x[h:], state[h:])
	if s2 < growthMinSlopeRatio*s1 {
		v.Why = fmt.Sprintf("levelling off: %.0f B/s in the second half, %.0f B/s in the first", s2, s1)
		return v
	}
	v.Unbounded = true
	return v
}

// fitLine is the least-squares line y = a + b·x: its slope, intercept, R²
// (1 when y is constant) and the mean of y.
func fitLine(x, y []float64) (b, a, r2, mean float64) {
	n := float64(len(x))
	var sx, sy float64
	for i := range x {
		sx += x[i]
		sy += y[i]
	}
	mx, my := sx/n, sy/n
	var sxx, sxy, syy float64
	for i := range x {
		dx, dy := x[i]-mx, y[i]-my
		sxx += dx * dx
		sxy += dx * dy
		syy += dy * dy
	}
	if sxx == 0 {
		return 0, my, 0, my
	}
	b = sxy / sxx
	a = my - b*mx
	r2 = 1.0
	if syy > 0 {
		r2 = sxy * sxy / (sxx * syy)
	}
	return b, a, r2, my
}

// Tracker follows one stage: its samples and whether it is flagged
// (with growthClearAfter's hysteresis).
type Tracker struct {
	samples []Sample
	started bool
	lastAt  time.Time
	lastIn  uint64
	verdict Verdict
	flagged bool
	since   time.Time
	calm    int
}

// Observe adds the stage's state and the sub-topology's records-in counter
// read at at, and reports whether the stage became flagged (an onset) or
// stopped being flagged.
func (t *Tracker) Observe(at time.Time, state, recordsIn uint64) (onset, ended bool) {
	if !t.started || recordsIn < t.lastIn {
		// The first reading, or a counter that went back (a new engine):
		// start over.
		t.started, t.lastAt, t.lastIn, t.samples = true, at, recordsIn, nil
		return false, false
	}
	dur := at.Sub(t.lastAt)
	if dur <= 0 {
		return false, false
	}
	t.samples = Trim(append(t.samples, Sample{At: at, Dur: dur, State: float64(state), Written: float64(recordsIn - t.lastIn)}))
	t.lastAt, t.lastIn = at, recordsIn
	t.verdict = Detect(t.samples)
	switch {
	case t.verdict.Unbounded:
		t.calm = 0
		if !t.flagged {
			t.flagged, t.since = true, at
			return true, false
		}
	case t.flagged:
		if t.calm++; t.calm >= growthClearAfter {
			t.flagged, t.calm, t.since = false, 0, time.Time{}
			return false, true
		}
	}
	return false, false
}

// Verdict is the tracker's latest verdict.
func (t *Tracker) Verdict() Verdict { return t.verdict }

// Flagged reports whether the stage is flagged, and since when.
func (t *Tracker) Flagged() (bool, time.Time) { return t.flagged, t.since }

// LastState is the state bytes of the newest sample (0: none yet).
func (t *Tracker) LastState() uint64 {
	if n := len(t.samples); n > 0 {
		return uint64(t.samples[n-1].State)
	}
	return 0
}
