package state

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"cairn/internal/base/sysfile"
)

// DefaultCacheSize is the block cache of a DB whose Options do not set one.
const DefaultCacheSize = 64 << 20

// DefaultMemTableSize is the memtable size of a DB whose Options do not set
// one. Pebble's default (4 MiB) made batched writes about 3x slower on a
// 2-core VM (0.25M vs 0.8M small writes/s, BenchmarkBatchPutCommit): smaller
// memtables mean more L0 files and more compaction. Up to two memtables can be
// live, so budget about 2x this per slot.
const DefaultMemTableSize = 32 << 20

// Options configure a slot's DB.
type Options struct {
	// KeyGroups is the job's key-group count.
	KeyGroups int
	// Range is the key groups this DB owns. Reads and writes outside it fail
	// with ErrOutOfRange.
	Range KeyGroupRange
	// TTL is the value-state time to live per stage id; 0 or absent means no
	// TTL. It applies to values written from now on (see value.go).
	TTL map[uint8]time.Duration
	// Now is the clock for TTL; nil means time.Now.
	Now func() time.Time
	// CacheSize is the block cache size in bytes; 0 means DefaultCacheSize.
	CacheSize int64
	// MemTableSize is the memtable size in bytes; 0 means
	// DefaultMemTableSize.
	MemTableSize int64
	// ValueCacheBytes bounds the value cache (cache.go); 0 means
	// DefaultValueCacheBytes, negative turns it off.
	ValueCacheBytes int
	// ReadOnly opens an existing DB without writing to it.
	ReadOnly bool
	// NoWAL writes no write-ahead log: a commit is a memtable insert and
	// nothing else; Close flushes the memtable, and a crash loses it. For a DB that is never reopened — an engine slot's live DB: a
	// start always restores a checkpoint, whose state CheckpointBegin's
	// flush made SSTs (docs/RATIONALE.md, "The slot DBs write no WAL").
	NoWAL bool
	// NoCompactions disables Pebble's automatic compactions, for a short
	// read-write open that only restructures files (a restore clipping a
	// slot to its range): opening a checkpoint with compaction debt would
	// otherwise start a compaction that Close waits for.
	NoCompactions bool
	// Logger receives Pebble's messages: informational ones at debug level,
	// errors at error level. nil discards them.
	Logger *slog.Logger

	// pebbleWALFiles restores Pebble's own WAL file handling (preallocated,
	// recycled), for BenchmarkWALDisk's comparison; see walfs.go.
	pebbleWALFiles bool
	// noFilters writes SSTs without bloom filters, for BenchmarkGetL0's
	// comparison; see pebbleOptions.
	noFilters bool
	// forceRead makes every read take one way (readGet, readPoint), for
	// BenchmarkGetUpdated's comparison; see point.go.
	forceRead int
}

func (o *Options) validate() error {
	if err := ValidateKeyGroups(o.KeyGroups); err != nil {
		return err
	}
	if o.Range.Len() == 0 || o.Range.First < 0 || o.Range.Last >= o.KeyGroups {
		return fmt.Errorf("range %v not a non-empty range within key_groups=%d: %w", o.Range, o.KeyGroups, ErrOutOfRange)
	}
	for stage, ttl := range o.TTL {
		if ttl < 0 {
			return fmt.Errorf("state: negative TTL %v for stage %d", ttl, stage)
		}
	}
	return nil
}

