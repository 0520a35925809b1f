package recovery

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/checkpoint"
)

// TestFullRestoreCatchesAbsorbedBitFlip: some flipped bits of a full
// checkpoint's data object change nothing zstd decodes (its headers and
// tables carry bits it does not need), so every segment still decodes to
// the right records. A restore onto the same slot count reads the whole
// object and refuses it by its SHA-256, naming it; so does verify. The test
// first finds such a bit, and fails when it finds none (then it shows
// nothing).
func TestFullRestoreCatchesAbsorbedBitFlip(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil, 32, 2, checkpoint.ModeFull, 21)
	e.write(4000, 20000, 20, 0)
	m, _ := e.checkpoint("")
	var data checkpoint.Object
	for _, o := range m.Objects {
		if o.Kind == checkpoint.KindFullData && o.Slot == 0 {
			data = o
		}
	}
	x, err := checkpoint.ReadIndex(ctx, e.store, m, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(e.storeRoot, filepath.FromSlash(data.Path))
	orig, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// Every segment still decodes, to as many records as its index says.
	decodes := func() bool {
		for _, seg := range x.Segments {
			if err := checkpoint.ReadSegmentTo(ctx, e.store, m, 0, x, seg.KeyGroup, io.Discard, func(_, _ []byte) error { return nil }); err != nil {
				return false
			}
		}
		return true
	}
	found := false
	for i := 0; i < len(orig) && !found; i++ {
		for bit := range 8 {
			b := append([]byte(nil), orig...)
			b[i] ^= 1 << bit
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if decodes() {
				t.Logf("byte %d bit %d of %s (%d bytes) is absorbed", i, bit, data.Path, len(orig))
				found = true
				break
			}
		}
	}
	if !found {
		t.Fatal("no absorbed bit flip found: the test shows nothing")
	}
	_, err = Restore(ctx, m, e.opts(t.TempDir(), 2))
	if !checkpoint.IsCorruption(err) {
		t.Fatalf("restore over an absorbed bit flip: %v, want a corruption error", err)
	}
	if err := err.Error(); !strings.Contains(err, data.Path) {
		t.Fatalf("the error does not name %s: %s", data.Path, err)
	}
	if err := os.WriteFile(p, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, m, e.opts(t.TempDir(), 2)); err != nil {
		t.Fatalf("the intact object: %v", err)
	}
}
