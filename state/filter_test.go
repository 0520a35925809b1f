package state

import (
	"fmt"
	"testing"
)

// l0DB opens a DB whose state is flushes L0 files of perFlush new keys each,
// the shape 1 s checkpoints give a job whose keys are new (each flush one
// L0 file spanning every key group). The value cache is off, so reads go
// to Pebble. Key i is "key-<i>".
func l0DB(tb testing.TB, noFilters bool, flushes, perFlush int) *DB {
	tb.Helper()
	d := openDB(tb, tb.TempDir(), Options{KeyGroups: 128, Range: KeyGroupRange{First: 0, Last: 127}, ValueCacheBytes: -1, NoWAL: true, NoCompactions: true, noFilters: noFilters})
	for f := range flushes {
		batch := d.NewBatch()
		for i := f * perFlush; i < (f+1)*perFlush; i++ {
			k := []byte(fmt.Sprintf("key-%08d", i))
			batch.Put(1, KeyGroup(k, 128), k, nil, []byte("value-of-some-32-bytes-length.."))
		}
		commit(tb, batch)
		if err := d.db.Flush(); err != nil {
			tb.Fatal(err)
		}
	}
	if n := d.db.Metrics().Levels[0].TablesCount; n != int64(flushes) {
		tb.Fatalf("%d files in L0, want %d", n, flushes)
	}
	return d
}

// TestGetThroughFilters: with bloom filters on L0, reads find every key of
// every flush and none of the keys never written; the files carry a filter.
func TestGetThroughFilters(t *testing.T) {
	const flushes, perFlush = 8, 2000
	d := l0DB(t, false, flushes, perFlush)
	for i := 0; i < flushes*perFlush+500; i += 7 {
		k := []byte(fmt.Sprintf("key-%08d", i))
		v, ok, err := d.Get(1, KeyGroup(k, 128), k, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < flushes*perFlush; ok != want || (ok && string(v) != "value-of-some-32-bytes-length..") {
			t.Fatalf("Get(%s) = %q, %v; want found %v", k, v, ok, want)
		}
	}
	m := d.db.Metrics()
	if m.Filter.Hits == 0 {
		t.Fatalf("no read was answered by a filter: %+v", m.Filter)
	}
}

// BenchmarkGetL0 reads keys from a DB of 4, 16 or 32 L0 files (checkpoint
// flushes of 10,000 new keys each; 32 is L0CompactionThreshold), with the
// bloom filters and without, ending the reads (EndReads, as a slot does
// after each operator call) after every read or after every 64: new is a
// key in no file, oldest a key of the first flush (found in the last file
// probed).
func BenchmarkGetL0(b *testing.B) {
	const perFlush = 10_000
	for _, flushes := range []int{4, 16, 32} {
		for _, filters := range []bool{true, false} {
			d := l0DB(b, !filters, flushes, perFlush)
			// What the filters cost on disk: the L0 files' bytes per key.
			bytesPerKey := float64(d.db.Metrics().Levels[0].TablesSize) / float64(flushes*perFlush)
			for _, perCall := range []int{1, 64} {
				for _, c := range []struct {
					name  string
					first int
					found bool
				}{{"new", flushes * perFlush, false}, {"oldest", 0, true}} {
					keys := make([][]byte, 1024)
					for i := range keys {
						keys[i] = []byte(fmt.Sprintf("key-%08d", c.first+(i*7919)%perFlush))
					}
					b.Run(fmt.Sprintf("files=%d/filters=%v/reads-per-call=%d/%s", flushes, filters, perCall, c.name), func(b *testing.B) {
						b.ReportAllocs()
						for i := 0; b.Loop(); i++ {
							k := keys[i%len(keys)]
							if _, ok, err := d.Get(1, KeyGroup(k, 128), k, nil); err != nil || ok != c.found {
								b.Fatal(k, ok, err)
							}
							if (i+1)%perCall == 0 {
								d.EndReads()
							}
						}
						d.EndReads()
						b.ReportMetric(bytesPerKey, "l0-bytes/key")
					})
				}
			}
			if err := d.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkGetUpdated reads keys updated since the DB was compacted: their
// newest version is in the memtable and an older one in L6. Get stops at the
// memtable; the point iterator seeks L6 too, which is why reads take it only
// while most of them find nothing (point.go). l6 reads keys held in L6 only.
func BenchmarkGetUpdated(b *testing.B) {
	const n, updated = 200_000, 1000
	for _, c := range []struct {
		name  string
		force int
	}{{"get", readGet}, {"point", readPoint}} {
		d := openDB(b, b.TempDir(), Options{KeyGroups: 128, Range: KeyGroupRange{First: 0, Last: 127}, ValueCacheBytes: -1, NoWAL: true, forceRead: c.force})
		put := func(from, to int, v string) {
			batch := d.NewBatch()
			for i := from; i < to; i++ {
				k := []byte(fmt.Sprintf("key-%08d", i))
				batch.Put(1, KeyGroup(k, 128), k, nil, []byte(v))
			}
			commit(b, batch)
		}
		put(0, n, "value-of-some-32-bytes-length..")
		if err := d.db.Flush(); err != nil {
			b.Fatal(err)
		}
		if err := d.db.Compact(b.Context(), []byte{0}, []byte{0xff}, true); err != nil {
			b.Fatal(err)
		}
		put(0, updated, "value-of-some-32-bytes-length.2")
		for _, r := range []struct {
			name  string
			first int
		}{{"memtable", 0}, {"l6", n / 2}} {
			keys := make([][]byte, 1024)
			for i := range keys {
				keys[i] = []byte(fmt.Sprintf("key-%08d", r.first+(i*7919)%updated))
			}
			b.Run(c.name+"/"+r.name, func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					k := keys[i%len(keys)]
					if _, ok, err := d.Get(1, KeyGroup(k, 128), k, nil); err != nil || !ok {
						b.Fatal(k, ok, err)
					}
					if (i+1)%64 == 0 {
						d.EndReads()
					}
				}
				d.EndReads()
			})
		}
		if err := d.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