func (o *Options) pebbleOptions() *pebble.Options {
	po := &pebble.Options{
		FormatMajorVersion: pebble.FormatNewest,
		ReadOnly:           o.ReadOnly,
		CacheSize:          o.CacheSize,
		Logger:             pebbleLogger{o.Logger},
		MemTableSize:       uint64(o.MemTableSize),
		// L0 thresholds: raised from Pebble's 4 / 12 so that L0 absorbs
		// many checkpoint flushes before it is compacted into Lbase.
		//
		// Why: every checkpoint flushes the memtable, and the 1% of keys a
		// job updates per interval are spread over the whole key space (the
		// key group, a hash, comes first), so each flushed L0 file overlaps
		// all of Lbase. Every L0->Lbase compaction therefore rewrites all of
		// Lbase, and the output is new SSTs that the next incremental
		// checkpoint must upload. With the default threshold this happened
		// every few intervals: 2 slots, 1% of keys updated per interval,
		// 50 intervals after the build (scratch test logging new SST bytes
		// per checkpoint and db.Metrics), the steady-state upload was
		// 22.5x the changed data at 256 MiB of state and 9.5x at 1 GiB.
		// With 32 / 128: 3.8x at 256 MiB (most intervals upload only the
		// flush, 1.0x, with an L0 compaction spike every ~16 intervals) and
		// 7.4x at 1 GiB (there L5->L6 compactions, Pebble's usual 10x level
		// fan-out, dominate; the leveled LSM cannot do much better on
		// uniformly random updates without read amplification growing
		// further). BenchmarkBatchPutCommit (-benchtime 2s -count 3, same
		// session) went from 1.17-1.27M to 1.47-1.57M writes/s, and bulk
		// loads got faster (fewer, larger L0 compactions).
		//
		// Same session, BenchmarkCheckpointSteady (5 intervals right after
		// the build): 256 MiB 124 -> 46 MiB per interval, 1 GiB 234 -> 82
		// MiB. Most of what is left there is not SSTs: each checkpoint
		// copies the current WAL, a recycled file that keeps the size of an
		// old WAL (~25-30 MiB per slot here; Pebble always recycles WALs and
		// copies the whole file), and that copy was uploaded as a private
		// file every time. DB.Checkpoint now empties that copy (see there).
		//
		// Cost: up to ~16-32 L0 sublevels, so point reads probe more files
		// (each a bloom filter probe for a key the file does not hold, see
		// the filters below). L0StopWritesThreshold stays 4x
		// the compaction threshold, the same headroom ratio as Pebble's
		// default (12 vs 4) rounded up, so bulk loads do not stall.
		//
		// Tried without a measurable gain: smaller TargetFileSizes (2 MiB
		// at every level) and LevelMultiplier 4. Compacting everything into
		// L6 after a bulk load (DB.Compact over the range) removes the
		// post-load compaction debt, but that is the loader's choice.
		L0CompactionThreshold:       32,
		L0StopWritesThreshold:       128,
		DisableAutomaticCompactions: o.NoCompactions,
		DisableWAL:                  o.NoWAL,
	}
	if !o.pebbleWALFiles {
		// WALs neither preallocated nor recycled: a slot's disk use is
		// what it wrote, not 4 x 1.1 x MemTableSize (walfs.go).
		po.FS = walFS{vfs.Default}
	}
	// Reads of an online restore's remote SSTs fetch what they touch first
	// (remote.go).
	if po.FS == nil {
		po.FS = vfs.Default
	}
	po.FS = remoteFS{po.FS}
	po.Experimental.CompactionScheduler = newGatedScheduler(remoteOutstanding)
	// SSTs of SSTTargetSize at every level (Pebble's default is 2 MiB at
	// L0 and Lbase's 4 MiB doubling per level below it): the checkpoint
	// store's objects per GiB of state fall from ~650 to ~100, and with them
	// every per-object cost: an online restore creates one sparse local
	// file per remote SST before the DB opens (on this VM 25 µs to 1 ms of
	// kernel time each), a restore from the store issues a GET per object,
	// a local checkpoint a hard link per file. Flushes are split at twice
	// L0's size, so a memtable of DefaultMemTableSize flushes into one
	// file, not eight. Same-run measurements in docs/bench/online-restore.md
	// ("Larger SSTs"); docs/RATIONALE.md has the trade-off.
	for i := range po.TargetFileSizes {
		po.TargetFileSizes[i] = SSTTargetSize
	}
	// Bloom filters (10 bits a key, ~1% false positives) on every level but
	// the last. A point read of a key that is not in an SST then costs a
	// filter probe instead of a seek through the SST's index and a data
	// block. It matters for keys that are new or cold: a read for a key
	// that is in no file probed every L0 file (up to L0CompactionThreshold,
	// one per checkpoint's flush) and every level above L6, and in the
	// latency benchmark (unique keys, 1 s checkpoints) those reads were a
	// fifth of the process's CPU. L6 gets none: Pebble does not read L6
	// filters on a Get (IterOptions.UseL6Filters), and L6 holds most of
	// the keys, so they would cost space and checkpoint bytes for nothing
	// (the same choice as RocksDB's optimize_filters_for_hits). Measured in
	// docs/bench/state-reads.md and weighed in docs/RATIONALE.md, both under
	// "Reads of keys the files lack".
	if !o.noFilters {
		for i := range po.Levels {
			po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		}
		po.Levels[len(po.Levels)-1].FilterPolicy = pebble.NoFilterPolicy
	}
	po.EnsureDefaults()
	return po
}

