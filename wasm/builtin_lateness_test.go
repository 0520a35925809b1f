package wasm

import (
	"context"
	"math"
	"strings"
	"testing"

	"cairn/operators/builtin"
)

// The engine hands a late record (at or before the watermark, admitted
// under watermark.allowed_lateness) to the keyed stage in a call of its
// own, at the watermark it was routed at: the tests below do the same,
// h.records(wm, 0, key, time) with one record.

// TestWindowCountLateness: tumbling windows of 10 ms with 20 ms of allowed
// lateness. A window fires at its end; a late record in it emits the
// updated count right away; a late record in a window not fired yet waits
// for it; a window that never had state but is still within the lateness
// is created and fired at once; beyond end + lateness a window's state is
// dropped (its cleanup timer) and its records are ignored.
func TestWindowCountLateness(t *testing.T) {
	h := newOpHarness(t, "window_count", `{"size_ms": 10, "allowed_lateness_ms": 20}`)
	h.records(math.MinInt64, 0, "k", 3, "k", 7)
	h.expect("window 0: its end and its cleanup", strings.Join(h.ops, " ")+" | "+h.state("k"), "k+9 k+29 k+9 k+29 | 0=2")

	h.fire(EventTime, 12)
	h.expect("on time", h.takeEmits(), "k=0,2@9")
	h.expect("kept after firing", h.state("k"), "0=2")

	h.records(12, 0, "k", 5)
	h.expect("late firing", h.takeEmits(), "k=0,3@9")
	h.expect("late: timers", strings.Join(h.ops, " ")+" | "+h.state("k"), "k+29 | 0=3")

	h.records(12, 0, "j", 1)
	h.expect("a late record in a window with no state yet fires it at once", h.takeEmits(), "j=0,1@9")
	h.expect("its cleanup only", strings.Join(h.ops, " ")+" | "+h.state("j"), "j+29 | 0=1")

	h.records(12, 0, "k", 11) // on time (behind the watermark's call, not its window's end)
	h.expect("window 10 waits for its end", h.takeEmits(), "")

	h.fire(EventTime, 29)
	h.expect("window 10 on time; the cleanups emit nothing", h.takeEmits(), "k=10,1@19")
	h.expect("window 0 dropped", h.state("k")+" | "+h.state("j"), "10=1 | ")

	h.records(29, 0, "k", 8) // window 0 is gone: end 9 + 20 <= 29
	h.expect("beyond the lateness: ignored", h.takeEmits()+" | "+strings.Join(h.ops, " ")+" | "+h.state("k"), " |  | 10=1")

	h.records(29, 0, "k", 15)
	h.expect("window 10 fired and kept: late firing", h.takeEmits(), "k=10,2@19")

	h.fire(EventTime, 38)
	h.expect("kept until its cleanup", h.state("k"), "10=2")
	h.fire(EventTime, 39)
	h.expect("no emit at cleanup", h.takeEmits(), "")
	h.expectEmpty()
}

// TestSlidingCountLateness: windows of 30 ms every 10 ms with 20 ms of
// allowed lateness. A bucket lives until the last window holding it is
// dropped (a cleanup timer at b+size-1+20); a late record re-emits every
// fired, kept window holding its bucket (oldest first), not the dropped
// ones nor the ones yet to fire.
func TestSlidingCountLateness(t *testing.T) {
	h := newOpHarness(t, "sliding_count", `{"size_ms": 30, "slide_ms": 10, "allowed_lateness_ms": 20}`)
	h.records(math.MinInt64, 0, "k", 5)
	h.expect("bucket 0: its windows' ends and its cleanup", strings.Join(h.ops, " "), "k+9 k+19 k+29 k+49")

	h.fire(EventTime, 15)
	h.expect("window -20 on time", h.takeEmits(), "k=-20,1@9")

	h.records(15, 0, "k", 2)
	h.expect("late: window -20 again, -10 not fired yet", h.takeEmits()+" | "+strings.Join(h.ops, " ")+" | "+h.state("k"), "k=-20,2@9 |  | 0=2")

	h.records(15, 0, "k", 12)
	h.expect("late, a new bucket whose windows have not fired", h.takeEmits()+" | "+strings.Join(h.ops, " "), " | k+19 k+29 k+39 k+59")

	h.fire(EventTime, 30)
	h.expect("windows -10 and 0 on time", h.takeEmits(), "k=-10,3@19 k=0,3@29")

	h.records(30, 0, "k", 1)
	h.expect("late: -20 is dropped (9+20 <= 30), -10 and 0 re-emitted", h.takeEmits(), "k=-10,4@19 k=0,4@29")

	h.records(30, 0, "k", 25)
	h.expect("late in a new bucket: window 0 fired, 10 and 20 not yet", h.takeEmits()+" | "+strings.Join(h.ops, " "), "k=0,5@29 | k+39 k+49 k+69")

	h.fire(EventTime, 49)
	h.expect("windows 10 and 20 on time", h.takeEmits(), "k=10,2@39 k=20,1@49")
	h.expect("bucket 0 dropped at 49", h.state("k"), "10=1 20=1")

	h.records(49, 0, "k", 3)
	h.expect("bucket 0's windows are all dropped: ignored", h.takeEmits()+" | "+strings.Join(h.ops, " ")+" | "+h.state("k"), " |  | 10=1 20=1")

	h.fire(EventTime, 69)
	h.expect("nothing at the cleanups", h.takeEmits(), "")
	h.expectEmpty()
}

