package dashboard

import (
	"bytes"
	"encoding/json"
	"math"
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
	s.SubTopologies = []SubTopology{
		{Name: "topwords", Slots: 2, RecordsIn: 900, RecordsOut: 4000, ProcessedSeq: 900, StreamLastSeq: 950, Watermark: math.MinInt64, StateBytes: 1 << 20, GraphCheckpoint: 7, GraphPart: 7},
		{Name: "topwords.s1", Slots: 1, RecordsIn: 4000, RecordsOut: 30, ProcessedSeq: 3990, StreamLastSeq: 4012, Watermark: 1_700_000_000_000, GraphCheckpoint: 7, GraphPart: 6},
	}
	s.Stages = []StageStats{
		{SubTopology: "topwords", Stage: "split", RecordsIn: 900, RecordsOut: 4000},
		{SubTopology: "topwords", Stage: "count", Keyed: true, RecordsIn: 4000, RecordsOut: 4000, DeadLetters: 2},
	}
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
	api := newAPISnapshot(s, now)
	if len(api.Stages) != 2 || api.Stages[1].Stage != "count" || !api.Stages[1].Keyed || api.Stages[1].DeadLetters != 2 {
		t.Errorf("stages in the API: %+v", api.Stages)
	}
	if len(api.SubTopologies) != 2 || api.SubTopologies[0].Lag != 50 || api.SubTopologies[1].Lag != 22 ||
		api.SubTopologies[0].WatermarkMs != nil || *api.SubTopologies[1].WatermarkMs != 1_700_000_000_000 ||
		api.SubTopologies[1].GraphCheckpoint != 7 || api.SubTopologies[1].GraphPart != 6 || back.SubTopologies[1].GraphPart != 6 {
		t.Errorf("sub-topologies in the API: %+v", api.SubTopologies)
	}
	if _, err := DecodeSnapshot([]byte("{")); err == nil {
		t.Fatal("a truncated document decoded")
	}
}
