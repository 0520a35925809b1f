package state

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// The point reader: while most of the reads that miss the value cache
// find no entry, Get reads through one iterator kept open between reads
// instead of Pebble's Get.
//
// Pebble's Get builds a fresh iterator stack for every read: an iterator
// for each memtable and for each file that may hold the key, opened from
// the file cache, its index block fetched from the block cache, until it
// finds the key. A slot's L0 holds up to L0CompactionThreshold (32) files,
// each spanning every key group, since each checkpoint flushes one, so a
// read of a key no file holds opened up to 32 table iterators, 1.7 µs each
// on this VM (BenchmarkGetL0). An open iterator keeps its table iterators:
// its next SeekPrefixGE into a file it has opened only probes that file's
// bloom filter. But an iterator seeks every level that holds a version of
// the key, where Get stops at the newest: a key updated in the memtable and
// held in L6 too costs about twice as much through the iterator
// (BenchmarkGetUpdated). So which one reads depends on what recent reads found
// (missScore): keys that are new or absent take the iterator, keys that
// are updated take Get. Both return the same entry; only the cost differs.
//
// An iterator sees the DB as it was when it was opened, so the point
// iterator lives only while nothing writes: every path that changes what
// the writer reads — a commit, the hold's begin and release, an ingest, an
// excise, Close — closes it first (dropPoint), and the next read opens a
// new one. It also pins the memtables and files it was opened over, so the
// writer ends it when a unit of work is done (EndReads): an engine slot
// after each operator call. Like the value cache it is writer-owned.

// missScore bounds and thresholds: a read that found no entry adds one, a
// read that found one takes one away, within [0, missScoreMax]. The point
// iterator is used from pointOnAt up and Get again from pointOffAt down,
// so a miss rate above about half switches to the iterator and one below
// it back, without switching on every read.
const (
	missScoreMax = 64
	pointOnAt    = 48
	pointOffAt   = 16
)

// read returns key's stored value (a copy); found is false when no entry
// has the key.
func (d *DB) read(key []byte) (raw []byte, found bool, err error) {
	point := d.pointOn
	switch d.opts.forceRead {
	case readGet:
		point = false
	case readPoint:
		point = true
	default:
		// Opening the iterator costs more than one Get (BenchmarkGetL0,
		// reads-per-call=1): a unit's first read takes Get unless the
		// last unit made several reads.
		if d.point == nil && d.unitReads == 0 && d.lastUnitReads < 2 {
			point = false
		}
	}
	d.unitReads++
	if point {
		raw, found, err = d.pointGet(key)
	} else {
		raw, found, err = d.pebbleGet(key)
	}
	if err != nil {
		return nil, false, err
	}
	if found {
		d.missScore = max(d.missScore-1, 0)
	} else {
		d.missScore = min(d.missScore+1, missScoreMax)
	}
	switch {
	case !d.pointOn && d.missScore >= pointOnAt:
		d.pointOn = true
	case d.pointOn && d.missScore <= pointOffAt:
		d.pointOn = false
		d.dropPoint()
	}
	return raw, found, nil
}

func (d *DB) pebbleGet(key []byte) ([]byte, bool, error) {
	r, closer, err := d.reader().Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	raw := append([]byte(nil), r...)
	closer.Close()
	return raw, true, nil
}

// pointGet reads key's stored value through the point iterator.
func (d *DB) pointGet(key []byte) (raw []byte, found bool, err error) {
	if d.point == nil {
		it, err := d.newIter(&pebble.IterOptions{})
		if err != nil {
			return nil, false, err
		}
		d.point = it
	}
	it := d.point
	// Keys are compared whole (the default comparer's Split is the whole
	// key), so a prefix seek finds the key itself or nothing.
	if !it.SeekPrefixGE(key) || !bytes.Equal(it.Key(), key) {
		if err := it.Error(); err != nil {
			d.dropPoint()
			return nil, false, err
		}
		return nil, false, nil
	}
	v, err := it.ValueAndErr()
	if err != nil {
		d.dropPoint()
		return nil, false, fmt.Errorf("value: %w", err)
	}
	return append([]byte(nil), v...), true, nil
}

// dropPoint closes the point iterator, if open.
func (d *DB) dropPoint() {
	if d.point != nil {
		_ = d.point.Close()
		d.point = nil
	}
}

// EndReads ends the current unit of reads: the iterator Get keeps open
// between reads is closed, so it no longer pins memtables and files that
// later flushes and compactions replace. Reads after it open a new one.
// Writer-owned, like Get.
func (d *DB) EndReads() {
	d.dropPoint()
	d.lastUnitReads, d.unitReads = d.unitReads, 0
}

// Options.forceRead values: BenchmarkGetUpdated's comparison of the two ways
// of reading. The zero value chooses by missScore.
const (
	readGet   = 1
	readPoint = 2
)
