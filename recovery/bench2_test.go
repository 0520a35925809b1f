package recovery

// BenchmarkRestoreMatrix: restores every way (store, local copy, standby,
// rescaled, full), each against a plain parallel copy of the same bytes. One run per state
// size (use -benchtime 1x), 2 source slots, a local file store:
//
//   - incremental, chain 1 (the first checkpoint) and chain -restore.chain
//     (1% of the keys changed per interval), from the store;
//   - the same chain from the node's local checkpoint copy, and from a
//     standby cache one checkpoint behind (synced before the last 1% update)
//     and fully caught up;
//   - rescaled 2 → 4 and 4 → 2 (the 4-slot checkpoint is taken from the
//     2 → 4 restored state), incremental and full;
//   - full (canonical), same slot count and rescaled;
//   - chain -restore.longchain for the sizes in -restore.longsizes;
//   - the reference: 8 parallel io.Copy + fsync of the same objects from
//     the store's folder to a temp folder (recovery.copyFile), same run.
//
//	go test ./recovery -run '^$' -bench RestoreMatrix -benchtime 1x -timeout 0 \
//	    -restore.sizes 1GiB,4GiB -restore.longsizes 1GiB -restore.dir /work/bench-tmp \
//	    -restore.out /tmp/restore.md
//
// Every restore is checked on a sample of keys against the state it was
// taken from. The default size (8MiB) keeps a plain -bench run short.

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/internal/app/job"
	"cairn/internal/base/datadir"
	"cairn/internal/base/par"
	"cairn/internal/testutil/benchstate"
	"cairn/state"
)

var (
	rbSizes     = flag.String("restore.sizes", "8MiB", "BenchmarkRestoreMatrix: comma-separated state sizes (key+value bytes)")
	rbLongSizes = flag.String("restore.longsizes", "8MiB", "BenchmarkRestoreMatrix: sizes (of -restore.sizes) that also get the long chain")
	rbChain     = flag.Int("restore.chain", 10, "BenchmarkRestoreMatrix: medium chain length")
	rbLongChain = flag.Int("restore.longchain", 50, "BenchmarkRestoreMatrix: long chain length")
	rbDir       = flag.String("restore.dir", "", "BenchmarkRestoreMatrix: work directory (default: the benchmark's temp dir)")
	rbOut       = flag.String("restore.out", "", "BenchmarkRestoreMatrix: append the markdown results to this file")
)

const rbSample = 500

// rbState is the benchmark's keyed state (internal/testutil/benchstate).
type rbState struct{ *benchstate.State }

func (s *rbState) snapshot(tb testing.TB, dir string) []state.SlotSnapshot {
	var out []state.SlotSnapshot
	for _, sn := range s.Snapshot(tb, dir) {
		out = append(out, state.SlotSnapshot{Slot: sn.Slot, Range: sn.Range, Dir: sn.Dir, SyncDuration: sn.Sync})
	}
	return out
}

// openSlots opens slots DBs under dataDir (as Restore leaves them).
func openSlots(tb testing.TB, dataDir string, slots int, readOnly bool) *rbState {
	return &rbState{benchstate.Open(tb, func(i int) string { return datadir.Slot(dataDir, i) }, 0, slots, readOnly)}
}

