package recovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"cairn/checkpoint"
	"cairn/internal/datadir"
	"cairn/internal/failpoint"
	"cairn/internal/par"
	"cairn/state"
)

// A restore's staging folders under the data directory, beside
// datadir.State.
const (
	tmpPrefix      = "restore.tmp-"
	oldStatePrefix = "state.old-"
)

// Options configure a Restore.
type Options struct {
	// Store holds the checkpoint.
	Store checkpoint.Store
	// Job is the job restoring; a manifest of another job is refused
	// (ErrWrongJob). Required.
	Job string
	// KeyGroups is the job's key_groups; a checkpoint with another count is
	// refused (ErrKeyGroupsMismatch). Required.
	KeyGroups int
	// SourceStream, when set, is the job's input stream; a checkpoint of
	// another stream is refused (ErrStreamMismatch): its source_seq means
	// nothing in this one.
	SourceStream string
	// Slots is the target slot count (0: the checkpoint's); from 1 to
	// MaxRescaleFactor times the checkpoint's (ErrSlotCount otherwise). A
	// count different from the checkpoint's is a rescaled restore.
	Slots int
	// DataDir is the job's data directory: slot i ends at
	// DataDir/state/slot-<i>. Required.
	DataDir string
	// LocalDir holds the engine's local checkpoint copies
	// (<LocalDir>/chk-<id>/slot-<i>/); "" disables local recovery.
	LocalDir string
	// CacheDir is a standby cache to take files from before downloading
	// ("" for none).
	CacheDir string
	// Concurrency bounds parallel downloads (default 8).
	Concurrency int
	// Progress, when set, is called about every ProgressEvery and once at
	// the end.
	Progress func(Progress)
	// ProgressEvery is the progress period (default 250ms).
	ProgressEvery time.Duration
	// Logger receives the restore's summary line (default slog.Default()).
	Logger *slog.Logger
}

// Result is the record of a finished restore (DESIGN.md, "Numbers that are
// part of the product").
type Result struct {
	// ID is the restored checkpoint's (or savepoint's) id.
	ID uint64
	// Savepoint is the savepoint's name, "" for a checkpoint.
	Savepoint    string
	SourceStream string
	// SourceSeq is the stream sequence of the last record the state
	// includes: consume from SourceSeq+1.
	SourceSeq   uint64
	Mode        checkpoint.Mode
	ChainLength int
	// Rescaled is true when ToSlots != FromSlots.
	Rescaled        bool
	FromSlots       int
	ToSlots         int
	Duration        time.Duration
	BytesLocal      int64
	BytesDownloaded int64
	BytesCache      int64
	Files           int
	FilesLocal      int
	FilesDownloaded int
	FilesCache      int
	Modules         map[string]string
	// Figures are the restored checkpoint's recorded figures (its
	// duration, sizes and predicted restore), from its manifest.
	Figures checkpoint.Figures
}

