package checkpoint

import (
	"context"
	"testing"
)

// sharedOf returns m's shared objects and their total size.
func sharedOf(m *Manifest) ([]Object, int64) {
	var objs []Object
	var n int64
	for _, o := range m.Objects {
		if o.Kind == KindSST {
			objs = append(objs, o)
			n += o.Size
		}
	}
	return objs, n
}

// TestRestoredObjectsAreNotReadBack: the first checkpoint of a writer in a
// process that restored from the store reads back only what the restore
// did not read itself; an object reported with another checksum than the
// manifests' is read back as before.
func TestRestoredObjectsAreNotReadBack(t *testing.T) {
	ctx := context.Background()
	const kgs, slots = 32, 2
	fs, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	dbs := openSlots(t, kgs, slots)
	w1, _ := NewWriter(ctx, fs, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger()})
	write(t, dbs, kgs, 0, 20000, 0)
	m1, err := w1.Commit(ctx, w1.NextID(), Meta{}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	w1.Close(ctx)
	objs, _ := sharedOf(m1)
	if len(objs) < 2 {
		t.Fatalf("want at least 2 shared objects, have %d", len(objs))
	}

	cs := &countingStore{Store: fs}
	w2, err := NewWriter(ctx, cs, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close(ctx)
	// The restore read every object but the first; the first is reported
	// with a wrong checksum, which must not count.
	wrong := objs[0]
	wrong.SHA256 = objs[1].SHA256
	if n := w2.Restored(append([]Object{wrong}, objs[1:]...)); n != len(objs)-1 {
		t.Fatalf("Restored took %d objects, want %d", n, len(objs)-1)
	}
	m2, err := w2.Commit(ctx, w2.NextID(), Meta{}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	if m2.Figures.BytesReused == 0 {
		t.Fatalf("the checkpoint reused nothing: %+v", m2.Figures)
	}
	if got, want := cs.bytes.Load(), objs[0].Size; got != want || cs.gets.Load() != 1 {
		t.Fatalf("the first checkpoint after the restore read %d bytes in %d reads, want %d in 1 (the object the restore did not check)", got, cs.gets.Load(), want)
	}
	retainedClean(t, fs)
}

// TestOnlineRestoreObjectsAreNotReadBack: an online restore's files are
// reused without a read-back (the restore's download checks them), and
// retention deletes nothing until the download reports them verified.
func TestOnlineRestoreObjectsAreNotReadBack(t *testing.T) {
	ctx := context.Background()
	const kgs, slots, retain = 32, 2, 2
	fs, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	dbs := openSlots(t, kgs, slots)
	cfg := WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Retain: retain, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}}
	w1, _ := NewWriter(ctx, fs, cfg)
	write(t, dbs, kgs, 0, 20000, 0)
	m1, err := w1.Commit(ctx, w1.NextID(), Meta{}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	w1.Close(ctx)
	objs, _ := sharedOf(m1)

	cs := &countingStore{Store: fs}
	w2, err := NewWriter(ctx, cs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close(ctx)
	if n := w2.OnlineRestore(objs); n != len(objs) {
		t.Fatalf("OnlineRestore took %d objects, want %d", n, len(objs))
	}
	// More checkpoints than retained: none is deleted while the download
	// has not verified the restored files, and none reads anything back.
	for i := range retain + 1 {
		write(t, dbs, kgs, 20000+i*100, 20100+i*100, 1)
		if _, err := w2.Commit(ctx, w2.NextID(), Meta{}, snapshot(t, dbs)); err != nil {
			t.Fatal(err)
		}
	}
	if got := cs.bytes.Load(); got != 0 {
		t.Fatalf("checkpoints after an online restore read %d bytes of its files back from the store", got)
	}
	if ids := retainedClean(t, fs); len(ids) != retain+2 || ids[0] != m1.ID {
		t.Fatalf("retained %v while the online download was unfinished, want all %d from %d", ids, retain+2, m1.ID)
	}
	// The download ends: retention applies again.
	if n := w2.Restored(objs); n != len(objs) {
		t.Fatalf("Restored took %d objects, want %d", n, len(objs))
	}
	write(t, dbs, kgs, 30000, 30100, 2)
	if _, err := w2.Commit(ctx, w2.NextID(), Meta{}, snapshot(t, dbs)); err != nil {
		t.Fatal(err)
	}
	if ids := retainedClean(t, fs); len(ids) != retain {
		t.Fatalf("retained %v after the download ended, want %d", ids, retain)
	}
	if got := cs.bytes.Load(); got != 0 {
		t.Fatalf("read %d bytes back after the download ended", got)
	}
}

// TestOnlineRestoreUnreadObjectsAreChecked: an online restore's file that
// its download never read (the state deleted it first) is not taken for
// verified: it goes back to unchecked, so it is read back like any object
// nobody read, and it no longer holds retention.
func TestOnlineRestoreUnreadObjectsAreChecked(t *testing.T) {
	ctx := context.Background()
	const kgs, slots, retain = 32, 2, 2
	fs, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	dbs := openSlots(t, kgs, slots)
	cfg := WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Retain: retain, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}}
	w1, _ := NewWriter(ctx, fs, cfg)
	write(t, dbs, kgs, 0, 20000, 0)
	m1, err := w1.Commit(ctx, w1.NextID(), Meta{}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	w1.Close(ctx)
	objs, _ := sharedOf(m1)
	if len(objs) < 2 {
		t.Fatalf("%d shared objects, the test needs two", len(objs))
	}
	cs := &countingStore{Store: fs}
	// The download verified all but the first, which it never read.
	w3, err := NewWriter(ctx, cs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w3.Close(ctx)
	w3.OnlineRestore(objs)
	if n := w3.Restored(objs[1:]); n != len(objs)-1 {
		t.Fatalf("Restored took %d objects, want %d", n, len(objs)-1)
	}
	if n := w3.Unread(objs[:1]); n != 1 {
		t.Fatalf("Unread took %d objects, want 1", n)
	}
	for i := range retain + 1 {
		write(t, dbs, kgs, 20000+i*100, 20100+i*100, 1)
		if _, err := w3.Commit(ctx, w3.NextID(), Meta{}, snapshot(t, dbs)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := cs.bytes.Load(), objs[0].Size; got != want || cs.gets.Load() != 1 {
		t.Fatalf("checkpoints after the download read %d bytes in %d reads, want %d in 1 (the object it never read)", got, cs.gets.Load(), want)
	}
	if ids := retainedClean(t, fs); len(ids) != retain {
		t.Fatalf("retained %v, want %d: an unread object still held retention", ids, retain)
	}
}
