package engine

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
)

// BenchmarkSinkBatchFences publishes through a fast-batch sink with a
// fence every `every` outputs that the publisher does not wait for, as a
// slot's checkpoint barrier does: what each fence costs the outputs after
// it (a new batch waits for the commit of the one before it).
//
//	go test ./engine -run '^$' -bench SinkBatchFences -count 3
func BenchmarkSinkBatchFences(b *testing.B) {
	for _, every := range []int{2_000, 20_000, 200_000} {
		b.Run(fmt.Sprintf("every=%d", every), func(b *testing.B) {
			nc := benchServer(b, true)
			cfg := Config{Job: "bench", KeyGroups: 128, OutputStream: "OUT", OutputSubject: "out", Delivery: ExactlyOnce}
			br, err := NewNATSBroker(nc, cfg)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := br.Prepare(context.Background(), PrepareRequest{}); err != nil {
				b.Fatal(err)
			}
			failed := make(chan struct{})
			var once sync.Once
			var ferr error
			pub, err := br.NewPublisher(0, true, func(err error) { once.Do(func() { ferr = err; close(failed) }) }, failed)
			if err != nil {
				b.Fatal(err)
			}
			s := pub.(*sink)
			next := make([]uint64, 128)
			value := make([]byte, 8)
			b.ResetTimer()
			for i := range b.N {
				kg := i % 128
				next[kg]++
				if err := s.Publish(Output{KeyGroup: kg, Index: next[kg], Key: []byte("key"), Value: value, Time: 1, Wm: math.MinInt64}); err != nil {
					b.Fatal(err)
				}
				if i%every == every-1 {
					_ = s.Fence()
				}
			}
			select {
			case <-s.Fence():
			case <-failed:
				b.Fatal(ferr)
			}
		})
	}
}
