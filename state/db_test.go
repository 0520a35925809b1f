package state

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

const testKGs = 16

var fullRange = KeyGroupRange{First: 0, Last: testKGs - 1}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func testOptions() Options {
	return Options{KeyGroups: testKGs, Range: fullRange, CacheSize: 1 << 20}
}

func openDB(t testing.TB, dir string, o Options) *DB {
	t.Helper()
	d, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func commit(t testing.TB, b *Batch) {
	t.Helper()
	if err := b.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close batch: %v", err)
	}
}

type kv struct{ k, v string }

// dump is every raw entry of d's range.
func dump(t testing.TB, d *DB, r KeyGroupRange) []kv {
	t.Helper()
	var out []kv
	if err := d.ScanRaw(r, func(k, v []byte) error {
		out = append(out, kv{string(k), string(v)})
		return nil
	}); err != nil {
		t.Fatalf("ScanRaw: %v", err)
	}
	return out
}

func mustGet(t testing.TB, d *DB, stage uint8, kg int, user, sub string) (string, bool) {
	t.Helper()
	v, ok, err := d.Get(stage, kg, []byte(user), []byte(sub))
	if err != nil {
		t.Fatalf("Get(%d, %d, %q, %q): %v", stage, kg, user, sub, err)
	}
	return string(v), ok
}

// fill writes a mix of every kind of entry across the key groups.
func fill(t testing.TB, d *DB, n int) {
	t.Helper()
	b := d.NewBatch()
	for i := 0; i < n; i++ {
		kg := i % testKGs
		user := fmt.Sprintf("user-%04d", i)
		b.Put(1, kg, []byte(user), nil, []byte(fmt.Sprintf("v%d", i)))
		b.Put(2, kg, []byte(user), []byte("sub"), []byte(strings.Repeat("x", i%50)))
		b.SetTimer(1, kg, DomainEventTime, int64(i-n/2), []byte(user))
		b.SetCounter(kg, CounterOutputs, uint64(i))
	}
	commit(t, b)
}

