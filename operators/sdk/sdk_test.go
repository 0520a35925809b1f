//go:build !wasip1

package sdk

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"cairn/operators/abi"
)

// countOp is the count example's logic.
var countOp = Operator{OnRecord: func(c *Context, r Record) error {
	var n uint64
	if v, ok := c.Get(""); ok {
		var err error
		if n, err = strconv.ParseUint(string(v), 10, 64); err != nil {
			return err
		}
	}
	n++
	buf := strconv.AppendUint(nil, n, 10)
	c.Put("", buf)
	c.Emit(r.Key, buf, r.Time)
	return nil
}}

func countInput(nRecords, nKeys int) []byte {
	in := &abi.Input{Watermark: 7, ProcTime: 8}
	for k := range nKeys {
		key := abi.Key{Key: fmt.Appendf(nil, "key-%d", k), Fetch: abi.Absent}
		if k%2 == 0 {
			key.Fetch, key.Value = abi.Present, []byte("41")
		}
		in.Keys = append(in.Keys, key)
	}
	for i := range nRecords {
		in.Records = append(in.Records, abi.Record{KeyIdx: uint32(i % nKeys), Time: int64(i), Value: []byte("payload")})
	}
	return abi.AppendInput(nil, in)
}

// The SDK's in-place decoder, the callbacks' overlay and the output writers
// agree with the abi package.
func TestProcessCount(t *testing.T) {
	Register(countOp)
	in := countInput(7, 3)
	var o abi.Output
	if err := abi.DecodeOutput(process(in), &o); err != nil {
		t.Fatal(err)
	}
	if o.Failed {
		t.Fatalf("failed: %s", o.ErrMsg)
	}
	var got []string
	for _, e := range o.Emits {
		got = append(got, fmt.Sprintf("%d:%s=%s@%d", e.Source, e.Key, e.Value, e.Time))
	}
	want := "[0:key-0=42@0 1:key-1=1@1 2:key-2=42@2 3:key-0=43@3 4:key-1=2@4 5:key-2=43@5 6:key-0=44@6]"
	if fmt.Sprint(got) != want {
		t.Fatalf("emits %v\nwant  %s", got, want)
	}
	got = nil
	for _, s := range o.State {
		got = append(got, fmt.Sprintf("%d/%s=%s %v", s.KeyIdx, s.Sub, s.Value, s.Delete))
	}
	if want := "[0/=44 false 1/=2 false 2/=43 false]"; fmt.Sprint(got) != want {
		t.Fatalf("state %v, want %s", got, want)
	}
}

// Sub-keys, deletes, timers and errors.
func TestProcessSubKeysTimers(t *testing.T) {
	Register(Operator{
		OnRecord: func(c *Context, r Record) error {
			if string(r.Value) == "err" {
				return errors.New("boom")
			}
			if string(r.Value) == "panic" {
				panic("bang")
			}
			v, _ := c.Get("s")
			c.Put("s", append(bytes.Clone(v), r.Value...))
			c.Delete("")
			c.RegisterEventTimer(r.Time + 10)
			return nil
		},
		OnTimer: func(c *Context, tm Timer) error {
			c.Emit(c.Key(), []byte("t"), tm.Time)
			c.Log(LevelWarn, "fired")
			return nil
		},
	})
	in := &abi.Input{
		Keys:    []abi.Key{{Key: []byte("a"), Fetch: abi.Absent}, {Key: []byte("b"), Fetch: abi.Present, Value: []byte("x")}},
		Timers:  []abi.Timer{{KeyIdx: 1, Time: 3, Processing: true}},
		Records: []abi.Record{{KeyIdx: 0, Value: []byte("1")}, {KeyIdx: 1, Value: []byte("2")}, {KeyIdx: 0, Value: []byte("3")}},
	}
	var o abi.Output
	if err := abi.DecodeOutput(process(abi.AppendInput(nil, in)), &o); err != nil || o.Failed {
		t.Fatal(err, string(o.ErrMsg))
	}
	got := fmt.Sprintf("%d %s %d %d %d ", len(o.Emits), o.Emits[0].Key, o.Emits[0].Source, len(o.Logs), len(o.Timers))
	for _, s := range o.State {
		got += fmt.Sprintf("%d/%s=%s,%v ", s.KeyIdx, s.Sub, s.Value, s.Delete)
	}
	if want := "1 b -1 1 3 0/=,true 1/=,true 0/s=13,false 1/s=2,false "; got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	for _, c := range []struct {
		val  string
		src  int32
		want string
	}{{"err", 1, "boom"}, {"panic", 1, "panic: bang"}} {
		in.Records[1].Value = []byte(c.val)
		if err := abi.DecodeOutput(process(abi.AppendInput(nil, in)), &o); err != nil {
			t.Fatal(err)
		}
		if !o.Failed || o.ErrSource != c.src || string(o.ErrMsg) != c.want {
			t.Fatalf("%s: failed %v source %d msg %q", c.val, o.Failed, o.ErrSource, o.ErrMsg)
		}
	}
}

