package state

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"testing"
)

// TestRemoteRemaining checks Remaining's bytes, derived from the count of
// missing chunks, against the chunks themselves as reads fill them in any
// order, the short last chunk included.
func TestRemoteRemaining(t *testing.T) {
	const size = 3*RemoteChunk + RemoteChunk/2
	content := bytes.Repeat([]byte{7}, size)
	s := NewRemoteSet()
	defer s.Close()
	err := s.Add(filepath.Join(t.TempDir(), "000001.sst"), RemoteObject{
		Name: "obj", Size: size,
		Fetch: func(_ context.Context, off, n int64) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(content[off : off+n])), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := s.files[0]
	want := func() int64 {
		var n int64
		for c, ok := range r.have {
			if !ok {
				n += min(int64(c+1)*RemoteChunk, size) - int64(c)*RemoteChunk
			}
		}
		return n
	}
	check := func(step string) {
		t.Helper()
		if _, got := s.Remaining(); got != want() {
			t.Fatalf("%s: Remaining says %d bytes, the chunks %d", step, got, want())
		}
	}
	check("nothing fetched")
	for _, c := range []int64{3, 1, 0, 2} { // the short last chunk first
		if err := r.fill(context.Background(), c*RemoteChunk, 1, nil); err != nil {
			t.Fatal(err)
		}
		check("after a read of chunk " + string(rune('0'+c)))
	}
	if files, b := s.Remaining(); b != 0 || files != 1 {
		t.Fatalf("all fetched, not verified: Remaining = %d files, %d bytes; want 1, 0", files, b)
	}
}
