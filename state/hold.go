package state

// The hold: a checkpoint's barrier without a pause. CheckpointBegin starts
// the memtable flush in the background and from then on keeps the writer's
// commits in an indexed batch on top of the DB instead of in it, so the
// flush, and the checkpoint that links the flushed files, see exactly the
// state at the barrier while processing goes on; reads see the DB with the
// held writes on top. Once the checkpoint has captured its files the held
// writes are committed to the DB, at the writer's next commit
// (docs/RATIONALE.md, "The barrier holds writes instead of flushing").

import (
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// hold is the writes made since a checkpoint's barrier, kept until the
// checkpoint has captured the DB's files. It belongs to the DB's writer
// goroutine; the checkpoint's finish, which may run on another, only
// closes captured, and the flush goroutine only sets flushErr, flushes and
// flushTook before closing flushed.
type hold struct {
	// b holds the writes; indexed, so reads through it see the DB with them
	// on top.
	b *pebble.Batch
	// flushed is closed when the barrier's flush returned, with its error,
	// the DB's flush count after it, and how long it took.
	flushed   chan struct{}
	flushErr  error
	flushes   int64
	flushTook time.Duration
	// captured is closed when the checkpoint has captured the DB's files
	// (or given up): the held writes may go into the DB.
	captured chan struct{}
	// iters is the iterators open over b; b is committed (and closed) only
	// when none is.
	iters int
}

// reader is what the writer's reads go through: the DB, or the DB with the
// held writes on top.
func (d *DB) reader() pebble.Reader {
	if d.hold != nil {
		return d.hold.b
	}
	return d.db
}

// iter is an iterator from reader; Close keeps the hold's count of open
// iterators.
type iter struct {
	*pebble.Iterator
	h *hold
}

func (it *iter) Close() error {
	if it.h != nil {
		it.h.iters--
		it.h = nil
	}
	return it.Iterator.Close()
}

// newIter opens an iterator over what the writer sees.
func (d *DB) newIter(o *pebble.IterOptions) (*iter, error) {
	it, err := d.reader().NewIter(o)
	if err != nil {
		return nil, err
	}
	if d.hold != nil {
		d.hold.iters++
	}
	return &iter{Iterator: it, h: d.hold}, nil
}

// commit writes b: into the DB, or, while a checkpoint has not captured the
// barrier's files yet, into the hold.
func (d *DB) commit(b *pebble.Batch) error {
	d.dropPoint()
	if !b.Empty() {
		d.writes++
	}
	if d.hold != nil {
		if err := d.release(false); err != nil {
			return err
		}
	}
	if h := d.hold; h != nil {
		return h.b.Apply(b, nil)
	}
	return b.Commit(pebble.NoSync)
}

// release commits the held writes to the DB if the checkpoint has captured
// its files and no iterator reads through them; with wait, it first waits
// for the capture. It returns with d.hold nil unless it could not release.
func (d *DB) release(wait bool) error {
	d.dropPoint() // what the writer reads is about to change
	h := d.hold
	if h == nil || h.iters > 0 {
		return nil
	}
	if wait {
		<-h.captured
	} else {
		select {
		case <-h.captured:
		default:
			return nil
		}
	}
	d.hold = nil
	err := h.b.Commit(pebble.NoSync)
	h.b.Close()
	if err != nil {
		return fmt.Errorf("state: commit the writes held since the barrier %s: %w", d.dir, err)
	}
	return nil
}

// beginHold starts the barrier's flush in the background and holds the
// writer's commits until the returned finish has captured the files.
func (d *DB) beginHold() *hold {
	d.dropPoint()
	h := &hold{b: d.db.NewIndexedBatch(), flushed: make(chan struct{}), captured: make(chan struct{})}
	go func() {
		t0 := time.Now()
		h.flushErr = d.db.Flush()
		h.flushTook = time.Since(t0)
		h.flushes = d.flushes.Load()
		close(h.flushed)
	}()
	d.hold = h
	return h
}

// Writes counts the non-empty batches committed to the DB since it was
// opened (held or not). A caller that noted it at a checkpoint learns at
// the next one whether anything was written between them: if not, the
// next checkpoint's files are the last one's, and a write of its own then
// would be the only thing it uploads. Writer-owned, like commit.
func (d *DB) Writes() uint64 { return d.writes }