// TestSessionCountLateness: sessions with a 10 ms gap and 20 ms of allowed
// lateness. A fired session is kept until the watermark passes its end +
// 20; a late record that extends it re-emits it at once; one that bridges
// it with a session not fired yet makes a session that fires on time; a
// late record whose session would already be dropped is ignored; timers
// the merges no longer need are deleted.
func TestSessionCountLateness(t *testing.T) {
	h := newOpHarness(t, "session_count", `{"gap_ms": 10, "allowed_lateness_ms": 20}`)
	h.records(math.MinInt64, 0, "k", 100, "k", 115)
	h.expect("two sessions: ends and cleanups", strings.Join(h.ops, " ")+" | "+h.state("k"), "k+109 k+129 k+124 k+144 | =100,100,1;115,115,1")

	h.fire(EventTime, 112)
	h.expect("first session on time", h.takeEmits(), "k=100,100,1@109")
	h.expect("kept", h.state("k"), "=100,100,1;115,115,1")

	h.records(112, 0, "k", 95)
	h.expect("late, extends the fired session: late firing", h.takeEmits()+" | "+strings.Join(h.ops, " "), "k=95,100,2@109 | ")

	h.records(112, 0, "k", 107)
	h.expect("late, bridges into a session not fired yet: no emit", h.takeEmits()+" | "+strings.Join(h.ops, " ")+" | "+h.state("k"),
		" | k-129 | =95,115,4")

	h.fire(EventTime, 124)
	h.expect("merged session on time", h.takeEmits(), "k=95,115,4@124")

	h.records(130, 0, "k", 118)
	h.expect("late, extends it past its old end, still at or before the watermark", h.takeEmits()+" | "+strings.Join(h.ops, " ")+" | "+h.state("k"),
		"k=95,118,5@127 | k-144 k+147 | =95,118,5")

	h.records(130, 0, "k", 140)
	h.expect("on time, a new session", h.takeEmits()+" | "+strings.Join(h.ops, " "), " | k+149 k+169")

	h.fire(EventTime, 147)
	h.expect("the first session dropped, no emit", h.takeEmits()+" | "+h.state("k"), " | =140,140,1")

	h.records(147, 0, "k", 110) // alone: ends 119, dropped at 139
	h.expect("beyond the lateness: ignored", h.takeEmits()+" | "+strings.Join(h.ops, " ")+" | "+h.state("k"), " |  | =140,140,1")

	h.records(147, 0, "k", 125) // ends 134, dropped at 154: a new session, fired at once
	h.expect("a late new session", h.takeEmits()+" | "+strings.Join(h.ops, " ")+" | "+h.state("k"), "k=125,125,1@134 | k+154 | =125,125,1;140,140,1")

	h.fire(EventTime, 149)
	h.expect("on time", h.takeEmits(), "k=140,140,1@149")
	h.fire(EventTime, 169)
	h.expect("nothing at the cleanups", h.takeEmits(), "")
	h.expectEmpty()
}