// Restore rebuilds DataDir/state from manifest m. Refusals (ErrWrongJob,
// ErrKeyGroupsMismatch, ErrSlotCount, checkpoint.ErrUnsupportedVersion)
// happen before anything is read or written; a missing object wraps
// checkpoint.ErrNotFound and a corrupt one is a *checkpoint.CorruptionError
// naming it. On any error DataDir/state is left as it was.
func Restore(ctx context.Context, m *checkpoint.Manifest, o Options) (*Result, error) {
	start := time.Now()
	if err := check(m, &o); err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	r := &Result{
		ID: m.ID, Savepoint: checkpoint.SavepointName(m), SourceStream: m.SourceStream, SourceSeq: m.SourceSeq,
		Mode: m.Mode, ChainLength: m.ChainLength, FromSlots: m.SlotCount(), ToSlots: o.Slots,
		Rescaled: o.Slots != m.SlotCount(), Modules: m.Modules, Figures: m.Figures,
	}
	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("recovery: restore %s/%d: %w", m.Job, m.ID, err)
	}
	if err := cleanDataDir(o.DataDir); err != nil {
		return nil, fmt.Errorf("recovery: restore %s/%d: %w", m.Job, m.ID, err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(o.DataDir, fmt.Sprintf("%s%d-%s", tmpPrefix, m.ID, hex.EncodeToString(rnd[:])))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("recovery: restore %s/%d: %w", m.Job, m.ID, err)
	}
	defer os.RemoveAll(tmp)

	c := &counters{}
	f := newFetcher(m, &o, c)
	prog := startProgress(o.Progress, o.ProgressEvery, c, start)
	b := &builder{m: m, o: &o, f: f, c: c, prog: prog, tmp: tmp, newState: datadir.State(tmp)}
	err := b.build(ctx)
	if err == nil {
		failpoint.Hit(failpoint.RestoreBeforeSwap)
		prog.phase(PhaseSwap)
		err = swapState(o.DataDir, b.newState)
	}
	r.Duration = time.Since(start)
	r.BytesLocal, r.BytesCache, r.BytesDownloaded = c.bytesLocal.Load(), c.bytesCache.Load(), c.bytesDownloaded.Load()
	r.FilesLocal, r.FilesCache, r.FilesDownloaded = int(c.filesLocal.Load()), int(c.filesCache.Load()), int(c.filesDownloaded.Load())
	r.Files = r.FilesLocal + r.FilesCache + r.FilesDownloaded
	if err != nil {
		prog.stop(PhaseFailed)
		log.Error("restore failed", "job", m.Job, "id", m.ID, "err", err, "duration", r.Duration)
		return nil, fmt.Errorf("recovery: restore %s/%d: %w", m.Job, m.ID, err)
	}
	prog.stop(PhaseDone)
	log.Debug("restore complete", "job", m.Job, "id", m.ID, "savepoint", r.Savepoint, "mode", m.Mode,
		"chain", m.ChainLength, "rescaled", r.Rescaled, "from_slots", r.FromSlots, "to_slots", r.ToSlots,
		"duration", r.Duration, "bytes_local", r.BytesLocal, "bytes_cache", r.BytesCache,
		"bytes_downloaded", r.BytesDownloaded, "files", r.Files, "source_seq", r.SourceSeq)
	return r, nil
}

// check applies the refusals that need no I/O and fills option defaults.
func check(m *checkpoint.Manifest, o *Options) error {
	if m == nil {
		return errors.New("recovery: restore: no manifest")
	}
	if o.Store == nil || o.DataDir == "" || o.Job == "" {
		return errors.New("recovery: restore: Options.Store, Job and DataDir are required")
	}
	if err := m.Validate(); err != nil {
		return fmt.Errorf("recovery: restore %s/%d: %w", m.Job, m.ID, err)
	}
	if m.Job != o.Job {
		return fmt.Errorf("recovery: restore: checkpoint %d belongs to job %q, this is job %q: %w (restore a checkpoint of this job, or --restore none)", m.ID, m.Job, o.Job, ErrWrongJob)
	}
	if o.SourceStream != "" && m.SourceStream != "" && m.SourceStream != o.SourceStream {
		return fmt.Errorf("recovery: restore %s/%d: it read stream %s, the job reads %s: %w", m.Job, m.ID, m.SourceStream, o.SourceStream, ErrStreamMismatch)
	}
	if m.KeyGroups != o.KeyGroups {
		return fmt.Errorf("recovery: restore %s/%d: checkpoint has key_groups=%d, the job %d: %w (key_groups can never change for a job's state: set it back to %d, or start a new job)",
			m.Job, m.ID, m.KeyGroups, o.KeyGroups, ErrKeyGroupsMismatch, m.KeyGroups)
	}
	old := m.SlotCount()
	if o.Slots == 0 {
		o.Slots = old
	}
	if o.Slots < 1 || o.Slots > MaxRescaleFactor*old || state.ValidateSlots(o.Slots, o.KeyGroups) != nil {
		return fmt.Errorf("recovery: restore %s/%d: %d slots from a checkpoint of %d: %w (allowed: 1 to %d, at most key_groups=%d)",
			m.Job, m.ID, o.Slots, old, ErrSlotCount, min(MaxRescaleFactor*old, o.KeyGroups), o.KeyGroups)
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	return nil
}

// builder builds the new state directory of one restore.
type builder struct {
	m        *checkpoint.Manifest
	o        *Options
	f        *fetcher
	c        *counters
	prog     *progressTracker
	tmp      string
	newState string
}

func (b *builder) build(ctx context.Context) error {
	if err := os.Mkdir(b.newState, 0o755); err != nil {
		return err
	}
	var err error
	switch {
	case b.m.Mode == checkpoint.ModeFull:
		err = b.full(ctx)
	case b.o.Slots == b.m.SlotCount():
		err = b.native(ctx)
	default:
		err = b.rescaleNative(ctx)
	}
	if err != nil {
		return err
	}
	return syncTree(b.newState)
}

func (b *builder) slotOptions(slots, slot int, readOnly bool) state.Options {
	return state.Options{
		KeyGroups: b.m.KeyGroups, Range: state.SlotRange(slot, slots, b.m.KeyGroups), ReadOnly: readOnly,
		CacheSize: 8 << 20, Logger: b.o.Logger,
	}
}

// fetchSlots places every object of the given old slots into
// dir/slot-<i>/<file>.
func (b *builder) fetchSlots(ctx context.Context, dir string, slots []int, link func(checkpoint.Object) bool) error {
	type job struct {
		o   checkpoint.Object
		dst string
	}
	var jobs []job
	var total int64
	for _, s := range slots {
		sd := datadir.SlotIn(dir, s)
		if err := os.Mkdir(sd, 0o755); err != nil {
			return err
		}
		for _, o := range b.m.SlotObjects(s) {
			jobs = append(jobs, job{o, filepath.Join(sd, o.File)})
			total += o.Size
		}
	}
	// Largest first, so one big file does not finish alone at the end.
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].o.Size > jobs[j].o.Size })
	b.prog.setTotal(total, len(jobs))
	b.prog.phase(PhaseFetch)
	return par.Do(ctx, len(jobs), b.o.Concurrency, func(ctx context.Context, i int) error {
		if err := b.f.fetch(ctx, jobs[i].o, jobs[i].dst, link(jobs[i].o)); err != nil {
			return fmt.Errorf("slot %d: %w", jobs[i].o.Slot, err)
		}
		failpoint.Hit(failpoint.RestoreDuringDownload)
		return nil
	})
}

