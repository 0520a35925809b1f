package wasm

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"cairn/operators/builtin"
)

// The two-input builtins, union and interval_join, driven by the opHarness
// of builtin_sliding_session_test.go with records of both sides (ABI v2).

// joinRec is an input record of a two-input stage.
type joinRec struct {
	key   string
	side  uint8
	value string
	time  int64
}

// sided processes one call of records, with their sides.
func (h *opHarness) sided(wm int64, recs ...joinRec) {
	h.t.Helper()
	b := &Batch{Watermark: wm}
	for n, r := range recs {
		b.Records = append(b.Records, Record{Seq: uint64(n + 1), Key: []byte(r.key), Value: []byte(r.value), Time: r.time, Side: r.side})
	}
	h.call(b)
}

// joinBounds is an interval_join config.
type joinBounds struct {
	lower, upper int64
	sep          string
}

func (jb joinBounds) config() string {
	return fmt.Sprintf(`{"lower_ms": %d, "upper_ms": %d, "separator": %q}`, jb.lower, jb.upper, jb.sep)
}

func (jb joinBounds) match(l, r joinRec) bool {
	return l.key == r.key && l.side == 0 && r.side == 1 && l.time+jb.lower <= r.time && r.time <= l.time+jb.upper
}

func (jb joinBounds) out(l, r joinRec) string {
	return fmt.Sprintf("%s=%s%s%s@%d", l.key, l.value, jb.sep, r.value, max(l.time, r.time))
}

// joinPairs is the reference join: a nested loop over every (left, right)
// pair, sorted (the order-free set of matches).
func joinPairs(jb joinBounds, recs []joinRec) []string {
	var out []string
	for _, l := range recs {
		for _, r := range recs {
			if jb.match(l, r) {
				out = append(out, jb.out(l, r))
			}
		}
	}
	slices.Sort(out)
	return out
}

// joinInOrder is the outputs in the operator's order: for each record in
// arrival order, its matches among the other side's earlier records, by
// time, then arrival.
func joinInOrder(jb joinBounds, recs []joinRec) []string {
	var out []string
	for n, x := range recs {
		var prior []joinRec
		for _, y := range recs[:n] {
			if y.key == x.key && y.side != x.side {
				prior = append(prior, y)
			}
		}
		sort.SliceStable(prior, func(i, j int) bool { return prior[i].time < prior[j].time })
		for _, y := range prior {
			l, r := x, y
			if x.side == 1 {
				l, r = y, x
			}
			if jb.match(l, r) {
				out = append(out, jb.out(l, r))
			}
		}
	}
	return out
}

// randomJoinInput returns n records of keys a, b, c of both sides, their
// times moving forward with up to 30 ms of disorder and many equal times.
func randomJoinInput(rng *rand.Rand, n int) []joinRec {
	recs := make([]joinRec, n)
	base := int64(1000)
	for i := range recs {
		base += rng.Int64N(4)
		side := uint8(rng.IntN(2))
		recs[i] = joinRec{
			key:   string(rune('a' + rng.IntN(3))),
			side:  side,
			value: fmt.Sprintf("%c%d", "lr"[side], i),
			time:  base + rng.Int64N(31) - 15,
		}
	}
	return recs
}

var joinBoundsCases = []joinBounds{
	{0, 600000, "|"},
	{-20, 30, "|"},
	{5, 5, "|"},
	{-50, -10, "+"},
	{0, 0, "::"},
	{-7, 0, ""},
}

