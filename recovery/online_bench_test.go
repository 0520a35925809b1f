package recovery_test

// BenchmarkOnlineRestore: how soon a restarted job can read, how fast it
// reads while the state downloads, and when it is fully local. For each state size (2 source
// slots, one incremental checkpoint) and each store — a local file store,
// the same throttled to -online.rate, and an S3 server (gofakes3,
// in-process) throttled to -online.rate — it restores the checkpoint
// with today's download and with online restore, same slots (2 -> 2) and
// scaled up (2 -> 4), and measures from the start of the restore:
//
//   - first read: the slot DBs are open and a random key's value is read
//     (what a job needs before its first output);
//   - fully local: every file of the state is on local disk and verified;
//   - point reads per second while the download runs (one reader, keys
//     uniformly random, or "hot keys": 90% of the reads on the 1% of the keys
//     that sort first in each key group; "batched": in batches of 1,024
//     keys prefetched together before they are read, as a slot reads a
//     call's keys), and after it (steady: once the slot DBs' compactions
//     have settled, same keys and batches), and their ratio.
//
// A scale-down (4 -> 2) is not online (it merges slots by scanning them);
// it restores as the download row does.
//
//	go test ./recovery -run '^$' -bench OnlineRestore -benchtime 1x -timeout 0 \
//	    -online.sizes 256MiB,1GiB -online.dir /work/bench-tmp -online.out /tmp/online.md

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/drill"
	"cairn/internal/app/job"
	"cairn/internal/base/datadir"
	"cairn/internal/testutil/benchstate"
	"cairn/internal/testutil/testservers"
	"cairn/recovery"
	"cairn/state"
)

var (
	obSizes = flag.String("online.sizes", "8MiB", "BenchmarkOnlineRestore: comma-separated state sizes")
	obRate  = flag.String("online.rate", "50MB", "BenchmarkOnlineRestore: the throttled stores' bandwidth per second")
	obDir   = flag.String("online.dir", "", "BenchmarkOnlineRestore: work directory (default: the benchmark's temp dir)")
	obOut   = flag.String("online.out", "", "BenchmarkOnlineRestore: append the markdown table to this file")
	obModes = flag.String("online.modes", "download,online,online hot keys", "BenchmarkOnlineRestore: comma-separated restores to run (download, online, online hot keys, online batched, online hot keys batched): the download rows take state ÷ rate each")
)

// obBatch is the batched modes' batch: a slot's call of the engine's
// default batch size.
const obBatch = 1024

// obSettle bounds the wait for the slot DBs' compactions before the steady
// reads.
const obSettle = 2 * time.Minute

type obRow struct {
	size, store, slots, mode string
	first, local             time.Duration
	// first's parts: Restore, opening the slot DBs, the first Get.
	restore, open, get time.Duration
	files              int // objects of the checkpoint
	during, steady     float64
	settle             time.Duration // until the last compaction before steady (then 1 s without)
	remote             int64
}

