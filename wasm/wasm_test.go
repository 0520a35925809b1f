package wasm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn/operators/builtin"
)

// memState is an in-memory State: a model of the engine's state that
// applies an Output's ops.
type memState struct{ m map[string]map[string][]byte }

func newMemState() *memState { return &memState{m: map[string]map[string][]byte{}} }

func (s *memState) Get(key, sub []byte) ([]byte, bool, error) {
	v, ok := s.m[string(key)][string(sub)]
	return v, ok, nil
}

func (s *memState) Scan(key, prefix []byte, fn func(sub, value []byte) error) error {
	subs := s.m[string(key)]
	var names []string
	for k := range subs {
		if strings.HasPrefix(k, string(prefix)) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if err := fn([]byte(n), subs[n]); err != nil {
			return err
		}
	}
	return nil
}

func (s *memState) apply(ops []StateOp) {
	for _, op := range ops {
		subs := s.m[string(op.Key)]
		if subs == nil {
			subs = map[string][]byte{}
			s.m[string(op.Key)] = subs
		}
		if op.Delete {
			delete(subs, string(op.Sub))
		} else {
			subs[string(op.Sub)] = bytes.Clone(op.Value)
		}
	}
}

var _ State = (*memState)(nil)

// testRuntime is shared by the tests: compiling a Go guest takes a while.
var testRuntime = sync.OnceValues(func() (*Runtime, error) {
	return NewRuntime(context.Background(), RuntimeConfig{})
})

func instance(t testing.TB, name string, c InstanceConfig) *Instance {
	t.Helper()
	ctx := context.Background()
	r, err := testRuntime()
	if err != nil {
		t.Fatal(err)
	}
	wasm, ok := builtin.Lookup(name)
	if !ok {
		t.Fatalf("no builtin %q", name)
	}
	m, err := r.Compile(ctx, name, wasm)
	if err != nil {
		t.Fatal(err)
	}
	if c.Stage == "" {
		c.Stage = name
	}
	i, err := m.Instantiate(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { i.Close(ctx) })
	return i
}

func rec(seq uint64, key, value string, t int64) Record {
	return Record{Seq: seq, Key: []byte(key), Value: []byte(value), Time: t}
}

func emitsString(out *Output) string {
	var b strings.Builder
	for _, e := range out.Emits {
		fmt.Fprintf(&b, "%s=%s@%d/%d,%d ", e.Key, e.Value, e.Time, e.Input, e.Timer)
	}
	return strings.TrimSpace(b.String())
}

func TestCount(t *testing.T) {
	ctx := context.Background()
	i := instance(t, "count", InstanceConfig{Slot: 0})
	st := newMemState()
	st.m["b"] = map[string][]byte{"": []byte("41")}
	b := &Batch{Records: []Record{
		rec(10, "a", "x", 1), rec(11, "b", "x", 2), rec(12, "a", "x", 3), rec(13, "c", "x", 4), rec(14, "a", "x", 5),
	}, Watermark: math.MinInt64}
	out, err := i.Process(ctx, b, st)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := emitsString(out), "a=1@1/0,-1 b=42@2/1,-1 a=2@3/2,-1 c=1@4/3,-1 a=3@5/4,-1"; got != want {
		t.Fatalf("emits\n got %s\nwant %s", got, want)
	}
	// One coalesced op per written key: read-your-writes made a's final value 3.
	var ops []string
	for _, op := range out.State {
		ops = append(ops, fmt.Sprintf("%s/%s=%s del=%v", op.Key, op.Sub, op.Value, op.Delete))
	}
	if got, want := strings.Join(ops, " "), "a/=3 del=false b/=42 del=false c/=1 del=false"; got != want {
		t.Fatalf("state ops\n got %s\nwant %s", got, want)
	}
	st.apply(out.State)
	out, err = i.Process(ctx, &Batch{Records: []Record{rec(15, "a", "x", 6), rec(16, "a", "x", 7)}}, st)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := emitsString(out), "a=4@6/0,-1 a=5@7/1,-1"; got != want {
		t.Fatalf("second batch: got %s want %s", got, want)
	}
}