// SSTTargetSize is the size the state DB's SSTs are cut at, at every level
// of the LSM (pebbleOptions).
const SSTTargetSize = 16 << 20

// DB is the state of one slot: a Pebble instance holding the key groups of
// Options.Range. The methods that read or write state — Get, Scan, Counter,
// the timer methods, batches and their Commit, SweepExpired, EndReads,
// Checkpoint, CheckpointBegin, IngestSorted, DeleteOutsideRange, Prefetch and
// Close — belong to one goroutine, the writer's: the hold, the value cache
// and the point reader are its state, unlocked. The finish CheckpointBegin
// returns may run on another goroutine, as may Dir, Range, ApproxSize and
// Compacting; ScanRaw may run on several at once over a DB nobody writes (a
// checkpoint's snapshot).
type DB struct {
	dir  string
	db   *pebble.DB
	po   *pebble.Options
	opts Options
	// ttlMs is the TTL in milliseconds per stage id, 0 for none.
	ttlMs [256]int64
	// hasTTL: some stage has a TTL.
	hasTTL bool
	// closed makes Close idempotent (Pebble panics on a second close).
	closed atomic.Bool
	// flushes counts the flushes begun (CheckpointBegin).
	flushes *atomic.Int64
	// hold is the writes made since a checkpoint's barrier that the
	// checkpoint has not let into the DB yet (hold.go); writer-owned.
	hold *hold
	// cache is the value cache (cache.go; nil: off); writer-owned.
	cache *valueCache
	// timers is the due-time index (timerindex.go); writer-owned.
	timers timerIndex
	// prefetchCalls counts PrefetchPays' calls (prefetch.go); writer-owned.
	prefetchCalls int
	// point is the iterator Get reads through while pointOn (point.go;
	// nil: none open), missScore what decides pointOn, unitReads and
	// lastUnitReads the reads that reached Pebble in this unit of reads
	// (EndReads) and the last one; writer-owned.
	point                    *iter
	pointOn                  bool
	missScore                int
	unitReads, lastUnitReads int
	// writes counts the non-empty batches committed (Writes); writer-owned.
	writes uint64

	mu struct {
		sync.Mutex
		// sweepCursor is the key SweepExpired resumes from; nil means the
		// start of the range.
		sweepCursor []byte
		// passExpiry: the sweep's current pass saw an entry with an
		// expiry; noSweep: a whole pass without a TTL saw none.
		passExpiry, noSweep bool
	}
}

// Open opens (creating if needed, unless read-only) the DB in dir.
func Open(dir string, o Options) (*DB, error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("state: open %s: %w", dir, err)
	}
	if !o.ReadOnly {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("state: open %s: %w", dir, err)
		}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CacheSize <= 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.MemTableSize <= 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	po := o.pebbleOptions()
	flushes := new(atomic.Int64)
	po.EventListener = &pebble.EventListener{FlushBegin: func(pebble.FlushInfo) { flushes.Add(1) }}
	pdb, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("state: open %s: %w", dir, err)
	}
	d := &DB{dir: dir, db: pdb, po: po, opts: o, flushes: flushes}
	if o.ValueCacheBytes >= 0 {
		d.cache = newValueCache(cmp.Or(o.ValueCacheBytes, DefaultValueCacheBytes))
	}
	for stage, ttl := range o.TTL {
		d.ttlMs[stage] = ttl.Milliseconds()
		if ttl > 0 && d.ttlMs[stage] == 0 {
			d.ttlMs[stage] = 1 // sub-millisecond TTLs round up, never to "no TTL"
		}
		d.hasTTL = d.hasTTL || ttl > 0
	}
	return d, nil
}

// Close closes the DB. Batches and iterations must be finished first. A
// second Close does nothing.
func (d *DB) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.dropPoint()
	var held error
	if h := d.hold; h != nil {
		// The barrier's flush must end before Pebble closes. Held writes go
		// in if their checkpoint captured its files; otherwise they are
		// dropped with the DB (a start always restores a checkpoint).
		<-h.flushed
		h.iters = 0
		select {
		case <-h.captured:
			held = d.release(false)
		default:
			d.hold = nil
			h.b.Close()
		}
	}
	if d.opts.NoWAL && !d.opts.ReadOnly && held == nil {
		// Without a WAL the memtable is gone at close: flush it, so the
		// DB on disk is what the writer left (tools and tests read a
		// stopped job's state there; a start never does).
		if err := d.db.Flush(); err != nil {
			held = fmt.Errorf("state: close %s: flush: %w", d.dir, err)
		}
	}
	if err := d.db.Close(); err != nil {
		return fmt.Errorf("state: close %s: %w", d.dir, err)
	}
	return held
}

