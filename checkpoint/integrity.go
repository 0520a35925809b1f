package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"cairn/internal/base/par"
)

// Integrity of the shared objects a writer reuses (docs/DESIGN.md, "The
// manifest and its commit rules": an object the store lost or damaged is
// re-uploaded or replaced, never referenced again).
//
// An incremental checkpoint references the shared SSTs that earlier
// checkpoints uploaded. Trusting them blindly spreads damage: a truncated
// object would be referenced by every new checkpoint, and retention would
// then delete the older, intact ones. So the writer reuses a shared object
// only while it knows it intact in the store:
//
//   - at start it lists shared/ once and compares every referenced object's
//     size with the manifests': a missing or truncated object is damaged
//     before the first checkpoint;
//   - before a checkpoint references an object this process did not upload,
//     the commit reads it back and checks its size and SHA-256 (once per
//     process: then it is known intact), unless this process has read it
//     already: a restore's download checked the same (Restored), and an
//     online restore's download is checking it (OnlineRestore);
//   - a background scrub reads every reusable object again at most every
//     ScrubConfig.Every, at a bounded rate.
//
// A damaged object is never reused. When the writer holds a local copy
// (the newest snapshot that contained it) the scrub re-uploads it, after
// checking the copy's checksum: the path is the content hash, so this heals
// every checkpoint that references it. Otherwise the next checkpoint whose
// snapshot holds the object uploads it anew; one that does not hold it does
// not reference it. Either way every new checkpoint is complete.

// ScrubConfig configures the writer's background scrub of shared objects.
type ScrubConfig struct {
	// Disabled turns the background scrub off. The start check (sizes) and
	// the check before an object's first reuse (size and checksum) stay.
	Disabled bool
	// BytesPerSecond bounds the scrub's reads (default
	// DefaultScrubBytesPerSecond). Each object counts as at least
	// ScrubMinObjectCost bytes, which also bounds the requests per second.
	BytesPerSecond int64
	// Every is how long an object stays trusted after it was uploaded or
	// checked before the scrub reads it again (default DefaultScrubEvery).
	Every time.Duration
}

// Scrub defaults. With them the scrub reads at most 2 MiB/s and 8 objects/s,
// and a state of up to 1.2 GB is re-read every 10 minutes; a larger state
// is re-read as fast as the rate allows.
const (
	DefaultScrubBytesPerSecond = 2 << 20
	DefaultScrubEvery          = 10 * time.Minute
	// ScrubMinObjectCost is what one object read costs against the rate at
	// least: a request is not free even for a tiny object.
	ScrubMinObjectCost = 256 << 10
)

func (c ScrubConfig) withDefaults() ScrubConfig {
	if c.BytesPerSecond <= 0 {
		c.BytesPerSecond = DefaultScrubBytesPerSecond
	}
	if c.Every <= 0 {
		c.Every = DefaultScrubEvery
	}
	return c
}

// ObjectEventKind says what the writer found or did about a shared object.
type ObjectEventKind string

const (
	// ObjectDamaged: the object is missing from the store or does not
	// match the manifests' size and checksum. No checkpoint references it
	// again until it has been re-uploaded.
	ObjectDamaged ObjectEventKind = "damaged"
	// ObjectHealed: a damaged object was re-uploaded from a local copy;
	// every checkpoint referencing it is whole again.
	ObjectHealed ObjectEventKind = "healed"
)

// ObjectEvent reports a damaged or healed shared object.
type ObjectEvent struct {
	Kind ObjectEventKind
	// Object is the store path.
	Object string
	// Err says what is wrong (ObjectDamaged: it wraps ErrNotFound or is a
	// *CorruptionError).
	Err error
	// By is what found or healed it: "start" (the size check of NewWriter),
	// "commit" (a checkpoint's check before reuse, or its upload) or
	// "scrub".
	By string
	// Checkpoint is the checkpoint whose commit found or healed the object
	// (0 for the start check and the scrub).
	Checkpoint uint64
	Time       time.Time
}

