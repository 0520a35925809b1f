package checkpoint

// BenchmarkCheckpointSteady: does an incremental checkpoint's cost follow
// the write rate rather than the state size, and how does a full one
// compare with copying the files? One run per
// state size (use -benchtime 1x): build keyed state with state batches of
// 1000, then take incremental checkpoints with 1% of the keys (or a fixed
// amount: -checkpoint.change 10MiB) changed per interval (one initial, one
// settling, then -checkpoint.intervals measured),
// time `cp -r` of the newest local checkpoint directory (the same DB files)
// on the same disk, then take -checkpoint.fulls full checkpoints, each after
// an update.
//
//	go test ./checkpoint -run '^$' -bench CheckpointSteady -benchtime 1x -timeout 0 \
//	    -checkpoint.sizes 256MiB,1GiB,4GiB -checkpoint.dir /work/bench-tmp \
//	    -checkpoint.out /tmp/ckpt.md
//
// The default size (8MiB) keeps a plain -bench run short.

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/internal/app/job"
	"cairn/internal/testutil/benchstate"
	"cairn/state"
)

var (
	ckptSizes     = flag.String("checkpoint.sizes", "8MiB", "BenchmarkCheckpointSteady: comma-separated state sizes (KiB, MiB, GiB) of key+value bytes")
	ckptIntervals = flag.Int("checkpoint.intervals", 5, "BenchmarkCheckpointSteady: measured incremental checkpoints after the settling one")
	ckptFulls     = flag.Int("checkpoint.fulls", 3, "BenchmarkCheckpointSteady: full checkpoints")
	ckptSlots     = flag.Int("checkpoint.slots", 2, "BenchmarkCheckpointSteady: slots")
	ckptDir       = flag.String("checkpoint.dir", "", "BenchmarkCheckpointSteady: work directory (default: the benchmark's temp dir)")
	ckptOut       = flag.String("checkpoint.out", "", "BenchmarkCheckpointSteady: append the markdown results to this file")
	ckptChange    = flag.String("checkpoint.change", "1%", "BenchmarkCheckpointSteady: keys changed per interval: a percentage of the keys (the write rate grows with the state) or a size of key+value bytes such as 10MiB (the same write rate at every state size)")
)

// changedKeys is the number of keys an interval changes (-checkpoint.change).
func changedKeys(tb testing.TB, keys int) int {
	c := strings.TrimSpace(*ckptChange)
	if p, ok := strings.CutSuffix(c, "%"); ok {
		var f float64
		if _, err := fmt.Sscanf(p, "%g", &f); err != nil || f <= 0 || f > 100 {
			tb.Fatalf("-checkpoint.change %q: want a percentage in (0, 100] or a size", c)
		}
		return max(1, int(float64(keys)*f/100))
	}
	n, err := job.ParseBytes(c)
	if err != nil || n <= 0 {
		tb.Fatalf("-checkpoint.change %q: want a percentage or a size: %v", c, err)
	}
	return max(1, min(keys, int(n/benchstate.EntryLen)))
}

// benchState is the benchmark's keyed state (internal/testutil/benchstate) and its root.
type benchState struct {
	*benchstate.State
	root string
}

func newBenchState(tb testing.TB, root string, size int64, slots int, seed uint64) (*benchState, time.Duration) {
	s, d := benchstate.Build(tb, root, size, slots, seed)
	return &benchState{State: s, root: root}, d
}

// snapshot is the local checkpoint: every slot, in parallel, flushes (the
// pause, SyncDuration) and takes its Pebble checkpoint under dir (the
// links, which the engine runs beside processing). It also returns the
// slowest slot's pause + flush + links: the local part, all of which was
// the pause before the links and then the flush went beside processing.
func (s *benchState) snapshot(tb testing.TB, dir string) ([]state.SlotSnapshot, time.Duration) {
	var out []state.SlotSnapshot
	var whole time.Duration
	for _, sn := range s.Snapshot(tb, dir) {
		out = append(out, state.SlotSnapshot{Slot: sn.Slot, Range: sn.Range, Dir: sn.Dir, SyncDuration: sn.Sync})
		whole = max(whole, sn.Sync+sn.Link)
	}
	return out, whole
}

