package state_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"cairn/internal/app/job"
	"cairn/internal/testutil/benchstate"
)

var (
	pauseSizes = flag.String("pause.sizes", "8MiB", "BenchmarkCheckpointPause: comma-separated state sizes (key+value bytes)")
	pauseDir   = flag.String("pause.dir", "", "BenchmarkCheckpointPause: work directory (default: the benchmark's temp dir)")
	pauseWrite = flag.Int("pause.writes", 20_000, "BenchmarkCheckpointPause: keys written between two checkpoints")
)

// BenchmarkCheckpointPause is the pause a checkpoint's barrier costs a slot
// (DB.CheckpointBegin: what the slot waits for before it processes the next
// record), over b.N checkpoints of each state size, each after
// -pause.writes writes; the rest of each checkpoint (flush, links) runs
// untimed. It reports the pause's p50, p90 and max per size and, with
// several sizes, each size's p50 ÷ the first's: the pause must not grow
// with the state, and this takes enough samples that microseconds compare.
//
//	go test ./state -run '^$' -bench CheckpointPause -benchtime 200x -timeout 0 \
//	    -pause.sizes 256MiB,1GiB,4GiB -pause.dir /work/bench-tmp
func BenchmarkCheckpointPause(b *testing.B) {
	var first time.Duration
	for i, sz := range strings.Split(*pauseSizes, ",") {
		size, err := job.ParseBytes(strings.TrimSpace(sz))
		if err != nil {
			b.Fatal(err)
		}
		// Built here, once: the sub-benchmark runs twice (N=1, then N).
		root := benchstate.WorkDir(b, *pauseDir, "pause-"+sz)
		s, _ := benchstate.Build(b, filepath.Join(root, "db"), size, 2, 42)
		b.Run(sz, func(b *testing.B) {
			p50 := benchPause(b, s, root)
			if i == 0 {
				first = p50
			} else if first > 0 {
				b.ReportMetric(float64(p50)/float64(first), "p50-ratio-to-first")
			}
		})
		s.Close()
		os.RemoveAll(root)
	}
}

// benchPause times b.N checkpoints of s's first slot, each in a folder
// under root, and returns the pause's p50.
func benchPause(b *testing.B, s *benchstate.State, root string) time.Duration {
	db := s.DBs[0]
	pauses := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for n := range b.N {
		b.StopTimer()
		s.UpdateN(b, *pauseWrite)
		dir := filepath.Join(root, "chk", fmt.Sprint(n))
		b.StartTimer()
		t := time.Now()
		finish, err := db.CheckpointBegin()
		pauses = append(pauses, time.Since(t))
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		if err := finish(dir); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(dir)
		b.StartTimer()
	}
	b.StopTimer()
	p50 := benchstate.Pct(pauses, .5)
	b.ReportMetric(float64(p50)/1e3, "p50-µs")
	b.ReportMetric(float64(benchstate.Pct(pauses, .9))/1e3, "p90-µs")
	b.ReportMetric(float64(slices.Max(pauses))/1e3, "max-µs")
	return p50
}
