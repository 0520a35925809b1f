package checkpoint

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSavepointWriteLoadAndRetention(t *testing.T) {
	ctx := context.Background()
	const kgs, slots = 16, 2
	dbs := openSlots(t, kgs, slots)
	store, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Retain: 1, OrphanGrace: time.Nanosecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	write(t, dbs, kgs, 0, 3000, 1)
	next := w.NextID()
	m, err := w.Savepoint(ctx, 7, "before-upgrade", Meta{SourceStream: "in", SourceSeq: 42}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	if w.NextID() != next {
		t.Fatalf("savepoint consumed checkpoint ids: %d -> %d", next, w.NextID())
	}
	if m.Mode != ModeFull || m.ID != 7 || m.SourceSeq != 42 {
		t.Fatalf("manifest %+v", m)
	}
	for _, o := range m.Objects {
		if !strings.HasPrefix(o.Path, SavepointDir(testJob, "before-upgrade")+"/slot-") || o.Kind == KindSST {
			t.Fatalf("object %+v outside the savepoint folder", o)
		}
	}
	if _, err := w.Savepoint(ctx, 8, "before-upgrade", Meta{}, snapshot(t, dbs)); !errors.Is(err, ErrSavepointExists) {
		t.Fatalf("second savepoint of the same name: %v", err)
	}
	if _, err := w.Savepoint(ctx, 8, "../x", Meta{}, snapshot(t, dbs)); err == nil {
		t.Fatal("bad name accepted")
	}

	// Checkpoints, retention and the orphan sweep never touch it.
	for i := range 3 {
		write(t, dbs, kgs, 0, 3000, i+2)
		if _, err := w.Commit(ctx, w.NextID(), Meta{}, snapshot(t, dbs)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := GC(ctx, store, testJob, 1, 0, false); err != nil {
		t.Fatal(err)
	}
	if probs := VerifyManifest(ctx, store, m, 2); len(probs) > 0 {
		t.Fatalf("savepoint damaged by retention: %v", probs)
	}
	got, err := LoadSavepoint(ctx, store, testJob, "before-upgrade")
	if err != nil {
		t.Fatal(err)
	}
	if SavepointName(got) != "before-upgrade" || len(got.Objects) != len(m.Objects) {
		t.Fatalf("loaded %+v", got)
	}
	names, err := ListSavepoints(ctx, store, testJob)
	if err != nil || len(names) != 1 || names[0] != "before-upgrade" {
		t.Fatalf("list: %v %v", names, err)
	}

	// Relocation: copy the folder to another store under another job and
	// name; the loaded manifest points at the new place.
	other, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	copyPrefix(t, store, other, SavepointDir(testJob, "before-upgrade")+"/", SavepointDir("job2", "moved")+"/")
	moved, err := LoadSavepoint(ctx, other, "job2", "moved")
	if err != nil {
		t.Fatal(err)
	}
	if moved.Job != "job2" || SavepointName(moved) != "moved" {
		t.Fatalf("moved %+v", moved)
	}
	if probs := VerifyManifest(ctx, other, moved, 2); len(probs) > 0 {
		t.Fatalf("moved savepoint: %v", probs)
	}
	if _, err := LoadSavepoint(ctx, other, "job2", "absent"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("absent savepoint: %v", err)
	}
}

// copyPrefix copies every object under from in src to the same name under
// to in dst.
func copyPrefix(t *testing.T, src, dst Store, from, to string) {
	t.Helper()
	ctx := context.Background()
	objs, err := listAll(ctx, src, from)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		b, err := readAll(ctx, src, o.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := dst.Put(ctx, to+strings.TrimPrefix(o.Name, from), strings.NewReader(string(b))); err != nil {
			t.Fatal(err)
		}
	}
}
