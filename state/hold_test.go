package state

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// inPebble reports whether the DB itself (not the hold) has the value key.
func inPebble(t *testing.T, d *DB, kg int, user string) bool {
	t.Helper()
	_, closer, err := d.db.Get(ValueKey(kg, 1, []byte(user), nil))
	if errors.Is(err, pebble.ErrNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	closer.Close()
	return true
}

func put(t *testing.T, d *DB, kg int, user, value string) {
	t.Helper()
	b := d.NewBatch()
	b.Put(1, kg, []byte(user), nil, []byte(value))
	commit(t, b)
}

// TestHoldReadsAndRelease: between CheckpointBegin and the checkpoint's
// capture the writer's commits stay out of the DB, every read sees them,
// the checkpoint has none of them, and the next commit after the capture
// lets them in (they survive a reopen).
func TestHoldReadsAndRelease(t *testing.T) {
	root := t.TempDir()
	d := openDB(t, filepath.Join(root, "db"), testOptions())
	fill(t, d, 500)
	atBarrier := dump(t, d, fullRange)
	finish, err := d.CheckpointBegin()
	if err != nil {
		t.Fatal(err)
	}
	b := d.NewBatch()
	b.Put(1, 3, []byte("held"), nil, []byte("h"))
	b.Delete(1, 0, []byte("user-0000"), nil)
	b.SetTimer(1, 3, DomainEventTime, -10_000, []byte("held"))
	b.SetCounter(3, CounterOutputs, 99_999)
	commit(t, b)

	if v, ok := mustGet(t, d, 1, 3, "held", ""); !ok || v != "h" {
		t.Fatalf("a held write is not read: %q, %v", v, ok)
	}
	if _, ok := mustGet(t, d, 1, 0, "user-0000", ""); ok {
		t.Fatal("a held delete is not read")
	}
	if n, err := d.Counter(3, CounterOutputs); err != nil || n != 99_999 {
		t.Fatalf("held counter: %d, %v", n, err)
	}
	if ts, ok, err := d.NextTimer(1, DomainEventTime); err != nil || !ok || ts != -10_000 {
		t.Fatalf("held timer: %d, %v, %v", ts, ok, err)
	}
	var scanned int
	if err := d.Scan(1, 3, []byte("held"), nil, func(_, v []byte) error { scanned++; return nil }); err != nil || scanned != 1 {
		t.Fatalf("scan through the hold: %d entries, %v", scanned, err)
	}
	if inPebble(t, d, 3, "held") {
		t.Fatal("a write after the barrier reached the DB before the checkpoint captured it")
	}

	chk := filepath.Join(root, "chk")
	if err := finish(chk); err != nil {
		t.Fatal(err)
	}
	o := testOptions()
	o.ReadOnly = true
	if got := dump(t, openDB(t, chk, o), fullRange); !slices.Equal(got, atBarrier) {
		t.Fatalf("checkpoint: %d entries, the DB had %d at the barrier", len(got), len(atBarrier))
	}
	put(t, d, 4, "after", "a")
	if d.hold != nil || !inPebble(t, d, 3, "held") || !inPebble(t, d, 4, "after") {
		t.Fatalf("the commit after the capture did not release the hold (hold %v)", d.hold != nil)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = openDB(t, filepath.Join(root, "db"), testOptions())
	if v, ok := mustGet(t, d, 1, 3, "held", ""); !ok || v != "h" {
		t.Fatalf("after reopen: %q, %v", v, ok)
	}
}

// TestHoldNextBarrierWaits: a barrier before the previous checkpoint's
// finish waits for it, so each checkpoint holds exactly its own barrier's
// state.
func TestHoldNextBarrierWaits(t *testing.T) {
	root := t.TempDir()
	d := openDB(t, filepath.Join(root, "db"), testOptions())
	put(t, d, 1, "w0", "0")
	finish1, err := d.CheckpointBegin()
	if err != nil {
		t.Fatal(err)
	}
	put(t, d, 1, "w1", "1")
	chk1, chk2 := filepath.Join(root, "chk1"), filepath.Join(root, "chk2")
	done1 := make(chan error, 1)
	go func() { done1 <- finish1(chk1) }()
	finish2, err := d.CheckpointBegin() // waits for finish1
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	put(t, d, 1, "w2", "2")
	if err := finish2(chk2); err != nil {
		t.Fatal(err)
	}
	o := testOptions()
	o.ReadOnly = true
	for _, c := range []struct {
		dir  string
		want []string
	}{{chk1, []string{"w0"}}, {chk2, []string{"w0", "w1"}}} {
		var got []string
		cd := openDB(t, c.dir, o)
		for _, k := range []string{"w0", "w1", "w2"} {
			if _, ok := mustGet(t, cd, 1, 1, k, ""); ok {
				got = append(got, k)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s holds %v, want %v", filepath.Base(c.dir), got, c.want)
		}
	}
}

// TestHoldOpenIteratorDefersRelease: a commit made while an iterator reads
// through the hold keeps the hold (the iterator's view stays valid); the
// next commit after the iterator closed lets everything in.
func TestHoldOpenIteratorDefersRelease(t *testing.T) {
	root := t.TempDir()
	d := openDB(t, filepath.Join(root, "db"), testOptions())
	put(t, d, 2, "k", "0")
	finish, err := d.CheckpointBegin()
	if err != nil {
		t.Fatal(err)
	}
	put(t, d, 2, "w1", "1")
	if err := finish(filepath.Join(root, "chk")); err != nil {
		t.Fatal(err)
	}
	var seen []string
	err = d.Scan(1, 2, []byte("k"), nil, func(_, v []byte) error {
		put(t, d, 2, "w2", "2") // captured, but an iterator is open: held
		seen = append(seen, string(v))
		return nil
	})
	if err != nil || !slices.Equal(seen, []string{"0"}) {
		t.Fatalf("scan: %v, %v", seen, err)
	}
	if d.hold == nil {
		t.Fatal("the hold was released under an open iterator")
	}
	put(t, d, 2, "w3", "3")
	for _, k := range []string{"w1", "w2", "w3"} {
		if !inPebble(t, d, 2, k) {
			t.Errorf("%s is not in the DB after the release", k)
		}
	}
}

// TestHoldCloseWithoutCapture: closing before the checkpoint captured its
// files drops the held writes (a start restores a checkpoint, never the
// live DB) and keeps the state at the barrier.
func TestHoldCloseWithoutCapture(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	d := openDB(t, dir, testOptions())
	put(t, d, 5, "before", "b")
	if _, err := d.CheckpointBegin(); err != nil {
		t.Fatal(err)
	}
	put(t, d, 5, "after", "a")
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = openDB(t, dir, testOptions())
	if _, ok := mustGet(t, d, 1, 5, "before", ""); !ok {
		t.Fatal("the state at the barrier is lost")
	}
	if _, ok := mustGet(t, d, 1, 5, "after", ""); ok {
		t.Fatal("a held write of a checkpoint never captured reached the DB")
	}
}

// TestNoWALCloseFlushes: a DB without a WAL keeps what was written before
// a Close (it flushes), so a stopped job's state can be read on disk.
func TestNoWALCloseFlushes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	o := testOptions()
	o.NoWAL = true
	d := openDB(t, dir, o)
	put(t, d, 3, "kept", "v")
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = openDB(t, dir, testOptions())
	if v, ok := mustGet(t, d, 1, 3, "kept", ""); !ok || v != "v" {
		t.Fatalf("after a close without a WAL: %q, %v", v, ok)
	}
}

// TestFatalHooks: every hook added runs before Pebble's fatal panic, and a
// removed one does not.
func TestFatalHooks(t *testing.T) {
	var got []string
	removeA := AddFatalHook(func(msg string) { got = append(got, "a:"+msg) })
	removeB := AddFatalHook(func(msg string) { got = append(got, "b:"+msg) })
	defer removeA()
	removeB()
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Fatalf did not panic")
			}
		}()
		pebbleLogger{}.Fatalf("corrupt %s", "x.sst")
	}()
	if len(got) != 1 || got[0] != "a:corrupt x.sst" {
		t.Fatalf("hooks ran: %q", got)
	}
}
