package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"cairn/internal/base/par"
)

// Leases: references to store objects that a node reads remotely (an online
// restore reads the SSTs of the restored checkpoint with ranged reads while
// it downloads them in the background). Retention and GC never delete an
// object that an unexpired lease lists; a lease expires so that a dead
// node's references do not pin objects forever.
//
//	<job>/leases/<holder>.json     one per node; Put again to renew
//
// Protocol for a reader: write the lease (HoldLease), then load the
// manifest of the checkpoint it reads. If the manifest is still there, the
// lease is seen by every retention round that could delete its objects:
// retention deletes the manifests first and reads the leases after.
// Renew before the lease expires (HoldLease does, every ttl/3); a holder
// that could not renew in time must assume its objects may be gone.

// LeaseFormatVersion is the lease format this package writes and reads.
const LeaseFormatVersion = 1

// DefaultLeaseTTL is the lease lifetime HoldLease uses when given none: a
// lease is renewed every third of it.
const DefaultLeaseTTL = 2 * time.Minute

// MaxLeaseTTL is the longest lease lifetime. A lease that claims more does
// not decode, and no lease is honoured longer than MaxLeaseTTL after its
// file was last written, whatever its expiry says.
const MaxLeaseTTL = time.Hour

// ErrUnsupportedLeaseVersion is returned (wrapped, by DecodeLease) for a
// lease of a format version this build cannot read.
var ErrUnsupportedLeaseVersion = errors.New("checkpoint: unsupported lease format version")

// ErrLeaseUnreadable is returned (wrapped) by GC when a lease file written
// less than MaxLeaseTTL ago does not decode (or the leases could not be
// read at all): what it protects is unknown, so no object was deleted.
var ErrLeaseUnreadable = errors.New("checkpoint: a lease cannot be read; no object deleted")

// Store layout. INVARIANT: part of the on-store format.
const (
	leasesDir   = "leases"
	leaseSuffix = ".json"
)

// Lease is one node's reference to objects of a job's store.
type Lease struct {
	// Job is the job whose objects are leased.
	Job string
	// Holder names the node holding the lease (e.g. host-pid-random); one
	// path segment of [A-Za-z0-9._-].
	Holder string
	// Checkpoint is the checkpoint the objects belong to (informational).
	Checkpoint uint64
	// Objects are the leased store paths (under <job>/).
	Objects []string
	// Expires is when the lease stops protecting its objects unless
	// renewed; at most MaxLeaseTTL after Written.
	Expires time.Time
	// Written is when the holder wrote this version of the lease.
	Written time.Time
}

// leaseJSON is the encoding of a Lease.
type leaseJSON struct {
	FormatVersion int      `json:"format_version"`
	Job           string   `json:"job"`
	Holder        string   `json:"holder"`
	Checkpoint    uint64   `json:"checkpoint"`
	Objects       []string `json:"objects"`
	Expires       string   `json:"expires"`
	Written       string   `json:"written"`
}

// LeasePath is the object holding holder's lease on job's objects.
func LeasePath(job, holder string) string {
	return job + "/" + leasesDir + "/" + holder + leaseSuffix
}

// leaseHolder returns the holder of the lease object name of job, or false
// when name is not a lease (another object, or junk under leases/ such as a
// file store's temp file, which the orphan sweep treats like any other).
func leaseHolder(job, name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, job+"/"+leasesDir+"/")
	if !ok {
		return "", false
	}
	holder, ok := strings.CutSuffix(rest, leaseSuffix)
	if !ok || validJob(holder) != nil {
		return "", false
	}
	return holder, true
}

// Validate checks the lease's fields.
func (l Lease) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("checkpoint: invalid lease %s/%s: %s", l.Job, l.Holder, fmt.Sprintf(format, args...))
	}
	if err := validJob(l.Job); err != nil {
		return bad("%v", err)
	}
	if err := validJob(l.Holder); err != nil {
		return bad("holder %q: one path segment of letters, digits, '.', '-', '_'", l.Holder)
	}
	if l.Written.IsZero() || l.Expires.IsZero() {
		return bad("no written or expires time")
	}
	if ttl := l.Expires.Sub(l.Written); ttl <= 0 || ttl > MaxLeaseTTL {
		return bad("expires %v after written (want (0, %v])", ttl, MaxLeaseTTL)
	}
	for _, o := range l.Objects {
		if err := validName(o); err != nil || !strings.HasPrefix(o, l.Job+"/") {
			return bad("object path %q", o)
		}
		if _, ok := leaseHolder(l.Job, o); ok {
			return bad("object %q is a lease", o)
		}
	}
	return nil
}

