package wasm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"cairn/operators/abi"
	"cairn/operators/builtin"
)

// sdkcallsWasm builds testdata/sdkcalls with the Go toolchain, once.
var sdkcallsWasm = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "cairn-sdkcalls-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "sdkcalls.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "./testdata/sdkcalls")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, errors.New(err.Error() + "\n" + string(b))
	}
	return os.ReadFile(out)
})

func sdkcallsInstance(t *testing.T) *Instance {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain")
	}
	mod, err := sdkcallsWasm()
	if err != nil {
		t.Fatal(err)
	}
	r, err := testRuntime()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := r.Compile(ctx, "sdkcalls", mod)
	if err != nil {
		t.Fatal(err)
	}
	i, err := m.Instantiate(ctx, InstanceConfig{Stage: "sdkcalls"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { i.Close(ctx) })
	return i
}

// countingState counts the State's reads (one per sub-key, however many
// host calls they came in).
type countingState struct {
	*memState
	gets int
}

func (s *countingState) Get(key, sub []byte) ([]byte, bool, error) {
	s.gets++
	return s.memState.Get(key, sub)
}

// EmitStart/EmitEnd: values written in place, one larger than the room
// EmitStart leaves (moved, then copied once), one empty, several in one
// call; they decode as the emits Emit would have made.
func TestSDKEmitInPlace(t *testing.T) {
	i := sdkcallsInstance(t)
	want := func(n int) string {
		var b strings.Builder
		for j := range n {
			b.WriteByte(byte('0' + j%10))
		}
		return b.String()
	}
	sizes := []int{0, 1, 95, 5000, 3, 5000, 1}
	var recs []Record
	for j, n := range sizes {
		recs = append(recs, rec(uint64(j+1), "k"+want(j%3+1), "emit "+strconv.Itoa(n), int64(j)))
	}
	out, err := i.Process(context.Background(), &Batch{Records: recs}, newMemState())
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Emits) != len(sizes) {
		t.Fatalf("%d emits, want %d", len(out.Emits), len(sizes))
	}
	for j, e := range out.Emits {
		if string(e.Value) != want(sizes[j]) || string(e.Key) != "k"+want(j%3+1) || e.Time != int64(j) || e.Input != j {
			t.Fatalf("emit %d: key %q, %d bytes, time %d, input %d; want %d bytes", j, e.Key, len(e.Value), e.Time, e.Input, sizes[j])
		}
	}
	// Another call: the output buffer is reused.
	out, err = i.Process(context.Background(), &Batch{Records: []Record{rec(9, "a", "emit 12", 1)}}, newMemState())
	if err != nil || len(out.Emits) != 1 || string(out.Emits[0].Value) != "012345678901" {
		t.Fatalf("second call: %v %+v", err, out)
	}
}

// Output between EmitStart and EmitEnd, or an EmitStart left open, fails
// the call with the SDK's reason (the guest's failure, as a panic's).
func TestSDKEmitMisuse(t *testing.T) {
	for _, c := range []struct{ cmd, want string }{
		{"log-in-emit", "between EmitStart and EmitEnd"},
		{"open-emit", "EmitStart without EmitEnd"},
	} {
		i := sdkcallsInstance(t)
		_, err := i.Process(context.Background(), &Batch{Records: []Record{rec(1, "a", "emit 2", 1), rec(2, "a", c.cmd, 1)}}, newMemState())
		var te *TrapError
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &te) {
			t.Fatalf("%s: got %v, want a guest failure containing %q", c.cmd, err, c.want)
		}
	}
}

// GetMany reads the sub-keys with state_get_many: present, absent, a
// value larger than the SDK's read buffer, a sub-key named twice, the
// key's own value; Gets after it read no more, and the call's own writes
// win over what GetMany would read.
func TestSDKGetMany(t *testing.T) {
	i := sdkcallsInstance(t)
	big := strings.Repeat("v", 9000)
	st := &countingState{memState: newMemState()}
	st.m["k"] = map[string][]byte{"": []byte("own"), "b1": []byte("x"), "a7": []byte(big), "w": []byte("old")}
	out, err := i.Process(context.Background(), &Batch{Records: []Record{
		rec(1, "k", "pre b1 a7 zz b1", 1),
		rec(2, "k", "put w new", 2),
		rec(3, "k", "pre w b1 q", 3),
		rec(4, "other", "pre b1", 4),
	}}, st)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, e := range out.Emits {
		got = append(got, string(e.Key)+": "+strings.ReplaceAll(string(e.Value), big, "<9000 v>"))
	}
	want := []string{"k: b1=x a7=<9000 v> zz=- b1=x", "k: w=new b1=x q=-", "other: b1=-"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Reads: the batch's keys' own values (2, prefetched with the input);
	// the first GetMany's four sub-keys (b1 asked twice: the SDK does not
	// look for repeats within one request), twice, as its result did not
	// fit the SDK's read buffer; then q alone (w was written, b1 read) and
	// other's b1. No Get after a GetMany reads again.
	if st.gets != 2+2*4+1+1 {
		t.Fatalf("%d reads, want 12", st.gets)
	}

	// A failing State: a plain error (the host's), not a trap.
	_, err = i.Process(context.Background(), &Batch{Records: []Record{rec(5, "k", "pre b1", 5)}}, &failingState{memState: newMemState(), failGet: true})
	var te *TrapError
	if err == nil || errors.As(err, &te) || !errors.Is(err, errInjected) {
		t.Fatalf("a host state failure must be a plain error wrapping the State's, got %v", err)
	}
}

// Only a module that calls GetMany imports state_get_many: the builtins,
// built with this SDK, do not (so they run on a host without it, as
// every module built before it does).
func TestSDKGetManyImportOnlyWhenCalled(t *testing.T) {
	for _, n := range builtin.Names() {
		m, _ := builtin.Lookup(n)
		if bytes.Contains(m, []byte(abi.ImportStateGetMany)) {
			t.Errorf("builtin %s imports %s without calling GetMany", n, abi.ImportStateGetMany)
		}
	}
	mod, err := sdkcallsWasm()
	if err != nil {
		t.Skip(err)
	}
	if !bytes.Contains(mod, []byte(abi.ImportStateGetMany)) {
		t.Fatalf("sdkcalls calls GetMany but does not import %s", abi.ImportStateGetMany)
	}
}
