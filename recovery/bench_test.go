package recovery

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"cairn/checkpoint"
	"cairn/internal/app/job"
	"cairn/internal/base/par"
)

var benchState = flag.String("recovery.state", "64MiB", "BenchmarkRestore: state size (KiB, MiB, GiB suffixes)")

// BenchmarkRestore measures restore time and bytes for one state (size from
// -recovery.state) checkpointed at 2 slots: incremental vs full, same slot
// count vs rescaled, store vs local vs a warm standby cache, and a plain
// parallel copy of the same bytes as the reference.
//
//	go test ./recovery -run '^$' -bench Restore -benchtime 3x -recovery.state 256MiB
func BenchmarkRestore(b *testing.B) {
	size, err := job.ParseBytes(*benchState)
	if err != nil {
		b.Fatal(err)
	}
	const valueLen = 100
	keys := int(size / (valueLen + 24))
	e := newEnv(b, nil, 128, 2, checkpoint.ModeIncremental, 42)
	e.write(keys, keys*4, valueLen, 0)
	e.checkpoint("")
	// Let the first compactions of the bulk load happen before the
	// checkpoint the standby holds, as in a job that has been running.
	e.write(keys/100, keys*4, valueLen, 0)
	first, _ := e.checkpoint("")
	cache := filepath.Join(b.TempDir(), "cache")
	sb := NewStandby(e.store, testJob, cache, quietLogger())
	if err := sb.Sync(context.Background()); err != nil {
		b.Fatal(err)
	}
	e.write(keys/100, keys*4, valueLen, 0) // a 1% update
	inc, _ := e.checkpoint("")
	full, _ := e.checkpoint(checkpoint.ModeFull)
	shared := map[string]bool{}
	for _, o := range first.Objects {
		shared[o.Path] = true
	}
	var reused int64
	for _, o := range inc.Objects {
		if shared[o.Path] {
			reused += o.Size
		}
	}
	b.Logf("after the 1%% update, %d of %d bytes are shared with the standby's checkpoint", reused, inc.Figures.FullStateSize)
	b.Logf("state: %d keys, incremental %d MiB in %d files, full %d MiB", keys, inc.Figures.FullStateSize>>20, len(inc.Objects), full.Figures.FullStateSize>>20)

	run := func(name string, m *checkpoint.Manifest, slots int, local, standby bool) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(m.Figures.FullStateSize)
			var r *Result
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				data := filepath.Join(b.TempDir(), fmt.Sprint(i))
				b.StartTimer()
				o := e.opts(data, slots)
				if local {
					o.LocalDir = e.localDir
				}
				if standby {
					o.CacheDir = cache
				}
				var err error
				if r, err = Restore(context.Background(), m, o); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(data)
				b.StartTimer()
			}
			b.ReportMetric(float64(r.BytesDownloaded), "B-downloaded/op")
		})
	}
	b.Run("copy-baseline", func(b *testing.B) {
		// A plain parallel copy of the incremental checkpoint's bytes from
		// the store's folder: the reference for store restore throughput.
		b.SetBytes(inc.Figures.FullStateSize)
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			dst := filepath.Join(b.TempDir(), fmt.Sprint(i))
			os.MkdirAll(dst, 0o755)
			b.StartTimer()
			err := par.Do(context.Background(), len(inc.Objects), 8, func(_ context.Context, j int) error {
				o := inc.Objects[j]
				return copyFile(filepath.Join(e.storeRoot, filepath.FromSlash(o.Path)), filepath.Join(dst, fmt.Sprint(j)))
			})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.RemoveAll(dst)
			b.StartTimer()
		}
	})
	run("incremental/same/store", inc, 2, false, false)
	run("incremental/same/local", inc, 2, true, false)
	run("incremental/same/standby", inc, 2, false, true)
	run("incremental/rescale-2to4/store", inc, 4, false, false)
	run("incremental/rescale-2to1/store", inc, 1, false, false)
	run("full/same/store", full, 2, false, false)
	run("full/rescale-2to4/store", full, 4, false, false)
}