// Dir is the directory the DB lives in.
func (d *DB) Dir() string { return d.dir }

// Range is the key-group range the DB owns.
func (d *DB) Range() KeyGroupRange { return d.opts.Range }

func (d *DB) nowMs() int64 { return d.opts.Now().UnixMilli() }

func (d *DB) checkRange(op string, kg int) error {
	if !d.opts.Range.Contains(kg) {
		return fmt.Errorf("state: %s: key group %d not in %v of %s: %w", op, kg, d.opts.Range, d.dir, ErrOutOfRange)
	}
	return nil
}

// Get returns the value state of (userKey, sub) of a stage. An entry past its
// TTL is not found. The returned slice is a copy owned by the caller.
func (d *DB) Get(stage uint8, kg int, userKey, sub []byte) ([]byte, bool, error) {
	if err := d.checkRange("get", kg); err != nil {
		return nil, false, err
	}
	key := ValueKey(kg, stage, userKey, sub)
	var raw []byte
	if c := d.cache; c != nil {
		var found bool
		if raw, found = c.get(key); found && raw == nil {
			return nil, false, nil
		}
	}
	if raw == nil {
		r, found, err := d.read(key)
		if err != nil {
			return nil, false, fmt.Errorf("state: get %x: %w", key, err)
		}
		if !found {
			if d.cache != nil {
				d.cache.put(string(key), nil)
			}
			return nil, false, nil
		}
		raw = r
		if d.cache != nil {
			d.cache.put(string(key), raw)
		}
	}
	payload, exp, hasExp, err := decodeValue(raw)
	if err != nil {
		return nil, false, fmt.Errorf("state: get %x: %w", key, err)
	}
	if expired(exp, hasExp, d.nowMs()) {
		return nil, false, nil
	}
	return append(make([]byte, 0, len(payload)), payload...), true, nil
}

// Scan calls fn for each sub-key of userKey that starts with prefix, in
// sub-key order, skipping entries past their TTL. sub and value are valid
// only until fn returns. An error from fn stops the scan and is returned.
func (d *DB) Scan(stage uint8, kg int, userKey, prefix []byte, fn func(sub, value []byte) error) error {
	if err := d.checkRange("scan", kg); err != nil {
		return err
	}
	base := appendValuePrefix(nil, kg, stage, userKey)
	lower := append(base[:len(base):len(base)], prefix...)
	it, err := d.newIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixSuccessor(lower)})
	if err != nil {
		return fmt.Errorf("state: scan %x: %w", lower, err)
	}
	now := d.nowMs()
	for ok := it.First(); ok; ok = it.Next() {
		raw, err := it.ValueAndErr()
		if err != nil {
			break
		}
		payload, exp, hasExp, err := decodeValue(raw)
		if err != nil {
			it.Close()
			return fmt.Errorf("state: scan %x: %w", it.Key(), err)
		}
		if expired(exp, hasExp, now) {
			continue
		}
		if err := fn(it.Key()[len(base):], payload); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("state: scan %x: %w", lower, err)
	}
	return nil
}

// Counter returns engine counter id of key group kg; an absent counter is 0.
func (d *DB) Counter(kg int, id uint8) (uint64, error) {
	if err := d.checkRange("counter", kg); err != nil {
		return 0, err
	}
	key := CounterKey(kg, id)
	raw, closer, err := d.reader().Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("state: counter %x: %w", key, err)
	}
	defer closer.Close()
	if len(raw) != 8 {
		return 0, fmt.Errorf("state: counter %x: %d bytes: %w", key, len(raw), ErrCorruptValue)
	}
	return binary.BigEndian.Uint64(raw), nil
}

// rangeIter is an iterator bounded to the DB's key-group span.
func (d *DB) rangeIter(r KeyGroupRange) (*iter, error) {
	lo, hi := KeyGroupSpan(r)
	return d.newIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
}

// sweepScanFactor bounds the entries one SweepExpired call examines to
// limit*sweepScanFactor (at least sweepMinScan), so a call on a large DB with
// little expired state costs bounded time; the cursor carries on next call.
const (
	sweepScanFactor = 16
	sweepMinScan    = 4096
)

