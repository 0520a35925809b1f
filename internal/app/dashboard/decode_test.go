package dashboard

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// TestDecodeSnapshotRoundTrip: what DecodeSnapshot reads back from /api/snapshot encodes
// to the same JSON again, so a supervisor shows its job's figures unchanged.
func TestDecodeSnapshotRoundTrip(t *testing.T) {
	s := newFakeSource().Snapshot()
	s.Restores[0].CaughtUp = 1500 * time.Millisecond
	s.Restores[0].CheckpointDuration = 80 * time.Millisecond
	s.Story = &Story{Phase: "catching up", Progress: -1, Lines: []string{"kill -9", "restored in 30ms"}}
	now := time.Now()
	first, err := json.Marshal(newAPISnapshot(s, now))
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeSnapshot(first)
	if err != nil {
		t.Fatal(err)
	}
	again, err := json.Marshal(newAPISnapshot(back, now))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, again) {
		t.Fatalf("round trip changed the snapshot:\n%s\n%s", first, again)
	}
	if _, err := DecodeSnapshot([]byte("{")); err == nil {
		t.Fatal("a truncated document decoded")
	}
}