// native restores an incremental checkpoint onto the same slot count: each
// slot's native Pebble files become the slot directory as they are.
func (b *builder) native(ctx context.Context) error {
	slots := make([]int, b.m.SlotCount())
	for i := range slots {
		slots[i] = i
	}
	// INVARIANT: only immutable SSTs are hard-linked into the new state; a
	// read-write DB may recycle or append to its WAL and metadata files, and
	// through a link that would change the local copy or the cache.
	isSST := func(o checkpoint.Object) bool { return o.Kind == checkpoint.KindSST }
	if err := b.fetchSlots(ctx, b.newState, slots, isSST); err != nil {
		return err
	}
	b.prog.phase(PhaseBuild)
	failpoint.Hit(failpoint.RestoreBeforeOpen)
	return par.Do(ctx, len(slots), runtime.GOMAXPROCS(0), func(ctx context.Context, i int) error {
		db, err := state.Open(datadir.SlotIn(b.newState, i), b.slotOptions(len(slots), i, true))
		if err != nil {
			return fmt.Errorf("slot %d: validate: %w", i, err)
		}
		return db.Close()
	})
}

// overlapping returns the old slots whose ranges overlap r, in key order.
func (b *builder) overlapping(r state.KeyGroupRange) []int {
	var out []int
	for _, s := range b.m.Slots {
		if s.Range.Overlaps(r) {
			out = append(out, s.Slot)
		}
	}
	return out
}

func intersect(a, c state.KeyGroupRange) state.KeyGroupRange {
	return state.KeyGroupRange{First: max(a.First, c.First), Last: min(a.Last, c.Last)}
}

