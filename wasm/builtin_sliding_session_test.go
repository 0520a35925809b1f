package wasm

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"cairn/operators/builtin"
)

// opHarness drives a builtin like the engine's slot does, with the state
// in a memState and the timers in a set: records in calls, then the due
// timers of a domain, (time, key) ordered, in one call.
type opHarness struct {
	t      *testing.T
	i      *Instance
	st     *memState
	timers map[opTimer]bool
	emits  []string // every emit so far, "key=value@time"
	ops    []string // the timer ops of the last call, "key+time" or "key-time"
}

type opTimer struct {
	key    string
	time   int64
	domain TimerDomain
}

func newOpHarness(t *testing.T, name, config string) *opHarness {
	return &opHarness{t: t, i: instance(t, name, InstanceConfig{Config: []byte(config)}), st: newMemState(), timers: map[opTimer]bool{}}
}

func (h *opHarness) call(b *Batch) {
	h.t.Helper()
	out, err := h.i.Process(context.Background(), b, h.st)
	if err != nil {
		h.t.Fatal(err)
	}
	h.st.apply(out.State)
	h.ops = h.ops[:0]
	for _, op := range out.Timers {
		k := opTimer{string(op.Key), op.Time, op.Domain}
		sign := "+"
		if op.Delete {
			sign = "-"
			delete(h.timers, k)
		} else {
			h.timers[k] = true
		}
		h.ops = append(h.ops, fmt.Sprintf("%s%s%d", op.Key, sign, op.Time))
	}
	for _, e := range out.Emits {
		h.emits = append(h.emits, fmt.Sprintf("%s=%s@%d", e.Key, e.Value, e.Time))
	}
	for k := range h.st.m {
		if len(h.st.m[k]) == 0 {
			delete(h.st.m, k)
		}
	}
}

// records processes one call of records of (key, time) pairs.
func (h *opHarness) records(wm, procTime int64, kts ...any) {
	h.t.Helper()
	b := &Batch{Watermark: wm, ProcTime: procTime}
	for n := 0; n < len(kts); n += 2 {
		b.Records = append(b.Records, rec(uint64(len(b.Records)+1), kts[n].(string), "v", int64(kts[n+1].(int))))
	}
	h.call(b)
}

// fire hands the operator every timer of the domain due at upTo.
func (h *opHarness) fire(domain TimerDomain, upTo int64) {
	h.t.Helper()
	var due []opTimer
	for k := range h.timers {
		if k.domain == domain && k.time <= upTo {
			due = append(due, k)
		}
	}
	slices.SortFunc(due, func(a, b opTimer) int {
		if a.time != b.time {
			return int(a.time - b.time)
		}
		return strings.Compare(a.key, b.key)
	})
	b := &Batch{Watermark: upTo, ProcTime: upTo}
	for _, k := range due {
		delete(h.timers, k) // the engine deletes the timers it fired
		b.Timers = append(b.Timers, Timer{Key: []byte(k.key), Time: k.time, Domain: k.domain})
	}
	h.call(b)
}

// takeEmits returns the emits since the last take.
func (h *opHarness) takeEmits() string {
	s := strings.Join(h.emits, " ")
	h.emits = h.emits[:0]
	return s
}

func (h *opHarness) state(key string) string {
	var subs []string
	for sub := range h.st.m[key] {
		subs = append(subs, sub)
	}
	slices.Sort(subs)
	for n, sub := range subs {
		subs[n] = sub + "=" + string(h.st.m[key][sub])
	}
	return strings.Join(subs, " ")
}