// objState is what a writer knows of a shared object's integrity.
type objState uint8

const (
	// objUnchecked: known from a manifest, not yet read back by this
	// process. Read back before its first reuse.
	objUnchecked objState = iota
	// objIntact: uploaded by this process, or read back with the right
	// size and checksum.
	objIntact
	// objDamaged: missing or not matching. Never reused; uploaded again by
	// the scrub (local copy) or the next checkpoint that holds it.
	objDamaged
	// objOnline: a file of an online restore in this process, still read
	// from the store, which the restore's download is verifying (see
	// OnlineRestore). Reused without a read-back; while one is, retention
	// deletes nothing.
	objOnline
)

// sharedObj is one shared object that committed manifests reference.
type sharedObj struct {
	// refs counts the committed manifests referencing it; lastRef is the
	// newest of them.
	refs    int
	lastRef uint64
	size    int64
	sum     string
	state   objState
	// checked is when the object was last uploaded or read by this process
	// (a failed read counts: it is not retried before Every).
	checked time.Time
	// gen changes with every change of state: a scrub result computed
	// without the lock applies only when gen is unchanged.
	gen uint64
	// local is a local file with the same content (from the newest
	// committed snapshot holding it), "" when none is known.
	local string
}

func (w *Writer) bumpLocked(o *sharedObj) {
	w.mu.gen++
	o.gen = w.mu.gen
}

// reusableLocked reports whether a checkpoint may reference the shared
// object path without uploading it.
func (w *Writer) reusableLocked(path string) bool {
	o := w.mu.shared[path]
	return o != nil && o.refs > 0 && (o.state == objIntact || o.state == objOnline)
}

// onlinePendingLocked reports whether a committed checkpoint references an
// online restore's file that its download has not verified yet.
func (w *Writer) onlinePendingLocked() bool {
	for _, o := range w.mu.shared {
		if o.refs > 0 && o.state == objOnline {
			return true
		}
	}
	return false
}

// Restored tells the writer that this process has just read objs from the
// store and found each one's size and SHA-256 (a restore's downloads, or an
// online restore's download once it ends): the same check as the read-back
// before a first reuse, so the next checkpoint reuses them without reading
// them again. An object whose size or checksum is not the one the
// committed manifests record, or that a check found damaged, is left as it
// is. It returns how many objects it marked intact.
func (w *Writer) Restored(objs []Object) int {
	return w.mark(objs, objIntact, objUnchecked, objOnline)
}

// Unread tells the writer that an online restore's objs were never read
// by its download (the state deleted them before it got there): they are
// unchecked again, as any object nobody has read, so the scrub reads them
// and retention is no longer held for them. It returns how many it took.
func (w *Writer) Unread(objs []Object) int {
	return w.mark(objs, objUnchecked, objOnline)
}

// OnlineRestore tells the writer that the state of this process holds objs
// as an online restore's files: read from the store on demand while a
// background download fetches and verifies them, and fails the job if one
// does not match (recovery.Result.Remote, runtime/online). A checkpoint
// reuses them without reading them back: a second read would compete with
// that download for the link, and would tell nothing the download does not
// (the process has no other copy to re-upload a damaged one from). Until
// Restored reports them verified, retention deletes no checkpoint: an older
// one may be the only one without an object the download has yet to find
// damaged. It returns how many objects it took.
func (w *Writer) OnlineRestore(objs []Object) int {
	return w.mark(objs, objOnline, objUnchecked)
}

func (w *Writer) mark(objs []Object, to objState, from ...objState) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.cfg.Now()
	n := 0
	for _, ob := range objs {
		o := w.mu.shared[ob.Path]
		if o == nil || o.refs <= 0 || o.size != ob.Size || o.sum != ob.SHA256 {
			continue
		}
		for _, f := range from {
			if o.state == f {
				o.state, o.checked = to, now
				w.bumpLocked(o)
				n++
				break
			}
		}
	}
	return n
}