// Checkpoint writes a snapshot of the DB into dir, which must not exist. The
// memtable is flushed first, so the snapshot's state is all in SSTs and does
// not depend on the WAL; SSTs are hard-linked, so it is fast.
func (d *DB) Checkpoint(dir string) error {
	finish, err := d.CheckpointBegin()
	if err != nil {
		return fmt.Errorf("state: checkpoint %s: %w", dir, err)
	}
	return finish(dir)
}

// ErrCheckpointRaced is returned by a checkpoint's finish when a flush
// wrote tables between CheckpointBegin and the moment finish captured the
// DB's files: writes made after CheckpointBegin may be in the checkpoint.
// The checkpoint is abandoned (its folder removed); the DB is fine.
var ErrCheckpointRaced = errors.New("state: a flush ran while the checkpoint was written; abandoned")

// CheckpointBegin is the part of a checkpoint that must happen at the
// barrier, and it does not wait for anything: it starts flushing the
// memtable in the background and, from now on, holds the writer's commits
// on top of the DB (reads see them) instead of writing them into it, so the
// DB itself stays exactly the state at the call (see hold.go). The returned
// finish waits for that flush, writes the snapshot into dir (which must not
// exist) — hard links of every SST, a copy of Pebble's metadata — and then
// lets the held writes into the DB, at the writer's next commit. finish may
// run on another goroutine while the writer goes on (docs/RATIONALE.md,
// "The barrier holds writes instead of flushing"); it must be called once.
// A CheckpointBegin before the previous checkpoint's finish returned waits
// for it. If anything but the barrier's flush wrote tables before finish
// captured the files, finish returns ErrCheckpointRaced.
func (d *DB) CheckpointBegin() (finish func(dir string) error, err error) {
	if d.hold != nil {
		if err := d.release(true); err != nil {
			return nil, err
		}
		if d.hold != nil {
			return nil, fmt.Errorf("state: checkpoint %s: an iterator is open over the previous checkpoint's held writes", d.dir)
		}
	}
	h := d.beginHold()
	return func(dir string) error {
		defer close(h.captured)
		<-h.flushed
		if h.flushErr != nil {
			return fmt.Errorf("state: checkpoint %s: flush: %w", dir, h.flushErr)
		}
		return d.checkpointFinish(dir, h.flushes)
	}, nil
}

func (d *DB) checkpointFinish(dir string, flushes int64) error {
	if err := d.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("state: checkpoint %s: %w", dir, err)
	}
	// INVARIANT: no flush began since the barrier's own returned. The
	// writer's commits since the barrier are held (hold.go), so nothing
	// should have: this guards against writers that bypass the hold. The
	// count is read after Pebble captured the files: a flush that began
	// later cannot be in them; one that began earlier is counted.
	if d.flushes.Load() != flushes {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("state: checkpoint %s: %w", dir, ErrCheckpointRaced)
	}
	// The copied WAL holds no writes: the held ones are not in the DB yet,
	// and the flush emptied the memtable. Pebble recycles WAL files, and a recycled file
	// keeps its old size (25-30 MiB of stale records measured per slot),
	// which an incremental checkpoint would upload every time. Truncate it.
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("state: checkpoint %s: %w", dir, err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		if err := truncateSync(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("state: checkpoint %s: empty the flushed WAL: %w", dir, err)
		}
	}
	return nil
}

// truncateSync empties a file and fsyncs it, unless the file is a hard link
// (Pebble copies WALs into a checkpoint; a linked one would be the live WAL).
func truncateSync(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if n, ok := sysfile.Links(st); !ok || n != 1 {
		return nil
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ScanRaw calls fn with every stored key and value in the key groups of r, in
// key order, values in their stored encoding (with the TTL header, expired or
// not). key and value are valid only until fn returns. r is clipped to the
// DB's range. Feeding the output to Batch.PutRaw or IngestSorted reproduces
// the entries unchanged.
func (d *DB) ScanRaw(r KeyGroupRange, fn func(key, value []byte) error) error {
	r = KeyGroupRange{First: max(r.First, d.opts.Range.First), Last: min(r.Last, d.opts.Range.Last)}
	if r.Len() == 0 {
		return nil
	}
	it, err := d.rangeIter(r)
	if err != nil {
		return fmt.Errorf("state: scan raw %v: %w", r, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("state: scan raw %v: value of %x: %w", r, it.Key(), err)
		}
		if err := fn(it.Key(), v); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("state: scan raw %v: %w", r, err)
	}
	return nil
}

// SlotSnapshot is the synchronous part of one slot's checkpoint: a local
// Pebble checkpoint directory made by DB.Checkpoint on the barrier. The
// engine takes it and hands it on; the checkpoint writer only reads it.
type SlotSnapshot struct {
	Slot  int
	Range KeyGroupRange
	// Dir is the local checkpoint directory.
	Dir string
	// SyncDuration is how long the slot paused to take it.
	SyncDuration time.Duration
}

// ApproxSize is an estimate of the DB's size on disk, in bytes.
func (d *DB) ApproxSize() (uint64, error) {
	return d.db.Metrics().DiskSpaceUsage(), nil
}

// pebbleLogger routes Pebble's log lines to an injected slog.Logger.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	if p.l != nil {
		p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
	}
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	if p.l != nil {
		p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
	}
}

