package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"cairn/internal/base/failpoint"
	"cairn/state"
)

// Meta is what the engine knows about a checkpoint besides the slots' files.
type Meta struct {
	SourceStream string
	SourceSeq    uint64
	// Modules maps each stage to its module hash.
	Modules    map[string]string
	ABIVersion int
	// StateVersions maps each stage whose module declares a state
	// version (not 0) to it (Manifest.StateVersions).
	StateVersions map[string]int
	// Mode overrides the writer's mode for this checkpoint ("" = default).
	Mode Mode
}

// WriterConfig configures a Writer.
type WriterConfig struct {
	Job       string
	KeyGroups int
	Slots     int
	// Mode is the default mode (default incremental).
	Mode Mode
	// FullEvery makes every checkpoint after FullEvery consecutive
	// incremental ones a full one (0: never).
	FullEvery int
	// Retain is how many committed checkpoints to keep (default 3).
	Retain int
	// OrphanGrace is the age after which unreferenced objects are swept
	// (default 1h). It must exceed the longest upload of a checkpoint.
	OrphanGrace time.Duration
	// Concurrency bounds parallel uploads (default 4).
	Concurrency int
	// Logger receives a line per checkpoint (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Scrub configures the background check of the shared objects the
	// writer may reuse (default on; see ScrubConfig).
	Scrub ScrubConfig
	// Events receives the writer's events: the one stream the dashboard,
	// /metrics and logs subscribe to (the writer keeps no history).
	Events EventListener
}

// EventListener receives a Writer's events, as Pebble's EventListener
// does: each func may be nil. They are called with the writer's lock held:
// they must return quickly and must not call the Writer.
type EventListener struct {
	// CheckpointEnd is called for every checkpoint attempt, committed or
	// failed.
	CheckpointEnd func(Stats)
	// Object is called for every shared object found missing or damaged in
	// the store, and for every one healed.
	Object func(ObjectEvent)
}

// Stats is the record of one checkpoint attempt.
type Stats struct {
	ID          uint64
	Mode        Mode
	Time        time.Time
	ChainLength int
	Figures     Figures
	// Err is nil for a committed checkpoint.
	Err error
}

// Writer uploads and commits checkpoints of one job. Commit calls are
// serialized: at most one checkpoint is in flight per Writer.
type Writer struct {
	store Store
	cfg   WriterConfig
	log   *slog.Logger
	// gcSuspended: a corrupt manifest was found at start; delete nothing.
	gcSuspended bool

	mu struct {
		sync.Mutex
		// beforeDrop is SetBeforeDrop's hook (nil: none).
		beforeDrop func(ctx context.Context, ids []uint64) error
		// next is the smallest id Commit accepts.
		next uint64
		// committed holds the job's committed checkpoints by id.
		committed map[uint64]*Manifest
		// shared holds, per shared object path that a committed manifest
		// references, the reference count and what this process knows of
		// the object's integrity. An incremental checkpoint reuses only
		// those it knows intact (see integrity.go).
		shared map[string]*sharedObj
		// gen numbers the changes of shared objects' states, so that a
		// scrub result computed without the lock is dropped when stale.
		gen uint64
		// hashes caches SST checksums by (slot, name, size, inode): SSTs
		// are immutable and their names never repeat within a DB.
		hashes map[sstKey]string
		// bandwidth is the last measured upload throughput, bytes/s.
		bandwidth int64
		// lastSweep is when the orphan sweep last ran.
		lastSweep time.Time
	}

	// closed is set by Close: the scrub writes nothing to the store after.
	closed atomic.Bool
	// scrubStop ends the background scrub; scrubDone is closed when it has.
	scrubStop context.CancelFunc
	scrubDone chan struct{}
}

type sstKey struct {
	slot  int
	name  string
	size  int64
	inode uint64
}