// rescaleNative restores an incremental checkpoint onto another slot
// count, as the old slots' native files clipped to the new ranges. Each new
// slot starts from the old slot it overlaps most: its SSTs hard-linked, its
// metadata copied, the DB opened and every key outside the new range
// excised (no key is rewritten). A new range inside one old slot (every
// slot of a scale-up) is then complete, and the next incremental checkpoint
// finds its SSTs already in the store. A new range that spans old slots (a
// scale-down) gets the key groups of the other overlapping old slots
// ingested, scanned from them in key order (DESIGN.md's general path, for
// that part only).
func (b *builder) rescaleNative(ctx context.Context) error {
	src := filepath.Join(b.tmp, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return err
	}
	base := make([]int, b.o.Slots) // the old slot each new slot is clipped from
	needed, scanned := map[int]bool{}, map[int]bool{}
	for i := range b.o.Slots {
		nr := state.SlotRange(i, b.o.Slots, b.m.KeyGroups)
		ov := b.overlapping(nr)
		base[i] = ov[0]
		for _, s := range ov {
			if intersect(nr, b.m.Slots[s].Range).Len() > intersect(nr, b.m.Slots[base[i]].Range).Len() {
				base[i] = s
			}
		}
		for _, s := range ov {
			needed[s] = true
			scanned[s] = scanned[s] || s != base[i]
		}
	}
	var old []int
	for s := range needed {
		old = append(old, s)
	}
	sort.Ints(old)
	// The sources are only read (a clipped slot copies what it may write
	// to): everything may be linked.
	if err := b.fetchSlots(ctx, src, old, func(checkpoint.Object) bool { return true }); err != nil {
		return err
	}
	b.prog.phase(PhaseBuild)
	dbs := make([]*state.DB, b.m.SlotCount())
	defer func() {
		for _, db := range dbs {
			if db != nil {
				db.Close()
			}
		}
	}()
	for _, s := range old {
		if !scanned[s] {
			continue
		}
		db, err := state.Open(datadir.SlotIn(src, s), b.slotOptions(b.m.SlotCount(), s, true))
		if err != nil {
			return fmt.Errorf("old slot %d: open: %w", s, err)
		}
		dbs[s] = db
	}
	return par.Do(ctx, b.o.Slots, runtime.GOMAXPROCS(0), func(ctx context.Context, i int) error {
		nr := state.SlotRange(i, b.o.Slots, b.m.KeyGroups)
		return b.clip(ctx, datadir.SlotIn(src, base[i]), base[i], i, func(yield func(k, v []byte) error) error {
			for _, s := range b.overlapping(nr) {
				if s == base[i] {
					continue
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := dbs[s].ScanRaw(intersect(nr, b.m.Slots[s].Range), yield); err != nil {
					return fmt.Errorf("old slot %d: %w", s, err)
				}
			}
			return nil
		})
	})
}

// clip builds new slot i from old slot s's files in from: SSTs hard-linked
// (immutable), every other file copied (a read-write DB may append to or
// recycle it), the keys outside slot i's range excised, then the pairs of
// rest (the slot's key groups that old slot s does not hold) ingested.
func (b *builder) clip(ctx context.Context, from string, s, i int, rest func(yield func(k, v []byte) error) error) error {
	to := datadir.SlotIn(b.newState, i)
	if err := os.Mkdir(to, 0o755); err != nil {
		return fmt.Errorf("slot %d: %w", i, err)
	}
	for _, o := range b.m.SlotObjects(s) {
		if err := place(filepath.Join(from, o.File), filepath.Join(to, o.File), o.Kind == checkpoint.KindSST); err != nil {
			return fmt.Errorf("slot %d from old slot %d: %w", i, s, err)
		}
	}
	o := b.slotOptions(b.o.Slots, i, false)
	o.NoCompactions = true // the job's own open compacts
	db, err := state.Open(to, o)
	if err != nil {
		return fmt.Errorf("slot %d from old slot %d: open: %w", i, s, err)
	}
	if err := db.DeleteOutsideRange(ctx); err != nil {
		db.Close()
		return fmt.Errorf("slot %d from old slot %d: %w", i, s, err)
	}
	if err := db.IngestSorted(rest); err != nil {
		db.Close()
		return fmt.Errorf("slot %d: build: %w", i, err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("slot %d from old slot %d: close: %w", i, s, err)
	}
	return nil
}

// ingest builds new slot i from sorted pairs and closes it (the build's
// open is the validation).
func (b *builder) ingest(i int, kvs func(yield func(k, v []byte) error) error) error {
	db, err := state.IngestSorted(datadir.SlotIn(b.newState, i), b.slotOptions(b.o.Slots, i, false), kvs)
	if err != nil {
		return fmt.Errorf("slot %d: build: %w", i, err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("slot %d: build: %w", i, err)
	}
	return nil
}

// full restores a full (canonical) checkpoint or savepoint onto any slot
// count: each new slot reads only its key groups' segments (ranged reads)
// and is built with state.IngestSorted.
func (b *builder) full(ctx context.Context) error {
	view := &storeView{Store: b.o.Store, job: b.m.Job, objects: map[string]checkpoint.Object{}, cacheDir: b.f.cacheDir, cacheIdx: b.f.cacheIdx, c: b.c}
	for _, o := range b.m.Objects {
		view.objects[o.Path] = o
	}
	b.prog.phase(PhaseFetch)
	idx := make([]*checkpoint.SegmentIndex, b.m.SlotCount())
	err := par.Do(ctx, len(idx), b.o.Concurrency, func(ctx context.Context, s int) error {
		x, err := checkpoint.ReadIndex(ctx, view, b.m, s)
		if err != nil {
			return fmt.Errorf("old slot %d: %w", s, err)
		}
		idx[s] = x
		return nil
	})
	if err != nil {
		return err
	}
	var total int64
	var files int
	for _, x := range idx {
		for _, seg := range x.Segments {
			total += seg.Length
		}
		files += 2
	}
	b.prog.setTotal(total+b.c.bytesDone.Load(), files)
	b.prog.phase(PhaseBuild)
	err = par.Do(ctx, b.o.Slots, runtime.GOMAXPROCS(0), func(ctx context.Context, i int) error {
		nr := state.SlotRange(i, b.o.Slots, b.m.KeyGroups)
		return b.ingest(i, func(yield func(k, v []byte) error) error {
			for _, s := range b.overlapping(nr) {
				r := intersect(nr, b.m.Slots[s].Range)
				for kg := r.First; kg <= r.Last; kg++ {
					if err := checkpoint.ReadSegment(ctx, view, b.m, s, idx[s], kg, yield); err != nil {
						return fmt.Errorf("old slot %d key group %d: %w", s, kg, err)
					}
				}
			}
			return nil
		})
	})
	fc, fs := view.files()
	b.c.filesCache.Store(int64(fc))
	b.c.filesDownloaded.Store(int64(fs))
	b.c.filesDone.Store(int64(fc + fs))
	return err
}

// syncTree fsyncs every directory under (and including) root; file contents
// were synced when written, or are hard links to durable files.
func syncTree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return checkpoint.SyncDir(p)
		}
		return nil
	})
}

