package checkpoint

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSavepointLifecycle: list with details, prune to a retain count
// (oldest first, corrupt manifests left alone), remove by name (manifest
// first; leftovers of an interrupted removal too), reuse a removed name;
// checkpoints and GC are unaffected.
func TestSavepointLifecycle(t *testing.T) {
	ctx := context.Background()
	const kgs, slots = 16, 2
	dbs := openSlots(t, kgs, slots)
	store, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { now = now.Add(time.Minute); return now }
	w, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Retain: 1, Logger: quietLogger(), Now: clock, Scrub: ScrubConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	write(t, dbs, kgs, 0, 500, 1)
	chk, err := w.Commit(ctx, w.NextID(), Meta{}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	// Written in the order c, a, b: "oldest" is by time, not by name.
	for i, name := range []string{"c", "a", "b"} {
		if _, err := w.Savepoint(ctx, uint64(10+i), name, Meta{SourceSeq: uint64(100 + i)}, snapshot(t, dbs)); err != nil {
			t.Fatal(err)
		}
	}
	list, err := ListSavepointInfo(ctx, store, testJob)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sp := range list {
		names = append(names, sp.Name)
		if sp.Corrupt != "" || sp.Bytes <= 0 || sp.Slots != slots || sp.KeyGroups != kgs {
			t.Fatalf("savepoint info %+v", sp)
		}
	}
	if !slices.Equal(names, []string{"c", "a", "b"}) || list[0].SourceSeq != 100 {
		t.Fatalf("list oldest first: %v (%+v)", names, list[0])
	}

	// A corrupt manifest is listed as such, and pruning neither counts nor
	// deletes it.
	if err := store.Put(ctx, SavepointManifestPath(testJob, "broken"), strings.NewReader("{not json")); err != nil {
		t.Fatal(err)
	}
	deleted, err := PruneSavepoints(ctx, store, testJob, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{"c"}) {
		t.Fatalf("pruned %v, want [c]", deleted)
	}
	all, _ := ListSavepoints(ctx, store, testJob)
	if !slices.Equal(all, []string{"a", "b", "broken"}) {
		t.Fatalf("after prune: %v", all)
	}
	if left, _ := listAll(ctx, store, SavepointDir(testJob, "c")+"/"); len(left) != 0 {
		t.Fatalf("pruned savepoint left %d objects", len(left))
	}

	// A manifest the store fails to return is not corrupt: the list and
	// the prune fail, naming it, and nothing is deleted.
	failing := &failGetStore{Store: store, name: SavepointManifestPath(testJob, "b")}
	if _, err := ListSavepointInfo(ctx, failing, testJob); !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "savepoint b ") {
		t.Fatalf("list with b unreadable: %v, want the store's error naming b", err)
	}
	if deleted, err := PruneSavepoints(ctx, failing, testJob, 1); !errors.Is(err, errInjected) || len(deleted) > 0 {
		t.Fatalf("prune with b unreadable: deleted %v, %v; want nothing deleted and the store's error", deleted, err)
	}

	// Remove by name; a second removal finds nothing.
	n, b, err := DeleteSavepoint(ctx, store, testJob, "a")
	if err != nil || n < 3 || b <= 0 {
		t.Fatalf("delete a: %d objects, %d bytes, %v", n, b, err)
	}
	if _, _, err := DeleteSavepoint(ctx, store, testJob, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	if _, _, err := DeleteSavepoint(ctx, store, testJob, "../chk"); err == nil {
		t.Fatal("bad name accepted")
	}
	// An interrupted removal (manifest gone, data left) is finished by rm.
	if err := store.Delete(ctx, SavepointManifestPath(testJob, "b")); err != nil {
		t.Fatal(err)
	}
	if n, _, err := DeleteSavepoint(ctx, store, testJob, "b"); err != nil || n == 0 {
		t.Fatalf("leftovers of b: %d objects, %v", n, err)
	}
	// The name can be used again.
	if _, err := w.Savepoint(ctx, 20, "a", Meta{}, snapshot(t, dbs)); err != nil {
		t.Fatalf("reuse a removed name: %v", err)
	}
	// Checkpoints are untouched and GC runs (over the corrupt savepoint it
	// stops, as for any unreadable manifest: remove it first).
	if probs := VerifyManifest(ctx, store, chk, 2); len(probs) > 0 {
		t.Fatalf("checkpoint damaged: %v", probs)
	}
	if _, _, err := DeleteSavepoint(ctx, store, testJob, "broken"); err != nil {
		t.Fatal(err)
	}
	if _, err := GC(ctx, store, testJob, 1, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSavepoint(ctx, store, testJob, "a"); err != nil {
		t.Fatal(err)
	}
}

// failGetStore fails every read of one object with errInjected.
type failGetStore struct {
	Store
	name string
}

func (s *failGetStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if name == s.name {
		return nil, errInjected
	}
	return s.Store.Get(ctx, name)
}