// NewWriter opens the job's checkpoints in store: it loads the committed
// manifests to know the next id, the parent and the reusable shared objects,
// checks the sizes of those objects, and starts the background scrub
// (cfg.Scrub). Close stops the scrub.
func NewWriter(ctx context.Context, store Store, cfg WriterConfig) (*Writer, error) {
	if err := validJob(cfg.Job); err != nil {
		return nil, fmt.Errorf("checkpoint: writer: %w", err)
	}
	if err := state.ValidateKeyGroups(cfg.KeyGroups); err != nil {
		return nil, fmt.Errorf("checkpoint: writer: %w", err)
	}
	if err := state.ValidateSlots(cfg.Slots, cfg.KeyGroups); err != nil {
		return nil, fmt.Errorf("checkpoint: writer: %w", err)
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeIncremental
	}
	if cfg.Mode != ModeIncremental && cfg.Mode != ModeFull {
		return nil, fmt.Errorf("checkpoint: writer: mode %q (use incremental or full)", cfg.Mode)
	}
	if cfg.Retain <= 0 {
		cfg.Retain = 3
	}
	if cfg.OrphanGrace <= 0 {
		cfg.OrphanGrace = time.Hour
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Scrub = cfg.Scrub.withDefaults()
	w := &Writer{store: store, cfg: cfg, log: cfg.Logger.With("job", cfg.Job)}
	w.mu.hashes = map[sstKey]string{}
	ms, maxID, broken, err := loadCheckpointsTolerant(ctx, store, cfg.Job)
	if err != nil {
		return nil, err
	}
	if len(broken) > 0 {
		// A corrupt manifest is not a checkpoint, but what it references is
		// unknown: nothing is deleted (no retention, no sweep) while it is
		// there. `cairn checkpoints verify` names it; remove it and restart
		// the job to resume GC (the writer reads manifests only at start).
		for _, b := range broken {
			w.log.Error("corrupt checkpoint manifest: ignored, and retention is suspended until it is removed and the job restarted", "err", b.err)
		}
		w.gcSuspended = true
	}
	for _, m := range ms {
		if m.KeyGroups != cfg.KeyGroups {
			return nil, fmt.Errorf("%w: job %s: checkpoint %d has key_groups=%d, this job %d: key_groups can never change for a job's state; use a new job name or the old count", ErrKeyGroupsMismatch, cfg.Job, m.ID, m.KeyGroups, cfg.KeyGroups)
		}
	}
	w.setCommittedLocked(ms)
	w.mu.next = maxID + 1
	if err := w.checkSizesLocked(ctx); err != nil {
		return nil, err
	}
	w.startScrub()
	return w, nil
}

// setCommittedLocked replaces the registry of committed checkpoints. What
// is known of the integrity of the shared objects that stay referenced is
// kept.
func (w *Writer) setCommittedLocked(ms []*Manifest) {
	w.mu.committed = map[uint64]*Manifest{}
	if w.mu.shared == nil {
		w.mu.shared = map[string]*sharedObj{}
	}
	for _, o := range w.mu.shared {
		o.refs, o.lastRef = 0, 0
	}
	for _, m := range ms {
		w.addCommittedLocked(m, nil, nil)
	}
	for p, o := range w.mu.shared {
		if o.refs == 0 {
			delete(w.mu.shared, p)
		}
	}
}

// addCommittedLocked registers a committed checkpoint. local maps the
// shared objects whose content this process holds in a local file (the
// snapshot just committed) to that file; uploaded holds those this process
// has just written to the store.
func (w *Writer) addCommittedLocked(m *Manifest, local map[string]string, uploaded map[string]bool) {
	w.mu.committed[m.ID] = m
	for _, o := range m.Objects {
		if o.Kind != KindSST {
			continue
		}
		s := w.mu.shared[o.Path]
		if s == nil {
			s = &sharedObj{size: o.Size, sum: o.SHA256}
			if uploaded[o.Path] {
				s.state, s.checked = objIntact, w.cfg.Now()
			}
			w.bumpLocked(s)
			w.mu.shared[o.Path] = s
		}
		s.refs++
		s.lastRef = max(s.lastRef, m.ID)
		if f, ok := local[o.Path]; ok {
			s.local = f
		}
	}
}

func (w *Writer) removeCommittedLocked(m *Manifest) {
	delete(w.mu.committed, m.ID)
	for _, o := range m.Objects {
		if o.Kind == KindSST {
			if s := w.mu.shared[o.Path]; s != nil {
				if s.refs--; s.refs <= 0 {
					delete(w.mu.shared, o.Path)
				}
			}
		}
	}
}

// NextID is the id the next checkpoint must use (ids only grow; an id is
// never reused, even after a failed attempt).
func (w *Writer) NextID() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.next
}