// Encode renders the lease as JSON (times in RFC 3339, UTC).
func (l Lease) Encode() ([]byte, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	objs := l.Objects
	if objs == nil {
		objs = []string{}
	}
	return json.MarshalIndent(leaseJSON{
		FormatVersion: LeaseFormatVersion,
		Job:           l.Job,
		Holder:        l.Holder,
		Checkpoint:    l.Checkpoint,
		Objects:       objs,
		Expires:       l.Expires.UTC().Format(time.RFC3339Nano),
		Written:       l.Written.UTC().Format(time.RFC3339Nano),
	}, "", "  ")
}

// DecodeLease parses and validates a lease, strictly: unknown fields and
// trailing data are errors, another format version wraps
// ErrUnsupportedLeaseVersion.
func DecodeLease(data []byte) (Lease, error) {
	var probe struct {
		FormatVersion *int `json:"format_version"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return Lease{}, fmt.Errorf("checkpoint: decode lease: %w", err)
	}
	if probe.FormatVersion == nil {
		return Lease{}, errors.New("checkpoint: decode lease: no format_version")
	}
	if *probe.FormatVersion != LeaseFormatVersion {
		return Lease{}, fmt.Errorf("%w %d (this build reads %d; use a newer cairn)", ErrUnsupportedLeaseVersion, *probe.FormatVersion, LeaseFormatVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var j leaseJSON
	if err := dec.Decode(&j); err != nil {
		return Lease{}, fmt.Errorf("checkpoint: decode lease: %w", err)
	}
	if dec.More() {
		return Lease{}, errors.New("checkpoint: decode lease: trailing data")
	}
	l := Lease{Job: j.Job, Holder: j.Holder, Checkpoint: j.Checkpoint, Objects: j.Objects}
	var err error
	if l.Expires, err = time.Parse(time.RFC3339Nano, j.Expires); err != nil {
		return Lease{}, fmt.Errorf("checkpoint: decode lease: expires: %w", err)
	}
	if l.Written, err = time.Parse(time.RFC3339Nano, j.Written); err != nil {
		return Lease{}, fmt.Errorf("checkpoint: decode lease: written: %w", err)
	}
	if err := l.Validate(); err != nil {
		return Lease{}, err
	}
	return l, nil
}

// WriteLease writes (or, when it exists, renews) l.Holder's lease.
func WriteLease(ctx context.Context, s Store, l Lease) error {
	b, err := l.Encode()
	if err != nil {
		return err
	}
	if err := s.Put(ctx, LeasePath(l.Job, l.Holder), bytes.NewReader(b)); err != nil {
		return fmt.Errorf("checkpoint: write lease %s/%s: %w", l.Job, l.Holder, err)
	}
	return nil
}

// DeleteLease deletes holder's lease on job's objects (none: no error).
func DeleteLease(ctx context.Context, s Store, job, holder string) error {
	if err := validJob(job); err != nil {
		return fmt.Errorf("checkpoint: delete lease: %w", err)
	}
	if err := validJob(holder); err != nil {
		return fmt.Errorf("checkpoint: delete lease: holder %q", holder)
	}
	if err := s.Delete(ctx, LeasePath(job, holder)); err != nil {
		return fmt.Errorf("checkpoint: delete lease %s/%s: %w", job, holder, err)
	}
	return nil
}

// leaseFile is one lease object as read from the store.
type leaseFile struct {
	info  ObjectInfo
	lease Lease
	err   error // a *CorruptionError, possibly wrapping ErrUnsupportedLeaseVersion
}

// readLeases lists and reads every lease of job. A lease deleted since the
// listing is left out; a lease that does not decode, or that names another
// job or holder than its path, is returned with err set.
func readLeases(ctx context.Context, s Store, job string) ([]leaseFile, error) {
	var files []leaseFile
	err := s.List(ctx, job+"/"+leasesDir+"/", func(o ObjectInfo) error {
		if _, ok := leaseHolder(job, o.Name); ok {
			files = append(files, leaseFile{info: o})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list leases of %s: %w", job, err)
	}
	gone := make([]bool, len(files))
	err = par.Do(ctx, len(files), 8, func(ctx context.Context, i int) error {
		f := &files[i]
		b, err := readAll(ctx, s, f.info.Name)
		if errors.Is(err, ErrNotFound) {
			gone[i] = true // released since the listing
			return nil
		}
		if err != nil {
			return err
		}
		holder, _ := leaseHolder(job, f.info.Name)
		l, err := DecodeLease(b)
		switch {
		case err != nil:
			f.err = &CorruptionError{Object: f.info.Name, Reason: err.Error()}
			if errors.Is(err, ErrUnsupportedLeaseVersion) {
				f.err = fmt.Errorf("%w (%w)", f.err, ErrUnsupportedLeaseVersion)
			}
		case l.Job != job || l.Holder != holder:
			f.err = &CorruptionError{Object: f.info.Name, Reason: fmt.Sprintf("lease names %s/%s", l.Job, l.Holder)}
		default:
			f.lease = l
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read leases of %s: %w", job, err)
	}
	out := files[:0]
	for i, f := range files {
		if !gone[i] {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].info.Name < out[j].info.Name })
	return out, nil
}

// Leases returns every lease of job that decodes, expired or not, sorted by
// holder. When some lease files do not decode, it returns the others and
// an error joining a *CorruptionError for each.
func Leases(ctx context.Context, s Store, job string) ([]Lease, error) {
	if err := validJob(job); err != nil {
		return nil, fmt.Errorf("checkpoint: leases: %w", err)
	}
	files, err := readLeases(ctx, s, job)
	if err != nil {
		return nil, err
	}
	var out []Lease
	var errs []error
	for _, f := range files {
		if f.err != nil {
			errs = append(errs, f.err)
		} else {
			out = append(out, f.lease)
		}
	}
	return out, errors.Join(errs...)
}

// leaseExpiry is when GC stops honouring l, whose file was last written at
// mod (the store's clock). The holder's Expires is honoured, and so is the
// lease's own lifetime counted from mod: a holder whose clock is behind
// GC's does not lose its objects early. Never later than MaxLeaseTTL after
// mod: a lease whose times are wrong does not pin objects for long.
func leaseExpiry(l Lease, mod time.Time) time.Time {
	if mod.IsZero() {
		mod = l.Written // a store that reports no time: trust the holder
	}
	exp := l.Expires
	if alt := mod.Add(l.Expires.Sub(l.Written)); alt.After(exp) {
		exp = alt
	}
	if limit := mod.Add(MaxLeaseTTL); exp.After(limit) {
		exp = limit
	}
	return exp
}

// leaseScan is what GC and retention need from job's leases.
type leaseScan struct {
	// objects are the objects of the unexpired leases.
	objects map[string]bool
	// expired are the lease files GC may delete: expired leases, and lease
	// files that do not decode and were written MaxLeaseTTL ago or more.
	expired []ObjectInfo
}

// scanLeases reads job's leases as of now.
//
// A lease file that does not decode (damaged, or written by a newer cairn
// in a format this build cannot read) may belong to a live node, and what
// it protects is unknown. If it was written less than MaxLeaseTTL ago, no
// lease outlives it, so it may still be live: scanLeases fails (wrapping
// ErrLeaseUnreadable), and callers then delete no object at all this round
// (manifests aside: leases protect objects, not manifests). Once older, it
// would be expired whatever it said, and is treated as an expired lease.
// Failing to read the leases at all fails the same way.
func scanLeases(ctx context.Context, s Store, job string, now time.Time) (leaseScan, error) {
	sc := leaseScan{objects: map[string]bool{}}
	files, err := readLeases(ctx, s, job)
	if err != nil {
		return sc, fmt.Errorf("%w: %w", ErrLeaseUnreadable, err)
	}
	var errs []error
	for _, f := range files {
		switch {
		case f.err != nil && now.Sub(f.info.ModTime) < MaxLeaseTTL:
			errs = append(errs, f.err)
		case f.err != nil || !now.Before(leaseExpiry(f.lease, f.info.ModTime)):
			sc.expired = append(sc.expired, f.info)
		default:
			for _, o := range f.lease.Objects {
				sc.objects[o] = true
			}
		}
	}
	if len(errs) > 0 {
		return sc, fmt.Errorf("%w: %w", ErrLeaseUnreadable, errors.Join(errs...))
	}
	return sc, nil
}

// leasedObjects returns the objects listed by job's unexpired leases at now.
// On error (see scanLeases: a young lease that does not decode, or the
// leases cannot be read) the caller must not delete any object.
func leasedObjects(ctx context.Context, s Store, job string, now time.Time) (map[string]bool, error) {
	sc, err := scanLeases(ctx, s, job, now)
	if err != nil {
		return nil, err
	}
	return sc.objects, nil
}

// LeaseHolder keeps one lease alive: it renews it every third of its TTL
// until Release.
type LeaseHolder struct {
	store Store
	ttl   time.Duration
	log   *slog.Logger

	// writeMu serializes the writes of the lease, so that the last one
	// always carries the newest object list.
	writeMu sync.Mutex
	mu      struct {
		sync.Mutex
		// lease is the lease to write; its times are those of the last
		// write.
		lease Lease
		// lapsed: a renewal came after the lease had expired.
		lapsed bool
		// released: Release has run; nothing is written any more.
		released bool
	}

	stop    context.CancelFunc
	done    chan struct{}
	release sync.Once
	relErr  error
}

// HoldLease writes l (its Written and Expires are set from the clock and
// ttl) and renews it every ttl/3 until Release. ttl <= 0 means
// DefaultLeaseTTL; more than MaxLeaseTTL is an error. It fails when the
// first write fails; a later renewal that fails is logged (log nil:
// slog.Default()) and retried at the next. ctx bounds the first write
// only: the renewals run until Release.
func HoldLease(ctx context.Context, s Store, l Lease, ttl time.Duration, log *slog.Logger) (*LeaseHolder, error) {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	if ttl > MaxLeaseTTL {
		return nil, fmt.Errorf("checkpoint: lease %s/%s: ttl %v above the maximum %v", l.Job, l.Holder, ttl, MaxLeaseTTL)
	}
	if log == nil {
		log = slog.Default()
	}
	h := &LeaseHolder{store: s, ttl: ttl, log: log.With("job", l.Job, "lease_holder", l.Holder), done: make(chan struct{})}
	l.Objects = append([]string(nil), l.Objects...)
	l.Written, l.Expires = time.Time{}, time.Time{}
	h.mu.lease = l
	if err := h.write(ctx); err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	h.stop = stop
	go h.renewLoop(rctx)
	return h, nil
}

// write writes the lease with a fresh expiry.
func (h *LeaseHolder) write(ctx context.Context) error {
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	now := time.Now()
	h.mu.Lock()
	l := h.mu.lease
	l.Objects = append([]string(nil), l.Objects...)
	released := h.mu.released
	h.mu.Unlock()
	if released {
		return fmt.Errorf("checkpoint: lease %s/%s: released", l.Job, l.Holder)
	}
	prev := l.Expires
	l.Written, l.Expires = now, now.Add(h.ttl)
	if err := WriteLease(ctx, h.store, l); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.lease.Written, h.mu.lease.Expires = l.Written, l.Expires
	if !prev.IsZero() && now.After(prev) && !h.mu.lapsed {
		h.mu.lapsed = true
		h.log.Error("lease renewed after it had expired: retention may have deleted leased objects", "expired", prev)
	}
	return nil
}

func (h *LeaseHolder) renewLoop(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(h.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		wctx, cancel := context.WithTimeout(ctx, h.ttl/3)
		err := h.write(wctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			h.log.Warn("lease renewal failed; retrying", "err", err)
		}
	}
}

// Update replaces the leased objects and writes the lease at once. When
// the write fails the new list is still kept and written at the next
// renewal; until then the store holds the previous list.
func (h *LeaseHolder) Update(ctx context.Context, objects []string) error {
	h.mu.Lock()
	h.mu.lease.Objects = append([]string(nil), objects...)
	h.mu.Unlock()
	return h.write(ctx)
}

// Lease returns the lease: the objects as last set, the times of the last
// successful write.
func (h *LeaseHolder) Lease() Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.mu.lease
	l.Objects = append([]string(nil), l.Objects...)
	return l
}

// Lapsed reports whether a renewal came after the lease had expired: GC
// may then have deleted objects it listed.
func (h *LeaseHolder) Lapsed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.lapsed
}

// Release stops the renewals and deletes the lease. Later calls return the
// first call's result.
func (h *LeaseHolder) Release(ctx context.Context) error {
	h.release.Do(func() {
		h.stop()
		<-h.done
		h.writeMu.Lock() // an Update in flight writes no lease after this
		defer h.writeMu.Unlock()
		h.mu.Lock()
		h.mu.released = true
		job, holder := h.mu.lease.Job, h.mu.lease.Holder
		h.mu.Unlock()
		h.relErr = DeleteLease(ctx, h.store, job, holder)
	})
	return h.relErr
}

// idsOf lists the ids of ms, for logs.
func idsOf(ms []*Manifest) []uint64 {
	ids := make([]uint64, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}