func TestGetPutDeleteScan(t *testing.T) {
	d := openDB(t, t.TempDir(), testOptions())
	b := d.NewBatch()
	b.Put(1, 3, []byte("k"), []byte("a"), []byte("1"))
	b.Put(1, 3, []byte("k"), []byte("ab"), []byte("2"))
	b.Put(1, 3, []byte("k"), []byte("b"), []byte("3"))
	b.Put(1, 3, []byte("k"), nil, []byte(""))
	b.Put(1, 3, []byte("kk"), []byte("a"), []byte("other user key"))
	b.Put(2, 3, []byte("k"), []byte("a"), []byte("other stage"))
	if b.Len() != 6 {
		t.Fatalf("Len = %d, want 6", b.Len())
	}
	commit(t, b)

	if v, ok := mustGet(t, d, 1, 3, "k", "ab"); !ok || v != "2" {
		t.Fatalf("Get = %q, %v", v, ok)
	}
	if v, ok := mustGet(t, d, 1, 3, "k", ""); !ok || v != "" {
		t.Fatalf("Get empty value = %q, %v", v, ok)
	}
	if _, ok := mustGet(t, d, 1, 4, "k", "ab"); ok {
		t.Fatal("found in another key group")
	}

	scan := func(prefix string) []string {
		var got []string
		if err := d.Scan(1, 3, []byte("k"), []byte(prefix), func(sub, v []byte) error {
			got = append(got, string(sub)+"="+string(v))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got, want := scan(""), []string{"=", "a=1", "ab=2", "b=3"}; !slices.Equal(got, want) {
		t.Fatalf("Scan all = %q, want %q", got, want)
	}
	if got, want := scan("a"), []string{"a=1", "ab=2"}; !slices.Equal(got, want) {
		t.Fatalf("Scan a = %q, want %q", got, want)
	}
	stop := errors.New("stop")
	if err := d.Scan(1, 3, []byte("k"), nil, func(_, _ []byte) error { return stop }); err != stop {
		t.Fatalf("Scan error = %v, want the callback's", err)
	}

	b = d.NewBatch()
	b.Delete(1, 3, []byte("k"), []byte("a"))
	commit(t, b)
	if got, want := scan("a"), []string{"ab=2"}; !slices.Equal(got, want) {
		t.Fatalf("Scan after delete = %q, want %q", got, want)
	}

	// Get returns a copy the caller owns.
	v, _, _ := d.Get(1, 3, []byte("k"), []byte("b"))
	v[0] = 'X'
	if v2, _ := mustGet(t, d, 1, 3, "k", "b"); v2 != "3" {
		t.Fatalf("Get result aliases storage: %q", v2)
	}
}

func TestOutOfRange(t *testing.T) {
	o := testOptions()
	o.Range = KeyGroupRange{First: 4, Last: 7}
	d := openDB(t, t.TempDir(), o)
	if _, _, err := d.Get(1, 3, []byte("k"), nil); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Get kg 3 = %v, want ErrOutOfRange", err)
	}
	if err := d.Scan(1, 8, []byte("k"), nil, func(_, _ []byte) error { return nil }); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Scan kg 8 = %v, want ErrOutOfRange", err)
	}
	if _, err := d.Counter(100, 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Counter kg 100 = %v, want ErrOutOfRange", err)
	}
	b := d.NewBatch()
	defer b.Close()
	b.Put(1, 4, []byte("ok"), nil, []byte("v"))
	b.SetTimer(1, 8, DomainEventTime, 1, []byte("k"))
	err := b.Commit()
	if !errors.Is(err, ErrOutOfRange) || !strings.HasPrefix(err.Error(), "state: commit") {
		t.Fatalf("Commit = %v, want state: commit ... ErrOutOfRange", err)
	}
	if _, ok := mustGet(t, d, 1, 4, "ok", ""); ok {
		t.Fatal("a failed batch wrote part of its content")
	}
	b.Reset()
	b.PutRaw(ValueKey(2, 1, []byte("k"), nil), []byte{0, 'v'})
	if err := b.Commit(); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("PutRaw kg 2 = %v, want ErrOutOfRange", err)
	}
	b.Reset()
	b.PutRaw(ValueKey(5, 1, []byte("k"), nil), []byte{9, 'v'})
	if err := b.Commit(); !errors.Is(err, ErrCorruptValue) {
		t.Fatalf("PutRaw bad header = %v, want ErrCorruptValue", err)
	}
	if _, err := Open(t.TempDir(), Options{KeyGroups: 8, Range: KeyGroupRange{First: 4, Last: 8}}); err == nil {
		t.Fatal("Open accepted a range beyond key_groups")
	}
}