// Intact reports whether every manifest the writer read at start decoded.
// Then Latest, before the writer's first commit, is what selecting the
// newest checkpoint would read from the store again.
func (w *Writer) Intact() bool { return !w.gcSuspended }

// Latest returns the newest committed checkpoint, or nil.
func (w *Writer) Latest() *Manifest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latestLocked()
}

// Committed returns the committed checkpoints this writer knows (the
// retained ones), oldest first.
func (w *Writer) Committed() []*Manifest {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*Manifest, 0, len(w.mu.committed))
	for _, m := range w.mu.committed {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (w *Writer) latestLocked() *Manifest {
	var latest *Manifest
	for _, m := range w.mu.committed {
		if latest == nil || m.ID > latest.ID {
			latest = m
		}
	}
	return latest
}

// upload is one object to write.
type upload struct {
	obj   Object
	local string // file to upload
	data  []byte // or bytes
	// stored: already written to the store (a full checkpoint's data
	// streamed into a streamStore); putAll skips it.
	stored bool
}

// Commit is the asynchronous part of checkpoint id: it uploads the slots'
// files, commits the manifest, then applies retention (and, from time to
// time, the orphan sweep). On error nothing becomes visible: objects already
// uploaded are unreferenced and left to the orphan sweep.
func (w *Writer) Commit(ctx context.Context, id uint64, meta Meta, slots []state.SlotSnapshot) (*Manifest, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	start := w.cfg.Now()
	m, err := w.commitLocked(ctx, id, meta, slots, start)
	st := Stats{ID: id, Time: start, Err: err}
	if m != nil {
		st.Mode, st.ChainLength, st.Figures = m.Mode, m.ChainLength, m.Figures
	}
	if err != nil {
		w.log.Error("checkpoint failed", "id", id, "err", err)
		if f := w.cfg.Events.CheckpointEnd; f != nil {
			f(st)
		}
		return nil, err
	}
	f := m.Figures
	w.log.Info("checkpoint complete", "id", id, "mode", m.Mode, "chain", m.ChainLength,
		"sync_max", f.SyncMax, "async", f.Async, "bytes_uploaded", f.BytesUploaded,
		"files_uploaded", f.FilesUploaded, "files_reused", f.FilesReused, "full_state_size", f.FullStateSize,
		"source_seq", m.SourceSeq)
	if f := w.cfg.Events.CheckpointEnd; f != nil {
		f(st)
	}
	if len(slots) > 0 && m.Mode == ModeIncremental {
		// The node keeps this checkpoint's local copy for local recovery:
		// record the files just hashed by (size, inode, mtime), so a
		// restore trusts them without hashing them again.
		if err := WriteLocalIndex(filepath.Dir(slots[0].Dir), m.Objects); err != nil {
			w.log.Warn("local recovery index not written; a restore will hash local files", "checkpoint", m.ID, "err", err)
		}
	}
	w.retainLocked(ctx)
	return m, nil
}

func (w *Writer) commitLocked(ctx context.Context, id uint64, meta Meta, slots []state.SlotSnapshot, start time.Time) (*Manifest, error) {
	if id < w.mu.next {
		return nil, fmt.Errorf("checkpoint: commit %d: ids must grow, next is %d", id, w.mu.next)
	}
	w.mu.next = id + 1
	m, slots, err := w.newManifest(fmt.Sprintf("commit %d", id), id, meta, slots, start)
	if err != nil {
		return nil, err
	}
	m.Mode = meta.Mode
	if m.Mode == "" {
		m.Mode = w.cfg.Mode
	}
	latest := w.latestLocked()
	if m.Mode == ModeIncremental && w.cfg.FullEvery > 0 && latest != nil && latest.Mode == ModeIncremental && latest.ChainLength >= w.cfg.FullEvery {
		m.Mode = ModeFull
	}
	if m.Mode == ModeIncremental && latest != nil && latest.Mode == ModeIncremental {
		m.Parent = latest.ID
		m.ChainLength = latest.ChainLength + 1
	}

	var uploads []upload
	var cleanup []string
	defer func() {
		for _, p := range cleanup {
			os.Remove(p)
		}
	}()
	perSlot := make([][]upload, len(slots))
	switch m.Mode {
	case ModeIncremental:
		for i, s := range slots {
			ups, err := w.incrementalSlot(m, s)
			if err != nil {
				return nil, fmt.Errorf("checkpoint: commit %d: slot %d: %w", id, s.Slot, err)
			}
			perSlot[i] = ups
		}
	case ModeFull:
		dir := func(slot int) string { return SlotDir(m.Job, m.ID, slot) }
		if perSlot, err = w.fullSlots(ctx, m, slots, dir, &cleanup); err != nil {
			return nil, fmt.Errorf("checkpoint: commit %d: %w", id, err)
		}
	default:
		return nil, fmt.Errorf("checkpoint: commit %d: mode %q (use incremental or full)", id, m.Mode)
	}
	local := map[string]string{}
	for _, ups := range perSlot {
		uploads = append(uploads, ups...)
		for _, u := range ups {
			if u.obj.Kind == KindSST {
				local[u.obj.Path] = u.local
			}
		}
	}
	// INVARIANT: a checkpoint references a shared object it does not upload
	// only when this process knows it intact in the store: uploaded by this
	// process, or read back with the manifest's size and checksum (by the
	// commit, the scrub or a restore), or held as an online restore's file
	// that its download is verifying (OnlineRestore).
	w.checkBeforeReuseLocked(ctx, id, uploads)
	// Reuse shared objects that a committed checkpoint references and that
	// are known intact; upload everything else (once, if two slots hold the
	// same content). Uploading a damaged object heals it for every
	// checkpoint that references it: the path is its content hash.
	var todo []upload
	var putBytes int64 // what putAll uploads: the bandwidth sample
	queued := map[string]bool{}
	for _, u := range uploads {
		m.Objects = append(m.Objects, u.obj)
		m.Figures.FullStateSize += u.obj.Size
		switch {
		case u.obj.Kind == KindSST && w.reusableLocked(u.obj.Path):
			m.Figures.FilesReused++
			m.Figures.BytesReused += u.obj.Size
		case queued[u.obj.Path]:
		default:
			queued[u.obj.Path] = true
			todo = append(todo, u)
			m.Figures.FilesUploaded++
			m.Figures.BytesUploaded += u.obj.Size
			if !u.stored {
				putBytes += u.obj.Size
			}
		}
	}
	upStart := time.Now()
	if err := w.putAll(ctx, todo); err != nil {
		return nil, fmt.Errorf("checkpoint: commit %d: upload: %w", id, err)
	}
	uploaded := w.uploadedLocked(id, todo)
	failpoint.Hit(failpoint.CheckpointAfterUpload)
	if up := time.Since(upStart); putBytes >= minBandwidthSample && up > 0 {
		w.mu.bandwidth = int64(float64(putBytes) / up.Seconds())
	}
	if bw := w.mu.bandwidth; bw > 0 {
		m.Figures.StoreBandwidth = bw
		m.Figures.PredictedRestore = time.Duration(float64(m.Figures.FullStateSize) / float64(bw) * float64(time.Second))
	}
	m.Figures.Async = w.cfg.Now().Sub(start)
	data, err := m.Encode()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: commit %d: %w", id, err)
	}
	failpoint.Hit(failpoint.CheckpointBeforeManifest)
	if err := w.store.Create(ctx, ManifestPath(w.cfg.Job, id), data); err != nil {
		return nil, fmt.Errorf("checkpoint: commit %d: manifest: %w", id, err)
	}
	failpoint.Hit(failpoint.CheckpointAfterManifest)
	w.addCommittedLocked(m, local, uploaded)
	return m, nil
}