// TestLatenessZeroUnchanged: "allowed_lateness_ms": 0 is the operator
// without the option: the same emits, timer ops and state at every step of
// on-time input, for the three windows.
func TestLatenessZeroUnchanged(t *testing.T) {
	type step struct {
		wm   int64
		kts  []any // records; nil: fire event timers up to wm
		fire bool
	}
	for _, tc := range []struct {
		name, config string
		steps        []step
	}{
		{"window_count", `"size_ms": 10`, []step{
			{math.MinInt64, []any{"k", 3, "k", 17, "j", 5}, false}, {9, nil, true},
			{9, []any{"k", 11, "j", 25}, false}, {40, nil, true},
		}},
		{"sliding_count", `"size_ms": 30, "slide_ms": 10`, []step{
			{math.MinInt64, []any{"k", 5, "k", 12, "k", 25, "j", 31, "k", 7}, false}, {19, nil, true},
			{19, []any{"k", 28}, false}, {100, nil, true},
		}},
		{"session_count", `"gap_ms": 10`, []step{
			{math.MinInt64, []any{"k", 100, "k", 105, "k", 130, "k", 120}, false},
			{math.MinInt64, []any{"k", 112, "k", 125, "j", 0, "j", 50}, false}, {60, nil, true},
			{60, []any{"k", 140}, false}, {139, nil, true}, {1000, nil, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newOpHarness(t, tc.name, "{"+tc.config+"}")
			b := newOpHarness(t, tc.name, "{"+tc.config+`, "allowed_lateness_ms": 0}`)
			for n, s := range tc.steps {
				for _, h := range []*opHarness{a, b} {
					if s.fire {
						h.fire(EventTime, s.wm)
					} else {
						h.records(s.wm, 0, s.kts...)
					}
				}
				got := b.takeEmits() + " | " + strings.Join(b.ops, " ") + " | " + b.state("k") + " | " + b.state("j")
				want := a.takeEmits() + " | " + strings.Join(a.ops, " ") + " | " + a.state("k") + " | " + a.state("j")
				if got != want {
					t.Fatalf("step %d: with allowed_lateness_ms 0:\n got %q\nwant %q", n, got, want)
				}
			}
			a.expectEmpty()
			b.expectEmpty()
		})
	}
}

// TestLatenessConfigRefused: a negative allowed lateness, or one on
// processing-time windows (never late), fails the instance's start with
// the operator's message.
func TestLatenessConfigRefused(t *testing.T) {
	ctx := context.Background()
	r, err := testRuntime()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, config, want string
	}{
		{"window_count", `{"allowed_lateness_ms": -1}`, `window_count: config "allowed_lateness_ms" is -1, want 0 or a positive number of milliseconds`},
		{"sliding_count", `{"allowed_lateness_ms": -5}`, `sliding_count: config "allowed_lateness_ms" is -5, want 0 or a positive number of milliseconds`},
		{"session_count", `{"allowed_lateness_ms": -7}`, `session_count: config "allowed_lateness_ms" is -7, want 0 or a positive number of milliseconds`},
		{"window_count", `{"time": "processing", "allowed_lateness_ms": 10}`, `window_count: config "allowed_lateness_ms" applies to event-time windows`},
		{"sliding_count", `{"time": "processing", "allowed_lateness_ms": 10}`, `sliding_count: config "allowed_lateness_ms" applies to event-time windows`},
		{"session_count", `{"time": "processing", "allowed_lateness_ms": 10}`, `session_count: config "allowed_lateness_ms" applies to event-time sessions`},
		{"window_count", `{"allowed_lateness_ms": 60000}`, ""},
		{"sliding_count", `{"allowed_lateness_ms": 0, "time": "processing"}`, ""},
		{"session_count", `{"allowed_lateness_ms": 1}`, ""},
	} {
		wasm, ok := builtin.Lookup(tc.name)
		if !ok {
			t.Fatalf("no builtin %q", tc.name)
		}
		m, err := r.Compile(ctx, tc.name, wasm)
		if err != nil {
			t.Fatal(err)
		}
		i, err := m.Instantiate(ctx, InstanceConfig{Stage: "s", Config: []byte(tc.config)})
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s %s refused: %v", tc.name, tc.config, err)
			} else {
				i.Close(ctx)
			}
			continue
		}
		if err == nil {
			i.Close(ctx)
			t.Errorf("%s %s: started, want refused with %q", tc.name, tc.config, tc.want)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: %v\nwant it to say %q", tc.name, tc.config, err, tc.want)
		}
	}
}