func rbMiB(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }
func rbSecs(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}
func rbRate(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

func BenchmarkRestoreMatrix(b *testing.B) {
	long := map[string]bool{}
	for _, s := range strings.Split(*rbLongSizes, ",") {
		long[strings.TrimSpace(s)] = true
	}
	for _, sz := range strings.Split(*rbSizes, ",") {
		sz = strings.TrimSpace(sz)
		size, err := job.ParseBytes(sz)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(sz, func(b *testing.B) { benchRestoreSize(b, sz, size, long[sz]) })
	}
}

type rbRow struct {
	name      string
	mode      checkpoint.Mode
	chain     int
	from, to  int
	source    string
	dur       time.Duration
	total     int64 // bytes of the checkpoint's objects
	down, loc int64
	cache     int64
	files     int
	baseline  float64 // MiB/s of the copy of the same objects, 0 when n/a
}

func benchRestoreSize(b *testing.B, label string, size int64, withLong bool) {
	ctx := context.Background()
	root := benchstate.WorkDir(b, *rbDir, "restore-"+label)
	storeRoot := filepath.Join(root, "store")
	store, err := checkpoint.NewFileStore(storeRoot, true)
	if err != nil {
		b.Fatal(err)
	}

	// The source job: 2 slots.
	st, build := benchstate.Build(b, filepath.Join(root, "db"), size, 2, 42)
	src := &rbState{st}
	defer src.Close()

	type ckptLog struct {
		job   string
		id    uint64
		mode  checkpoint.Mode
		chain int
		slots int
		f     checkpoint.Figures
	}
	var ckpts []ckptLog
	nextID := uint64(1)
	// take checkpoints s's state under local/chk-<id> (the engine's layout,
	// keeping only the newest local copy per job) and commits it.
	prevLocal := map[string]string{}
	take := func(w *checkpoint.Writer, job string, s *rbState, mode checkpoint.Mode) *checkpoint.Manifest {
		id := nextID
		nextID++
		local := filepath.Join(root, "local-"+job)
		dir := datadir.Checkpoint(local, id)
		snaps := s.snapshot(b, dir)
		m, err := w.Commit(ctx, id, checkpoint.Meta{SourceStream: "in", SourceSeq: id, ABIVersion: 1, Mode: mode}, snaps)
		if err != nil {
			b.Fatal(err)
		}
		if err := checkpoint.WriteLocalIndex(dir, m.Objects); err != nil {
			b.Fatal(err)
		}
		if p := prevLocal[job]; p != "" {
			os.RemoveAll(p)
		}
		prevLocal[job] = dir
		ckpts = append(ckpts, ckptLog{job, id, m.Mode, m.ChainLength, s.Slots, m.Figures})
		return m
	}
	writer := func(job string, slots int, mode checkpoint.Mode) *checkpoint.Writer {
		w, err := checkpoint.NewWriter(ctx, store, checkpoint.WriterConfig{Job: job, KeyGroups: benchstate.KeyGroups, Slots: slots, Mode: mode, Retain: 3, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		return w
	}

	// copyBaseline copies m's objects from the store's folder with 8
	// parallel io.Copy + fsync (what download does, minus the SHA-256).
	copyBaseline := func(m *checkpoint.Manifest) (int64, time.Duration) {
		seen := map[string]bool{}
		var objs []checkpoint.Object
		var total int64
		for _, o := range m.Objects {
			if !seen[o.Path] {
				seen[o.Path] = true
				objs = append(objs, o)
				total += o.Size
			}
		}
		sort.Slice(objs, func(i, j int) bool { return objs[i].Size > objs[j].Size })
		dst := filepath.Join(root, "copy")
		os.RemoveAll(dst)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			b.Fatal(err)
		}
		t := time.Now()
		err := par.Do(ctx, len(objs), 8, func(_ context.Context, j int) error {
			return copyFile(filepath.Join(storeRoot, filepath.FromSlash(objs[j].Path)), filepath.Join(dst, fmt.Sprint(j)))
		})
		d := time.Since(t)
		if err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(dst)
		return total, d
	}

	var rows []rbRow
	var baselines []string
	n := 0
	// restore runs one restore into a fresh data dir, checks a sample of
	// keys against truth, and removes it unless keep.
	restore := func(name, source string, m *checkpoint.Manifest, job string, slots int, truth *rbState, baseline float64, keep bool) string {
		n++
		data := filepath.Join(root, fmt.Sprintf("data-%d", n))
		o := Options{Store: store, Job: job, KeyGroups: benchstate.KeyGroups, Slots: slots, DataDir: data, Logger: quietLogger()}
		switch source {
		case "local":
			o.LocalDir = filepath.Join(root, "local-"+job)
		case "standby, 1 behind", "standby, caught up":
			o.CacheDir = filepath.Join(root, "cache-"+job)
		}
		r, err := Restore(ctx, m, o)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		var total int64
		seen := map[string]bool{}
		for _, ob := range m.Objects {
			if !seen[ob.Path] {
				seen[ob.Path] = true
				total += ob.Size
			}
		}
		rows = append(rows, rbRow{name: name, mode: m.Mode, chain: m.ChainLength, from: m.SlotCount(), to: slots, source: source, dur: r.Duration,
			total: total, down: r.BytesDownloaded, loc: r.BytesLocal, cache: r.BytesCache, files: r.Files, baseline: baseline})
		// Check a sample of keys against the state the checkpoint was
		// taken from.
		got := openSlots(b, data, slots, true)
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		for range rbSample {
			i := rng.IntN(src.Keys)
			if g, w := got.Get(b, i), truth.Get(b, i); g != w {
				b.Fatalf("%s: key %d: restored %q, want %q", name, i, g, w)
			}
		}
		got.Close()
		if !keep {
			os.RemoveAll(data)
		}
		return data
	}
	baseline := func(what string, m *checkpoint.Manifest) float64 {
		bytes, d := copyBaseline(m)
		rate := rbRate(bytes, d)
		baselines = append(baselines, fmt.Sprintf("| %s | %s | %d | %s | %.0f |", what, rbMiB(bytes), len(m.Objects), rbSecs(d), rate))
		return rate
	}

	// Incremental chain 1: the first checkpoint of the built state.
	inc := writer("inc", 2, checkpoint.ModeIncremental)
	m1 := take(inc, "inc", src, checkpoint.ModeIncremental)
	bl := baseline("incremental chain 1", m1)
	restore("incremental chain 1", "store", m1, "inc", 2, src, bl, false)

	// Up to chain-1, a standby syncs, then the last 1% update and checkpoint.
	for range *rbChain - 2 {
		src.Update(b)
		take(inc, "inc", src, checkpoint.ModeIncremental)
	}
	sb := NewStandby(store, "inc", filepath.Join(root, "cache-inc"), quietLogger())
	t := time.Now()
	if err := sb.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	sbInitial := time.Since(t)
	src.Update(b)
	mc := take(inc, "inc", src, checkpoint.ModeIncremental)
	chainName := fmt.Sprintf("incremental chain %d", mc.ChainLength)
	bl = baseline(chainName, mc)
	restore(chainName, "store", mc, "inc", 2, src, bl, false)
	restore(chainName, "local", mc, "inc", 2, src, bl, false)
	restore(chainName, "standby, 1 behind", mc, "inc", 2, src, bl, false)
	t = time.Now()
	if err := sb.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	sbDelta := time.Since(t)
	restore(chainName, "standby, caught up", mc, "inc", 2, src, bl, false)
	d24 := restore(chainName+" rescaled", "store", mc, "inc", 4, src, bl, true)

	// The 4-slot job: the 2 → 4 restored state, checkpointed at 4 slots
	// (incremental and full), restored back onto 2 slots.
	s4 := openSlots(b, d24, 4, false)
	s4.Keys = src.Keys
	inc4 := writer("inc4", 4, checkpoint.ModeIncremental)
	m4 := take(inc4, "inc4", s4, checkpoint.ModeIncremental)
	bl4 := baseline("incremental chain 1, 4 slots", m4)
	restore("incremental chain 1 rescaled", "store", m4, "inc4", 2, s4, bl4, false)
	full4 := writer("full4", 4, checkpoint.ModeFull)
	mf4 := take(full4, "full4", s4, checkpoint.ModeFull)
	blf4 := baseline("full, 4 slots", mf4)
	restore("full rescaled", "store", mf4, "full4", 2, s4, blf4, false)
	s4.Close()
	os.RemoveAll(d24)
	os.RemoveAll(filepath.Join(root, "local-inc4"))
	os.RemoveAll(filepath.Join(root, "local-full4"))

	// Full, 2 slots, after one more 1% update.
	src.Update(b)
	full := writer("full", 2, checkpoint.ModeFull)
	mf := take(full, "full", src, checkpoint.ModeFull)
	blf := baseline("full", mf)
	restore("full", "store", mf, "full", 2, src, blf, false)
	restore("full rescaled", "store", mf, "full", 4, src, blf, false)
	os.RemoveAll(filepath.Join(root, "local-full"))

	if withLong {
		ml := mc
		for ml.ChainLength < *rbLongChain {
			src.Update(b)
			ml = take(inc, "inc", src, checkpoint.ModeIncremental)
		}
		name := fmt.Sprintf("incremental chain %d", ml.ChainLength)
		bll := baseline(name, ml)
		restore(name, "store", ml, "inc", 2, src, bll, false)
		restore(name, "local", ml, "inc", 2, src, bll, false)
	}

	// Report.
	var out strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&out, format, args...) }
	p("\n### Restores, %s of keyed state\n\n", label)
	p("%d keys × (16-byte key + 100-byte value) = %s MiB logical, built in %s (%.0f k writes/s) on 2 slots; 1%% of the keys changed per checkpoint interval; store: local file store on the same disk; Restore concurrency 8 (default).\n\n",
		src.Keys, rbMiB(int64(src.Keys)*benchstate.EntryLen), rbSecs(build), float64(src.Keys)/build.Seconds()/1e3)
	p("| restore | mode | chain | slots | from | duration | checkpoint MiB | downloaded MiB | local MiB | standby MiB | files | MiB/s | ÷ copy baseline |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range rows {
		rate := rbRate(x.total, x.dur)
		ratio := "—"
		if x.source == "store" && x.baseline > 0 {
			ratio = fmt.Sprintf("%.2f×", rate/x.baseline)
		}
		p("| %s | %s | %d | %d → %d | %s | %s | %s | %s | %s | %s | %d | %.0f | %s |\n", x.name, x.mode, x.chain, x.from, x.to, x.source, rbSecs(x.dur),
			rbMiB(x.total), rbMiB(x.down), rbMiB(x.loc), rbMiB(x.cache), x.files, rate, ratio)
	}
	p("\nCopy baseline (8 parallel io.Copy + fsync of the same store objects into a temp dir, same run; page cache as it is):\n\n| objects of | MiB | files | duration | MiB/s |\n|---|---|---|---|---|\n%s\n", strings.Join(baselines, "\n"))
	p("\nStandby: initial sync (chain %d, whole state) %s; catch-up sync of the last checkpoint's delta %s (the last checkpoint uploaded %s MiB).\n",
		mc.ChainLength-1, rbSecs(sbInitial), rbSecs(sbDelta), rbMiB(mc.Figures.BytesUploaded))
	p("\nCheckpoints taken for this run:\n\n| job | id | mode | slots | chain | sync (max slot) | async | uploaded MiB | full state MiB |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range ckpts {
		p("| %s | %d | %s | %d | %d | %s | %s | %s | %s |\n", c.job, c.id, c.mode, c.slots, c.chain, rbSecs(c.f.SyncMax), rbSecs(c.f.Async), rbMiB(c.f.BytesUploaded), rbMiB(c.f.FullStateSize))
	}
	var du int64
	filepath.WalkDir(storeRoot, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				du += fi.Size()
			}
		}
		return nil
	})
	p("\nStore size at the end: %s MiB.\n", rbMiB(du))
	fmt.Print(out.String())
	if *rbOut != "" {
		f, err := os.OpenFile(*rbOut, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		f.WriteString(out.String())
		f.Close()
	}
}
