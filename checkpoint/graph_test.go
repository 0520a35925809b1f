package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"cairn/state"
)

// graphOf is a graph checkpoint over checkpoints ids of job and job.s1.
func graphOf(job string, ids ...uint64) *GraphManifest {
	names := []string{job, job + ".s1", job + ".s2"}
	var parts []*Manifest
	for k, id := range ids {
		parts = append(parts, &Manifest{Job: names[k], ID: id, Mode: ModeIncremental, KeyGroups: 16, SourceStream: "IN", SourceSeq: 10 * id,
			Slots: []SlotInfo{{Slot: 0, Range: state.SlotRange(0, 1, 16)}}})
	}
	return GraphOf(job, time.Unix(1, 0), parts)
}

func TestGraphManifestRoundTripAndDamage(t *testing.T) {
	ctx := context.Background()
	s, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	g := graphOf("jg", 7, 5)
	if err := CommitGraph(ctx, s, g); err != nil {
		t.Fatal(err)
	}
	if err := CommitGraph(ctx, s, graphOf("jg", 7, 6)); !errors.Is(err, ErrExists) {
		t.Fatalf("a second graph checkpoint 7: %v, want ErrExists", err)
	}
	got, err := LoadGraph(ctx, s, "jg", 7)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := got.Part("jg.s1"); !ok || p.Checkpoint != 5 || p.SourceSeq != 50 || got.ID != 7 {
		t.Fatalf("loaded %+v", got)
	}
	if _, err := LoadGraph(ctx, s, "jg", 8); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}

	data, _ := g.Encode()
	// A flipped digit: corrupt, naming the object.
	bad := bytes.Replace(data, []byte(`"source_seq": 50`), []byte(`"source_seq": 51`), 1)
	if _, err := DecodeGraph(GraphPath("jg", 7), bad); !IsCorruption(err) {
		t.Fatalf("damaged: %v, want a CorruptionError", err)
	}
	// Stored under another id: corrupt.
	if _, err := DecodeGraph(GraphPath("jg", 8), data); !IsCorruption(err) {
		t.Fatalf("misplaced: %v, want a CorruptionError", err)
	}
	// A newer format: refused as such, not as damage.
	newer := bytes.Replace(data, []byte(`"format_version": 1`), []byte(`"format_version": 2`), 1)
	if _, err := DecodeGraph(GraphPath("jg", 7), newer); !errors.Is(err, ErrUnsupportedVersion) || IsCorruption(err) {
		t.Fatalf("newer: %v, want ErrUnsupportedVersion", err)
	}
	// Parts not in sub-topology order, or one part: invalid.
	swapped := graphOf("jg", 7, 5)
	swapped.Parts[0], swapped.Parts[1] = swapped.Parts[1], swapped.Parts[0]
	if _, err := swapped.Encode(); err == nil {
		t.Fatal("parts out of order encoded")
	}
	if _, err := graphOf("jg", 7).Encode(); err == nil {
		t.Fatal("a one-part graph checkpoint encoded")
	}
}

// Graph checkpoints are indexes GC's orphan sweep and FindUnreferenced
// leave alone; PruneGraphs removes those naming a checkpoint that is gone.
func TestGraphManifestRetention(t *testing.T) {
	ctx := context.Background()
	s, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	for _, ids := range [][]uint64{{1, 1}, {2, 2}, {3, 2}, {4, 3}} {
		if err := CommitGraph(ctx, s, graphOf("jg", ids...)); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := gcAt(ctx, s, "jg", 3, time.Minute, time.Now().Add(time.Hour), false)
	if err != nil || len(rep.Deleted) != 0 {
		t.Fatalf("gc deleted %v (%v)", rep.Deleted, err)
	}
	un, err := FindUnreferenced(ctx, s, "jg")
	if err != nil || len(un.Objects) != 0 {
		t.Fatalf("unreferenced %v (%v)", un.Objects, err)
	}
	// jg kept 2..4, jg.s1 kept 3 only.
	kept := map[string][]uint64{"jg": {2, 3, 4}, "jg.s1": {3}}
	pruned, err := PruneGraphs(ctx, s, "jg", func(name string, id uint64) bool { return slices.Contains(kept[name], id) })
	if err != nil || !slices.Equal(pruned, []uint64{1, 2, 3}) {
		t.Fatalf("pruned %v (%v), want [1 2 3]", pruned, err)
	}
	if ids, err := GraphIDs(ctx, s, "jg"); err != nil || !slices.Equal(ids, []uint64{4}) {
		t.Fatalf("left %v (%v)", ids, err)
	}
	// A damaged one names nothing restorable: pruned too, and listed as
	// unreadable until then.
	if err := s.Put(ctx, GraphPath("jg", 9), bytes.NewReader([]byte("{not json"))); err != nil {
		t.Fatal(err)
	}
	gs, bad, err := ListGraphs(ctx, s, "jg")
	if err != nil || len(gs) != 1 || len(bad) != 1 || !IsCorruption(bad[0]) {
		t.Fatalf("list: %v %v %v", gs, bad, err)
	}
	if pruned, err := PruneGraphs(ctx, s, "jg", func(string, uint64) bool { return true }); err != nil || !slices.Equal(pruned, []uint64{9}) {
		t.Fatalf("pruned %v (%v), want [9]", pruned, err)
	}
}