func BenchmarkOnlineRestore(b *testing.B) {
	rate, err := job.ParseBytes(*obRate)
	if err != nil {
		b.Fatal(err)
	}
	var rows []obRow
	for _, sz := range strings.Split(*obSizes, ",") {
		sz = strings.TrimSpace(sz)
		size, err := job.ParseBytes(sz)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(sz, func(b *testing.B) { rows = append(rows, benchOnlineSize(b, sz, size, rate)...) })
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n| state | store | slots | restore | first read | of it: Restore / open / first Get | objects | fully local | reads/s during download | compactions settled after | reads/s steady | during ÷ steady | remote at start |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		during, ratio := "—", "—"
		if r.during > 0 {
			during, ratio = fmt.Sprintf("%.0f", r.during), fmt.Sprintf("%.2f", r.during/r.steady)
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s / %s / %s | %d | %s | %s | %s | %.0f | %s | %.1f MiB |\n", r.size, r.store, r.slots, r.mode,
			obDur(r.first), obDur(r.restore), obDur(r.open), obDur(r.get), r.files, obDur(r.local), during, obDur(r.settle), r.steady, ratio, float64(r.remote)/(1<<20))
	}
	b.Log(sb.String())
	if *obOut != "" {
		f, err := os.OpenFile(*obOut, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		fmt.Fprint(f, sb.String())
	}
}

func obDur(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func benchOnlineSize(b *testing.B, label string, size, rate int64) []obRow {
	ctx := context.Background()
	root := benchstate.WorkDir(b, *obDir, "online-"+label)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	fileStore, err := checkpoint.NewFileStore(filepath.Join(root, "store"), true)
	if err != nil {
		b.Fatal(err)
	}
	b.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	s3, err := checkpoint.OpenStore(ctx, testservers.StartGoFakeS3(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s3.Close(ctx)

	src, _ := benchstate.Build(b, filepath.Join(root, "db"), size, 2, 42)
	defer src.Close()
	keys := src.Keys
	ms := map[checkpoint.Store]*checkpoint.Manifest{}
	for _, st := range []checkpoint.Store{fileStore, s3} {
		w, err := checkpoint.NewWriter(ctx, st, checkpoint.WriterConfig{Job: "bench", KeyGroups: benchstate.KeyGroups, Slots: 2, Mode: checkpoint.ModeIncremental, Retain: 3, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		dir := filepath.Join(root, "local", fmt.Sprint(len(root)))
		os.RemoveAll(dir)
		var snaps []state.SlotSnapshot
		for _, sn := range src.Snapshot(b, dir) {
			snaps = append(snaps, state.SlotSnapshot{Slot: sn.Slot, Range: sn.Range, Dir: sn.Dir})
		}
		if ms[st], err = w.Commit(ctx, 1, checkpoint.Meta{SourceStream: "in", SourceSeq: 1, ABIVersion: 1, Mode: checkpoint.ModeIncremental}, snaps); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(dir)
	}
	stores := []struct {
		name string
		s    checkpoint.Store
		m    *checkpoint.Manifest
	}{
		{"file", fileStore, ms[fileStore]},
		{"file @ " + *obRate + "/s", drill.NewThrottledStore(fileStore, rate), ms[fileStore]},
		{"s3 @ " + *obRate + "/s", drill.NewThrottledStore(s3, rate), ms[s3]},
	}
	rng := rand.New(rand.NewPCG(7, 7))
	var rows []obRow
	for _, st := range stores {
		for _, to := range []int{2, 4} {
			for _, mode := range []string{"download", "online", "online, hot keys", "online, batched", "online, hot keys, batched"} {
				if !slices.Contains(strings.Split(*obModes, ","), strings.ReplaceAll(mode, ",", "")) {
					continue
				}
				online, hot, batched := mode != "download", strings.Contains(mode, "hot keys"), strings.HasSuffix(mode, "batched")
				pick := func() int {
					if hot && rng.IntN(10) < 9 {
						return rng.IntN(keys/100) * 100 // 90% of reads on 1% of the keys
					}
					return rng.IntN(keys)
				}
				data := filepath.Join(root, "data")
				os.RemoveAll(data)
				row := obRow{size: label, store: st.name, slots: fmt.Sprintf("2 → %d", to), mode: mode}
				start := time.Now()
				r, err := recovery.Restore(ctx, st.m, recovery.Options{Store: st.s, Job: "bench", KeyGroups: benchstate.KeyGroups, Slots: to, DataDir: data, Online: online, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				row.restore, row.files = time.Since(start), len(st.m.Objects)
				dbs := benchstate.Open(b, func(i int) string { return datadir.Slot(data, i) }, keys, to, false)
				row.open = time.Since(start) - row.restore
				want := src.Get(b, keys/3)
				if got := dbs.Get(b, keys/3); got != want {
					b.Fatalf("key %d: restored value differs", keys/3)
				}
				row.first = time.Since(start)
				row.get = row.first - row.restore - row.open
				row.remote = r.BytesRemote
				// read makes reads and returns how many: one, or a batch of
				// obBatch keys the way a slot reads a call's keys — their
				// state prefetched together when that pays
				// (state.DB.PrefetchPays, Prefetch), then read one at a time.
				batch := make([]int, 0, obBatch)
				perSlot := make([][][]byte, to)
				read := func() int {
					if !batched {
						dbs.Get(b, pick())
						return 1
					}
					batch = batch[:0]
					for range obBatch {
						batch = append(batch, pick())
					}
					for i := range perSlot {
						perSlot[i] = perSlot[i][:0]
					}
					for _, k := range batch {
						key := benchstate.UserKey(nil, k)
						sl := state.SlotOf(state.KeyGroup(key, benchstate.KeyGroups), to, benchstate.KeyGroups)
						perSlot[sl] = append(perSlot[sl], key)
					}
					for i, keys := range perSlot {
						if dbs.DBs[i].PrefetchPays() {
							dbs.DBs[i].Prefetch(benchstate.Stage, keys)
						}
					}
					for _, k := range batch {
						dbs.Get(b, k)
					}
					return len(batch)
				}
				if r.Remote != nil {
					done := make(chan error, 1)
					go func() { done <- r.Remote.Download(ctx, 0, 4) }()
					n, t0 := 0, time.Now()
				during:
					for {
						select {
						case err := <-done:
							if err != nil {
								b.Fatal(err)
							}
							break during
						default:
						}
						n += read()
					}
					row.local = time.Since(start)
					row.during = float64(n) / time.Since(t0).Seconds()
					r.Remote.Close()
				} else {
					row.local = row.first
				}
				// Steady is the DB at rest: local, and no compaction running
				// for a second. Compactions wait while files are remote
				// (state/scheduler.go), so after an online restore the debt
				// is paid now; reads measured meanwhile showed
				// 3,000-70,000/s against ~100,000.
				settle, quiet := time.Now(), time.Now()
				for time.Since(settle) < obSettle && time.Since(quiet) < time.Second {
					if slices.ContainsFunc(dbs.DBs, (*state.DB).Compacting) {
						quiet = time.Now()
					}
					time.Sleep(50 * time.Millisecond)
				}
				row.settle = quiet.Sub(settle) // until the last compaction seen
				n, t0 := 0, time.Now()
				for time.Since(t0) < time.Second {
					n += read()
				}
				row.steady = float64(n) / time.Since(t0).Seconds()
				for _, i := range []int{0, keys / 2, keys - 1} {
					if dbs.Get(b, i) != src.Get(b, i) {
						b.Fatalf("key %d: restored value differs", i)
					}
				}
				dbs.Close()
				rows = append(rows, row)
				b.Logf("%s %s %s %s: first read %v, fully local %v, reads/s %.0f during, %.0f steady; a lone miss %v", label, row.store, row.slots, row.mode, row.first, row.local, row.during, row.steady, state.MissCost())
			}
		}
	}
	return rows
}
