package state

import (
	"fmt"
	"testing"
)

// BenchmarkSweepWithoutTTL is what one sweep call cost a slot before a DB
// without a TTL stopped sweeping: a pass over 200k value entries none of
// which can expire (the old call examined up to 640k per second, on the
// slot's goroutine), and what a call costs now once a clean pass is done.
//
//	go test ./state -run '^$' -bench SweepWithoutTTL -benchtime 20x
func BenchmarkSweepWithoutTTL(b *testing.B) {
	d := openDB(b, b.TempDir(), testOptions())
	const entries = 200_000
	batch := d.NewBatch()
	for i := range entries {
		batch.Put(1, i%testKGs, []byte(fmt.Sprintf("user-%07d", i)), nil, []byte("v"))
	}
	commit(b, batch)
	b.Run("pass-200k", func(b *testing.B) {
		for range b.N {
			d.mu.noSweep, d.mu.sweepCursor = false, nil
			if n, err := d.SweepExpired(entries / sweepScanFactor); err != nil || n != 0 {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("after-clean-pass", func(b *testing.B) {
		if d.NeedsSweep() {
			b.Fatal("a clean pass without a TTL left the DB needing sweeps")
		}
		for range b.N {
			if _, err := d.SweepExpired(1000); err != nil {
				b.Fatal(err)
			}
		}
	})
}