// dirSize is the total size of the regular files under dir.
func dirSize(tb testing.TB, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func mib(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }
func secs(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
	if d < time.Second {
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}
func mbps(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

var pct = benchstate.Pct

type benchReport struct {
	tb  testing.TB
	out strings.Builder
}

func (r *benchReport) printf(format string, args ...any) {
	fmt.Fprintf(&r.out, format, args...)
}

func (r *benchReport) flush() {
	fmt.Print(r.out.String())
	if *ckptOut != "" {
		f, err := os.OpenFile(*ckptOut, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			r.tb.Fatal(err)
		}
		defer f.Close()
		f.WriteString(r.out.String())
	}
}

func BenchmarkCheckpointSteady(b *testing.B) {
	for _, sz := range strings.Split(*ckptSizes, ",") {
		size, err := job.ParseBytes(strings.TrimSpace(sz))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(strings.TrimSpace(sz), func(b *testing.B) { benchCheckpointSize(b, strings.TrimSpace(sz), size) })
	}
}

type ckptRow struct {
	label    string
	id       uint64
	chain    int
	upd      time.Duration
	syncMax  time.Duration
	whole    time.Duration // pause + flush + links: the pause before it was split
	async    time.Duration
	commit   time.Duration
	uploaded int64
	files    int
	reused   int
	full     int64
	snapSize int64
}

func benchCheckpointSize(b *testing.B, label string, size int64) {
	ctx := context.Background()
	root := benchstate.WorkDir(b, *ckptDir, "ckpt-"+label)
	slots := *ckptSlots
	s, build := newBenchState(b, filepath.Join(root, "db"), size, slots, 42)
	defer s.Close()
	nChange := changedKeys(b, s.Keys)
	changed := int64(nChange) * benchstate.EntryLen
	update := func() time.Duration { return s.UpdateN(b, nChange) }
	store, err := NewFileStore(filepath.Join(root, "store"), true)
	if err != nil {
		b.Fatal(err)
	}
	local := filepath.Join(root, "local")
	var prevLocal string
	nextID := uint64(1)
	take := func(w *Writer, mode Mode, label string, upd time.Duration) ckptRow {
		id := nextID
		nextID++
		dir := filepath.Join(local, fmt.Sprintf("chk-%020d", id))
		snaps, whole := s.snapshot(b, dir)
		t := time.Now()
		m, err := w.Commit(ctx, id, Meta{SourceStream: "in", SourceSeq: id, ABIVersion: 1, Mode: mode}, snaps)
		if err != nil {
			b.Fatal(err)
		}
		commit := time.Since(t)
		row := ckptRow{label: label, id: id, chain: m.ChainLength, upd: upd, syncMax: m.Figures.SyncMax, whole: whole, async: m.Figures.Async, commit: commit,
			uploaded: m.Figures.BytesUploaded, files: m.Figures.FilesUploaded, reused: m.Figures.FilesReused, full: m.Figures.FullStateSize, snapSize: dirSize(b, dir)}
		// The engine keeps only its last local checkpoint.
		if prevLocal != "" {
			os.RemoveAll(prevLocal)
		}
		prevLocal = dir
		return row
	}
	mkWriter := func(job string, mode Mode) *Writer {
		w, err := NewWriter(ctx, store, WriterConfig{Job: job, KeyGroups: benchstate.KeyGroups, Slots: slots, Mode: mode, Retain: 3, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		return w
	}

	var rows []ckptRow
	inc := mkWriter("inc", ModeIncremental)
	rows = append(rows, take(inc, ModeIncremental, "initial", 0))
	rows = append(rows, take(inc, ModeIncremental, "settling", update()))
	for i := range *ckptIntervals {
		rows = append(rows, take(inc, ModeIncremental, fmt.Sprintf("interval %d", i+1), update()))
	}

	// cp -r of the same DB on the same disk: of the newest local
	// checkpoint directory (the slots' DB files as of that checkpoint, hard
	// links), because the live directories change under cp while
	// compactions run. Page cache as it is (the DB was just written: mostly
	// cached); then the same followed by sync(1) on the destination's file
	// system, since the store fsyncs.
	dbSize := dirSize(b, prevLocal)
	cp := func(withSync bool) time.Duration {
		dst := filepath.Join(root, "cp")
		os.RemoveAll(dst)
		exec.Command("sync", "-f", root).Run()
		t := time.Now()
		if out, err := exec.Command("cp", "-r", prevLocal, dst).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v: %s", err, out)
		}
		if withSync {
			if out, err := exec.Command("sync", "-f", dst).CombinedOutput(); err != nil {
				b.Fatalf("sync: %v: %s", err, out)
			}
		}
		d := time.Since(t)
		os.RemoveAll(dst)
		exec.Command("sync", "-f", root).Run()
		return d
	}
	cpPlain := cp(false)
	cpSync := cp(true)

	var fulls []ckptRow
	full := mkWriter("full", ModeFull)
	for i := range *ckptFulls {
		fulls = append(fulls, take(full, ModeFull, fmt.Sprintf("full %d", i+1), update()))
	}
	// Order as they ran: the cp baseline ran between the incremental and
	// the full checkpoints.

	r := &benchReport{tb: b}
	r.printf("\n### Checkpoints, %s of keyed state (%d slots)\n\n", label, slots)
	r.printf("%d keys × (16-byte key + 100-byte value) = %s MiB logical; build %s (%.0f k writes/s, batches of %d); DB files of the last incremental checkpoint (what cp -r copies) %s MiB. Update per interval (-checkpoint.change %s) = %d keys = %s MiB of changed key+value data.\n\n",
		s.Keys, mib(int64(s.Keys)*benchstate.EntryLen), secs(build), float64(s.Keys)/build.Seconds()/1e3, benchstate.Batch, mib(dbSize), *ckptChange, nChange, mib(changed))
	r.printf("| checkpoint | mode | chain | update | sync (max slot) | async | uploaded MiB | files up/reused | uploaded ÷ changed | full state MiB |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range append(append([]ckptRow(nil), rows...), fulls...) {
		mode := "incremental"
		if strings.HasPrefix(x.label, "full") {
			mode = "full"
		}
		upd := "—"
		if x.upd > 0 {
			upd = secs(x.upd)
		}
		r.printf("| %d %s | %s | %d | %s | %s | %s | %s | %d/%d | %.2f× | %s |\n", x.id, x.label, mode, x.chain, upd, secs(x.syncMax), secs(x.async), mib(x.uploaded), x.files, x.reused, float64(x.uploaded)/float64(changed), mib(x.full))
	}
	steady := rows[2:]
	var sd, ad, wd []time.Duration
	var upSum, upMax int64
	for _, x := range steady {
		sd, ad, wd = append(sd, x.syncMax), append(ad, x.async), append(wd, x.whole)
		upSum += x.uploaded
		upMax = max(upMax, x.uploaded)
	}
	var fsd, fad []time.Duration
	var fsnap int64
	for _, x := range fulls {
		fsd, fad = append(fsd, x.syncMax), append(fad, x.async)
		fsnap += x.snapSize
	}
	fsnap /= int64(max(1, len(fulls)))
	r.printf("\nSteady state (%d incremental intervals): sync p50 %s max %s; async p50 %s max %s; uploaded mean %s MiB (%.2f× changed), max %s MiB (%.2f× changed).\n",
		len(steady), secs(pct(sd, .5)), secs(pct(sd, 1)), secs(pct(ad, .5)), secs(pct(ad, 1)), mib(upSum/int64(len(steady))), float64(upSum)/float64(len(steady))/float64(changed), mib(upMax), float64(upMax)/float64(changed))
	r.printf("Pause (sync) p50 %s max %s; the whole local part, pause + flush + links (all of it the pause before the links and the flush ran beside processing) p50 %s max %s.\n",
		secs(pct(sd, .5)), secs(pct(sd, 1)), secs(pct(wd, .5)), secs(pct(wd, 1)))
	r.printf("Full (%d): sync p50 %s max %s; async p50 %s max %s; throughput over the snapshot's native bytes (%s MiB): %.0f MiB/s at p50.\n",
		len(fulls), secs(pct(fsd, .5)), secs(pct(fsd, 1)), secs(pct(fad, .5)), secs(pct(fad, 1)), mib(fsnap), mbps(fsnap, pct(fad, .5)))
	r.printf("`cp -r` of the last incremental checkpoint's DB directory (%s MiB): %s (%.0f MiB/s); with `sync -f` after: %s (%.0f MiB/s). Full checkpoint throughput ÷ cp -r: %.2f× (÷ cp -r + sync: %.2f×).\n",
		mib(dbSize), secs(cpPlain), mbps(dbSize, cpPlain), secs(cpSync), mbps(dbSize, cpSync),
		mbps(fsnap, pct(fad, .5))/mbps(dbSize, cpPlain), mbps(fsnap, pct(fad, .5))/mbps(dbSize, cpSync))
	r.printf("\nSUMMARY %s inc_async_p50=%s inc_async_max=%s inc_sync_p50=%s inc_up_mean_ratio=%.2f inc_up_max_ratio=%.2f full_async_p50=%s full_mibps=%.0f cp_mibps=%.0f cpsync_mibps=%.0f\n",
		label, secs(pct(ad, .5)), secs(pct(ad, 1)), secs(pct(sd, .5)), float64(upSum)/float64(len(steady))/float64(changed), float64(upMax)/float64(changed),
		secs(pct(fad, .5)), mbps(fsnap, pct(fad, .5)), mbps(dbSize, cpPlain), mbps(dbSize, cpSync))
	r.flush()
	b.ReportMetric(pct(ad, .5).Seconds(), "inc-async-p50-s")
	b.ReportMetric(pct(fad, .5).Seconds(), "full-async-p50-s")
}