// TestIntervalJoinMatchesReference: with no watermark, records arriving in
// various orders and batchings give exactly the reference's matches, each
// record's in the order of the other side's times (then arrival).
func TestIntervalJoinMatchesReference(t *testing.T) {
	for ci, jb := range joinBoundsCases {
		rng := rand.New(rand.NewPCG(uint64(ci), 7))
		recs := randomJoinInput(rng, 150)
		want := joinPairs(jb, recs)
		if len(want) == 0 {
			t.Fatalf("%s: the reference has no match: a useless case", jb.config())
		}
		bySide := slices.Clone(recs)
		sort.SliceStable(bySide, func(i, j int) bool { return bySide[i].side > bySide[j].side })
		reversed := slices.Clone(recs)
		slices.Reverse(reversed)
		shuffled := slices.Clone(recs)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		for _, order := range []struct {
			name string
			recs []joinRec
		}{
			{"arrival", recs},
			{"reversed", reversed},
			{"rights first", bySide},
			{"shuffled", shuffled},
		} {
			for _, batching := range []string{"one call", "one record a call", "random calls"} {
				h := newOpHarness(t, "interval_join", jb.config())
				switch batching {
				case "one call":
					h.sided(math.MinInt64, order.recs...)
				case "one record a call":
					for _, r := range order.recs {
						h.sided(math.MinInt64, r)
					}
				default:
					for rest := order.recs; len(rest) > 0; {
						n := min(1+rng.IntN(10), len(rest))
						h.sided(math.MinInt64, rest[:n]...)
						rest = rest[n:]
					}
				}
				what := fmt.Sprintf("%s, %s, %s", jb.config(), order.name, batching)
				got := slices.Clone(h.emits)
				if exp := joinInOrder(jb, order.recs); !slices.Equal(got, exp) {
					t.Fatalf("%s: emits in order\n got %d %v\nwant %d %v", what, len(got), got, len(exp), exp)
				}
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Fatalf("%s: the set of matches\n got %v\nwant %v", what, got, want)
				}
			}
		}
	}
}

// TestIntervalJoinWithWatermark: the engine's order of things, with the
// watermark 20 ms behind the latest time, late records dropped (the engine
// dead-letters them) and the due timers fired before each call: expiry
// loses no match (the outputs are the reference join of the admitted
// records), and when the watermark passes everything no state and no timer
// is left.
func TestIntervalJoinWithWatermark(t *testing.T) {
	for ci, jb := range joinBoundsCases {
		if jb.upper > 1000 {
			jb.upper = 100 // the default would keep everything to the end
		}
		rng := rand.New(rand.NewPCG(uint64(ci), 11))
		recs := randomJoinInput(rng, 400)
		h := newOpHarness(t, "interval_join", jb.config())
		wm, maxTime := int64(math.MinInt64), int64(math.MinInt64)
		var admitted []joinRec
		maxState := 0
		for rest := recs; len(rest) > 0; {
			n := min(1+rng.IntN(6), len(rest))
			var call []joinRec
			for _, r := range rest[:n] {
				if r.time > wm {
					call = append(call, r)
				}
			}
			rest = rest[n:]
			h.sided(wm, call...)
			admitted = append(admitted, call...)
			for _, r := range call {
				maxTime = max(maxTime, r.time)
			}
			if w := maxTime - 20; w > wm {
				wm = w
				h.fire(EventTime, wm)
			}
			for _, subs := range h.st.m {
				maxState = max(maxState, len(subs))
			}
		}
		what := jb.config()
		if len(admitted) == len(recs) || len(admitted) < len(recs)/2 {
			t.Fatalf("%s: %d of %d records admitted: a useless case", what, len(admitted), len(recs))
		}
		if exp := joinInOrder(jb, admitted); !slices.Equal(h.emits, exp) {
			t.Fatalf("%s: emits\n got %d %v\nwant %d %v", what, len(h.emits), h.emits, len(exp), exp)
		}
		t.Logf("%s: %d of %d records admitted, %d matches, at most %d sub-keys for a key", what, len(admitted), len(recs), len(h.emits), maxState)
		if maxState > 80 {
			t.Errorf("%s: %d sub-keys for a key: expiry does not keep up", what, maxState)
		}
		h.fire(EventTime, math.MaxInt64-1)
		h.expectEmpty()
	}
}