// SetBeforeDrop makes retention call f with the ids of the checkpoints it
// is about to drop (oldest first), before it deletes their manifests, with
// the writer's lock held. An index that names checkpoints (a job graph's
// graph checkpoints) removes its entries there, so that nothing in the
// store names a checkpoint that is gone, even after a crash between the
// two. When f fails, this round drops nothing: the checkpoints stay, and
// the next commit's retention tries again. Set it before the first Commit.
func (w *Writer) SetBeforeDrop(f func(ctx context.Context, ids []uint64) error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mu.beforeDrop = f
}

// retainLocked drops committed checkpoints beyond Retain (manifests first,
// then private files, then shared objects no remaining manifest
// references; objects an unexpired lease lists are kept) and runs the
// orphan sweep when it is due. Errors are logged: the checkpoint is
// committed, and whatever is left is swept later.
func (w *Writer) retainLocked(ctx context.Context) {
	if w.gcSuspended || w.onlinePendingLocked() {
		return
	}
	now := w.cfg.Now()
	if w.mu.lastSweep.IsZero() || now.Sub(w.mu.lastSweep) >= w.cfg.OrphanGrace/2 {
		rep, err := gcWith(ctx, w.store, w.cfg.Job, w.cfg.Retain, w.cfg.OrphanGrace, now, false, w.mu.beforeDrop)
		if err != nil {
			w.log.Warn("checkpoint gc failed", "err", err)
		} else {
			w.mu.lastSweep = now
			w.setCommittedLocked(rep.remaining)
			if len(rep.Deleted) > 0 || rep.KeptByLease > 0 {
				w.log.Info("checkpoint gc", "dropped", rep.Dropped, "objects_deleted", len(rep.Deleted), "bytes_freed", rep.BytesFreed,
					"kept_by_lease", rep.KeptByLease, "leases_expired", rep.LeasesExpired)
			}
			return
		}
	}
	ids := make([]uint64, 0, len(w.mu.committed))
	for id := range w.mu.committed {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var drop []*Manifest
	for ; len(ids) > w.cfg.Retain; ids = ids[1:] {
		drop = append(drop, w.mu.committed[ids[0]])
	}
	if len(drop) == 0 {
		return
	}
	if err := w.dropLocked(ctx, drop, now); err != nil {
		w.log.Warn("checkpoint retention failed", "err", err)
	}
}

// dropLocked deletes committed checkpoints: every manifest first, then the
// leases are read (once for the round), then the files no remaining
// manifest references and no unexpired lease lists.
//
// INVARIANT: the leases are read after the manifests are deleted and before
// any object is (see gcAt). When they cannot be read (or a young lease file
// does not decode, see scanLeases), the manifests stay deleted — a lease
// protects objects, not manifests, and the checkpoint is already gone for
// everyone else — and no object is deleted: the files are left to the
// orphan sweep, which reads the leases again.
func (w *Writer) dropLocked(ctx context.Context, drop []*Manifest, now time.Time) error {
	if f := w.mu.beforeDrop; f != nil {
		if err := f(ctx, idsOf(drop)); err != nil {
			return fmt.Errorf("checkpoints %v kept: what names them was not removed first: %w", idsOf(drop), err)
		}
	}
	var errs []error
	for i, m := range drop {
		if err := w.store.Delete(ctx, ManifestPath(m.Job, m.ID)); err != nil {
			errs = append(errs, fmt.Errorf("drop %d: %w", m.ID, err))
			drop = drop[:i]
			break
		}
		failpoint.Hit(failpoint.GCAfterManifestDelete)
		w.removeCommittedLocked(m)
	}
	if len(drop) == 0 {
		return errors.Join(errs...)
	}
	leased, err := leasedObjects(ctx, w.store, w.cfg.Job, now)
	if err != nil {
		errs = append(errs, fmt.Errorf("checkpoints %v dropped, their files left to the orphan sweep: %w", idsOf(drop), err))
		return errors.Join(errs...)
	}
	done := map[string]bool{}
	var kept []string
	for _, m := range drop {
		for _, o := range m.Objects {
			if done[o.Path] || (o.Kind == KindSST && w.mu.shared[o.Path] != nil) {
				continue
			}
			done[o.Path] = true
			if leased[o.Path] {
				kept = append(kept, o.Path)
				continue
			}
			if err := w.store.Delete(ctx, o.Path); err != nil {
				errs = append(errs, fmt.Errorf("drop %d: %w", m.ID, err))
			}
		}
	}
	if len(kept) > 0 {
		w.log.Info("checkpoint retention kept leased objects; the orphan sweep deletes them once released", "dropped", idsOf(drop), "kept_by_lease", len(kept))
	}
	return errors.Join(errs...)
}

// minBandwidthSample is the smallest upload that measures the store's
// bandwidth; smaller ones are dominated by per-request latency.
const minBandwidthSample = 256 << 10
