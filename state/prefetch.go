package state

import (
	"sync"
	"sync/atomic"
)

// PrefetchConcurrency is how many reads Prefetch runs at once: enough to
// keep a link busy with 16 KiB chunk fetches whose round trips are
// milliseconds, few enough not to crowd out the download on a slow one.
const PrefetchConcurrency = 16

// prefetched counts the keys Prefetch read, in this process.
var prefetched atomic.Int64

// Prefetched returns how many keys Prefetch has read in this process: the
// keys whose state an online restore's reads fetched ahead of a call.
func Prefetched() int64 { return prefetched.Load() }

// Remote reports whether some file of an online restore in this process is
// still remote, which is when Prefetch does anything.
func Remote() bool { return remoteOutstanding() }

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
