package recovery

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"time"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/internal/base/failpoint"
	"cairn/internal/base/par"
	"cairn/internal/base/procs"
	"cairn/internal/base/sysfile"
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
	// Online asks for an online restore: SSTs not on local disk stay in the
	// store, read remotely on demand, and Result.Remote downloads them after
	// the restore (docs/RATIONALE.md, "Online restore"). It applies to an
	// incremental checkpoint restored onto the same slot count or scaled up;
	// anything else restores as usual, with the reason in
	// Result.OnlineRefused.
	Online bool
}

// Result is the record of a finished restore (docs/DESIGN.md, "Numbers that are
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
	// Origin is a tool-written savepoint's (nil otherwise).
	Origin *checkpoint.Origin
	// Figures are the restored checkpoint's recorded figures (its
	// duration, sizes and predicted restore), from its manifest.
	Figures checkpoint.Figures
	// Remote holds an online restore's files still in the store (nil when
	// everything is local): run its Download while the job runs, and Close
	// it when the job stops.
	Remote *state.RemoteSet
	// BytesMoved is what a rescaled restore of an incremental checkpoint
	// scanned from old slots that were not a new slot's base and ingested
	// (in file bytes, as recovery.Plan.BytesRebuild counts it).
	BytesMoved int64
	// Read lists the shared objects this restore downloaded from the store
	// and found with their manifest's size and SHA-256; RemoteObjects those
	// an online restore left in the store (Remote downloads and checks
	// them). A checkpoint writer in the same process need not read either
	// back (checkpoint.Writer.Restored, OnlineRestore).
	Read, RemoteObjects []checkpoint.Object
	// BytesRemote and FilesRemote are what Remote held when the restore
	// returned.
	BytesRemote int64
	FilesRemote int
	// OnlineRefused says why Options.Online did not apply ("" when it did
	// or was not asked).
	OnlineRefused string
	// OldStateRemoved is closed once the state this restore replaced is
	// removed from disk, which happens after Restore returns (swapState);
	// nil when the restore failed.
	OldStateRemoved <-chan struct{}
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
		Rescaled: o.Slots != m.SlotCount(), Modules: m.Modules, Figures: m.Figures, Origin: m.Origin,
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
	if o.Online {
		if r.OnlineRefused = b.onlineRefusal(); r.OnlineRefused == "" {
			b.remote = state.NewRemoteSet()
		}
	}
	err := b.build(ctx)
	if err == nil {
		failpoint.Hit(failpoint.RestoreBeforeSwap)
		prog.phase(PhaseSwap)
		r.OldStateRemoved, err = swapState(o.DataDir, b.newState, log)
	}
	r.Duration = time.Since(start)
	r.BytesLocal, r.BytesCache, r.BytesDownloaded = c.bytesLocal.Load(), c.bytesCache.Load(), c.bytesDownloaded.Load()
	r.FilesLocal, r.FilesCache, r.FilesDownloaded = int(c.filesLocal.Load()), int(c.filesCache.Load()), int(c.filesDownloaded.Load())
	r.BytesRemote, r.FilesRemote = c.bytesRemote.Load(), int(c.filesRemote.Load())
	r.Files = r.FilesLocal + r.FilesCache + r.FilesDownloaded + r.FilesRemote
	r.Read, r.RemoteObjects = c.read, c.remoteObjs
	if r.Rescaled && m.Mode == checkpoint.ModeIncremental {
		r.BytesMoved = movedBytes(m, o.Slots)
	}
	if b.remote != nil {
		if err != nil || r.FilesRemote == 0 {
			b.remote.Close()
		} else {
			r.Remote = b.remote
		}
	}
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
	// remote collects an online restore's remote SSTs (nil: offline).
	remote *state.RemoteSet
}

// onlineRefusal says why an online restore of b's checkpoint is not
// possible ("" when it is): a full checkpoint or savepoint must be rebuilt
// from its canonical segments, and a scale-down merges old slots by
// scanning them; both read everything before the DB can open.
func (b *builder) onlineRefusal() string {
	if !sysfile.HasID {
		return "an online restore finds its remote files by device and inode, which " + runtime.GOOS + " does not give"
	}
	if b.m.Mode == checkpoint.ModeFull {
		return "a full checkpoint or savepoint is rebuilt from its canonical format; online restore references the SSTs of an incremental checkpoint"
	}
	for i := range b.o.Slots {
		if len(b.overlapping(state.SlotRange(i, b.o.Slots, b.m.KeyGroups))) > 1 {
			return fmt.Sprintf("scaling %d slots down to %d merges old slots by scanning them; online restore covers the same slot count and scale-ups", b.m.SlotCount(), b.o.Slots)
		}
	}
	return ""
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
		if b.remote != nil && jobs[i].o.Kind == checkpoint.KindSST {
			if err := b.f.fetchOrRemote(ctx, jobs[i].o, jobs[i].dst, b.remote); err != nil {
				return fmt.Errorf("slot %d: %w", jobs[i].o.Slot, err)
			}
			return nil
		}
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
	return par.Do(ctx, len(slots), procs.CPUs(), func(ctx context.Context, i int) error {
		db, err := state.Open(datadir.SlotIn(b.newState, i), b.slotOptions(len(slots), i, true))
		if err != nil {
			return fmt.Errorf("slot %d: validate: %w", i, err)
		}
		return db.Close()
	})
}

// wholeObject returns old slot s's data object when reading key groups r of
// it in order reads the whole object: r is the slot's whole range and its
// segments lie end to end from the object's first byte to its last (as
// every canonical writer lays them out; otherwise nil, and the segments'
// own checks are all).
func wholeObject(m *checkpoint.Manifest, s int, x *checkpoint.SegmentIndex, r state.KeyGroupRange) *checkpoint.Object {
	if r != m.Slots[s].Range {
		return nil
	}
	var next int64
	for _, seg := range x.Segments {
		if seg.Length == 0 {
			continue
		}
		if seg.Offset != next {
			return nil
		}
		next += seg.Length
	}
	for i := range m.Objects {
		if o := &m.Objects[i]; o.Kind == checkpoint.KindFullData && o.Slot == s && o.Size == next && o.SHA256 != "" {
			return o
		}
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
	err = par.Do(ctx, b.o.Slots, procs.CPUs(), func(ctx context.Context, i int) error {
		nr := state.SlotRange(i, b.o.Slots, b.m.KeyGroups)
		return b.ingest(i, func(yield func(k, v []byte) error) error {
			for _, s := range b.overlapping(nr) {
				r := intersect(nr, b.m.Slots[s].Range)
				// A new slot that reads all of an old slot reads its whole
				// data object, segment after segment: hashed on the way, it
				// is checked against the manifest as a download would be.
				whole := wholeObject(b.m, s, idx[s], r)
				var h hash.Hash // nil: no hashing
				if whole != nil {
					h = sha256.New()
				}
				for kg := r.First; kg <= r.Last; kg++ {
					if err := checkpoint.ReadSegmentTo(ctx, view, b.m, s, idx[s], kg, h, yield); err != nil {
						return fmt.Errorf("old slot %d key group %d: %w", s, kg, err)
					}
				}
				if whole != nil && hex.EncodeToString(h.Sum(nil)) != whole.SHA256 {
					return fmt.Errorf("old slot %d: %w", s, &checkpoint.CorruptionError{Object: whole.Path, Reason: "sha256 mismatch"})
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
