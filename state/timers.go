package state

// Timers and expiry: a stage's timers in key order (next, due), and the
// sweep of expired value state.
import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
)

// NextTimer returns the smallest timer time of a stage and domain across the
// DB's key groups; ok is false when there is none. It costs one seek per key
// group that holds entries of the stage, so callers should cache the result
// rather than ask per record.
func (d *DB) NextTimer(stage uint8, domain uint8) (ts int64, ok bool, err error) {
	return d.NextTimerFrom(stage, domain, math.MinInt64)
}

// NextTimerFrom is NextTimer for a caller that knows no timer of the stage
// and domain is earlier than from: each key group's walk starts there, not
// at the fired timers before it, whose deletions stay in the memtable (and
// are stepped over one by one) until a flush and a compaction drop them.
func (d *DB) NextTimerFrom(stage uint8, domain uint8, from int64) (ts int64, ok bool, err error) {
	// One seek per key group, each of which may read a block: while an
	// online restore's files are remote every such read is a round trip to
	// the store, and a slot's 64 key groups in a row held a restored job's
	// start for seconds (two domains, per slot, before the first record).
	// Then the key groups are walked in parts at once.
	parts := 1
	if remoteOutstanding() {
		parts = min(PrefetchConcurrency, d.opts.Range.Len())
	}
	its := make([]*iter, parts)
	defer func() {
		for _, it := range its {
			if it != nil {
				if cerr := it.Close(); cerr != nil && err == nil {
					ts, ok, err = 0, false, fmt.Errorf("state: next timer stage %d: %w", stage, cerr)
				}
			}
		}
	}()
	ranges := make([]KeyGroupRange, parts)
	n, first := d.opts.Range.Len(), d.opts.Range.First
	for i := range parts {
		ranges[i] = KeyGroupRange{First: first + i*n/parts, Last: first + (i+1)*n/parts - 1}
		if its[i], err = d.rangeIter(ranges[i]); err != nil {
			return 0, false, fmt.Errorf("state: next timer stage %d: %w", stage, err)
		}
	}
	type result struct {
		ts  int64
		ok  bool
		err error
	}
	res := make([]result, parts)
	walk := func(i int) {
		res[i].ts, res[i].ok, res[i].err = nextTimerIn(its[i], ranges[i], stage, domain, from)
	}
	if parts == 1 {
		walk(0)
	} else {
		// Reads in flight together are not a lone miss: counted as
		// prefetching, they stay out of the miss cost that decides
		// whether prefetching pays.
		prefetching.Add(1)
		defer prefetching.Add(-1)
		var wg sync.WaitGroup
		for i := range parts {
			wg.Go(func() { walk(i) })
		}
		wg.Wait()
	}
	for _, r := range res {
		if r.err != nil {
			return 0, false, fmt.Errorf("state: next timer stage %d: %w", stage, r.err)
		}
		if r.ok && (!ok || r.ts < ts) {
			ts, ok = r.ts, true
		}
	}
	return ts, ok, nil
}

// nextTimerIn is NextTimerFrom over the key groups of r, with it an
// iterator bounded to r.
func nextTimerIn(it *iter, r KeyGroupRange, stage, domain uint8, from int64) (ts int64, ok bool, err error) {
	var prefix, seek []byte
	for kg := r.First; kg <= r.Last; {
		prefix = appendTimerPrefix(prefix[:0], kg, stage, domain)
		seek = appendTime(append(seek[:0], prefix...), from)
		if !it.SeekGE(seek) {
			break
		}
		key := it.Key()
		got := int(binary.BigEndian.Uint16(key))
		if got > kg {
			// No timers of this stage in kg..got-1: jump, skipping empty key groups.
			kg = got
			continue
		}
		if bytes.HasPrefix(key, prefix) {
			k, derr := DecodeKey(key)
			if derr != nil {
				return 0, false, derr
			}
			if !ok || k.Time < ts {
				ts, ok = k.Time, true
			}
		}
		kg++
	}
	return ts, ok, it.Error()
}