// cleanDataDir finishes or undoes what a crashed restore left: temporary
// directories are removed; when state is missing but a renamed-away old
// state exists (a crash between the two renames of swapState), it is put
// back, so the data directory is never left without its state.
func cleanDataDir(dataDir string) error {
	ents, err := os.ReadDir(dataDir)
	if err != nil {
		return err
	}
	cur := datadir.State(dataDir)
	_, statErr := os.Lstat(cur)
	var olds []string
	for _, e := range ents {
		switch {
		case strings.HasPrefix(e.Name(), tmpPrefix):
			if err := os.RemoveAll(filepath.Join(dataDir, e.Name())); err != nil {
				return err
			}
		case strings.HasPrefix(e.Name(), oldStatePrefix):
			olds = append(olds, e.Name())
		}
	}
	sort.Strings(olds) // names carry a zero-padded time: newest last
	if errors.Is(statErr, fs.ErrNotExist) && len(olds) > 0 {
		newest := olds[len(olds)-1]
		olds = olds[:len(olds)-1]
		if err := os.Rename(filepath.Join(dataDir, newest), cur); err != nil {
			return err
		}
		if err := checkpoint.SyncDir(dataDir); err != nil {
			return err
		}
	}
	for _, n := range olds {
		if err := os.RemoveAll(filepath.Join(dataDir, n)); err != nil {
			return err
		}
	}
	return nil
}

// swapState replaces dataDir/state by newState: rename the old away, rename
// the new in, fsync the data directory, remove the old.
func swapState(dataDir, newState string) error {
	cur := datadir.State(dataDir)
	old := ""
	if _, err := os.Lstat(cur); err == nil {
		old = filepath.Join(dataDir, fmt.Sprintf("%s%020d", oldStatePrefix, time.Now().UnixNano()))
		if err := os.Rename(cur, old); err != nil {
			return fmt.Errorf("swap: %w", err)
		}
	}
	if err := os.Rename(newState, cur); err != nil {
		if old != "" {
			if rerr := os.Rename(old, cur); rerr != nil {
				return fmt.Errorf("swap: %w (and putting the old state back failed: %v; it is at %s)", err, rerr, old)
			}
		}
		return fmt.Errorf("swap: %w", err)
	}
	// INVARIANT: an fsync failure is fatal and not retried.
	if err := checkpoint.SyncDir(dataDir); err != nil {
		return fmt.Errorf("swap: %w", err)
	}
	if old != "" {
		if err := os.RemoveAll(old); err != nil {
			return fmt.Errorf("swap: remove old state %s: %w", old, err)
		}
	}
	return nil
}
