package state

import (
	"sync"
	"sync/atomic"
	"time"
)

// PrefetchConcurrency is how many reads Prefetch runs at once: enough to
// keep a link busy with 16 KiB chunk fetches whose round trips are
// milliseconds, few enough not to crowd out the download on a slow one.
const PrefetchConcurrency = 16

// prefetched counts the keys Prefetch read, in this process.
var prefetched atomic.Int64

// prefetching counts the Prefetch calls running; while one runs, fetches
// are not lone and are not measured.
var prefetching atomic.Int64

// loneFetchNs is the moving average (weight 1/8) of how long a read's fetch
// of missing chunks took while no Prefetch ran: the cost of a miss to a
// read on its own. 0: none measured yet.
var loneFetchNs atomic.Int64

// readChunks is the most chunks a DB read's miss fetches (a block of a few
// KiB straddling a chunk boundary): only such fetches measure a miss; a
// longer run (EnsureLocal completing a file for an upload) is a transfer,
// not a miss, and its time would make every miss look slow.
const readChunks = 2

func observeLoneFetch(d time.Duration) {
	for {
		old := loneFetchNs.Load()
		n := int64(d)
		if old != 0 {
			n = old + (n-old)/8
		}
		if n <= 0 {
			n = 1
		}
		if loneFetchNs.CompareAndSwap(old, n) {
			return
		}
	}
}

// MissCost is the moving average of what a read's fetch of a chunk not yet
// local took, measured while no prefetch ran (0: none measured).
func MissCost() time.Duration { return time.Duration(loneFetchNs.Load()) }

// PrefetchMinFetch is the cost of a miss below which PrefetchPays says no:
// where a read of a chunk not yet local takes less (a local file store, on
// this project's 2-core VM about 0.1 ms), the reads are bound by the CPU,
// not by waiting, and reading ahead only adds a second read of each key
// (docs/bench/online-restore.md, "A call's keys fetched together": 0.70-0.78x the reads
// on the unthrottled file store at 256 MiB); on a 50 MB/s link a 16 KiB
// chunk alone takes 0.33 ms.
const PrefetchMinFetch = 250 * time.Microsecond

// prefetchResample: one call in this many reads its keys on its own (no
// Prefetch), so the cost of a lone miss is measured again.
const prefetchResample = 16

// Prefetched returns how many keys Prefetch has read in this process: the
// keys whose state an online restore's reads fetched ahead of a call.
func Prefetched() int64 { return prefetched.Load() }

// PrefetchMode is the process's choice of when PrefetchPays says yes
// (the job file's restore.prefetch).
type PrefetchMode int32

const (
	// PrefetchAuto: when a lone miss costs PrefetchMinFetch or more.
	PrefetchAuto PrefetchMode = iota
	// PrefetchOn: whenever a file is remote.
	PrefetchOn
	// PrefetchOff: never.
	PrefetchOff
)

var prefetchMode atomic.Int32

// SetPrefetch sets the process's prefetch mode (default PrefetchAuto).
func SetPrefetch(m PrefetchMode) { prefetchMode.Store(int32(m)) }

// PrefetchPays reports whether a call's reads should be prefetched
// (Prefetch) now: some file is remote, and (in PrefetchAuto) a lone read's miss has been
// measured (the call's own reads measure it when none has) to cost at least
// PrefetchMinFetch; and it is not the call, one in prefetchResample, left
// to read alone so that the cost is measured again. A DB's writer calls it
// once per call.
func (d *DB) PrefetchPays() bool {
	if !remoteOutstanding() {
		return false
	}
	switch PrefetchMode(prefetchMode.Load()) {
	case PrefetchOn:
		return true
	case PrefetchOff:
		return false
	}
	d.prefetchCalls++
	ns := loneFetchNs.Load()
	return ns >= int64(PrefetchMinFetch) && d.prefetchCalls%prefetchResample != 0
}

// Prefetch reads the value state (userKey, no sub-key) of a stage for each
// of userKeys concurrently, PrefetchConcurrency at a time, while files of an
// online restore are still remote; it returns at once when none is. A
// keyed stage reads its keys' state one at a time on the writer's
// goroutine, and a read of a block not yet local waits for a fetch from the
// store: one round trip per miss in a row. Prefetch puts a batch's misses
// in flight together, so the reads that follow find their blocks local
// (and in the block cache); a chunk wanted by several keys is fetched once
// (remoteFile.claim). Keys outside the DB's range, repeated, or known to
// the value cache are skipped. Errors are not returned: the read that
// follows meets and reports them. Call it on the writer's goroutine, like
// Get; the reads go to the DB's files directly (not through writes held
// since a barrier), which is all a prefetch needs.
func (d *DB) Prefetch(stage uint8, userKeys [][]byte) {
	if !remoteOutstanding() || len(userKeys) == 0 {
		return
	}
	seen := make(map[string]struct{}, len(userKeys))
	keys := make([][]byte, 0, len(userKeys))
	for _, k := range userKeys {
		kg := KeyGroup(k, d.opts.KeyGroups)
		if !d.opts.Range.Contains(kg) {
			continue
		}
		key := ValueKey(kg, stage, k, nil)
		if _, dup := seen[string(key)]; dup {
			continue
		}
		seen[string(key)] = struct{}{}
		if c := d.cache; c != nil {
			if _, found := c.get(key); found {
				continue
			}
		}
		keys = append(keys, key)
	}
	prefetched.Add(int64(len(keys)))
	prefetching.Add(1)
	defer prefetching.Add(-1)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range min(PrefetchConcurrency, len(keys)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < len(keys); i = int(next.Add(1)) - 1 {
				if _, closer, err := d.db.Get(keys[i]); err == nil {
					closer.Close()
				}
			}
		}()
	}
	wg.Wait()
}