// DueTimers calls fn for every timer of a stage and domain with time <= upTo,
// key group by key group in ascending order, and within a key group in (time,
// user key) order. It does not delete them: the caller deletes what it fired
// in its batch. userKey is valid only until fn returns. An error from fn stops
// the walk and is returned.
func (d *DB) DueTimers(stage uint8, domain uint8, upTo int64, fn func(kg int, ts int64, userKey []byte) error) error {
	_, _, err := d.DueTimersFrom(stage, domain, math.MinInt64, upTo, fn)
	return err
}

// DueTimersFrom is DueTimers for a caller that knows no timer is earlier
// than from (see NextTimerFrom). It also returns the earliest timer after
// upTo (ok false: none), which the walk meets anyway: the caller needs no
// NextTimer walk after it. That earliest time may be early (a lower bound,
// never late) where a timer was deleted since the key group was last
// walked: a walk at it finds nothing due there.
//
// Key groups the due-time index (timerindex.go) shows without a due timer
// are not sought.
func (d *DB) DueTimersFrom(stage uint8, domain uint8, from, upTo int64, fn func(kg int, ts int64, userKey []byte) error) (next int64, ok bool, err error) {
	x := &d.timers
	first, last := d.opts.Range.First, d.opts.Range.Last
	ents := x.entriesFor(stage, domain, d.opts.Range.Len())
	var (
		it            *iter
		gen           uint64
		lo, hi, seek  []byte
		after         int64
		fired, hasAft bool
	)
	fail := func(err error) (int64, bool, error) {
		x.reset()
		if it != nil {
			it.Close()
		}
		return 0, false, err
	}
	for kg := first; kg <= last; {
		if e := ents[kg-first]; e.skip(from, upTo) {
			if e.low != math.MaxInt64 && (!ok || e.low < next) {
				next, ok = e.low, true
			}
			kg++
			continue
		}
		if it == nil {
			gen = x.gen
			if it, err = d.rangeIter(d.opts.Range); err != nil {
				return fail(fmt.Errorf("state: due timers stage %d: %w", stage, err))
			}
		}
		lo = appendTimerPrefix(lo[:0], kg, stage, domain)
		if upTo == int64(^uint64(0)>>1) {
			hi = prefixSuccessor(lo)
		} else {
			hi = appendTime(append(hi[:0], lo...), upTo+1)
		}
		fired, hasAft = false, false
		valid := it.SeekGE(appendTime(append(seek[:0], lo...), from))
		for ; valid && bytes.Compare(it.Key(), hi) < 0; valid = it.Next() {
			k, derr := DecodeKey(it.Key())
			if derr != nil {
				return fail(fmt.Errorf("state: due timers stage %d: %w", stage, derr))
			}
			fired = true
			if err := fn(kg, k.Time, k.UserKey); err != nil {
				return fail(err)
			}
		}
		if !valid {
			if err := it.Error(); err != nil {
				return fail(fmt.Errorf("state: due timers stage %d: %w", stage, err))
			}
			// Nothing after upTo in kg, and no timer at all in the key
			// groups after it.
			x.walked(ents, kg-first, gen, fired, upTo, 0, false)
			for k := kg + 1; k <= last; k++ {
				x.walked(ents, k-first, gen, false, upTo, 0, false)
			}
			break
		}
		if key := it.Key(); bytes.HasPrefix(key, lo) {
			// The key group's first timer after upTo.
			k, derr := DecodeKey(key)
			if derr != nil {
				return fail(fmt.Errorf("state: due timers stage %d: %w", stage, derr))
			}
			after, hasAft = k.Time, true
			if !ok || k.Time < next {
				next, ok = k.Time, true
			}
		}
		x.walked(ents, kg-first, gen, fired, upTo, after, hasAft)
		// Jump over key groups without timers of this stage, which the
		// seek has shown to hold none at all.
		nkg := max(kg+1, int(binary.BigEndian.Uint16(it.Key())))
		for k := kg + 1; k < nkg && k <= last; k++ {
			x.walked(ents, k-first, gen, false, upTo, 0, false)
		}
		kg = nkg
	}
	if it != nil {
		err := it.Close()
		it = nil
		if err != nil {
			return fail(fmt.Errorf("state: due timers stage %d: %w", stage, err))
		}
	}
	return next, ok, nil
}

