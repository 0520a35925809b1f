package engine

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/state"
	"cairn/wasm"
)

// callCounter is a keyed operator that emits each record and counts its
// calls; it reads and writes no state, so the value cache never learns
// its key and every prefetch of the key is counted.
type callCounter struct{ calls *atomic.Int64 }

func (c callCounter) Process(_ context.Context, b *wasm.Batch, _ wasm.State) (*wasm.Output, error) {
	c.calls.Add(1)
	out := &wasm.Output{}
	for i, r := range b.Records {
		out.Emits = append(out.Emits, wasm.Emit{Key: r.Key, Value: []byte("x"), Time: r.Time, Input: i})
	}
	return out, nil
}

func (callCounter) Close(context.Context) error { return nil }

// TestPrefetchOncePerItem: while an online restore's files are remote, a
// slot fetches the state of a whole item's keys together before its first
// call. The item here is 40 records of one key, ingested 20 ms apart, so
// the slot splits it into 40 calls (one per processing-clock step, as in a
// replay of a slow input); fetching per call would read the key 40 times,
// one round trip after another on a real link.
func TestPrefetchOncePerItem(t *testing.T) {
	defer state.SetPrefetch(state.PrefetchAuto)
	state.SetPrefetch(state.PrefetchOn)
	// A remote file of no DB's: the process has a restore still remote.
	rs := state.NewRemoteSet()
	defer rs.Close()
	if err := rs.Add(filepath.Join(t.TempDir(), "000001.sst"), state.RemoteObject{Name: "000001.sst", Size: 4 << 10}); err != nil {
		t.Fatal(err)
	}

	var calls atomic.Int64
	b := NewMemLog(0)
	const n = 40
	var msgs []Message
	for i := range n {
		msgs = append(msgs, Message{
			Subject: "in.k", Header: nats.Header{HeaderTime: {"1000"}},
			Data: []byte("v"), TsNanos: int64(1000+20*i) * int64(time.Millisecond),
		})
	}
	b.Append(msgs...) // before the run: one pipeline batch, one slot item
	cfg := Config{
		Job: "prefetch", KeyGroups: 8, Slots: 1,
		InputStream: "IN", InputSubjects: []string{"in.>"},
		Stages:       []Stage{{Name: "count", Keyed: true, New: func(context.Context, int) (Operator, error) { return callCounter{&calls}, nil }}},
		OutputStream: "OUT", OutputSubject: "out",
		DataDir: t.TempDir(), BatchSize: 64,
		Logger:                  quietLogger(),
		ProcessingTimerInterval: time.Hour,
		TTLSweepInterval:        time.Hour,
	}
	e, err := NewWithBroker(cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	before := state.Prefetched()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for e.Stats().ProcessedSeq < n {
		if time.Now().After(deadline) {
			t.Fatalf("input not processed through seq %d", n)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	prefetched := state.Prefetched() - before
	// The calls show the records were split as a replay's are; the
	// prefetches, that the key was fetched once per item (a pipeline
	// batch may still come in a few pieces), not once per call.
	if c := calls.Load(); c < n {
		t.Fatalf("%d calls for %d records 20 ms apart: the clock did not split them", c, n)
	}
	if prefetched < 1 || prefetched > 5 {
		t.Fatalf("the key was prefetched %d times over %d calls; want once per slot item", prefetched, calls.Load())
	}
}