// isDamage reports whether a read error means the object is lost or
// damaged (as opposed to the store being unreachable).
func isDamage(err error) bool {
	return errors.Is(err, ErrNotFound) || IsCorruption(err)
}

func (w *Writer) emitLocked(ev ObjectEvent) {
	ev.Time = w.cfg.Now()
	switch ev.Kind {
	case ObjectDamaged:
		w.log.Error("checkpoint store object damaged: no checkpoint references it until it is re-uploaded",
			"object", ev.Object, "err", ev.Err, "found_by", ev.By, "checkpoint", ev.Checkpoint)
	case ObjectHealed:
		w.log.Warn("checkpoint store object healed: re-uploaded from a local copy",
			"object", ev.Object, "by", ev.By, "checkpoint", ev.Checkpoint)
	}
	if f := w.cfg.Events.Object; f != nil {
		f(ev)
	}
}

func (w *Writer) damagedLocked(path string, o *sharedObj, err error, by string, id uint64) {
	o.state = objDamaged
	w.bumpLocked(o)
	w.emitLocked(ObjectEvent{Kind: ObjectDamaged, Object: path, Err: err, By: by, Checkpoint: id})
}

// checkSizesLocked is the start check: one listing of shared/, every
// referenced object's size compared with the manifests'.
func (w *Writer) checkSizesLocked(ctx context.Context) error {
	if len(w.mu.shared) == 0 {
		return nil
	}
	sizes := map[string]int64{}
	err := w.store.List(ctx, w.cfg.Job+"/shared/", func(o ObjectInfo) error {
		sizes[o.Name] = o.Size
		return nil
	})
	if err != nil {
		return fmt.Errorf("checkpoint: writer: list shared objects: %w", err)
	}
	paths := make([]string, 0, len(w.mu.shared))
	for p := range w.mu.shared {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		o := w.mu.shared[p]
		size, ok := sizes[p]
		switch {
		case !ok:
			w.damagedLocked(p, o, fmt.Errorf("%s: %w", p, ErrNotFound), "start", 0)
		case size != o.size:
			w.damagedLocked(p, o, &CorruptionError{Object: p, Reason: fmt.Sprintf("size %d, manifest says %d", size, o.size)}, "start", 0)
		}
	}
	return nil
}

// checkBeforeReuseLocked reads back, with bounded parallelism, every shared
// object of uploads that a committed checkpoint references and that this
// process has not checked yet. An object that cannot be read for another
// reason stays unchecked: this checkpoint uploads it.
func (w *Writer) checkBeforeReuseLocked(ctx context.Context, id uint64, uploads []upload) {
	var objs []Object
	seen := map[string]bool{}
	for _, u := range uploads {
		if u.obj.Kind != KindSST || seen[u.obj.Path] {
			continue
		}
		seen[u.obj.Path] = true
		if o := w.mu.shared[u.obj.Path]; o != nil && o.refs > 0 && o.state == objUnchecked {
			objs = append(objs, Object{Path: u.obj.Path, Size: o.size, SHA256: o.sum})
		}
	}
	if len(objs) == 0 {
		return
	}
	errs := make([]error, len(objs))
	_ = par.Do(ctx, len(objs), w.cfg.Concurrency, func(ctx context.Context, i int) error {
		errs[i] = verifyObject(ctx, w.store, objs[i])
		return nil
	})
	now := w.cfg.Now()
	for i, err := range errs {
		o := w.mu.shared[objs[i].Path]
		switch {
		case err == nil:
			o.state, o.checked = objIntact, now
			w.bumpLocked(o)
		case isDamage(err):
			w.damagedLocked(objs[i].Path, o, err, "commit", id)
		default:
			w.log.Warn("checkpoint: cannot read a shared object back before reusing it; uploading it again", "id", id, "object", objs[i].Path, "err", err)
		}
	}
}

