package wasm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"cairn/operators/abi"
)

// The host's input encoder must produce what the SDK's decoder reads back:
// deduplicated keys with prefetched state for keyed stages, one key per
// timer and record for stateless ones.
func TestEncodeInputRoundTrip(t *testing.T) {
	st := newMemState()
	st.m["a"] = map[string][]byte{"": []byte("7")}
	b := &Batch{
		Records:   []Record{rec(1, "a", "v1", 10), rec(2, "b", "v2", 11), rec(3, "a", "", 12)},
		Timers:    []Timer{{Key: []byte("b"), Time: 5, Domain: ProcessingTime}, {Key: []byte("c"), Time: 6}},
		Watermark: math.MinInt64, ProcTime: 123,
	}
	for _, keyed := range []bool{true, false} {
		var e encoder
		var s State
		if keyed {
			s = st
		}
		if err := e.encode(b, s); err != nil {
			t.Fatal(err)
		}
		var in abi.Input
		if err := abi.DecodeInput(e.buf, &in); err != nil {
			t.Fatal(err)
		}
		if in.Watermark != b.Watermark || in.ProcTime != 123 || len(in.Records) != 3 || len(in.Timers) != 2 {
			t.Fatalf("header/counts: %+v", in)
		}
		for j, r := range in.Records {
			if !bytes.Equal(in.Keys[r.KeyIdx].Key, b.Records[j].Key) || !bytes.Equal(r.Value, b.Records[j].Value) || r.Time != b.Records[j].Time {
				t.Fatalf("record %d: %+v", j, r)
			}
		}
		for j, tm := range in.Timers {
			if !bytes.Equal(in.Keys[tm.KeyIdx].Key, b.Timers[j].Key) || tm.Time != b.Timers[j].Time || tm.Processing != (b.Timers[j].Domain == ProcessingTime) {
				t.Fatalf("timer %d: %+v", j, tm)
			}
		}
		var got []string
		for _, k := range in.Keys {
			got = append(got, fmt.Sprintf("%s:%d:%s", k.Key, k.Fetch, k.Value))
		}
		want := "[b:1: c:1: a:2:7]" // timers' keys first, then records', deduplicated
		if !keyed {
			want = "[b:0: c:0: a:0: b:0: a:0:]"
		}
		if fmt.Sprint(got) != want {
			t.Fatalf("keyed=%v keys %v, want %s", keyed, got, want)
		}
	}
}

func TestDecodeOutputHost(t *testing.T) {
	keys := [][]byte{[]byte("k0"), []byte("k1")}
	o := &abi.Output{
		Emits:  []abi.Emit{{Source: 1, Time: 5, Key: []byte("x"), Value: []byte("y")}, {Source: abi.TimerSource(0), Time: 6, Key: []byte("z")}},
		State:  []abi.StateOp{{KeyIdx: 1, Sub: []byte("s"), Value: []byte("v")}, {KeyIdx: 0, Delete: true}},
		Timers: []abi.TimerOp{{KeyIdx: 0, Time: 9, Processing: true, Delete: true}},
		Logs:   []abi.Log{{Level: 4, Msg: []byte("hi")}},
	}
	var scratch abi.Output
	out, gf, err := decodeOutput(abi.AppendOutput(nil, o), &scratch, 2, 1, keys, true, 1)
	if err != nil || gf != nil {
		t.Fatal(err, gf)
	}
	want := "x=y@5/1,-1 z=@6/-1,0 | k1/s=v false k0/= true | k0@9 d1 true | 4 hi"
	got := emitsString(out) + " |"
	for _, s := range out.State {
		got += fmt.Sprintf(" %s/%s=%s %v", s.Key, s.Sub, s.Value, s.Delete)
	}
	got += " |"
	for _, tm := range out.Timers {
		got += fmt.Sprintf(" %s@%d d%d %v", tm.Key, tm.Time, tm.Domain, tm.Delete)
	}
	got += " |"
	for _, l := range out.Logs {
		got += fmt.Sprintf(" %d %s", l.Level, l.Msg)
	}
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	// Out-of-range references are refused.
	for _, bad := range []*abi.Output{
		{Emits: []abi.Emit{{Source: 2}}},
		{Emits: []abi.Emit{{Source: abi.TimerSource(1)}}},
		{Emits: []abi.Emit{{Source: math.MinInt32}}},
		{State: []abi.StateOp{{KeyIdx: 2}}},
		{Timers: []abi.TimerOp{{KeyIdx: 7}}},
	} {
		if _, _, err := decodeOutput(abi.AppendOutput(nil, bad), &scratch, 2, 1, keys, true, 1); !errors.Is(err, ErrBadOutput) {
			t.Fatalf("%+v accepted: %v", bad, err)
		}
	}
	// An emit to a port the stage has is kept with its port; one past
	// the stage's ports is refused.
	ported := &abi.Output{Emits: []abi.Emit{{Port: 2, Source: 0, Key: []byte("p")}}}
	if out, _, err := decodeOutput(abi.AppendOutput(nil, ported), &scratch, 2, 1, keys, true, 3); err != nil || out.Emits[0].Port != 2 {
		t.Fatalf("port 2 of 3: %v %+v", err, out)
	}
	if _, _, err := decodeOutput(abi.AppendOutput(nil, ported), &scratch, 2, 1, keys, true, 2); !errors.Is(err, ErrBadOutput) {
		t.Fatalf("port 2 of 2 accepted: %v", err)
	}
	// State writes from a stateless stage are refused.
	if _, _, err := decodeOutput(abi.AppendOutput(nil, &abi.Output{State: o.State}), &scratch, 2, 1, keys, false, 1); !errors.Is(err, ErrBadOutput) {
		t.Fatal(err)
	}
	// A guest failure comes back with its source and message.
	_, gf, err = decodeOutput(abi.AppendOutput(nil, &abi.Output{Failed: true, ErrSource: 1, ErrMsg: []byte("boom")}), &scratch, 2, 1, keys, true, 1)
	if err != nil || gf == nil || gf.source != 1 || gf.msg != "boom" {
		t.Fatal(err, gf)
	}
}

