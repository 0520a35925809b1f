package model

import (
	"strings"
	"testing"
	"time"
)

// restoreIn is an OK prediction of secs seconds at 45 MB/s.
func restoreIn(mode string, secs float64) Prediction {
	return Prediction{OK: true, Seconds: secs, now: t0,
		In:    Input{Mode: mode, Source: SourceStore, BytesFetch: 40e6, Objects: 10},
		Terms: map[string]Term{TermBandwidth: {Value: 45e6, Samples: 3, Measured: t0}}}
}

// calibrating is a prediction lacking the terms named.
func calibrating(terms ...string) Prediction { return Prediction{Missing: terms, now: t0} }

// ck is a checkpoint n intervals (10 s) after t0 that took took ms
// (sync 5 ms), uploaded up bytes, restores per p.
func ck(id uint64, mode string, took time.Duration, up int64, p Prediction) AdviseCheckpoint {
	return AdviseCheckpoint{ID: id, Mode: mode, Time: t0.Add(time.Duration(id) * 10 * time.Second), Sync: 5 * time.Millisecond, Async: took - 5*time.Millisecond,
		BytesUploaded: up, FullStateSize: 40e6, ChainLength: 1, Restore: p}
}

const ms = time.Millisecond

func TestAdvise(t *testing.T) {
	// The example: state 40 MB; a full checkpoint takes 400 ms and
	// restores in 300 ms; incremental takes 100 ms and restores in 1.1 s.
	example := func() []AdviseCheckpoint {
		inc := ck(3, Incremental, 100*ms, 2e6, restoreIn(Incremental, 1.1))
		inc.ChainLength = 5
		return []AdviseCheckpoint{ck(1, Full, 400*ms, 40e6, restoreIn(Full, 0.3)), ck(2, Incremental, 100*ms, 2e6, restoreIn(Incremental, 1.1)), inc}
	}
	withSavepoint := func() []AdviseCheckpoint {
		sp := ck(0, Full, 420*ms, 39e6, restoreIn(Full, 0.3))
		sp.Savepoint = "before-upgrade"
		return []AdviseCheckpoint{sp, ck(2, Incremental, 100*ms, 2e6, restoreIn(Incremental, 0.32)), ck(3, Incremental, 110*ms, 2e6, restoreIn(Incremental, 0.32))}
	}
	gone := func() []AdviseCheckpoint {
		old := ck(1, Full, 400*ms, 40e6, restoreIn(Full, 0.3))
		old.Gone = true
		return []AdviseCheckpoint{old, ck(5, Incremental, 90*ms, 2e6, restoreIn(Incremental, 0.31))}
	}
	cases := []struct {
		name      string
		in        AdviseInput
		recommend string
		contains  []string
		lacks     []string
	}{
		{name: "nothing measured", in: AdviseInput{},
			recommend: RecommendUnknown, contains: []string{"no committed checkpoint"}},
		{name: "no full checkpoint: how to take one",
			in:        AdviseInput{Mode: Incremental, Checkpoints: []AdviseCheckpoint{ck(1, Incremental, 100*ms, 2e6, restoreIn(Incremental, 1.1))}},
			recommend: RecommendUnknown,
			contains:  []string{"No full checkpoint or savepoint", "api/action/checkpoint?mode=full", "checkpoint.full_every: N", "cairn savepoint", "restores from the store in 1.10 s"},
			lacks:     []string{"Recommended"}},
		{name: "no full checkpoint retained under full_every",
			in:        AdviseInput{Mode: Incremental, FullEvery: 10, Retain: 3, Checkpoints: []AdviseCheckpoint{ck(1, Incremental, 100*ms, 2e6, restoreIn(Incremental, 1.1))}},
			recommend: RecommendUnknown, contains: []string{"checkpoint.full_every: 10", "checkpoint.retain: 3 drops it"}},
		{name: "no incremental checkpoint: how to take one",
			in:        AdviseInput{Mode: Full, Checkpoints: []AdviseCheckpoint{ck(1, Full, 400*ms, 40e6, calibrating(TermDecode))}},
			recommend: RecommendUnknown,
			contains:  []string{"No incremental checkpoint", "mode=incremental", "checkpoint.mode: incremental", "calibrating", "cairn drill"},
			lacks:     []string{"restores from the store in", "Recommended"}},
		{name: "restore not calibrated: no number, what is missing",
			in: AdviseInput{Interval: 10 * time.Second, Checkpoints: []AdviseCheckpoint{
				ck(1, Full, 400*ms, 40e6, calibrating(TermBandwidth, TermDecode)), ck(2, Incremental, 100*ms, 2e6, calibrating(TermBandwidth))}},
			recommend: RecommendUnknown,
			contains:  []string{"saves 300 ms per checkpoint", "no store bandwidth measured yet", "no full-checkpoint rebuild measured yet", "not known yet"},
			lacks:     []string{"restores in", "Recommended", "to a restore at"}},
		{name: "the issue's example at a 10 s interval: full",
			in:        AdviseInput{Interval: 10 * time.Second, Checkpoints: example()},
			recommend: RecommendFull,
			contains: []string{"state 40.0 MB (40.0 MB as a full checkpoint): a full checkpoint takes 400 ms (uploads 40.0 MB) and restores in 300 ms",
				"incremental saves 300 ms per checkpoint (uploads 38.0 MB less) and adds 800 ms to a restore at 45.0 MB/s (chain of 5)",
				"Recommended: full", "fit the 10s interval"}},
		{name: "full checkpoints would not keep up with the interval: incremental",
			in:        AdviseInput{Interval: 700 * time.Millisecond, Checkpoints: example()},
			recommend: RecommendIncremental, contains: []string{"would not keep up"}},
		{name: "interval measured from the spacing of the checkpoints",
			in:        AdviseInput{Checkpoints: example()},
			recommend: RecommendFull, contains: []string{"fit the 10s interval"}},
		{name: "incremental restore within the budget: incremental",
			in:        AdviseInput{Interval: 10 * time.Second, Budget: 2 * time.Second, Checkpoints: example()},
			recommend: RecommendIncremental, contains: []string{"within checkpoint.restore_budget 2s"}},
		{name: "incremental restore over the budget: full",
			in:        AdviseInput{Interval: 10 * time.Second, Budget: time.Second, Checkpoints: example()},
			recommend: RecommendFull, contains: []string{"exceeds checkpoint.restore_budget 1s"}},
		{name: "a trade-off with no interval known: either, saying what is traded",
			in: AdviseInput{Checkpoints: func() []AdviseCheckpoint {
				cs := example()
				for i := range cs {
					cs[i].Time = time.Time{}
				}
				return cs
			}()},
			recommend: RecommendEither, contains: []string{"a trade-off", "restore_budget"}},
		{name: "incremental cheaper, restores no slower",
			in: AdviseInput{Interval: 10 * time.Second, Checkpoints: []AdviseCheckpoint{
				ck(1, Full, 900*ms, 40e6, restoreIn(Full, 0.5)), ck(2, Incremental, 120*ms, 2e6, restoreIn(Incremental, 0.52))}},
			recommend: RecommendIncremental, contains: []string{"cost less and restore no slower", "adds 20 ms to a restore"}},
		{name: "incremental restores faster at the same cost (no decode)",
			in: AdviseInput{Interval: 10 * time.Second, Checkpoints: []AdviseCheckpoint{
				ck(1, Full, 300*ms, 20e6, restoreIn(Full, 2.0)), ck(2, Incremental, 290*ms, 18e6, restoreIn(Incremental, 0.6))}},
			recommend: RecommendIncremental, contains: []string{"restore faster and cost no more", "takes 1.40 s off a restore"}},
		{name: "full cheaper and faster",
			in: AdviseInput{Interval: 10 * time.Second, Checkpoints: []AdviseCheckpoint{
				ck(1, Full, 200*ms, 5e6, restoreIn(Full, 0.2)), ck(2, Incremental, 600*ms, 9e6, restoreIn(Incremental, 0.9))}},
			recommend: RecommendFull, contains: []string{"full checkpoints cost less and restore faster", "costs 400 ms more per checkpoint (uploads 4.0 MB more)"}},
		{name: "differences under the thresholds: either",
			in: AdviseInput{Interval: 10 * time.Second, Checkpoints: []AdviseCheckpoint{
				ck(1, Full, 40*ms, 1e6, restoreIn(Full, 0.030)), ck(2, Incremental, 10*ms, 1e5, restoreIn(Incremental, 0.060))}},
			recommend: RecommendEither, contains: []string{"neither mode is measurably"}},
		{name: "a savepoint stands in for a full checkpoint",
			in:        AdviseInput{Interval: 10 * time.Second, Checkpoints: withSavepoint()},
			recommend: RecommendIncremental, contains: []string{"cost less and restore no slower", "(savepoint before-upgrade)"}, lacks: []string{"was taken"}},
		{name: "a full checkpoint no longer retained stands in (the dashboard's memory)",
			in:        AdviseInput{Interval: 10 * time.Second, Checkpoints: gone()},
			recommend: RecommendIncremental, contains: []string{"a full checkpoint (#1, no longer retained)"}},
		{name: "an old savepoint is said to be old",
			in: AdviseInput{Interval: 10 * time.Second, Checkpoints: func() []AdviseCheckpoint {
				cs := withSavepoint()
				cs[0].Time = cs[0].Time.Add(-time.Hour)
				return cs
			}()},
			recommend: RecommendIncremental, contains: []string{"The full one was taken 1h0m30s before the newest incremental one"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := Advise(c.in)
			t.Log(a.Text)
			if a.Recommend != c.recommend {
				t.Errorf("Recommend = %q, want %q\n%s", a.Recommend, c.recommend, a.Text)
			}
			for _, s := range c.contains {
				if !strings.Contains(a.Text, s) {
					t.Errorf("text lacks %q:\n%s", s, a.Text)
				}
			}
			for _, s := range c.lacks {
				if strings.Contains(a.Text, s) {
					t.Errorf("text has %q:\n%s", s, a.Text)
				}
			}
			if (a.Recommend == RecommendUnknown) != (len(a.Missing) > 0) {
				t.Errorf("Recommend %q with Missing %q: unknown, and only unknown, says what is missing", a.Recommend, a.Missing)
			}
		})
	}
}