// NeedsSweep reports whether SweepExpired can find anything: a stage has a
// TTL, or entries written with an expiry (under an earlier configuration)
// may remain — until one whole pass without a TTL saw none. A job without
// TTL then no longer scans its state every sweep interval.
func (d *DB) NeedsSweep() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.mu.noSweep
}

// SweepExpired deletes up to limit value-state entries that are past their
// TTL and returns how many it deleted. It resumes from where the previous call
// stopped and wraps around at the end of the range, so repeated calls cover
// the whole DB; one call examines at most max(16*limit, 4096) entries.
//
// It must not run concurrently with batches that write value state of the
// same DB: an entry read as expired and rewritten before the sweep's delete
// commits would be lost. Call it from the goroutine that writes the DB.
//
// While an online restore's files are remote it deletes nothing and reads
// nothing: a sweep reads values in key order on the writer's goroutine,
// and through remote files every block it touches is a round trip to the
// store, one after the other (a restarted process has not yet seen a whole
// pass, so it sweeps even a state without a TTL). Behind a link of 20 ms
// per request that held the records of a 48 MiB state until its download
// ended. Reads hide expired entries meanwhile (Get, Scan): the deletes
// only reclaim space, and the sweep resumes once the state is local.
func (d *DB) SweepExpired(limit int) (removed int, err error) {
	if !d.NeedsSweep() || remoteOutstanding() {
		return 0, nil
	}
	if limit <= 0 {
		return 0, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	it, err := d.rangeIter(d.opts.Range)
	if err != nil {
		return 0, fmt.Errorf("state: sweep %s: %w", d.dir, err)
	}
	defer it.Close()
	b := d.db.NewBatch()
	defer b.Close()
	now := d.nowMs()
	budget := max(limit*sweepScanFactor, sweepMinScan)
	var swept []string // keys deleted, for the value cache
	var valid bool
	if d.mu.sweepCursor == nil {
		valid = it.First()
	} else {
		valid = it.SeekGE(d.mu.sweepCursor)
	}
	for ; valid && removed < limit && budget > 0; valid = it.Next() {
		budget--
		key := it.Key()
		if len(key) < headerLen || Kind(key[3]) != KindValue {
			continue
		}
		raw, verr := it.ValueAndErr()
		if verr != nil {
			break
		}
		_, exp, hasExp, derr := decodeValue(raw)
		if derr != nil {
			return removed, fmt.Errorf("state: sweep %x: %w", key, derr)
		}
		d.mu.passExpiry = d.mu.passExpiry || hasExp
		if expired(exp, hasExp, now) {
			if err := b.Delete(key, nil); err != nil {
				return removed, fmt.Errorf("state: sweep %x: %w", key, err)
			}
			if d.cache != nil {
				swept = append(swept, string(key))
			}
			removed++
		}
	}
	if err := it.Error(); err != nil {
		return 0, fmt.Errorf("state: sweep %s: %w", d.dir, err)
	}
	if valid {
		d.mu.sweepCursor = append(d.mu.sweepCursor[:0], it.Key()...)
	} else {
		d.mu.sweepCursor = nil
		// A whole pass done: without a TTL now and no entry with an
		// expiry seen, nothing can ever expire (new entries have none).
		d.mu.noSweep = !d.hasTTL && !d.mu.passExpiry
		d.mu.passExpiry = false
	}
	if removed > 0 {
		if err := d.commit(b); err != nil {
			return 0, fmt.Errorf("state: commit sweep %s: %w", d.dir, err)
		}
		for _, k := range swept {
			d.cache.drop(k)
		}
	}
	return removed, nil
}