// Many sub-keys of several keys in one call: the overlay grows its table,
// reads its own writes under each (key, sub-key) apart, keeps a sub-key
// passed from a buffer the caller reuses, and starts the next call empty.
func TestProcessManySubKeys(t *testing.T) {
	const subsPerRecord = 50
	var sub []byte
	Register(Operator{OnRecord: func(c *Context, r Record) error {
		for i := range subsPerRecord {
			sub = strconv.AppendInt(append(sub[:0], 's'), int64(i), 10)
			v, _ := c.Get(string(sub))
			n, _ := strconv.Atoi(string(v))
			c.Put(string(sub), strconv.AppendInt(nil, int64(n+1), 10))
		}
		v, ok := c.Get("s7")
		c.Emit(r.Key, fmt.Appendf(nil, "%s %v", v, ok), r.Time)
		return nil
	}})
	in := &abi.Input{Keys: []abi.Key{{Key: []byte("a"), Fetch: abi.Absent}, {Key: []byte("b"), Fetch: abi.Absent}}}
	for i := range 5 {
		in.Records = append(in.Records, abi.Record{KeyIdx: uint32(i % 2), Value: []byte("x")})
	}
	for call := range 3 {
		var o abi.Output
		if err := abi.DecodeOutput(process(abi.AppendInput(nil, in)), &o); err != nil || o.Failed {
			t.Fatal(err, string(o.ErrMsg))
		}
		var got []string
		for _, e := range o.Emits {
			got = append(got, string(e.Key)+"="+string(e.Value))
		}
		// Outside wasip1 the host has no state: each call starts from none.
		if want := "[a=1 true b=1 true a=2 true b=2 true a=3 true]"; fmt.Sprint(got) != want {
			t.Fatalf("call %d: emits %v, want %s", call, got, want)
		}
		if len(o.State) != 2*subsPerRecord {
			t.Fatalf("call %d: %d state writes, want %d", call, len(o.State), 2*subsPerRecord)
		}
		for i, s := range o.State {
			wantSub := "s" + strconv.Itoa(i%subsPerRecord)
			wantVal := map[uint32]string{0: "3", 1: "2"}[s.KeyIdx]
			if s.KeyIdx != uint32(i/subsPerRecord) || string(s.Sub) != wantSub || string(s.Value) != wantVal {
				t.Fatalf("call %d: state write %d is %d/%s=%s, want %d/%s=%s", call, i, s.KeyIdx, s.Sub, s.Value, i/subsPerRecord, wantSub, wantVal)
			}
		}
	}
}

// A malformed input fails the call (never a panic out of process) with no
// source.
func TestProcessMalformed(t *testing.T) {
	Register(countOp)
	good := countInput(3, 2)
	var o abi.Output
	check := func(what string, b []byte) {
		t.Helper()
		if err := abi.DecodeOutput(process(b), &o); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !o.Failed || o.ErrSource != abi.ProgressIdle || !bytes.HasPrefix(o.ErrMsg, []byte("sdk: malformed input")) {
			t.Fatalf("%s: failed %v source %d msg %q", what, o.Failed, o.ErrSource, o.ErrMsg)
		}
	}
	for n := range len(good) {
		check(fmt.Sprintf("truncated at %d", n), good[:n])
	}
	check("trailing bytes", append(bytes.Clone(good), 0))
	bad := bytes.Clone(good)
	bad[0] = 2
	check("version", bad)
	check("key index", abi.AppendInput(nil, &abi.Input{Keys: []abi.Key{{Key: []byte("k")}}, Records: []abi.Record{{KeyIdx: 1}}}))
	check("timer key index", abi.AppendInput(nil, &abi.Input{Keys: []abi.Key{{Key: []byte("k")}}, Timers: []abi.Timer{{KeyIdx: 1}}}))
}

func BenchmarkProcessCount(b *testing.B) {
	Register(countOp)
	in := countInput(256, 150)
	b.ReportAllocs()
	for b.Loop() {
		process(in)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*256), "ns/record")
}
