package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"cairn/internal/base/failpoint"
	"cairn/internal/base/par"
)

// loadCheckpoints reads every committed checkpoint manifest of job, sorted by
// id, and the largest checkpoint id seen in any object name (committed or
// not), so a new writer never reuses the folder of an uncommitted attempt.
func loadCheckpoints(ctx context.Context, s Store, job string) ([]*Manifest, uint64, error) {
	ms, maxID, broken, err := loadCheckpointsTolerant(ctx, s, job)
	if err != nil {
		return nil, 0, err
	}
	if len(broken) > 0 {
		return nil, 0, broken[0].err
	}
	return ms, maxID, nil
}

// LoadIntact returns the committed checkpoints of job whose manifests
// decode, oldest first, and the errors of those that do not.
func LoadIntact(ctx context.Context, s Store, job string) ([]*Manifest, []error, error) {
	ms, _, broken, err := loadCheckpointsTolerant(ctx, s, job)
	var errs []error
	for _, b := range broken {
		errs = append(errs, b.err)
	}
	return ms, errs, err
}

// brokenManifest is a checkpoint manifest that does not decode.
type brokenManifest struct {
	id  uint64
	err error // a *CorruptionError
}

// loadCheckpointsTolerant is loadCheckpoints that skips corrupt manifests
// and returns them separately, by id.
func loadCheckpointsTolerant(ctx context.Context, s Store, job string) ([]*Manifest, uint64, []brokenManifest, error) {
	var names []string
	var ids []uint64
	var maxID uint64
	err := s.List(ctx, job+"/"+chkPrefix, func(o ObjectInfo) error {
		id, rest, ok := parseCheckpointDir(job, o.Name)
		if !ok {
			return nil
		}
		maxID = max(maxID, id)
		if rest == manifestName {
			names = append(names, o.Name)
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return nil, 0, nil, err
	}
	loaded := make([]*Manifest, len(names))
	errs := make([]error, len(names))
	// Errors are collected per manifest (a corrupt one must not stop the
	// others), so the parallel run itself never fails.
	_ = par.Do(ctx, len(names), 8, func(ctx context.Context, i int) error {
		b, err := readAll(ctx, s, names[i])
		if err == nil {
			loaded[i], err = DecodeObject(names[i], b)
		}
		errs[i] = err
		return nil
	})
	var ms []*Manifest
	var broken []brokenManifest
	for i, err := range errs {
		switch {
		case err == nil:
			ms = append(ms, loaded[i])
		case IsCorruption(err):
			broken = append(broken, brokenManifest{id: ids[i], err: err})
		default:
			return nil, 0, nil, err
		}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	sort.Slice(broken, func(i, j int) bool { return broken[i].id < broken[j].id })
	return ms, maxID, broken, nil
}

// loadManifests reads the manifests listed as names. One deleted since the
// listing (retention by the job's writer, or another gc) is left out: it
// is no longer a checkpoint, and what it shares with a newer one is
// referenced by that one.
func loadManifests(ctx context.Context, s Store, names []string) ([]*Manifest, error) {
	ms := make([]*Manifest, len(names))
	err := par.Do(ctx, len(names), 8, func(ctx context.Context, i int) error {
		b, err := readAll(ctx, s, names[i])
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		m, err := DecodeObject(names[i], b)
		if err != nil {
			return err
		}
		ms[i] = m
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := ms[:0]
	for _, m := range ms {
		if m != nil {
			out = append(out, m)
		}
	}
	return out, nil
}

// Load reads and validates the manifest of checkpoint id of job. A manifest
// naming another job or checkpoint is a *CorruptionError; naming another
// job, it also wraps ErrWrongJob.
func Load(ctx context.Context, s Store, job string, id uint64) (*Manifest, error) {
	b, err := readAll(ctx, s, ManifestPath(job, id))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load %s/%d: %w", job, id, err)
	}
	m, err := DecodeObject(ManifestPath(job, id), b)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load %s/%d: %w", job, id, err)
	}
	if m.Job != job || m.ID != id {
		c := &CorruptionError{Object: ManifestPath(job, id), Reason: fmt.Sprintf("manifest names %s/%d", m.Job, m.ID)}
		if m.Job != job {
			return nil, fmt.Errorf("%w (%w)", c, ErrWrongJob)
		}
		return nil, c
	}
	return m, nil
}

// ManifestIDs lists the ids of job's committed checkpoints (those with a
// manifest), without reading the manifests.
func ManifestIDs(ctx context.Context, s Store, job string) ([]uint64, error) {
	var ids []uint64
	err := s.List(ctx, job+"/"+chkPrefix, func(o ObjectInfo) error {
		if id, rest, ok := parseCheckpointDir(job, o.Name); ok && rest == manifestName {
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list %s: %w", job, err)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// Latest returns the newest committed checkpoint of job, or ErrNotFound.
func Latest(ctx context.Context, s Store, job string) (*Manifest, error) {
	ms, _, err := loadCheckpoints(ctx, s, job)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("checkpoint: job %s: no committed checkpoint: %w", job, ErrNotFound)
	}
	return ms[len(ms)-1], nil
}

// ListEntry is one committed checkpoint as `cairn checkpoints ls` shows it.
type ListEntry struct {
	ID uint64
	// Corrupt says why the checkpoint's manifest does not decode ("" for an
	// intact one); the other fields are then empty.
	Corrupt     string `json:",omitempty"`
	Mode        Mode
	Time        time.Time
	SourceSeq   uint64
	Slots       int
	KeyGroups   int
	ChainLength int
	Figures     Figures
	// RetainedExclusive is the bytes of objects only this checkpoint
	// references (what deleting it frees); RetainedShared the bytes of the
	// objects it shares with other checkpoints.
	RetainedExclusive int64
	RetainedShared    int64
}

// List describes the committed checkpoints of job, oldest first. A
// checkpoint whose manifest is corrupt is listed with Corrupt set, between
// the others: one bad manifest does not hide the intact ones. Retained
// sizes count the intact manifests only.
func List(ctx context.Context, s Store, job string) ([]ListEntry, error) {
	ms, _, broken, err := loadCheckpointsTolerant(ctx, s, job)
	if err != nil {
		return nil, err
	}
	refs := map[string]int{}
	for _, m := range ms {
		for p := range objectSizes(m) {
			refs[p]++
		}
	}
	out := make([]ListEntry, 0, len(ms))
	for _, m := range ms {
		e := ListEntry{ID: m.ID, Mode: m.Mode, Time: m.Time, SourceSeq: m.SourceSeq, Slots: len(m.Slots), KeyGroups: m.KeyGroups, ChainLength: m.ChainLength, Figures: m.Figures}
		for p, size := range objectSizes(m) {
			if refs[p] == 1 {
				e.RetainedExclusive += size
			} else {
				e.RetainedShared += size
			}
		}
		out = append(out, e)
	}
	for _, b := range broken {
		out = append(out, ListEntry{ID: b.id, Corrupt: b.err.Error()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// objectSizes maps each distinct object path of m to its size.
func objectSizes(m *Manifest) map[string]int64 {
	out := make(map[string]int64, len(m.Objects))
	for _, o := range m.Objects {
		out[o.Path] = o.Size
	}
	return out
}

// Problem is one broken object found by Verify.
type Problem struct {
	// Object is the store path.
	Object string
	// Err says what is wrong (ErrNotFound or a *CorruptionError, or the
	// read error).
	Err error
}

func (p Problem) String() string { return fmt.Sprintf("%s: %v", p.Object, p.Err) }

// Verify checks that every object checkpoint id of job references exists
// with the size and SHA-256 the manifest records. It returns the broken
// objects; the error is for failures to check at all (manifest unreadable).
func Verify(ctx context.Context, s Store, job string, id uint64) ([]Problem, error) {
	m, err := Load(ctx, s, job, id)
	if err != nil {
		var c *CorruptionError
		if errors.As(err, &c) {
			return []Problem{{Object: c.Object, Err: err}}, nil
		}
		return nil, err
	}
	probs := VerifyManifest(ctx, s, m, 4)
	// An object in the checkpoint's folder that the manifest does not list
	// is not part of the checkpoint (restore never reads it), but its
	// presence means something wrote where it should not: report it.
	listed := map[string]bool{ManifestPath(job, id): true}
	for _, o := range m.Objects {
		listed[o.Path] = true
	}
	err = s.List(ctx, CheckpointDir(job, id)+"/", func(o ObjectInfo) error {
		if !listed[o.Name] {
			probs = append(probs, Problem{Object: o.Name, Err: ErrUnexpectedObject})
		}
		return nil
	})
	if err != nil {
		return probs, err
	}
	return probs, nil
}

// ErrUnexpectedObject: an object in a checkpoint's folder that its manifest
// does not list.
var ErrUnexpectedObject = errors.New("checkpoint: object not listed in the manifest")

// VerifyManifest checks m's objects with at most concurrency parallel reads.
func VerifyManifest(ctx context.Context, s Store, m *Manifest, concurrency int) []Problem {
	objs := map[string]Object{}
	for _, o := range m.Objects {
		objs[o.Path] = o
	}
	paths := make([]string, 0, len(objs))
	for p := range objs {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	probs := make([]error, len(paths))
	_ = par.Do(ctx, len(paths), concurrency, func(ctx context.Context, i int) error {
		probs[i] = verifyObject(ctx, s, objs[paths[i]])
		return nil
	})
	var out []Problem
	for i, err := range probs {
		if err != nil {
			out = append(out, Problem{Object: paths[i], Err: err})
		}
	}
	return out
}

func verifyObject(ctx context.Context, s Store, o Object) error {
	rc, err := s.Get(ctx, o.Path)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := sha256.New()
	// One byte past the recorded size tells a longer object apart without
	// reading all of it.
	n, err := io.Copy(h, io.LimitReader(rc, o.Size+1))
	if err != nil {
		return err
	}
	if n > o.Size {
		return &CorruptionError{Object: o.Path, Reason: fmt.Sprintf("longer than the %d bytes the manifest says", o.Size)}
	}
	if n != o.Size {
		return &CorruptionError{Object: o.Path, Reason: fmt.Sprintf("size %d, manifest says %d", n, o.Size)}
	}
	if hex.EncodeToString(h.Sum(nil)) != o.SHA256 {
		return &CorruptionError{Object: o.Path, Reason: "sha256 mismatch"}
	}
	return nil
}

// GCReport says what GC deleted (or, dry run, would delete).
type GCReport struct {
	// Dropped lists the checkpoints removed by retention.
	Dropped []uint64
	// Kept lists the committed checkpoints that remain.
	Kept []uint64
	// Deleted lists the objects deleted, manifests included.
	Deleted []ObjectInfo
	// BytesFreed is their total size.
	BytesFreed int64
	// DryRun is true when nothing was actually deleted.
	DryRun bool
	// KeptByLease counts the objects that would have been deleted but
	// that an unexpired lease lists: a later gc deletes them once the
	// lease is released or expired.
	KeptByLease int
	// LeasesExpired counts the expired lease files deleted (dry run: to
	// delete); they are listed in Deleted too.
	LeasesExpired int

	remaining []*Manifest
}

// GC applies retention and the orphan sweep to job: it keeps the newest
// retain committed checkpoints (retain <= 0: all), deleting each older one
// manifest first, then its private files, then the shared objects no
// remaining manifest or savepoint references; then it deletes every other
// object under the job that no manifest references and that is older than
// grace. Savepoints are never touched. Every step is crash-safe: the
// manifests are the only registry, and a manifest is deleted before anything
// it references.
//
// GC itself accepts any grace: with no writer running (a stopped job, a
// test) 0 sweeps everything unreferenced. Beside a running job the grace
// must be at least MinGCGrace (CheckGCGrace; `cairn checkpoints gc`
// refuses less): a checkpoint's files are uploaded before the manifest that
// references them. Retention beside a running job is safe with a retain at
// least the job's; the job's own writer applies it anyway.
//
// Leases (lease.go): no object that an unexpired lease lists is deleted,
// whether a dropped checkpoint's or an orphan; expired lease files are
// deleted. When a lease written less than MaxLeaseTTL ago cannot be read,
// GC drops the manifests retention drops but deletes no object, and
// returns an error wrapping ErrLeaseUnreadable.
func GC(ctx context.Context, s Store, job string, retain int, grace time.Duration, dryRun bool) (GCReport, error) {
	return gcAt(ctx, s, job, retain, grace, time.Now(), dryRun)
}

// GCBeforeDrop is GC that calls beforeDrop with the ids of the checkpoints
// retention drops (oldest first) before it deletes their manifests, as
// Writer.SetBeforeDrop does; its error stops GC before anything is deleted.
func GCBeforeDrop(ctx context.Context, s Store, job string, retain int, grace time.Duration, dryRun bool, beforeDrop func(context.Context, []uint64) error) (GCReport, error) {
	return gcWith(ctx, s, job, retain, grace, time.Now(), dryRun, beforeDrop)
}

func gcAt(ctx context.Context, s Store, job string, retain int, grace time.Duration, now time.Time, dryRun bool) (GCReport, error) {
	return gcWith(ctx, s, job, retain, grace, now, dryRun, nil)
}

// gcWith is GC at now; beforeDrop, when not nil, is called with the ids
// retention drops before their manifests are deleted (Writer.SetBeforeDrop),
// and its error stops the round before anything is deleted.
func gcWith(ctx context.Context, s Store, job string, retain int, grace time.Duration, now time.Time, dryRun bool, beforeDrop func(context.Context, []uint64) error) (GCReport, error) {
	rep := GCReport{DryRun: dryRun}
	if err := validJob(job); err != nil {
		return rep, fmt.Errorf("checkpoint: gc: %w", err)
	}
	all, err := listAll(ctx, s, job+"/")
	if err != nil {
		return rep, fmt.Errorf("checkpoint: gc %s: %w", job, err)
	}
	var chkNames, spNames []string
	for _, o := range all {
		if !isManifest(o.Name) {
			continue
		}
		if _, rest, ok := parseCheckpointDir(job, o.Name); ok && rest == manifestName {
			chkNames = append(chkNames, o.Name)
		} else if isSavepoint(job, o.Name) {
			spNames = append(spNames, o.Name)
		}
	}
	// INVARIANT: an unreadable manifest stops GC; deleting without knowing
	// what it references could break a committed checkpoint.
	chks, err := loadManifests(ctx, s, chkNames)
	if err != nil {
		return rep, fmt.Errorf("checkpoint: gc %s: %w", job, err)
	}
	sps, err := loadManifests(ctx, s, spNames)
	if err != nil {
		return rep, fmt.Errorf("checkpoint: gc %s: %w", job, err)
	}
	sort.Slice(chks, func(i, j int) bool { return chks[i].ID < chks[j].ID })
	var dropped []*Manifest
	if retain > 0 && len(chks) > retain {
		dropped, chks = chks[:len(chks)-retain], chks[len(chks)-retain:]
	}
	rep.remaining = chks
	refs := map[string]bool{}
	for _, m := range append(append([]*Manifest(nil), chks...), sps...) {
		for _, o := range m.Objects {
			refs[o.Path] = true
		}
		rep.Kept = append(rep.Kept, m.ID)
	}
	rep.Kept = rep.Kept[:len(chks)]
	sizes := map[string]ObjectInfo{}
	for _, o := range all {
		if _, ok := leaseHolder(job, o.Name); ok {
			continue // not checkpoint data: handled with the leases below
		}
		sizes[o.Name] = o
	}
	del := func(name string) error {
		o, ok := sizes[name]
		if !ok {
			return nil // already gone
		}
		if !dryRun {
			if err := s.Delete(ctx, name); err != nil {
				return err
			}
		}
		delete(sizes, name)
		rep.Deleted = append(rep.Deleted, o)
		rep.BytesFreed += o.Size
		return nil
	}
	// Retention: what names a dropped checkpoint first, then its manifest,
	// then what only it referenced.
	if beforeDrop != nil && len(dropped) > 0 && !dryRun {
		if err := beforeDrop(ctx, idsOf(dropped)); err != nil {
			return rep, fmt.Errorf("checkpoint: gc %s: checkpoints %v kept: what names them was not removed first: %w", job, idsOf(dropped), err)
		}
	}
	for _, m := range dropped {
		if err := del(ManifestPath(job, m.ID)); err != nil {
			return rep, fmt.Errorf("checkpoint: gc %s: drop %d: %w", job, m.ID, err)
		}
		rep.Dropped = append(rep.Dropped, m.ID)
	}
	if len(dropped) > 0 && !dryRun {
		failpoint.Hit(failpoint.GCAfterManifestDelete)
	}
	// INVARIANT: the leases are read after the manifests are deleted and
	// before any object is. A node writes its lease, then checks that the
	// manifest of the checkpoint it reads still exists: if it did, this
	// read sees the lease.
	leases, err := scanLeases(ctx, s, job, now)
	if err != nil {
		return rep, fmt.Errorf("checkpoint: gc %s: %w", job, err)
	}
	keptByLease := map[string]bool{}
	leased := func(name string) bool {
		if !leases.objects[name] {
			return false
		}
		if !keptByLease[name] {
			keptByLease[name] = true
			rep.KeptByLease++
		}
		return true
	}
	for _, m := range dropped {
		for _, o := range m.Objects {
			if !refs[o.Path] && !leased(o.Path) {
				if err := del(o.Path); err != nil {
					return rep, fmt.Errorf("checkpoint: gc %s: drop %d: %w", job, m.ID, err)
				}
			}
		}
	}
	// Orphan sweep.
	cutoff := now.Add(-grace)
	names := make([]string, 0, len(sizes))
	for n := range sizes {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, n := range names {
		o := sizes[n]
		if refs[n] || isSavepoint(job, n) || isGraphManifest(job, n) || o.ModTime.After(cutoff) {
			continue
		}
		if _, rest, ok := parseCheckpointDir(job, n); ok && rest == manifestName {
			continue // committed and retained
		}
		if leased(n) {
			continue
		}
		if err := del(n); err != nil {
			errs = append(errs, err)
		}
	}
	// An expired lease protects nothing; its holder, if alive, renewed too
	// late (LeaseHolder.Lapsed) and must not trust its objects any more.
	for _, o := range leases.expired {
		if !dryRun {
			if err := s.Delete(ctx, o.Name); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		rep.LeasesExpired++
		rep.Deleted = append(rep.Deleted, o)
		rep.BytesFreed += o.Size
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("checkpoint: gc %s: sweep: %w", job, err)
	}
	return rep, nil
}