// FuzzDecodeOutput feeds arbitrary bytes as a guest's output buffer: the
// host must never panic, and whatever it accepts references only the batch.
func FuzzDecodeOutput(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 8 {
		o := &abi.Output{}
		for range r.IntN(4) {
			o.Emits = append(o.Emits, abi.Emit{Source: int32(r.IntN(5) - 2), Time: r.Int64(), Key: []byte("k"), Value: []byte("v")})
			o.State = append(o.State, abi.StateOp{KeyIdx: uint32(r.IntN(3)), Sub: []byte("s"), Value: []byte("x")})
			o.Timers = append(o.Timers, abi.TimerOp{KeyIdx: uint32(r.IntN(3)), Time: r.Int64()})
			o.Logs = append(o.Logs, abi.Log{Level: 0, Msg: []byte("m")})
		}
		f.Add(abi.AppendOutput(nil, o))
	}
	f.Add([]byte{abi.Version, abi.TagError, 1, 0, 0, 0, 2, 0, 0, 0, 'h', 'i'})
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("c")}
	f.Fuzz(func(t *testing.T, b []byte) {
		var scratch abi.Output
		out, gf, err := decodeOutput(b, &scratch, 3, 2, keys, true, 1)
		if err != nil {
			if !errors.Is(err, ErrBadOutput) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if gf != nil {
			return
		}
		for _, e := range out.Emits {
			if (e.Input < 0 || e.Input >= 3) && (e.Input != -1 || e.Timer < 0 || e.Timer >= 2) {
				t.Fatalf("emit out of range: %+v", e)
			}
		}
		for _, s := range out.State {
			if s.Key == nil {
				t.Fatal("state op without key")
			}
		}
	})
}

// --- benchmarks -----------------------------------------------------------

// zipfBatch returns a batch of n records over 10k keys, Zipf-distributed
// (a few hot keys, a long tail).
func zipfBatches(n, count int) []*Batch {
	r := rand.New(rand.NewPCG(42, 42))
	z := rand.NewZipf(r, 1.1, 1, 9999)
	var bs []*Batch
	seq := uint64(0)
	for range count {
		b := &Batch{Watermark: math.MinInt64}
		for range n {
			seq++
			b.Records = append(b.Records, Record{Seq: seq, Key: fmt.Appendf(nil, "user-%05d", z.Uint64()), Value: []byte("payload-64-bytes-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), Time: int64(seq)})
		}
		bs = append(bs, b)
	}
	return bs
}

func BenchmarkCountBatch(b *testing.B) {
	for _, deadline := range []time.Duration{0, time.Second} {
		for _, n := range []int{256, 1024} {
			name := fmt.Sprintf("deadline=%v/batch=%d", deadline, n)
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				i := instance(b, "count", InstanceConfig{Deadline: deadline})
				st := newMemState()
				batches := zipfBatches(n, 16)
				b.ReportAllocs()
				b.ResetTimer()
				for k := 0; k < b.N; k++ {
					out, err := i.Process(ctx, batches[k%len(batches)], st)
					if err != nil {
						b.Fatal(err)
					}
					st.apply(out.State)
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
			})
		}
	}
}

// BenchmarkEmptyCall is one call with a one-record batch through a
// stateless pass-through: the fixed cost of a call.
func BenchmarkEmptyCall(b *testing.B) {
	for _, deadline := range []time.Duration{0, time.Second} {
		b.Run(fmt.Sprintf("deadline=%v", deadline), func(b *testing.B) {
			ctx := context.Background()
			i := instance(b, "trap", InstanceConfig{Deadline: deadline})
			batch := &Batch{Records: []Record{rec(1, "k", "v", 1)}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := i.Process(ctx, batch, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