func (h *opHarness) expect(what, got, want string) {
	h.t.Helper()
	if got != want {
		h.t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

// expectEmpty: no state and no timer left.
func (h *opHarness) expectEmpty() {
	h.t.Helper()
	if len(h.st.m) != 0 || len(h.timers) != 0 {
		h.t.Fatalf("state %v and timers %v left after every window closed", h.st.m, h.timers)
	}
}

// TestSlidingCountEventTime: windows of 30 ms every 10 ms. Each new bucket
// registers the ends of its three windows; a timer emits its one window,
// the sum of its buckets, and drops the bucket no later window contains; a
// record in an existing bucket registers nothing.
func TestSlidingCountEventTime(t *testing.T) {
	h := newOpHarness(t, "sliding_count", `{"size_ms": 30, "slide_ms": 10}`)
	h.records(math.MinInt64, 0, "k", 5, "k", 12, "k", 25, "j", 31, "k", 7)
	h.expect("timer ops", strings.Join(h.ops, " "), "k+9 k+19 k+29 k+19 k+29 k+39 k+29 k+39 k+49 j+39 j+49 j+59")
	h.expect("k's buckets", h.state("k"), "0=2 10=1 20=1")
	h.expect("emits before any timer", h.takeEmits(), "")

	h.fire(EventTime, 19)
	h.expect("windows -20 and -10", h.takeEmits(), "k=-20,2@9 k=-10,3@19")
	h.expect("k's buckets after -10", h.state("k"), "0=2 10=1 20=1")

	h.records(19, 0, "k", 28) // bucket 20 exists: no timer
	h.expect("timer ops of a known bucket", strings.Join(h.ops, " "), "")
	h.fire(EventTime, 100)
	h.expect("the remaining windows", h.takeEmits(), "k=0,5@29 j=10,1@39 k=10,3@39 j=20,1@49 k=20,2@49 j=30,1@59")
	h.expectEmpty()
}

// TestSlidingCountProcessingTime: records go to the bucket of the call's
// processing clock whatever their event time, with processing-time timers.
func TestSlidingCountProcessingTime(t *testing.T) {
	h := newOpHarness(t, "sliding_count", `{"size_ms": 100, "slide_ms": 50, "time": "processing"}`)
	h.records(math.MinInt64, 1000, "k", 5, "k", 999_999)
	h.expect("timer ops", strings.Join(h.ops, " "), "k+1049 k+1099")
	for k := range h.timers {
		if k.domain != ProcessingTime {
			t.Fatalf("timer %+v is not a processing-time timer", k)
		}
	}
	h.records(math.MinInt64, 1060, "k", 7)
	h.fire(EventTime, math.MaxInt64-1) // the watermark closes nothing
	h.expect("emits by the watermark", h.takeEmits(), "")
	h.fire(ProcessingTime, 1100)
	h.expect("windows 950 and 1000", h.takeEmits(), "k=950,2@1049 k=1000,3@1099")
	h.expect("buckets", h.state("k"), "1050=1")
	h.fire(ProcessingTime, 1149)
	h.expect("window 1050", h.takeEmits(), "k=1050,1@1149")
	h.expectEmpty()
}

// TestSessionCountEventTime: sessions with a 10 ms gap. Records out of
// order bridge sessions (two at once, then the merged one with a third);
// records exactly gap apart do not join; the timer moves to the merged
// session's end and the replaced sessions' timers are deleted.
func TestSessionCountEventTime(t *testing.T) {
	h := newOpHarness(t, "session_count", `{"gap_ms": 10}`)
	h.records(math.MinInt64, 0, "k", 100)
	h.expect("first record", strings.Join(h.ops, " ")+" | "+h.state("k"), "k+109 | =100,100,1")
	h.records(math.MinInt64, 0, "k", 105)
	h.expect("extended", strings.Join(h.ops, " ")+" | "+h.state("k"), "k-109 k+114 | =100,105,2")
	h.records(math.MinInt64, 0, "k", 130, "k", 120)
	h.expect("two more sessions (120 is 10 from 130: not within the gap)", strings.Join(h.ops, " ")+" | "+h.state("k"),
		"k+139 k+129 | =100,105,2;120,120,1;130,130,1")
	h.records(math.MinInt64, 0, "k", 112)
	h.expect("112 bridges 100-105 and 120", strings.Join(h.ops, " ")+" | "+h.state("k"), "k-114 | =100,120,4;130,130,1")
	h.records(math.MinInt64, 0, "k", 125, "j", 0, "j", 50)
	h.expect("125 bridges 100-120 and 130", strings.Join(h.ops, " ")+" | "+h.state("k"), "k-129 j+9 j+59 | =100,130,6")
	h.expect("j's two sessions", h.state("j"), "=0,0,1;50,50,1")
	h.expect("k's timers", fmt.Sprint(h.timers[opTimer{"k", 139, EventTime}], len(h.timers)), "true 3")
	h.expect("emits before any timer", h.takeEmits(), "")

	h.fire(EventTime, 60)
	h.expect("j's sessions", h.takeEmits(), "j=0,0,1@9 j=50,50,1@59")
	h.records(60, 0, "k", 140) // 10 after 130: a new session
	h.expect("a new session", strings.Join(h.ops, " ")+" | "+h.state("k"), "k+149 | =100,130,6;140,140,1")
	h.fire(EventTime, 139)
	h.expect("k's first session", h.takeEmits(), "k=100,130,6@139")
	h.expect("k's open session", h.state("k"), "=140,140,1")
	h.fire(EventTime, 1000)
	h.expect("k's second session", h.takeEmits(), "k=140,140,1@149")
	h.expectEmpty()
}

// TestSessionCountProcessingTime: sessions by the call's processing clock.
func TestSessionCountProcessingTime(t *testing.T) {
	h := newOpHarness(t, "session_count", `{"gap_ms": 100, "time": "processing"}`)
	h.records(math.MinInt64, 1000, "k", 5, "k", 1)
	h.records(math.MinInt64, 1050, "k", 2)
	h.expect("timer moved", strings.Join(h.ops, " ")+" | "+h.state("k"), "k-1099 k+1149 | =1000,1050,3")
	h.fire(EventTime, math.MaxInt64-1)
	h.expect("emits by the watermark", h.takeEmits(), "")
	h.fire(ProcessingTime, 1148)
	h.expect("emits before the end", h.takeEmits(), "")
	h.fire(ProcessingTime, 1149)
	h.expect("the session", h.takeEmits(), "k=1000,1050,3@1149")
	h.expectEmpty()
	h.records(math.MinInt64, 1150, "k", 3)
	h.expect("a new session", h.state("k"), "=1150,1150,1")
}

// TestSlidingSessionConfigRefused: a config the operator cannot use fails
// the instance's start with the operator's message; a usable one starts.
func TestSlidingSessionConfigRefused(t *testing.T) {
	ctx := context.Background()
	r, err := testRuntime()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, config, want string
	}{
		{"sliding_count", `{"size_ms": 60000, "slide_ms": 7000}`, `sliding_count: config "slide_ms" 7000 does not divide "size_ms" 60000`},
		{"sliding_count", `{"size_ms": 5000}`, `sliding_count: config "slide_ms" 10000 (the default) does not divide "size_ms" 5000`},
		{"sliding_count", `{"size_ms": 60000, "slide_ms": 0}`, `sliding_count: config "slide_ms" is 0, want a positive number`},
		{"sliding_count", `{"size_ms": -10}`, `sliding_count: config "size_ms" is -10, want a positive number`},
		{"sliding_count", `{"size_ms": 3600000, "slide_ms": 1}`, `sliding_count: config "size_ms"/"slide_ms" is 3600000 windows per record, at most 1000`},
		{"sliding_count", `{"time": "sideways"}`, `sliding_count: config "time" is "sideways", want "event" or "processing"`},
		{"sliding_count", `{"size_ms": "1m"}`, `sliding_count: bad config`},
		{"session_count", `{"gap_ms": 0}`, `session_count: config "gap_ms" is 0, want a positive number`},
		{"session_count", `{"gap_ms": -5}`, `session_count: config "gap_ms" is -5, want a positive number`},
		{"session_count", `{"time": "wall"}`, `session_count: config "time" is "wall", want "event" or "processing"`},
		{"sliding_count", `{"size_ms": 60000}`, ""},
		{"sliding_count", `{"size_ms": 3000, "slide_ms": 1000, "time": "processing"}`, ""},
		{"sliding_count", ``, ""},
		{"session_count", `{}`, ""},
		{"session_count", `{"gap_ms": 1, "time": "event"}`, ""},
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