// TestIntervalJoinEqualTimes: records of equal times stay distinct, and
// each record's matches come in the other side's arrival order.
func TestIntervalJoinEqualTimes(t *testing.T) {
	h := newOpHarness(t, "interval_join", `{"upper_ms": 0}`)
	h.sided(math.MinInt64, joinRec{"k", 0, "a", 100}, joinRec{"k", 1, "x", 100}, joinRec{"k", 0, "b", 100})
	h.sided(math.MinInt64, joinRec{"k", 1, "y", 100}, joinRec{"k", 1, "z", 101}, joinRec{"j", 1, "w", 100})
	h.sided(math.MinInt64, joinRec{"k", 0, "c", 100})
	h.expect("emits", h.takeEmits(), "k=a|x@100 k=b|x@100 k=a|y@100 k=b|y@100 k=c|x@100 k=c|y@100")
	if got := len(h.st.m["k"]); got != 7 {
		t.Fatalf("k has %d sub-keys, want 6 records and the sequence: %q", got, h.state("k"))
	}
	h.expect("k's sequence", fmt.Sprintf("%x", h.st.m["k"]["n"]), "0000000000000006")
}

// TestIntervalJoinExpiry: a left record's timer is one after the last time a
// right record can match it, a right record's one after the last time a
// left record can; the timer deletes the expired records (both sides, only
// those), the sequence with the last of them, and an expired record matches
// no later record.
func TestIntervalJoinExpiry(t *testing.T) {
	h := newOpHarness(t, "interval_join", `{"lower_ms": -10, "upper_ms": 20}`)
	h.sided(math.MinInt64, joinRec{"k", 0, "l100", 100}, joinRec{"k", 1, "r200", 200}, joinRec{"k", 0, "l95", 95})
	h.expect("timer ops", strings.Join(h.ops, " "), "k+121 k+211 k+116")
	h.expect("emits", h.takeEmits(), "")
	h.fire(EventTime, 115)
	h.expect("state at 115", fmt.Sprint(len(h.st.m["k"])), "4")
	h.fire(EventTime, 116)
	h.expect("state at 116", fmt.Sprint(len(h.st.m["k"])), "3")
	h.fire(EventTime, 121)
	if _, ok := h.st.m["k"]["n"]; !ok || len(h.st.m["k"]) != 2 {
		t.Fatalf("after the left records expired, k holds %q, want the right record and the sequence", h.state("k"))
	}
	h.sided(121, joinRec{"k", 1, "r110", 110}, joinRec{"k", 0, "l190", 190})
	h.expect("emits after the left records expired", h.takeEmits(), "k=l190|r200@200")
	h.fire(EventTime, 211)
	h.expect("state at 211", h.state("k"), "")
	h.expectEmpty()
	h.sided(211, joinRec{"k", 0, "l195", 195})
	h.expect("a left record after the right one expired", h.takeEmits(), "")
	h.expect("a fresh sequence", fmt.Sprintf("%x", h.st.m["k"]["n"]), "0000000000000001")
}

// TestIntervalJoinExtremeTimes: times at the ends of int64 neither overflow
// the bounds nor the timers (clamped).
func TestIntervalJoinExtremeTimes(t *testing.T) {
	h := newOpHarness(t, "interval_join", `{"lower_ms": -5, "upper_ms": 5}`)
	h.sided(math.MinInt64,
		joinRec{"hi", 0, "L", math.MaxInt64}, joinRec{"hi", 1, "R", math.MaxInt64 - 3},
		joinRec{"lo", 0, "L", math.MinInt64 + 1}, joinRec{"lo", 1, "R", math.MinInt64 + 2},
		joinRec{"far", 0, "L", math.MinInt64 + 1}, joinRec{"far", 1, "R", math.MaxInt64})
	h.expect("emits", h.takeEmits(), fmt.Sprintf("hi=L|R@%d lo=L|R@%d", int64(math.MaxInt64), int64(math.MinInt64+2)))
	h.expect("timer ops", strings.Join(h.ops, " "), fmt.Sprintf("hi+%d hi+%d lo+%d lo+%d far+%d far+%d",
		int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MinInt64+7), int64(math.MinInt64+8), int64(math.MinInt64+7), int64(math.MaxInt64)))

	h = newOpHarness(t, "interval_join", fmt.Sprintf(`{"lower_ms": %d, "upper_ms": %d}`, int64(math.MinInt64), int64(math.MaxInt64)))
	h.sided(math.MinInt64, joinRec{"k", 0, "L", 0}, joinRec{"k", 1, "R", math.MaxInt64}, joinRec{"k", 1, "S", math.MinInt64},
		joinRec{"k", 0, "M", -1})
	h.expect("every pair within the widest bounds (M and R are 2^63 apart: beyond them)", h.takeEmits(),
		fmt.Sprintf("k=L|R@%d k=L|S@0 k=M|S@-1", int64(math.MaxInt64)))
	// S, at the earliest time, can match left records up to MinInt64-lower = 0.
	h.expect("clamped timers", strings.Join(h.ops, " "), fmt.Sprintf("k+%d k+%d k+1 k+%d", int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64)))
}