func TestSplitStateless(t *testing.T) {
	i := instance(t, "split", InstanceConfig{Slot: -1})
	out, err := i.Process(context.Background(), &Batch{Records: []Record{
		rec(1, "line1", "Hello, World! hello", 100), rec(2, "line2", "  ", 101), rec(3, "line3", "Go-lang's fine.", 102),
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := emitsString(out), "hello=1@100/0,-1 world=1@100/0,-1 hello=1@100/0,-1 golangs=1@102/2,-1 fine=1@102/2,-1"; got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

func TestDedupe(t *testing.T) {
	ctx := context.Background()
	i := instance(t, "dedupe", InstanceConfig{})
	st := newMemState()
	st.m["old"] = map[string][]byte{"": {1}}
	out, err := i.Process(ctx, &Batch{Records: []Record{
		rec(1, "a", "v1", 1), rec(2, "a", "v2", 2), rec(3, "old", "v3", 3), rec(4, "b", "v4", 4),
	}}, st)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := emitsString(out), "a=v1@1/0,-1 b=v4@4/3,-1"; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	if len(out.State) != 2 {
		t.Fatalf("state ops %+v", out.State)
	}
}

func TestWindowCount(t *testing.T) {
	ctx := context.Background()
	i := instance(t, "window_count", InstanceConfig{Config: []byte(`{"size_ms": 1000}`)})
	st := newMemState()
	out, err := i.Process(ctx, &Batch{Records: []Record{
		rec(1, "k", "", 100), rec(2, "k", "", 999), rec(3, "k", "", 1000), rec(4, "j", "", 1500), rec(5, "k", "", -1),
	}}, st)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Emits) != 0 {
		t.Fatalf("emits before timers: %s", emitsString(out))
	}
	var timers []string
	for _, op := range out.Timers {
		timers = append(timers, fmt.Sprintf("%s@%d", op.Key, op.Time))
	}
	if got, want := strings.Join(timers, " "), "k@999 k@999 k@1999 j@1999 k@-1"; got != want {
		t.Fatalf("timers: got %s want %s", got, want)
	}
	st.apply(out.State)
	if got := string(st.m["k"]["0"]); got != "2" {
		t.Fatalf("window 0 count = %q", got)
	}
	// A second batch: one more record in k's window 1000 (the overlay must
	// merge with Scan), then k's timers fire before the records.
	out, err = i.Process(ctx, &Batch{
		Timers:  []Timer{{Key: []byte("k"), Time: 999}, {Key: []byte("k"), Time: 1999}, {Key: []byte("j"), Time: 999}},
		Records: []Record{rec(6, "k", "", 1001)},
	}, st)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := emitsString(out), "k=-1000,1@-1/-1,0 k=0,2@999/-1,0 k=1000,1@1999/-1,1"; got != want {
		t.Fatalf("timer emits: got %s want %s", got, want)
	}
	st.apply(out.State)
	if _, ok := st.m["k"]["0"]; ok {
		t.Fatal("window 0 state not deleted")
	}
	if got := string(st.m["k"]["1000"]); got != "1" {
		t.Fatalf("window 1000 = %q, want 1 (deleted by the timer, then one new record)", got)
	}
}

func TestScanHostImport(t *testing.T) {
	ctx := context.Background()
	i := instance(t, "window_count", InstanceConfig{Config: []byte(`{"size_ms": 10}`)})
	st := newMemState()
	st.m["k"] = map[string][]byte{"0": []byte("3"), "10": []byte("4"), "20": []byte("5"), "x": []byte("?")}
	// Timer 19 fires windows 0 and 10 (found by Scan). Timer 19 again finds
	// nothing: Scan sees this call's deletes. Timer 29 then finds only 20.
	out, err := i.Process(ctx, &Batch{Timers: []Timer{
		{Key: []byte("k"), Time: 19}, {Key: []byte("k"), Time: 19}, {Key: []byte("k"), Time: 29},
	}}, st)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := emitsString(out), "k=0,3@9/-1,0 k=10,4@19/-1,0 k=20,5@29/-1,2"; got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	st.apply(out.State)
	if len(st.m["k"]) != 1 {
		t.Fatalf("state left: %v", st.m["k"])
	}

	// A failing State: a plain error (the host's fault), not a trap.
	j := instance(t, "window_count", InstanceConfig{Config: []byte(`{"size_ms": 10}`)})
	_, err = j.Process(ctx, &Batch{Timers: []Timer{{Key: []byte("k"), Time: 9}}}, &failingState{memState: newMemState(), failScan: true})
	var te *TrapError
	if err == nil || errors.As(err, &te) || !errors.Is(err, errInjected) {
		t.Fatalf("a host state failure must be a plain error wrapping the State's, got %v", err)
	}
}

func TestStateGetFailure(t *testing.T) {
	i := instance(t, "window_count", InstanceConfig{Config: []byte(`{"size_ms": 10}`)})
	_, err := i.Process(context.Background(), &Batch{Records: []Record{rec(7, "k", "", 5)}}, &failingState{memState: newMemState(), failGet: true})
	var te *TrapError
	if err == nil || errors.As(err, &te) || !errors.Is(err, errInjected) {
		t.Fatalf("a host state failure must be a plain error wrapping the State's, got %v", err)
	}
}

var errInjected = errors.New("injected state failure")

type failingState struct {
	*memState
	failGet, failScan bool
}

func (s *failingState) Scan(key, prefix []byte, fn func(sub, value []byte) error) error {
	if s.failScan {
		return errInjected
	}
	return s.memState.Scan(key, prefix, fn)
}

func (s *failingState) Get(key, sub []byte) ([]byte, bool, error) {
	if s.failGet && len(sub) > 0 {
		return nil, false, errInjected
	}
	return s.memState.Get(key, sub)
}

func TestTrapNamesRecord(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		value, reason string
		returned      bool // the operator returned the error: an error of its own, not a trap
	}{
		{"TRAP", "panic: trap: asked to trap", false},
		{"ERR", "trap: asked to fail", true},
	} {
		i := instance(t, "trap", InstanceConfig{Stage: "s1", Slot: 3})
		_, err := i.Process(ctx, &Batch{Records: []Record{rec(100, "a", "ok", 1), rec(101, "b", tc.value, 2), rec(102, "c", "ok", 3)}}, nil)
		var te *TrapError
		if !errors.As(err, &te) {
			t.Fatalf("%s: want TrapError, got %v", tc.value, err)
		}
		if te.Stage != "s1" || te.Slot != 3 || te.Seq != 101 || te.Reason != tc.reason || te.Returned != tc.returned {
			t.Fatalf("%s: got %+v", tc.value, te)
		}
		if said := strings.Contains(te.Error(), "operator returned an error"); said != tc.returned {
			t.Fatalf("%s: %q, want it to say whether the operator returned the error (%v)", tc.value, te.Error(), tc.returned)
		}
		for _, s := range []string{`"s1"`, "slot 3", "seq 101"} {
			if !strings.Contains(te.Error(), s) {
				t.Fatalf("%q does not name %s", te.Error(), s)
			}
		}
		if _, err := i.Process(ctx, &Batch{Records: []Record{rec(1, "a", "ok", 1)}}, nil); !errors.Is(err, ErrInstanceUnusable) {
			t.Fatalf("after a trap: %v", err)
		}
	}
}

func TestLoopDeadline(t *testing.T) {
	ctx := context.Background()
	i := instance(t, "trap", InstanceConfig{Stage: "loop", Slot: -1, Deadline: 200 * time.Millisecond})
	// A normal call works with the deadline on.
	if out, err := i.Process(ctx, &Batch{Records: []Record{rec(1, "a", "ok", 1)}}, nil); err != nil || len(out.Emits) != 1 {
		t.Fatalf("%v %+v", err, out)
	}
	start := time.Now()
	_, err := i.Process(ctx, &Batch{Records: []Record{rec(7, "a", "ok", 1), rec(8, "a", "LOOP", 1)}}, nil)
	var te *TrapError
	if !errors.As(err, &te) || te.Reason != ReasonDeadline || te.Seq != 8 {
		t.Fatalf("want deadline TrapError at seq 8, got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("deadline took %v", d)
	}
	// The host survives: a fresh instance works.
	j := instance(t, "trap", InstanceConfig{Deadline: time.Second})
	if _, err := j.Process(ctx, &Batch{Records: []Record{rec(1, "a", "ok", 1)}}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestOOM(t *testing.T) {
	ctx := context.Background()
	i := instance(t, "trap", InstanceConfig{Stage: "oom", MemoryPages: 1024}) // 64 MiB
	_, err := i.Process(ctx, &Batch{Records: []Record{rec(5, "a", "OOM", 1)}}, nil)
	var te *TrapError
	if !errors.As(err, &te) || te.Seq != 5 {
		t.Fatalf("want TrapError at seq 5, got %v", err)
	}
	t.Logf("OOM reason: %s", te.Reason)
	if !strings.Contains(te.Reason, "out of memory") {
		t.Errorf("reason %q does not say out of memory", te.Reason)
	}
	j := instance(t, "trap", InstanceConfig{MemoryPages: 1024})
	if _, err := j.Process(ctx, &Batch{Records: []Record{rec(1, "a", "ok", 1)}}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestCompileErrors(t *testing.T) {
	ctx := context.Background()
	r, err := NewRuntime(ctx, RuntimeConfig{MaxModuleBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)

	if _, err := r.Compile(ctx, "junk", []byte("definitely not a wasm module")); !errors.Is(err, ErrInvalidModule) {
		t.Fatalf("random bytes: %v", err)
	}
	big := append([]byte("\x00asm\x01\x00\x00\x00"), make([]byte, 1<<20)...)
	if _, err := r.Compile(ctx, "big", big); !errors.Is(err, ErrModuleTooLarge) {
		t.Fatalf("big module: %v", err)
	}
	_, err = r.Compile(ctx, "old", moduleImporting("cairn_v0", "log"))
	if !errors.Is(err, ErrABIVersion) || !strings.Contains(err.Error(), "cairn_v0") {
		t.Fatalf("cairn_v0 module: %v", err)
	}
	t.Log(err)
	if _, err := r.Compile(ctx, "env", moduleImporting("env", "f")); !errors.Is(err, ErrNotOperator) {
		t.Fatalf("env import: %v", err)
	}
	if _, err := r.Compile(ctx, "empty", moduleImporting("", "")); !errors.Is(err, ErrNotOperator) {
		t.Fatalf("module without exports: %v", err)
	}
}

// moduleImporting returns a minimal module importing one function
// `() -> ()` as mod.name (none when mod is "").
func moduleImporting(mod, name string) []byte {
	b := []byte("\x00asm\x01\x00\x00\x00")
	b = append(b, 1, 4, 1, 0x60, 0, 0) // type section: one func type () -> ()
	if mod != "" {
		imp := []byte{1, byte(len(mod))}
		imp = append(imp, mod...)
		imp = append(imp, byte(len(name)))
		imp = append(imp, name...)
		imp = append(imp, 0, 0) // func, type 0
		b = append(b, 2, byte(len(imp)))
		b = append(b, imp...)
	}
	return b
}

func TestCompileCachedByHash(t *testing.T) {
	ctx := context.Background()
	r, _ := testRuntime()
	wasm, _ := builtin.Lookup("count")
	m1, err := r.Compile(ctx, "count", wasm)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := r.Compile(ctx, "count-again", bytes.Clone(wasm))
	if err != nil {
		t.Fatal(err)
	}
	if m1 != m2 || len(m1.Hash()) != 64 {
		t.Fatalf("not cached: %p %p %s", m1, m2, m1.Hash())
	}
}

func TestCompilationCacheDir(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	wasm, _ := builtin.Lookup("dedupe")
	for round := 0; round < 2; round++ {
		r, err := NewRuntime(ctx, RuntimeConfig{CacheDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		m, err := r.Compile(ctx, "dedupe", wasm)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: compile %v", round, time.Since(start))
		i, err := m.Instantiate(ctx, InstanceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := i.Process(ctx, &Batch{Records: []Record{rec(1, "a", "v", 1)}}, newMemState()); err != nil {
			t.Fatal(err)
		}
		r.Close(ctx)
	}
}

func TestStatelessStageStateAccessTraps(t *testing.T) {
	// count needs state; run it as a stateless stage.
	i := instance(t, "count", InstanceConfig{Slot: -1})
	_, err := i.Process(context.Background(), &Batch{Records: []Record{rec(9, "a", "", 1)}}, nil)
	var te *TrapError
	if !errors.As(err, &te) || te.Seq != 9 || !strings.Contains(te.Reason, "stateless") {
		t.Fatalf("got %v", err)
	}
}

func TestLargeBatchGrowsInput(t *testing.T) {
	i := instance(t, "trap", InstanceConfig{})
	big := strings.Repeat("x", 200<<10)
	out, err := i.Process(context.Background(), &Batch{Records: []Record{rec(1, "a", big, 1), rec(2, "b", big, 2)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Emits) != 2 || string(out.Emits[1].Value) != big {
		t.Fatal("bad emits")
	}
}

func ExampleModule_Instantiate() {
	ctx := context.Background()
	r, _ := NewRuntime(ctx, RuntimeConfig{})
	defer r.Close(ctx)
	wasm, _ := builtin.Lookup("count")
	m, _ := r.Compile(ctx, "count", wasm)
	inst, _ := m.Instantiate(ctx, InstanceConfig{Stage: "count", Slot: 0})
	defer inst.Close(ctx)

	st := newMemState()
	out, err := inst.Process(ctx, &Batch{Records: []Record{
		{Seq: 1, Key: []byte("apple"), Time: 1000},
		{Seq: 2, Key: []byte("pear"), Time: 1001},
		{Seq: 3, Key: []byte("apple"), Time: 1002},
	}}, st)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range out.Emits {
		fmt.Printf("%s %s t=%d (input %d)\n", e.Key, e.Value, e.Time, e.Input)
	}
	for _, op := range out.State {
		fmt.Printf("state %s = %s\n", op.Key, op.Value)
	}
	// Output:
	// apple 1 t=1000 (input 0)
	// pear 1 t=1001 (input 1)
	// apple 2 t=1002 (input 2)
	// state apple = 2
	// state pear = 1
}
