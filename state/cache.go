package state

// The value cache: value-state entries read or written recently, in front of
// Pebble. A keyed operator reads the state of nearly every key it is given,
// and a read that misses the cache is a seek in the memtable and the LSM
// (about 1 µs per record in the keyed count's profile, its largest cost
// after the publish). The cache holds an entry's stored bytes (with the TTL
// header, so an expiry is checked at every read as in Get) or the fact that
// the key is absent. It is written through by Batch.Commit with exactly the
// writes the commit made, and a batch that is never committed leaves it as
// it was, so it always equals what reads of the DB would return. Writes that
// bypass batches (an ingest, an excise) clear it; the sweep's deletes remove
// their keys. It is bounded by bytes; past the bound a random half goes.
// Like the rest of the DB's writing side, it belongs to the writer's
// goroutine.

// DefaultValueCacheBytes is the value cache of a DB whose Options do not set
// one.
const DefaultValueCacheBytes = 4 << 20

// entryOverhead approximates a cached entry's bookkeeping (map slot,
// string and slice headers) for the byte bound.
const entryOverhead = 64

type valueCache struct {
	m     map[string][]byte // stored value; nil: the key is absent
	bytes int
	max   int
}

func newValueCache(max int) *valueCache {
	return &valueCache{m: map[string][]byte{}, max: max}
}

// get returns the stored value of key: found says whether the cache knows
// the key; raw is nil when the key is absent.
func (c *valueCache) get(key []byte) (raw []byte, found bool) {
	raw, found = c.m[string(key)]
	return raw, found
}

// put records key's stored value (nil: absent); raw is kept, not copied.
func (c *valueCache) put(key string, raw []byte) {
	if old, ok := c.m[key]; ok {
		c.bytes -= len(key) + len(old) + entryOverhead
	}
	c.m[key] = raw
	c.bytes += len(key) + len(raw) + entryOverhead
	if c.bytes > c.max {
		c.shrink()
	}
}

func (c *valueCache) drop(key string) {
	if old, ok := c.m[key]; ok {
		c.bytes -= len(key) + len(old) + entryOverhead
		delete(c.m, key)
	}
}

// shrink drops entries (in the map's random order) until half the bound.
func (c *valueCache) shrink() {
	for k, v := range c.m {
		if c.bytes <= c.max/2 {
			return
		}
		c.bytes -= len(k) + len(v) + entryOverhead
		delete(c.m, k)
	}
}

func (c *valueCache) clear() {
	clear(c.m)
	c.bytes = 0
}

// cacheOp is a value-state write of a batch, applied to the cache when the
// batch commits.
type cacheOp struct {
	key string
	raw []byte // nil: a delete
}

// clearCache empties the value cache (a write bypassed the batches).
func (d *DB) clearCache() {
	d.dropPoint()
	if d.cache != nil {
		d.cache.clear()
	}
}
