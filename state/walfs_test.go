package state

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"cairn/internal/base/sysfile"
)

// allocated is the disk space the files under dir occupy (allocated blocks,
// what du counts), and the part of it in WAL files.
func allocated(t testing.TB, dir string) (total, wal int64) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		n := sysfile.Allocated(info)
		total += n
		if strings.HasSuffix(p, ".log") {
			wal += n
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total, wal
}

// putBatches commits n batches of 1000 small writes, as BenchmarkBatchPutCommit.
func putBatches(t testing.TB, d *DB, from, n int) {
	batch := d.NewBatch()
	defer batch.Close()
	key := make([]byte, 16)
	val := make([]byte, 32)
	for i := from; i < from+n; i++ {
		batch.Reset()
		for j := 0; j < 1000; j++ {
			x := uint64(i)*1000 + uint64(j)
			for k := range 8 {
				key[k] = byte(x >> (8 * k))
			}
			batch.Put(1, int(x%128), key, nil, val)
		}
		if err := batch.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWALDiskBounded: a fresh slot and one after writes and checkpoints
// occupy about what they wrote, not Pebble's preallocated WALs (35 MiB each
// at the default memtable size, walfs.go).
func TestWALDiskBounded(t *testing.T) {
	dir := t.TempDir()
	d := openDB(t, filepath.Join(dir, "db"), Options{KeyGroups: 128, Range: KeyGroupRange{First: 0, Last: 127}})
	if total, _ := allocated(t, d.Dir()); total > 1<<20 {
		t.Errorf("fresh DB allocates %d bytes, want < 1 MiB", total)
	}
	for i := range 6 {
		putBatches(t, d, i*20, 20) // 20k writes, ~1.2 MB of WAL
		if err := d.Checkpoint(filepath.Join(dir, "chk", string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	total, wal := allocated(t, d.Dir())
	t.Logf("after 120k writes and 6 checkpoints: %d bytes allocated, %d in WALs", total, wal)
	if wal > 8<<20 {
		t.Errorf("WALs allocate %d bytes, want < 8 MiB (4 WALs of ~1.2 MB written each)", wal)
	}
	// Reads after the WAL files were replaced rather than reused: reopen
	// replays the live WAL.
	putBatches(t, d, 1000, 1)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2 := openDB(t, filepath.Join(dir, "db"), Options{KeyGroups: 128, Range: KeyGroupRange{First: 0, Last: 127}})
	n := 0
	if err := d2.ScanRaw(KeyGroupRange{First: 0, Last: 127}, func(_, _ []byte) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 121_000 {
		t.Fatalf("%d entries after reopen, want 121000", n)
	}
}

// BenchmarkWALDisk compares Pebble's WAL file handling (preallocated,
// recycled) with walFS's on the same writes as BenchmarkBatchPutCommit:
// without checkpoints (WALs rotate when a memtable fills), and with a
// checkpoint (memtable flush, WAL rotation) every 200 batches of 1000 writes.
// It reports writes/s and the slot directory's allocated MiB at the end.
func BenchmarkWALDisk(b *testing.B) {
	for _, every := range []int{0, 200} {
		for _, c := range []struct {
			name   string
			pebble bool
		}{{"pebble-prealloc-recycle", true}, {"bounded", false}} {
			b.Run(fmt.Sprintf("checkpoint-every=%d/%s", every, c.name), func(b *testing.B) {
				dir := b.TempDir()
				d := openDB(b, filepath.Join(dir, "db"), Options{KeyGroups: 128, Range: KeyGroupRange{First: 0, Last: 127}, pebbleWALFiles: c.pebble})
				b.ReportAllocs()
				b.ResetTimer()
				step := every
				if step == 0 {
					step = b.N
				}
				for i, chk := 0, 0; i < b.N; i += step {
					n := min(step, b.N-i)
					putBatches(b, d, i, n)
					if every > 0 && n == every {
						chk++
						if err := d.Checkpoint(filepath.Join(dir, "chk", strconv.Itoa(chk))); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "writes/s")
				total, wal := allocated(b, d.Dir())
				b.ReportMetric(float64(total)/(1<<20), "dir-MiB")
				b.ReportMetric(float64(wal)/(1<<20), "wal-MiB")
			})
		}
	}
}