// uploadedLocked records the shared objects a commit has just written and
// returns their paths. A damaged one is healed.
func (w *Writer) uploadedLocked(id uint64, ups []upload) map[string]bool {
	done := map[string]bool{}
	now := w.cfg.Now()
	for _, u := range ups {
		if u.obj.Kind != KindSST {
			continue
		}
		done[u.obj.Path] = true
		if o := w.mu.shared[u.obj.Path]; o != nil {
			was := o.state
			o.state, o.checked, o.local = objIntact, now, u.local
			w.bumpLocked(o)
			if was == objDamaged {
				w.emitLocked(ObjectEvent{Kind: ObjectHealed, Object: u.obj.Path, By: "commit", Checkpoint: id})
			}
		}
	}
	return done
}

// startScrub starts the background scrub unless it is disabled.
func (w *Writer) startScrub() {
	if w.cfg.Scrub.Disabled {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.scrubStop, w.scrubDone = cancel, make(chan struct{})
	go w.scrubLoop(ctx)
}

// Close stops the background scrub and waits for it to end (or for ctx).
// The Writer must not be used after Close.
func (w *Writer) Close(ctx context.Context) error {
	w.closed.Store(true)
	if w.scrubStop == nil {
		return nil
	}
	w.scrubStop()
	select {
	case <-w.scrubDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// scrubLoop checks one due object at a time, then waits as long as the
// object's cost takes at the configured rate.
func (w *Writer) scrubLoop(ctx context.Context) {
	defer close(w.scrubDone)
	cfg := w.cfg.Scrub
	idle := max(min(cfg.Every/4, 30*time.Second), 10*time.Millisecond)
	for {
		wait := idle
		if path := w.nextDue(); path != "" {
			size, _ := w.scrubObject(ctx, path)
			wait = time.Duration(float64(max(size, ScrubMinObjectCost)) / float64(cfg.BytesPerSecond) * float64(time.Second))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// nextDue returns the reusable object checked longest ago, if it is due.
func (w *Writer) nextDue() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.cfg.Now()
	best := ""
	var bestAt time.Time
	for p, o := range w.mu.shared {
		if o.state == objDamaged || o.state == objOnline || o.refs <= 0 || (!o.checked.IsZero() && now.Sub(o.checked) < w.cfg.Scrub.Every) {
			continue
		}
		if best == "" || o.checked.Before(bestAt) || o.checked.Equal(bestAt) && p < best {
			best, bestAt = p, o.checked
		}
	}
	return best
}

// scrubResult is the outcome of one scrub check.
type scrubResult uint8

const (
	scrubSkipped scrubResult = iota // no longer referenced, or changed meanwhile
	scrubIntact
	scrubUnreadable // the store could not be read: tried again after Every
	scrubDamaged    // damaged, not healed (no usable local copy)
	scrubHealed     // damaged and re-uploaded
)

// scrubObject reads one shared object back and, when it is damaged,
// re-uploads it from its local copy. It holds the writer's lock only to
// read and record state: a commit is never blocked by a store read.
func (w *Writer) scrubObject(ctx context.Context, path string) (int64, scrubResult) {
	w.mu.Lock()
	o := w.mu.shared[path]
	if o == nil || o.refs <= 0 || o.state == objDamaged {
		w.mu.Unlock()
		return 0, scrubSkipped
	}
	obj, gen := Object{Path: path, Size: o.size, SHA256: o.sum}, o.gen
	w.mu.Unlock()

	err := verifyObject(ctx, w.store, obj)

	w.mu.Lock()
	o = w.mu.shared[path]
	if o == nil || o.gen != gen {
		w.mu.Unlock()
		return obj.Size, scrubSkipped
	}
	now := w.cfg.Now()
	o.checked = now
	switch {
	case err == nil:
		o.state = objIntact
		w.mu.Unlock()
		return obj.Size, scrubIntact
	case !isDamage(err):
		w.mu.Unlock()
		if ctx.Err() == nil {
			w.log.Warn("checkpoint scrub: cannot read a shared object; trying again later", "object", path, "err", err)
		}
		return obj.Size, scrubUnreadable
	}
	w.damagedLocked(path, o, err, "scrub", 0)
	gen, local, manifest := o.gen, o.local, ManifestPath(w.cfg.Job, o.lastRef)
	w.mu.Unlock()
	if local == "" {
		w.log.Warn("checkpoint scrub: no local copy of the damaged object; the next checkpoint that holds it uploads it", "object", path)
		return obj.Size, scrubDamaged
	}
	if err := w.heal(ctx, obj, local, manifest); err != nil {
		if ctx.Err() == nil {
			w.log.Warn("checkpoint scrub: cannot re-upload the damaged object from its local copy; the next checkpoint that holds it uploads it",
				"object", path, "local", local, "err", err)
		}
		return obj.Size, scrubDamaged
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if o := w.mu.shared[path]; o != nil && o.gen == gen {
		o.state, o.checked = objIntact, w.cfg.Now()
		w.bumpLocked(o)
		w.emitLocked(ObjectEvent{Kind: ObjectHealed, Object: path, By: "scrub"})
	}
	return obj.Size, scrubHealed
}

// heal re-uploads obj from the local file, after checking that the file
// holds exactly the object's content and that the newest manifest
// referencing it is still in the store (a store that is gone or was
// emptied is not written to).
func (w *Writer) heal(ctx context.Context, obj Object, local, manifest string) error {
	if w.closed.Load() {
		return errors.New("checkpoint: writer closed")
	}
	if _, err := w.store.Stat(ctx, manifest); err != nil {
		return fmt.Errorf("manifest %s: %w", manifest, err)
	}
	f, err := os.Open(local)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if n != obj.Size || hex.EncodeToString(h.Sum(nil)) != obj.SHA256 {
		return fmt.Errorf("local copy %s does not match the object (size %d, want %d)", local, n, obj.Size)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return w.store.Put(ctx, obj.Path, f)
}

// ScrubReport is what ScrubOnce found.
type ScrubReport struct {
	// Checked is the number of objects read; Bytes their size.
	Checked int
	Bytes   int64
	// Damaged lists the objects found missing or damaged and not healed;
	// Healed those found damaged and re-uploaded from a local copy.
	Damaged []string
	Healed  []string
	// Unreadable lists the objects the store could not return.
	Unreadable []string
}

// ScrubOnce checks every shared object the writer may reuse now, without
// the rate bound and whenever it was last checked, and heals what it can,
// like the background scrub. For tests and tools.
func (w *Writer) ScrubOnce(ctx context.Context) (ScrubReport, error) {
	w.mu.Lock()
	paths := make([]string, 0, len(w.mu.shared))
	for p, o := range w.mu.shared {
		if o.refs > 0 && o.state != objDamaged {
			paths = append(paths, p)
		}
	}
	w.mu.Unlock()
	sort.Strings(paths)
	var rep ScrubReport
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		size, res := w.scrubObject(ctx, p)
		if res == scrubSkipped {
			continue
		}
		rep.Checked++
		rep.Bytes += size
		switch res {
		case scrubDamaged:
			rep.Damaged = append(rep.Damaged, p)
		case scrubHealed:
			rep.Healed = append(rep.Healed, p)
		case scrubUnreadable:
			rep.Unreadable = append(rep.Unreadable, p)
		}
	}
	return rep, nil
}

// MinGCGrace is the shortest orphan grace period `cairn checkpoints gc`
// accepts. A running job uploads a checkpoint's objects before it commits
// the manifest that references them, and the engine allows the upload up to
// its checkpoint timeout (10 minutes by default); until the manifest is
// there, those objects look like orphans. A sweep that deletes only
// unreferenced objects older than MinGCGrace cannot delete one that an
// in-flight checkpoint will reference: its checkpoint committed or was
// aborted before. The extra 5 minutes cover clock skew between the store
// (which sets the objects' times) and the host running gc.
//
// INVARIANT: above the engine's checkpoint timeout plus any clock skew.
const MinGCGrace = 15 * time.Minute

// ErrGraceTooShort is returned by CheckGCGrace.
var ErrGraceTooShort = errors.New("checkpoint: gc grace period below the safe floor")

// CheckGCGrace refuses an orphan grace period shorter than MinGCGrace.
func CheckGCGrace(grace time.Duration) error {
	if grace < MinGCGrace {
		return fmt.Errorf("%w: %v is shorter than %v: a running job uploads a checkpoint's files before it commits the manifest that references them, "+
			"and may take up to its checkpoint timeout (10m) to do so; a shorter grace could delete files that a checkpoint in flight is about to reference. "+
			"Use --grace %v or more (a job sweeps younger orphans itself)", ErrGraceTooShort, grace, MinGCGrace, MinGCGrace)
	}
	return nil
}

// UnreferencedReport is what FindUnreferenced found under a job's prefix.
type UnreferencedReport struct {
	// Objects are the objects that no checkpoint or savepoint manifest
	// references (manifests excluded), by name: uploads of checkpoints that
	// never committed, temp files, anything else written there.
	Objects []ObjectInfo
	// Corrupt lists the manifests that do not decode. What they reference
	// is unknown: objects in their folders are not listed, and a listed
	// shared object may be one of theirs.
	Corrupt []error
}

// FindUnreferenced lists every object under job's prefix that no manifest
// references. GC deletes those older than its grace period (except under
// savepoints/, which it never touches).
func FindUnreferenced(ctx context.Context, s Store, job string) (UnreferencedReport, error) {
	var rep UnreferencedReport
	if err := validJob(job); err != nil {
		return rep, fmt.Errorf("checkpoint: unreferenced: %w", err)
	}
	all, err := listAll(ctx, s, job+"/")
	if err != nil {
		return rep, fmt.Errorf("checkpoint: unreferenced %s: %w", job, err)
	}
	ms, _, broken, err := loadCheckpointsTolerant(ctx, s, job)
	if err != nil {
		return rep, fmt.Errorf("checkpoint: unreferenced %s: %w", job, err)
	}
	refs := map[string]bool{}
	var skipDirs []string
	for _, m := range ms {
		refs[ManifestPath(job, m.ID)] = true
		for _, o := range m.Objects {
			refs[o.Path] = true
		}
	}
	for _, b := range broken {
		refs[ManifestPath(job, b.id)] = true
		skipDirs = append(skipDirs, CheckpointDir(job, b.id)+"/")
		rep.Corrupt = append(rep.Corrupt, b.err)
	}
	names, err := ListSavepoints(ctx, s, job)
	if err != nil {
		return rep, fmt.Errorf("checkpoint: unreferenced %s: %w", job, err)
	}
	for _, n := range names {
		refs[SavepointManifestPath(job, n)] = true
		m, err := LoadSavepoint(ctx, s, job, n)
		if err != nil {
			if !IsCorruption(err) {
				return rep, err
			}
			skipDirs = append(skipDirs, SavepointDir(job, n)+"/")
			rep.Corrupt = append(rep.Corrupt, err)
			continue
		}
		for _, o := range m.Objects {
			refs[o.Path] = true
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
next:
	for _, o := range all {
		if refs[o.Name] {
			continue
		}
		if _, ok := leaseHolder(job, o.Name); ok {
			continue // a node's lease (lease.go), not checkpoint data
		}
		if isGraphManifest(job, o.Name) {
			continue // a graph checkpoint: PruneGraphs removes it with what it names
		}
		for _, d := range skipDirs {
			if len(o.Name) > len(d) && o.Name[:len(d)] == d {
				continue next
			}
		}
		rep.Objects = append(rep.Objects, o)
	}
	return rep, nil
}
