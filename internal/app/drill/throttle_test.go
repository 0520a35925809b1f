package drill

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"cairn/checkpoint"
)

// TestThrottleHoldsRate moves a few seconds' worth of bytes through a
// ThrottledStore in each direction, with parallel transfers sharing the
// link, and checks the achieved rate is within 10% of the limit.
func TestThrottleHoldsRate(t *testing.T) {
	ctx := context.Background()
	inner, err := checkpoint.OpenStore(ctx, "file://"+t.TempDir()+"?create_dir=true")
	if err != nil {
		t.Fatal(err)
	}
	const rate = 4 << 20 // bytes/s each way
	const objects, size = 4, 3 << 20
	s := NewThrottledStore(inner, rate)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}

	check := func(dir string, moved int64, d time.Duration) {
		t.Helper()
		got := float64(moved) / d.Seconds()
		t.Logf("%s: %d bytes in %s: %.2f MiB/s (limit %.2f MiB/s)", dir, moved, d.Round(time.Millisecond), got/(1<<20), float64(rate)/(1<<20))
		// Above the limit is the throttle's fault; below it, a loaded
		// machine's (the race detector, other processes), unless far below.
		if got > 1.1*rate || got < 0.5*rate {
			t.Errorf("%s: rate %.0f B/s is not between 50%% and 110%% of %d B/s", dir, got, rate)
		}
	}
	parallel := func(fn func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, objects)
		for i := range objects {
			wg.Go(func() { errs[i] = fn(i) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	start := time.Now()
	parallel(func(i int) error {
		return s.Put(ctx, fmt.Sprintf("job/obj-%d", i), bytes.NewReader(data))
	})
	check("upload", s.BytesUp(), time.Since(start))

	start = time.Now()
	parallel(func(i int) error {
		rc, err := s.Get(ctx, fmt.Sprintf("job/obj-%d", i))
		if err != nil {
			return err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err == nil && !bytes.Equal(b, data) {
			err = fmt.Errorf("object %d: content differs", i)
		}
		return err
	})
	check("download", s.BytesDown(), time.Since(start))
}

// TestLimiterNil checks that a zero bandwidth does not limit.
func TestLimiterNil(t *testing.T) {
	if l := NewLimiter(0); l != nil {
		t.Fatalf("NewLimiter(0) = %v, want nil", l)
	}
	var l *Limiter
	if err := l.Wait(context.Background(), 1<<30); err != nil {
		t.Fatal(err)
	}
}

// TestBusyDownCountsOpenReads: the busy time grows only while a read is
// open, and overlapping reads count once.
func TestBusyDownCountsOpenReads(t *testing.T) {
	ctx := context.Background()
	inner, err := checkpoint.OpenStore(ctx, "file://"+t.TempDir()+"?create_dir=true")
	if err != nil {
		t.Fatal(err)
	}
	s := NewThrottledStore(inner, 0)
	if err := s.Put(ctx, "a", bytes.NewReader([]byte("hello"))); err != nil {
		t.Fatal(err)
	}
	if d := s.BusyDown(); d != 0 {
		t.Fatalf("busy %v before any read", d)
	}
	r1, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.GetRange(ctx, "a", 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "missing"); err == nil {
		t.Fatal("no error for a missing object")
	}
	_ = r1.Close()
	_ = r1.Close() // a second Close must not end the interval of r2
	if s.busy.open != 1 {
		t.Fatalf("%d reads open, want 1", s.busy.open)
	}
	_ = r2.Close()
	d := s.BusyDown()
	if d <= 0 || s.BusyDown() != d {
		t.Fatalf("busy %v then %v: want a positive time that does not grow while no read is open", d, s.BusyDown())
	}
}