// Fatalf is called by Pebble on unrecoverable conditions (e.g. a failed
// fsync, or a corrupt block of a file read remotely in the background);
// continuing is unsafe, so it panics after logging and after the fatal
// hooks (AddFatalHook) have run.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if p.l != nil {
		p.l.Error(msg, "component", "pebble", "fatal", true)
	}
	fatalHooks.Lock()
	hooks := make([]func(string), 0, len(fatalHooks.m))
	for _, h := range fatalHooks.m {
		hooks = append(hooks, h)
	}
	fatalHooks.Unlock()
	for _, h := range hooks {
		h(msg)
	}
	panic("state: pebble fatal: " + msg)
}

// fatalHooks are called with the message of a Pebble fatal error before the
// process panics.
var fatalHooks struct {
	sync.Mutex
	next int
	m    map[int]func(msg string)
}

// AddFatalHook adds what runs when any DB of the process meets a Pebble
// fatal error, just before the panic: an online restore records there that
// its restore must not be retried online. Several can be set at once (each
// sub-topology of a job graph restores on its own); remove takes this one
// away.
func AddFatalHook(h func(msg string)) (remove func()) {
	fatalHooks.Lock()
	defer fatalHooks.Unlock()
	if fatalHooks.m == nil {
		fatalHooks.m = map[int]func(string){}
	}
	id := fatalHooks.next
	fatalHooks.next++
	fatalHooks.m[id] = h
	return func() {
		fatalHooks.Lock()
		defer fatalHooks.Unlock()
		delete(fatalHooks.m, id)
	}
}

// DeleteOutsideRange removes every key outside the DB's key-group range. A
// rescaled restore opens a copy of an old slot's files for a new slot whose
// range lies inside the old one's. Pebble's Excise drops the files that lie
// wholly outside the range at once and narrows the few that straddle its
// bounds to virtual tables over the same file: no key is rewritten, so the
// cost does not depend on the state size, and the remaining files keep
// their content (the next incremental checkpoint finds them in the store).
func (d *DB) DeleteOutsideRange(ctx context.Context) error {
	if d.opts.ReadOnly {
		return fmt.Errorf("state: delete outside range %s: read-only", d.dir)
	}
	if err := d.release(true); err != nil {
		return err
	}
	d.clearCache()
	d.timers.reset()
	lo, hi := KeyGroupSpan(d.opts.Range)
	// Every key starts with its 2-byte key group (< MaxKeyGroups, so the
	// first byte is below 0x80): [0x00, lo) and [hi, 0xff) cover all others.
	for _, span := range []pebble.KeyRange{{Start: []byte{0}, End: lo}, {Start: hi, End: []byte{0xff}}} {
		if bytes.Compare(span.Start, span.End) >= 0 {
			continue
		}
		if err := d.db.Excise(ctx, span); err != nil {
			return fmt.Errorf("state: delete outside range %s: excise [%x, %x): %w", d.dir, span.Start, span.End, err)
		}
	}
	return nil
}

// Compacting reports whether the DB has compactions running: a benchmark
// waits for a quiet spell before it measures reads "steady". (Pebble's
// estimated compaction debt is no such signal: it can stay above zero for
// an LSM no compaction will be scheduled for.)
func (d *DB) Compacting() bool {
	return d.db.Metrics().Compact.NumInProgress > 0
}

// TableStatsLoaded reports whether Pebble's background table statistics are
// loaded: after Open, and after each new file, a goroutine of Pebble's opens
// the tables to collect them, which during an online restore fetches their
// tails from the store at a time of its own. A test that counts the bytes
// its reads fetch waits for this first.
func (d *DB) TableStatsLoaded() bool {
	m := d.db.Metrics()
	return m.Table.InitialStatsCollectionComplete && m.Table.PendingStatsCollectionCount == 0
}
