package e2e

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"cairn/engine"
	"cairn/operators/builtin"
	"cairn/state"
	"cairn/wasm"
)

// pebbleState is the engine's view of a keyed stage's state over a real
// Pebble slot DB (what engine's slot does), for operator benchmarks.
type pebbleState struct {
	db  *state.DB
	kgs int
}

func (v pebbleState) Get(key, sub []byte) ([]byte, bool, error) {
	return v.db.Get(engine.KeyedStageID, state.KeyGroup(key, v.kgs), key, sub)
}

func (v pebbleState) Scan(key, prefix []byte, fn func(sub, value []byte) error) error {
	return v.db.Scan(engine.KeyedStageID, state.KeyGroup(key, v.kgs), key, prefix, fn)
}

// BenchmarkOperatorCount compares the keyed count as WASM (per-call deadline
// off and on) and as native Go on the same path: batches of Zipf-skewed keys
// from 100k, state read from and written to a real Pebble DB in one batch per
// call. Reports ns/record.
func BenchmarkOperatorCount(b *testing.B) {
	ctx := context.Background()
	rt, err := wasm.NewRuntime(ctx, wasm.RuntimeConfig{CacheDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close(ctx)
	code, _ := builtin.Lookup("count")
	mod, err := rt.Compile(ctx, "count", code)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		op   func() (engine.Operator, error)
	}{
		{"native", func() (engine.Operator, error) { return engine.NewNativeCount(ctx, 0) }},
		{"wasm-deadline-off", func() (engine.Operator, error) {
			return mod.Instantiate(ctx, wasm.InstanceConfig{Stage: "count", Slot: 0})
		}},
		{"wasm-deadline-5s", func() (engine.Operator, error) {
			return mod.Instantiate(ctx, wasm.InstanceConfig{Stage: "count", Slot: 0, Deadline: 5e9})
		}},
	} {
		benchCountOp(b, tc.name, tc.op)
	}
}

const benchKeyGroups, benchBatchSize = 128, 1024

// countBatches are the benchmark's input: 64 batches of Zipf-skewed keys
// from 100k, the same for every operator.
var countBatches = sync.OnceValue(func() []*wasm.Batch {
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.2, 1, 100000-1)
	var batches []*wasm.Batch
	for range 64 {
		bt := &wasm.Batch{Watermark: math.MinInt64}
		for i := range benchBatchSize {
			bt.Records = append(bt.Records, wasm.Record{Seq: uint64(i), Key: fmt.Appendf(nil, "key-%d", zipf.Uint64()), Value: []byte("x"), Time: int64(i)})
		}
		batches = append(batches, bt)
	}
	return batches
})

// benchCountOp runs a keyed count operator over countBatches, its state in
// a real Pebble DB (read through the State, written in one batch per
// call), as sub-benchmark name. Reports ns/record.
func benchCountOp(b *testing.B, name string, newOp func() (engine.Operator, error)) {
	ctx := context.Background()
	batches := countBatches()
	kgs := benchKeyGroups
	b.Run(name, func(b *testing.B) {
		db, err := state.Open(b.TempDir(), state.Options{KeyGroups: kgs, Range: state.KeyGroupRange{First: 0, Last: kgs - 1}})
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		op, err := newOp()
		if err != nil {
			b.Fatal(err)
		}
		defer op.Close(ctx)
		st := pebbleState{db: db, kgs: kgs}
		b.ResetTimer()
		for k := 0; k < b.N; k++ {
			bt := batches[k%len(batches)]
			out, err := op.Process(ctx, bt, st)
			if err != nil {
				b.Fatal(err)
			}
			batch := db.NewBatch()
			for _, s := range out.State {
				batch.Put(engine.KeyedStageID, state.KeyGroup(s.Key, kgs), s.Key, s.Sub, s.Value)
			}
			if err := batch.Commit(); err != nil {
				b.Fatal(err)
			}
			batch.Close()
		}
		b.StopTimer()
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatchSize), "ns/record")
	})
}