func TestTTL(t *testing.T) {
	clock := newFakeClock()
	o := testOptions()
	o.Now = clock.Now
	o.TTL = map[uint8]time.Duration{1: time.Minute}
	dir := t.TempDir()
	d := openDB(t, dir, o)

	b := d.NewBatch()
	for i := 0; i < 100; i++ {
		b.Put(1, i%testKGs, []byte(fmt.Sprint("old", i)), []byte("s"), []byte("v"))
	}
	b.Put(2, 0, []byte("no-ttl"), nil, []byte("forever"))
	commit(t, b)

	clock.Advance(40 * time.Second)
	b = d.NewBatch()
	b.Put(1, 0, []byte("fresh"), []byte("s"), []byte("new"))
	b.Put(1, 0, []byte("old0"), []byte("t"), []byte("new sub of old key"))
	commit(t, b)

	if _, ok := mustGet(t, d, 1, 0, "old0", "s"); !ok {
		t.Fatal("value invisible before its TTL")
	}
	clock.Advance(30 * time.Second) // old: 70s > 60s; fresh: 30s
	if _, ok := mustGet(t, d, 1, 0, "old0", "s"); ok {
		t.Fatal("value visible after its TTL")
	}
	if v, ok := mustGet(t, d, 1, 0, "fresh", "s"); !ok || v != "new" {
		t.Fatalf("fresh value = %q, %v", v, ok)
	}
	if v, ok := mustGet(t, d, 2, 0, "no-ttl", ""); !ok || v != "forever" {
		t.Fatalf("no-TTL value = %q, %v", v, ok)
	}
	var subs []string
	if err := d.Scan(1, 0, []byte("old0"), nil, func(sub, _ []byte) error {
		subs = append(subs, string(sub))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(subs, []string{"t"}) {
		t.Fatalf("Scan after TTL = %q, want [t]", subs)
	}

	// Expired entries are still stored until swept.
	if n := len(dump(t, d, fullRange)); n != 103 {
		t.Fatalf("raw entries before sweep = %d, want 103", n)
	}
	total := 0
	for i := 0; i < 20; i++ {
		n, err := d.SweepExpired(7)
		if err != nil {
			t.Fatal(err)
		}
		if n > 7 {
			t.Fatalf("SweepExpired(7) removed %d", n)
		}
		total += n
	}
	if total != 100 {
		t.Fatalf("swept %d entries, want 100", total)
	}
	raw := dump(t, d, fullRange)
	if len(raw) != 3 {
		t.Fatalf("raw entries after sweep = %d, want 3", len(raw))
	}
	for _, e := range raw {
		if strings.Contains(e.k, "old") && !strings.Contains(e.k, "old0") {
			t.Fatalf("expired entry %x survived the sweep", e.k)
		}
	}
	if n, err := d.SweepExpired(1000); err != nil || n != 0 {
		t.Fatalf("second sweep = %d, %v", n, err)
	}

	// The stored expiry is honoured after a restart without the TTL config.
	d.Close()
	o.TTL = nil
	d2 := openDB(t, dir, o)
	clock.Advance(time.Hour)
	if _, ok := mustGet(t, d2, 1, 0, "fresh", "s"); ok {
		t.Fatal("stored expiry ignored after reopening without TTL")
	}
	if _, ok := mustGet(t, d2, 2, 0, "no-ttl", ""); !ok {
		t.Fatal("no-TTL value lost")
	}

	// Without a TTL the sweep goes on while entries written with an expiry
	// may remain, and stops after a whole pass that saw none.
	sweepPass := func() (removed int) {
		for i := 0; i < 10 && d2.NeedsSweep(); i++ {
			n, err := d2.SweepExpired(1000)
			if err != nil {
				t.Fatal(err)
			}
			removed += n
		}
		return removed
	}
	if !d2.NeedsSweep() {
		t.Fatal("a DB that may hold expiring entries does not need a sweep")
	}
	if n := sweepPass(); n == 0 || d2.NeedsSweep() {
		t.Fatalf("sweep without TTL: removed %d (want the entries written with a TTL), needs sweep %v after a clean pass", n, d2.NeedsSweep())
	}
	if n, err := d2.SweepExpired(1000); n != 0 || err != nil {
		t.Fatalf("a sweep after it stopped: %d, %v", n, err)
	}
}

func TestTimers(t *testing.T) {
	dir := t.TempDir()
	o := testOptions()
	o.Range = KeyGroupRange{First: 2, Last: 9}
	d := openDB(t, dir, o)
	if _, ok, err := d.NextTimer(1, DomainEventTime); err != nil || ok {
		t.Fatalf("NextTimer on empty DB = %v, %v", ok, err)
	}
	b := d.NewBatch()
	b.SetTimer(1, 7, DomainEventTime, 50, []byte("b"))
	b.SetTimer(1, 7, DomainEventTime, 50, []byte("a"))
	b.SetTimer(1, 7, DomainEventTime, 50, []byte("a")) // idempotent
	b.SetTimer(1, 7, DomainEventTime, -10, []byte("z"))
	b.SetTimer(1, 3, DomainEventTime, 100, []byte("c"))
	b.SetTimer(1, 3, DomainEventTime, 20, []byte("d"))
	b.SetTimer(1, 9, DomainEventTime, 5, []byte("e"))
	b.SetTimer(1, 2, DomainProcessingTime, -1000, []byte("proc"))
	b.SetTimer(2, 2, DomainEventTime, -2000, []byte("other stage"))
	b.Put(1, 5, []byte("value"), nil, []byte("v"))
	commit(t, b)

	d.Close()
	d = openDB(t, dir, o)

	if ts, ok, err := d.NextTimer(1, DomainEventTime); err != nil || !ok || ts != -10 {
		t.Fatalf("NextTimer event = %d, %v, %v; want -10", ts, ok, err)
	}
	if ts, ok, err := d.NextTimer(1, DomainProcessingTime); err != nil || !ok || ts != -1000 {
		t.Fatalf("NextTimer processing = %d, %v, %v; want -1000", ts, ok, err)
	}
	if ts, ok, err := d.NextTimer(2, DomainEventTime); err != nil || !ok || ts != -2000 {
		t.Fatalf("NextTimer stage 2 = %d, %v, %v; want -2000", ts, ok, err)
	}
	if _, ok, err := d.NextTimer(3, DomainEventTime); err != nil || ok {
		t.Fatalf("NextTimer stage 3 = %v, %v", ok, err)
	}

	due := func(upTo int64) []string {
		var got []string
		if err := d.DueTimers(1, DomainEventTime, upTo, func(kg int, ts int64, user []byte) error {
			got = append(got, fmt.Sprintf("%d/%d/%s", kg, ts, user))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got, want := due(50), []string{"3/20/d", "7/-10/z", "7/50/a", "7/50/b", "9/5/e"}; !slices.Equal(got, want) {
		t.Fatalf("DueTimers(50) = %q, want %q", got, want)
	}
	if got, want := due(49), []string{"3/20/d", "7/-10/z", "9/5/e"}; !slices.Equal(got, want) {
		t.Fatalf("DueTimers(49) = %q, want %q", got, want)
	}
	if got := due(-11); len(got) != 0 {
		t.Fatalf("DueTimers(-11) = %q", got)
	}
	if got := due(1<<63 - 1); len(got) != 6 {
		t.Fatalf("DueTimers(max) = %q, want 6", got)
	}

	// The caller deletes what fired.
	b = d.NewBatch()
	if err := d.DueTimers(1, DomainEventTime, 50, func(kg int, ts int64, user []byte) error {
		b.DeleteTimer(1, kg, DomainEventTime, ts, user)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	commit(t, b)
	if got, want := due(1<<63-1), []string{"3/100/c"}; !slices.Equal(got, want) {
		t.Fatalf("after delete = %q, want %q", got, want)
	}
	if ts, ok, _ := d.NextTimer(1, DomainEventTime); !ok || ts != 100 {
		t.Fatalf("NextTimer after delete = %d, %v", ts, ok)
	}
}

func TestCountersPersist(t *testing.T) {
	dir := t.TempDir()
	d := openDB(t, dir, testOptions())
	if n, err := d.Counter(3, CounterOutputs); err != nil || n != 0 {
		t.Fatalf("absent counter = %d, %v", n, err)
	}
	b := d.NewBatch()
	b.SetCounter(3, CounterOutputs, 1<<40+7)
	b.SetCounter(4, CounterOutputs, 1)
	commit(t, b)
	d.Close()
	d = openDB(t, dir, testOptions())
	if n, err := d.Counter(3, CounterOutputs); err != nil || n != 1<<40+7 {
		t.Fatalf("counter after reopen = %d, %v", n, err)
	}
	if n, _ := d.Counter(4, CounterOutputs); n != 1 {
		t.Fatalf("counter kg 4 = %d", n)
	}
}

func TestCheckpoint(t *testing.T) {
	root := t.TempDir()
	d := openDB(t, filepath.Join(root, "db"), testOptions())
	fill(t, d, 2000)
	// Unflushed writes just before the checkpoint must be in it.
	b := d.NewBatch()
	b.Put(1, 0, []byte("last"), nil, []byte("write"))
	commit(t, b)

	chk := filepath.Join(root, "chk")
	if err := d.Checkpoint(chk); err != nil {
		t.Fatal(err)
	}
	if err := d.Checkpoint(chk); err == nil {
		t.Fatal("Checkpoint overwrote an existing directory")
	}
	want := dump(t, d, fullRange)

	// Writes after the checkpoint are not in it.
	b = d.NewBatch()
	b.Put(1, 0, []byte("after"), nil, []byte("x"))
	commit(t, b)

	o := testOptions()
	o.ReadOnly = true
	c := openDB(t, chk, o)
	got := dump(t, c, fullRange)
	if !slices.Equal(got, want) {
		t.Fatalf("checkpoint has %d entries, DB had %d", len(got), len(want))
	}
	if v, ok := mustGet(t, c, 1, 0, "last", ""); !ok || v != "write" {
		t.Fatalf("last write = %q, %v", v, ok)
	}
	if _, ok := mustGet(t, c, 1, 0, "after", ""); ok {
		t.Fatal("write after checkpoint visible in it")
	}
	if sz, err := d.ApproxSize(); err != nil || sz == 0 {
		t.Fatalf("ApproxSize = %d, %v", sz, err)
	}
}

func TestRawRoundTrip(t *testing.T) {
	clock := newFakeClock()
	o := testOptions()
	o.Now = clock.Now
	o.TTL = map[uint8]time.Duration{1: time.Hour}
	src := openDB(t, t.TempDir(), o)
	fill(t, src, 500)
	want := dump(t, src, fullRange)

	dst := openDB(t, t.TempDir(), testOptions()) // no TTL config: the header travels with the value
	b := dst.NewBatch()
	if err := src.ScanRaw(fullRange, func(k, v []byte) error {
		b.PutRaw(k, v)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	commit(t, b)
	if got := dump(t, dst, fullRange); !slices.Equal(got, want) {
		t.Fatalf("PutRaw copy differs: %d vs %d entries", len(got), len(want))
	}
}

func ingestFrom(src *DB, r KeyGroupRange) func(yield func(k, v []byte) error) error {
	return func(yield func(k, v []byte) error) error { return src.ScanRaw(r, yield) }
}

func TestIngestSorted(t *testing.T) {
	root := t.TempDir()
	src := openDB(t, filepath.Join(root, "src"), testOptions())
	fill(t, src, 3000)
	want := dump(t, src, fullRange)

	dst, err := IngestSorted(filepath.Join(root, "full"), testOptions(), ingestFrom(src, fullRange))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if got := dump(t, dst, fullRange); !slices.Equal(got, want) {
		t.Fatalf("ingested DB differs: %d vs %d entries", len(got), len(want))
	}
	if _, err := os.Stat(filepath.Join(dst.Dir(), ingestStaging)); !os.IsNotExist(err) {
		t.Fatalf("staging folder left behind: %v", err)
	}
	if ts, ok, err := dst.NextTimer(1, DomainEventTime); err != nil || !ok || ts != -1500 {
		t.Fatalf("NextTimer in ingested DB = %d, %v, %v", ts, ok, err)
	}
	// The ingested DB is writable.
	b := dst.NewBatch()
	b.Put(1, 0, []byte("new"), nil, []byte("v"))
	commit(t, b)

	// Range-restricted: only key groups 5..9.
	part := KeyGroupRange{First: 5, Last: 9}
	o := testOptions()
	o.Range = part
	pd, err := IngestSorted(filepath.Join(root, "part"), o, ingestFrom(src, part))
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	got := dump(t, pd, fullRange)
	if wantPart := dump(t, src, part); !slices.Equal(got, wantPart) || len(got) == 0 {
		t.Fatalf("partial ingest: %d entries, want %d", len(got), len(wantPart))
	}
	for _, e := range got {
		if kg := int(e.k[0])<<8 | int(e.k[1]); !part.Contains(kg) {
			t.Fatalf("partial ingest holds key group %d", kg)
		}
	}
	// Bypass ScanRaw's clipping: the raw Pebble contents hold nothing else.
	it, err := pd.db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	it.Close()
	if n != len(got) {
		t.Fatalf("partial DB has %d raw keys, want %d", n, len(got))
	}

	// Keys outside the range, out of order, or into a non-empty dir are refused.
	if _, err := IngestSorted(filepath.Join(root, "bad-range"), o, ingestFrom(src, fullRange)); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("out-of-range ingest = %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "bad-range")); !os.IsNotExist(err) {
		t.Fatalf("failed ingest left its directory: %v", err)
	}
	unsorted := func(yield func(k, v []byte) error) error {
		if err := yield(CounterKey(2, 1), make([]byte, 8)); err != nil {
			return err
		}
		return yield(CounterKey(1, 1), make([]byte, 8))
	}
	if _, err := IngestSorted(filepath.Join(root, "unsorted"), testOptions(), unsorted); !errors.Is(err, ErrUnsorted) {
		t.Fatalf("unsorted ingest = %v", err)
	}
	if _, err := IngestSorted(filepath.Join(root, "src"), testOptions(), ingestFrom(src, fullRange)); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("ingest into existing DB = %v", err)
	}
}

// TestIngestSortedSplitsFiles writes past the SST size target (lowered for the
// test) so the input spans several files.
func TestIngestSortedSplitsFiles(t *testing.T) {
	defer func(old uint64) { ingestFileSize = old }(ingestFileSize)
	ingestFileSize = 256 << 10
	const n = 20_000
	rng := rand.New(rand.NewPCG(1, 2))
	val := make([]byte, 1+100)
	kvs := func(yield func(k, v []byte) error) error {
		for i := 0; i < n; i++ {
			for j := 1; j < len(val); j++ {
				val[j] = byte(rng.Uint32())
			}
			if err := yield(ValueKey(i*testKGs/n, 1, []byte(fmt.Sprintf("%08d", i)), nil), val); err != nil {
				return err
			}
		}
		return nil
	}
	d, err := IngestSorted(filepath.Join(t.TempDir(), "db"), testOptions(), kvs)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if files := d.db.Metrics().Levels[6].TablesCount; files < 4 {
		t.Errorf("%d files in L6, want several", files)
	}
	count := 0
	if err := d.ScanRaw(fullRange, func(_, _ []byte) error { count++; return nil }); err != nil {
		t.Fatal(err)
	}
	if count != n {
		t.Fatalf("%d entries, want %d", count, n)
	}
}

func BenchmarkBatchPutCommit(b *testing.B) {
	d := openDB(b, b.TempDir(), Options{KeyGroups: 128, Range: KeyGroupRange{First: 0, Last: 127}})
	batch := d.NewBatch()
	defer batch.Close()
	key := make([]byte, 16)
	val := make([]byte, 32)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch.Reset()
		for j := 0; j < 1000; j++ {
			x := uint64(i)*1000 + uint64(j)
			for k := range 8 {
				key[k] = byte(x >> (8 * k))
			}
			batch.Put(1, int(x%128), key, nil, val)
		}
		if err := batch.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "writes/s")
}

func BenchmarkGet(b *testing.B) {
	d := openDB(b, b.TempDir(), Options{KeyGroups: 128, Range: KeyGroupRange{First: 0, Last: 127}})
	const n = 100_000
	batch := d.NewBatch()
	for i := 0; i < n; i++ {
		k := []byte(fmt.Sprintf("key-%06d", i))
		batch.Put(1, KeyGroup(k, 128), k, nil, []byte("value-of-some-32-bytes-length.."))
		if batch.Len() == 1000 {
			if err := batch.Commit(); err != nil {
				b.Fatal(err)
			}
			batch.Reset()
		}
	}
	commit(b, batch)
	if err := d.db.Flush(); err != nil {
		b.Fatal(err)
	}
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key-%06d", (i*7919)%n))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := keys[i%len(keys)]
		if _, ok, err := d.Get(1, KeyGroup(k, 128), k, nil); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// TestDeleteOutsideRange: a copy of a DB opened for a sub-range and clipped
// holds exactly that sub-range's entries, also after a reopen, and a
// read-only DB refuses to clip.
func TestDeleteOutsideRange(t *testing.T) {
	dir := t.TempDir()
	src, err := Open(dir, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	fill(t, src, 600)
	sub := KeyGroupRange{First: 3, Last: testKGs / 2}
	want := dump(t, src, sub)
	if len(want) == 0 || len(want) == len(dump(t, src, fullRange)) {
		t.Fatalf("test data: %d entries in the sub-range", len(want))
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	o := testOptions()
	o.Range = sub
	o.ReadOnly = true
	ro := openDB(t, dir, o)
	if err := ro.DeleteOutsideRange(context.Background()); err == nil {
		t.Fatal("a read-only DB clipped its range")
	}
	ro.Close()
	o.ReadOnly = false
	d, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteOutsideRange(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopened over every key group: only the sub-range is left.
	all := openDB(t, dir, testOptions())
	if got := dump(t, all, fullRange); !slices.Equal(got, want) {
		t.Fatalf("after clipping to %v: %d entries, want the %d of the range", sub, len(got), len(want))
	}
}

// TestClipThenIngest is a scale-down restore's slot: a copy of one DB
// clipped to the part of the new range it holds, plus the other part
// ingested from another DB. The result equals the union; a failed ingest
// (keys out of order) leaves the DB as it was.
func TestClipThenIngest(t *testing.T) {
	root := t.TempDir()
	src := openDB(t, filepath.Join(root, "src"), testOptions())
	fill(t, src, 3000)
	newRange := KeyGroupRange{First: 4, Last: 11}
	want := dump(t, src, newRange)
	if err := src.Checkpoint(filepath.Join(root, "copy")); err != nil {
		t.Fatal(err)
	}
	o := testOptions()
	o.Range = newRange
	o.NoCompactions = true
	d := openDB(t, filepath.Join(root, "copy"), o)
	// The copy stands for an old slot holding key groups 0-7: clip it to
	// 4-11 (it keeps 4-7, here also 8-11: excised below, then ingested).
	if err := d.DeleteOutsideRange(context.Background()); err != nil {
		t.Fatal(err)
	}
	half := KeyGroupRange{First: 8, Last: 11}
	if err := d.db.Excise(context.Background(), pebble.KeyRange{Start: kgKey(half.First), End: kgKey(half.Last + 1)}); err != nil {
		t.Fatal(err)
	}
	before := dump(t, d, fullRange)
	if err := d.IngestSorted(func(yield func(k, v []byte) error) error {
		_ = yield([]byte{0, 9, 1, 1, 1, 'b'}, []byte{0})
		return yield([]byte{0, 8, 1, 1, 1, 'a'}, []byte{0})
	}); !errors.Is(err, ErrUnsorted) {
		t.Fatalf("unsorted ingest: %v", err)
	}
	if got := dump(t, d, fullRange); !slices.Equal(got, before) {
		t.Fatal("a failed ingest changed the DB")
	}
	if err := d.IngestSorted(ingestFrom(src, half)); err != nil {
		t.Fatal(err)
	}
	if got := dump(t, d, fullRange); !slices.Equal(got, want) {
		t.Fatalf("clipped + ingested: %d entries, want %d", len(got), len(want))
	}
}

// TestCheckpointBeginFinish: the snapshot holds exactly the state at
// CheckpointBegin although the writer went on before finish (its writes,
// also deletes and overwrites, stay out); a flush between the two makes
// finish fail with ErrCheckpointRaced and leave no folder.
func TestCheckpointBeginFinish(t *testing.T) {
	root := t.TempDir()
	d := openDB(t, filepath.Join(root, "db"), testOptions())
	fill(t, d, 2000)
	b := d.NewBatch()
	b.Put(1, 0, []byte("before"), nil, []byte("v1"))
	commit(t, b)
	finish, err := d.CheckpointBegin()
	if err != nil {
		t.Fatal(err)
	}
	want := dump(t, d, fullRange)
	b = d.NewBatch()
	b.Put(1, 0, []byte("before"), nil, []byte("v2"))
	b.Put(1, 0, []byte("after"), nil, []byte("x"))
	commit(t, b)
	chk := filepath.Join(root, "chk")
	if err := finish(chk); err != nil {
		t.Fatal(err)
	}
	o := testOptions()
	o.ReadOnly = true
	c := openDB(t, chk, o)
	if got := dump(t, c, fullRange); !slices.Equal(got, want) {
		t.Fatalf("checkpoint has %d entries, the DB had %d at CheckpointBegin", len(got), len(want))
	}
	if v, ok := mustGet(t, c, 1, 0, "before", ""); !ok || v != "v1" {
		t.Fatalf("overwritten after begin: checkpoint has %q, %v; want v1", v, ok)
	}
	if _, ok := mustGet(t, c, 1, 0, "after", ""); ok {
		t.Fatal("a write after CheckpointBegin is in the checkpoint")
	}

	// A write that bypasses the hold, flushed before finish: abandoned.
	finish, err = d.CheckpointBegin()
	if err != nil {
		t.Fatal(err)
	}
	<-d.hold.flushed
	if err := d.db.Set(ValueKey(0, 1, []byte("bypass"), nil), []byte("y"), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := d.db.Flush(); err != nil {
		t.Fatal(err)
	}
	chk2 := filepath.Join(root, "chk2")
	if err := finish(chk2); !errors.Is(err, ErrCheckpointRaced) {
		t.Fatalf("finish after a flush: %v, want ErrCheckpointRaced", err)
	}
	if _, err := os.Stat(chk2); !os.IsNotExist(err) {
		t.Fatalf("the abandoned checkpoint's folder is still there: %v", err)
	}
}
