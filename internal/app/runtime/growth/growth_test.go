package growth

import (
	"math"
	"strings"
	"testing"
	"time"
)

const mib = 1 << 20

// series builds n samples 10 s apart: state(i) bytes after interval i and
// written(i) records during it.
func series(n int, state func(i int) float64, written func(i int) float64) []Sample {
	return seriesEvery(n, 10*time.Second, state, written)
}

func seriesEvery(n int, every time.Duration, state func(i int) float64, written func(i int) float64) []Sample {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	out := make([]Sample, n)
	for i := range out {
		out[i] = Sample{At: t0.Add(time.Duration(i+1) * every), Dur: every, State: state(i), Written: written(i)}
	}
	return out
}

// flat is a write rate of 50k records per interval, ±4% (a real input is
// never exactly flat).
func flat(i int) float64 { return 50_000 * (1 + 0.04*float64(i%3-1)) }

// TestDetectGrowth runs the detector over synthetic series: growth with a
// flat input is flagged; a flat state, compaction sawtooth, growth with a
// growing input, too few samples, no input, tiny growth are not.
func TestDetectGrowth(t *testing.T) {
	cases := []struct {
		name    string
		s       []Sample
		want    bool
		why     string // part of the reason it is not flagged
		bytesPS float64
	}{
		{name: "growing, flat input", s: series(30, func(i int) float64 { return 50*mib + float64(i)*mib }, flat), want: true, bytesPS: mib / 10},
		{name: "growing, flat input, compactions on top", want: true, s: series(30, func(i int) float64 {
			v := 50*mib + float64(i)*mib
			if i%4 == 3 {
				v -= 1.5 * mib // a compaction drops obsolete versions: the level still rises
			}
			return v
		}, flat)},
		{name: "growing under flush noise", want: true, s: series(30, func(i int) float64 {
			return 50*mib + float64(i)*mib + float64(i%2*2-1)*6*mib // ±6 MiB each interval around a 1 MiB/interval rise
		}, flat)},
		{name: "only the last 10 minutes count", want: true, s: func() []Sample {
			early := series(60, func(int) float64 { return 50 * mib }, func(int) float64 { return 500_000 }) // flat state, 10x input
			late := series(60, func(i int) float64 { return 50*mib + float64(i)*mib }, flat)
			for i := range late {
				late[i].At = late[i].At.Add(10 * time.Minute)
			}
			return append(early, late...)
		}()},
		{name: "flat state", why: "rose by", s: series(30, func(i int) float64 { return 50*mib + float64(i%2)*0.3*mib }, flat)},
		{name: "sawtooth from compactions", why: "", s: series(30, func(i int) float64 {
			return 50*mib + float64(i%6)*2*mib // five intervals of L0 growth, then a compaction back to the level
		}, flat)},
		{name: "a long tooth that has just dropped: a rising fit, flat troughs", why: "sawtooth", s: series(30, func(i int) float64 {
			return 50*mib + float64(i%29)*mib
		}, flat)},
		{name: "a tooth and a half", why: "no trend", s: series(30, func(i int) float64 {
			return 50*mib + float64(i%20)*mib
		}, flat)},
		{name: "growing with a growing input", why: "write rate changed", s: series(30, func(i int) float64 {
			return 50*mib + float64(i*i)*0.05*mib
		}, func(i int) float64 { return 20_000 + float64(i)*2_000 })},
		{name: "nine samples", why: "9 of 10", s: series(9, func(i int) float64 { return 50*mib + float64(i)*mib }, flat)},
		{name: "ten samples over 5 minutes", want: true, s: seriesEvery(10, 30*time.Second, func(i int) float64 { return 50*mib + float64(i)*3*mib }, flat)},
		{name: "29 samples: under 5 minutes", why: "4m50s of 5m0s observed", s: series(29, func(i int) float64 { return 50*mib + float64(i)*mib }, flat)},
		{name: "levelling off: a key space covered for the first time", why: "levelling off", s: series(30, func(i int) float64 {
			return 50*mib + 40*mib*(1-math.Exp(-float64(i)/10)) // new keys ever rarer
		}, flat)},
		{name: "no input", why: "nothing written", s: series(30, func(i int) float64 { return 50*mib + float64(i)*mib }, func(int) float64 { return 0 })},
		{name: "tiny growth", why: "rose by", s: series(30, func(i int) float64 { return 50*mib + float64(i)*10_000 }, flat)},
		{name: "shrinking", why: "rose by", s: series(30, func(i int) float64 { return 80*mib - float64(i)*mib }, flat)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Detect(c.s)
			t.Logf("unbounded %v: %s (%.0f B/s, %.0f records/s)", v.Unbounded, v.Why, v.BytesPerSecond, v.WrittenPerSecond)
			if v.Unbounded != c.want {
				t.Fatalf("Unbounded = %v, want %v (%s)", v.Unbounded, c.want, v.Why)
			}
			if !c.want && !strings.Contains(v.Why, c.why) {
				t.Errorf("not flagged because %q, want %q", v.Why, c.why)
			}
			if c.bytesPS != 0 && (v.BytesPerSecond < 0.99*c.bytesPS || v.BytesPerSecond > 1.01*c.bytesPS) {
				t.Errorf("BytesPerSecond = %v, want %v", v.BytesPerSecond, c.bytesPS)
			}
			if v.Samples != len(Trim(c.s)) {
				t.Errorf("Samples = %d, want %d", v.Samples, len(Trim(c.s)))
			}
		})
	}
}

// TestGrowthTracker: an onset is reported once, the flag holds through a
// few calm samples and clears after growthClearAfter of them (reported
// once); a counter that goes back starts over.
func TestGrowthTracker(t *testing.T) {
	var tr Tracker
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var in uint64
	state := uint64(50 * mib)
	at := t0
	step := func(grow bool) (bool, bool) {
		at = at.Add(10 * time.Second)
		in += 50_000
		if grow {
			state += mib
		}
		return tr.Observe(at, state, in)
	}
	if on, _ := tr.Observe(at, state, in); on {
		t.Fatal("onset on the first reading")
	}
	onsets := 0
	for i := range 40 {
		on, end := step(true)
		if end {
			t.Fatalf("sample %d: an end while growing", i)
		}
		if on {
			onsets++
			if i+1 < growthMinSamples {
				t.Fatalf("onset after %d samples, want at least %d", i+1, growthMinSamples)
			}
		}
	}
	if onsets != 1 || !tr.flagged || tr.since.IsZero() {
		t.Fatalf("%d onsets, flagged %v: want one onset, still flagged", onsets, tr.flagged)
	}
	// The state stops growing: the fit over the window takes a while to
	// turn, then growthClearAfter calm samples clear the flag, once.
	ends := 0
	for range 60 {
		on, end := step(false)
		if on {
			t.Fatal("a second onset while the state is flat")
		}
		if end {
			ends++
		}
	}
	if ends != 1 || tr.flagged {
		t.Fatalf("%d ends, flagged %v: want one end, not flagged", ends, tr.flagged)
	}
	// A new engine (its counter back at 0) starts the samples over.
	in = 0
	if on, end := tr.Observe(at.Add(10*time.Second), state, in); on || end || len(tr.samples) != 0 {
		t.Fatalf("after the counter went back: onset %v end %v, %d samples, want a fresh start", on, end, len(tr.samples))
	}
}