// TestJoinConfigRefused: a config interval_join or union cannot use fails
// the instance's start with the operator's message; a usable one starts.
func TestJoinConfigRefused(t *testing.T) {
	ctx := context.Background()
	r, err := testRuntime()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, config, want string }{
		{"interval_join", `{"lower_ms": 10, "upper_ms": 5}`, `interval_join: config "lower_ms" 10 is greater than "upper_ms" 5: no pair could join`},
		{"interval_join", `{"lower_ms": 700000}`, `interval_join: config "lower_ms" 700000 is greater than "upper_ms" 600000 (the default)`},
		{"interval_join", `{"upper_ms": -1}`, `interval_join: config "lower_ms" 0 (the default) is greater than "upper_ms" -1`},
		{"interval_join", `{"upper_ms": "10m"}`, `interval_join: bad config`},
		{"interval_join", `{"lower_ms": 1.5}`, `interval_join: bad config`},
		{"interval_join", `{"separator": 5}`, `interval_join: bad config`},
		{"interval_join", `[1]`, `interval_join: bad config`},
		{"union", `{"key": "x", "a": 1}`, `union: takes no config; got field "a"`},
		{"union", `"x"`, `union: bad config`},
		{"interval_join", ``, ""},
		{"interval_join", `{}`, ""},
		{"interval_join", `{"upper_ms": 0}`, ""},
		{"interval_join", `{"lower_ms": 7, "upper_ms": 7}`, ""},
		{"interval_join", `{"lower_ms": -5000, "upper_ms": -1000, "separator": ""}`, ""},
		{"union", ``, ""},
		{"union", `{}`, ""},
		{"union", `null`, ""},
		{"lookup_join", `{"missing": "sometimes"}`, `lookup_join: config "missing" is "sometimes": want "drop" or "emit"`},
		{"lookup_join", `{"separator": 1}`, `lookup_join: bad config`},
		{"lookup_join", `{"missing": "emit", "separator": ""}`, ""},
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

// TestUnion: every record out unchanged, in order, whatever its side; no
// state, no timers.
func TestUnion(t *testing.T) {
	i := instance(t, "union", InstanceConfig{})
	b := &Batch{Watermark: math.MinInt64}
	var want []string
	for n := range 20 {
		r := Record{Seq: uint64(n + 1), Key: []byte(fmt.Sprintf("k%d", n%3)), Value: []byte(strings.Repeat("v", n%4)), Time: int64(n*7 - 50), Side: uint8(n % 2)}
		if n%5 == 4 {
			r.Side = 1 - r.Side
		}
		b.Records = append(b.Records, r)
		want = append(want, fmt.Sprintf("%s=%s@%d/%d,-1", r.Key, r.Value, r.Time, n))
	}
	for round := range 2 { // the instance is reused across calls
		out, err := i.Process(context.Background(), b, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := emitsString(out); got != strings.Join(want, " ") {
			t.Fatalf("round %d: emits\n got %s\nwant %s", round, got, strings.Join(want, " "))
		}
		if len(out.State) != 0 || len(out.Timers) != 0 {
			t.Fatalf("round %d: state %v, timers %v", round, out.State, out.Timers)
		}
	}
}

// TestJoinModulesSeeSide: the SDK's modules speak ABI v2, and a record's
// side reaches the guest: interval_join puts the left value first whichever
// arrived first, joins nothing between records of one side, and refuses a
// side it does not know.
func TestJoinModulesSeeSide(t *testing.T) {
	ctx := context.Background()
	r, err := testRuntime()
	if err != nil {
		t.Fatal(err)
	}
	// Every builtin, even one that never calls the host in a record's
	// path (split, rekey): the SDK imports cairn_v2 whatever the operator.
	for _, name := range builtin.Names() {
		wasm, _ := builtin.Lookup(name)
		m, err := r.Compile(ctx, name, wasm)
		if err != nil {
			t.Fatal(err)
		}
		if v := m.ABIVersion(); v != 2 {
			t.Errorf("%s speaks ABI %d, want 2", name, v)
		}
	}

	h := newOpHarness(t, "interval_join", `{"upper_ms": 0, "separator": " & "}`)
	h.sided(math.MinInt64, joinRec{"k", 1, "right", 5}, joinRec{"k", 0, "left", 5})
	h.sided(math.MinInt64, joinRec{"k", 0, "left2", 5})
	h.expect("emits", h.takeEmits(), "k=left & right@5 k=left2 & right@5")
	h.sided(math.MinInt64, joinRec{"j", 0, "a", 5}, joinRec{"j", 0, "b", 5})
	h.expect("emits of one side", h.takeEmits(), "")

	_, err = h.i.Process(ctx, &Batch{Records: []Record{{Seq: 9, Key: []byte("k"), Value: []byte("x"), Time: 5, Side: 2}}}, h.st)
	if err == nil || !strings.Contains(err.Error(), "interval_join: a record from input 2: the stage must have two inputs") {
		t.Fatalf("a record of side 2: %v", err)
	}
}

// TestLookupJoin: the table side (input 1) sets and deletes a key's row, the
// stream side (input 0) is enriched with the row current at its place in
// the input; without a row it is dropped, or emitted bare with
// missing: emit. Checked record by record and in one call.
func TestLookupJoin(t *testing.T) {
	type rec struct {
		key   string
		side  uint8
		del   bool
		value string
	}
	in := []rec{
		{"u1", 0, false, "click1"}, // no row yet
		{"u1", 1, false, "alice"},
		{"u1", 0, false, "click2"},
		{"u2", 1, false, "bob"},
		{"u1", 1, false, "alice2"}, // an update
		{"u1", 0, false, "click3"},
		{"u2", 0, false, "click4"},
		{"u2", 1, true, ""}, // a delete
		{"u2", 0, false, "click5"},
	}
	for _, c := range []struct {
		config string
		want   []string
	}{
		{`{}`, []string{"u1=click2|alice@7", "u1=click3|alice2@7", "u2=click4|bob@7"}},
		{`{"missing": "emit", "separator": ","}`, []string{"u1=click1,@7", "u1=click2,alice@7", "u1=click3,alice2@7", "u2=click4,bob@7", "u2=click5,@7"}},
	} {
		for _, oneByOne := range []bool{false, true} {
			h := newOpHarness(t, "lookup_join", c.config)
			var b Batch
			for n, r := range in {
				b.Records = append(b.Records, Record{Seq: uint64(n + 1), Key: []byte(r.key), Value: []byte(r.value), Time: 7, Side: r.side, Delete: r.del})
				if oneByOne {
					h.call(&b)
					b.Records = nil
				}
			}
			if !oneByOne {
				h.call(&b)
			}
			if got := strings.Join(h.emits, " "); got != strings.Join(c.want, " ") {
				t.Errorf("%s (one by one %v):\n got %s\nwant %s", c.config, oneByOne, got, strings.Join(c.want, " "))
			}
			if _, ok := h.st.m["u2"]; ok {
				t.Errorf("%s: the deleted row of u2 is still in state: %v", c.config, h.st.m["u2"])
			}
		}
	}
}