// TestAdviseFigures: the p50s are lower medians over the retained
// checkpoints of a mode (a measured value), the restore is the newest's.
func TestAdviseFigures(t *testing.T) {
	cks := []AdviseCheckpoint{
		ck(1, Incremental, 100*ms, 1e6, restoreIn(Incremental, 0.5)),
		ck(2, Incremental, 900*ms, 30e6, restoreIn(Incremental, 0.6)), // a chain start: uploads everything
		ck(3, Incremental, 120*ms, 3e6, restoreIn(Incremental, 0.7)),
		ck(4, Incremental, 110*ms, 2e6, restoreIn(Incremental, 0.8)),
		ck(5, Full, 500*ms, 40e6, restoreIn(Full, 0.4)),
	}
	a := Advise(AdviseInput{Checkpoints: cks, Interval: 10 * time.Second})
	inc := a.Incremental
	if inc == nil || inc.N != 4 || inc.Took != 110*ms || inc.Uploaded != 2e6 || inc.Newest != 4 || inc.Restore.Seconds != 0.8 {
		t.Fatalf("incremental figures %+v, want p50 110 ms and 2 MB over 4, newest #4 restoring in 0.8 s", inc)
	}
	if a.Full == nil || a.Full.N != 1 || a.Full.Took != 500*ms || a.Saves != 390*ms || a.SavesBytes != 38e6 {
		t.Fatalf("full figures %+v, saves %v / %d", a.Full, a.Saves, a.SavesBytes)
	}
	if !a.RestoreKnown || a.AddsToRestore != 400*ms {
		t.Fatalf("adds to restore %v (known %v), want 400 ms", a.AddsToRestore, a.RestoreKnown)
	}
}

func TestDiffers(t *testing.T) {
	for _, c := range []struct {
		a, b float64
		want int
	}{
		{1.0, 0.5, 1}, {0.5, 1.0, -1},
		{1.0, 0.85, 0},  // 15% of the larger: under 20%
		{0.08, 0.04, 0}, // 40 ms: under 50 ms
		{0.10, 0.04, 1}, // 60 ms and 60%
		{100, 81, 0},    // 19%
		{100, 79, 1},    // 21%
		{0, 0, 0},
	} {
		if got := differs(c.a, c.b); got != c.want {
			t.Errorf("differs(%v, %v) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
