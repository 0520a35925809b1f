package par

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

func TestDoBoundsAndStopsOnError(t *testing.T) {
	var running, peak, calls atomic.Int32
	err := Do(context.Background(), 100, 3, func(ctx context.Context, i int) error {
		calls.Add(1)
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		switch {
		case i < 10:
			return nil
		case i == 10:
			return errors.New("boom")
		}
		<-ctx.Done() // calls after the failing one wait for its cancellation
		return nil
	})
	if err == nil || err.Error() != "boom" {
		t.Fatalf("err %v, want boom", err)
	}
	if peak.Load() > 3 {
		t.Fatalf("%d calls ran at once, limit 3", peak.Load())
	}
	// Calls 0-10 and up to 2 running beside the failing one; the call
	// that waited in Go for a free slot does not start after the failure.
	if c := calls.Load(); c > 13 {
		t.Fatalf("%d calls started; at most 13 may start when call 11 fails", c)
	}
}

func TestDoAll(t *testing.T) {
	var sum atomic.Int64
	if err := Do(context.Background(), 1000, 0, func(_ context.Context, i int) error { sum.Add(int64(i)); return nil }); err != nil {
		t.Fatal(err)
	}
	if sum.Load() != 999*1000/2 {
		t.Fatalf("sum %d", sum.Load())
	}
}

// TestDoCancelled: a caller's context that ends before every call ran is an
// error, never a silent success with calls skipped.
func TestDoCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var calls atomic.Int32
	err := Do(ctx, 10, 2, func(context.Context, int) error { calls.Add(1); return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with a cancelled context: %v after %d calls, want context.Canceled", err, calls.Load())
	}
}
