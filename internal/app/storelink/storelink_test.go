package storelink

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"cairn/checkpoint"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Link
		str  string
	}{
		{"25MB/s,20ms", Link{25e6, 20 * time.Millisecond}, "25MB/s,20ms"},
		{"8MiB/s", Link{8 << 20, 0}, "8MiB/s"},
		{"5ms", Link{0, 5 * time.Millisecond}, "5ms"},
		{"off", Link{}, "off"},
		{"", Link{}, "off"},
	} {
		got, err := Parse(c.in)
		if err != nil || got != c.want || got.String() != c.str {
			t.Errorf("Parse(%q) = %+v (%q), %v; want %+v (%q)", c.in, got, got.String(), err, c.want, c.str)
		}
		if back, err := Parse(got.String()); err != nil || back != got {
			t.Errorf("Parse(%q) does not round-trip: %+v, %v", got.String(), back, err)
		}
	}
	for _, bad := range []string{"fast", "25MB/s,20ms,30ms", "1MB/s,2MB/s", "-5ms", "0MB/s"} {
		if _, err := Parse(bad); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q): %v, want ErrSyntax", bad, err)
		}
	}
}

// TestWrap reads and writes a real file store through a link and checks
// that the link costs what it says: the latency per request and the
// bandwidth per byte.
func TestWrap(t *testing.T) {
	ctx := context.Background()
	inner, err := checkpoint.NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	if got := (Link{}).Wrap(inner); got != inner {
		t.Fatal("an off link wraps the store")
	}
	data := bytes.Repeat([]byte("x"), 1<<20)
	if err := inner.Put(ctx, "a/obj", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	s := Link{Bandwidth: 4 << 20, Latency: 50 * time.Millisecond}.Wrap(inner)

	start := time.Now()
	if _, err := s.Stat(ctx, "a/obj"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("a stat took %s, under the link's latency of 50ms", d)
	}

	start = time.Now()
	rc, err := s.Get(ctx, "a/obj")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	_ = rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes through the link, %v", len(got), err)
	}
	// 1 MiB at 4 MiB/s, less the limiter's burst (1/20 s), plus 50 ms.
	if d := time.Since(start); d < 200*time.Millisecond+50*time.Millisecond {
		t.Errorf("1 MiB through a 4 MiB/s link with 50ms latency took %s", d)
	}

	ctx2, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Get(ctx2, "a/obj"); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled read: %v", err)
	}
}
