package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func leaseFileStore(t *testing.T) Store {
	t.Helper()
	s, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func leasePut(t *testing.T, s Store, name, data string) {
	t.Helper()
	if err := s.Put(context.Background(), name, strings.NewReader(data)); err != nil {
		t.Fatal(err)
	}
}

func leaseExists(t *testing.T, s Store, name string) bool {
	t.Helper()
	_, err := s.Stat(context.Background(), name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func leaseRead(t *testing.T, s Store, job, holder string) Lease {
	t.Helper()
	b, err := readAll(context.Background(), s, LeasePath(job, holder))
	if err != nil {
		t.Fatal(err)
	}
	l, err := DecodeLease(b)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// leaseWaitFor polls cond for at most 3 s.
func leaseWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func sampleLease(now time.Time, holder string, objs ...string) Lease {
	return Lease{Job: testJob, Holder: holder, Checkpoint: 7, Objects: objs, Written: now, Expires: now.Add(time.Minute)}
}

func TestLeaseEncodeDecode(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("x", 3600))
	l := sampleLease(now, "host-42-ab12", testJob+"/shared/ab/abcd.sst", testJob+"/chk-00000000000000000007/slot-0/MANIFEST-000001")
	b, err := l.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"format_version": 1`, `"holder": "host-42-ab12"`, `"checkpoint": 7`, `"expires": "2026-03-01T11:01:00.123456789Z"`, `"written": "2026-03-01T11:00:00.123456789Z"`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("encoding lacks %s:\n%s", want, b)
		}
	}
	got, err := DecodeLease(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Job != l.Job || got.Holder != l.Holder || got.Checkpoint != 7 || len(got.Objects) != 2 || got.Objects[1] != l.Objects[1] ||
		!got.Expires.Equal(l.Expires) || !got.Written.Equal(l.Written) {
		t.Fatalf("round trip: %+v, want %+v", got, l)
	}
	if LeasePath(testJob, "h1") != testJob+"/leases/h1.json" {
		t.Fatalf("path %s", LeasePath(testJob, "h1"))
	}

	// Strict decoding.
	for name, data := range map[string]string{
		"unknown field": strings.Replace(string(b), `"job"`, `"extra": 1, "job"`, 1),
		"trailing":      string(b) + "{}",
		"no version":    strings.Replace(string(b), `"format_version": 1,`, "", 1),
		"bad time":      strings.Replace(string(b), "2026-03-01T11:01", "tomorrow", 1),
		"truncated":     string(b[:len(b)/2]),
	} {
		if _, err := DecodeLease([]byte(data)); err == nil {
			t.Errorf("%s: decoded", name)
		} else if errors.Is(err, ErrUnsupportedLeaseVersion) {
			t.Errorf("%s: %v is not a version error", name, err)
		}
	}
	v2 := strings.Replace(string(b), `"format_version": 1`, `"format_version": 2`, 1)
	if _, err := DecodeLease([]byte(v2)); !errors.Is(err, ErrUnsupportedLeaseVersion) {
		t.Errorf("version 2: %v", err)
	}

	// Validation, on encode (and so on decode).
	for name, f := range map[string]func(*Lease){
		"holder with slash": func(l *Lease) { l.Holder = "a/b" },
		"holder dotdot":     func(l *Lease) { l.Holder = ".." },
		"bad job":           func(l *Lease) { l.Job = "" },
		"other job object":  func(l *Lease) { l.Objects = []string{"job2/shared/ab/x.sst"} },
		"unclean object":    func(l *Lease) { l.Objects = []string{testJob + "/../x"} },
		"lease as object":   func(l *Lease) { l.Objects = []string{LeasePath(testJob, "other")} },
		"expires first":     func(l *Lease) { l.Expires = l.Written.Add(-time.Second) },
		"ttl too long":      func(l *Lease) { l.Expires = l.Written.Add(MaxLeaseTTL + time.Second) },
		"no written":        func(l *Lease) { l.Written = time.Time{} },
	} {
		bad := l
		f(&bad)
		if _, err := bad.Encode(); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// TestLeaseExpiry: a holder's lease lives until its Expires, or its
// lifetime counted from the store's write time if later (a holder clock
// behind), never more than MaxLeaseTTL after the write.
func TestLeaseExpiry(t *testing.T) {
	mod := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	behind := Lease{Written: mod.Add(-90 * time.Minute), Expires: mod.Add(-88 * time.Minute)}
	if got := leaseExpiry(behind, mod); !got.Equal(mod.Add(2 * time.Minute)) {
		t.Errorf("clock behind: %v", got)
	}
	ahead := Lease{Written: mod.Add(10 * time.Minute), Expires: mod.Add(12 * time.Minute)}
	if got := leaseExpiry(ahead, mod); !got.Equal(ahead.Expires) {
		t.Errorf("clock ahead: %v", got)
	}
	far := Lease{Written: mod.Add(100 * time.Hour), Expires: mod.Add(100*time.Hour + time.Minute)}
	if got := leaseExpiry(far, mod); !got.Equal(mod.Add(MaxLeaseTTL)) {
		t.Errorf("far future: %v", got)
	}
}

// TestLeaseNotCheckpointData: the lease folder is invisible to every
// listing of checkpoints, and the orphan sweep keeps a live lease file (it
// deletes other junk under leases/ like any orphan).
func TestLeaseNotCheckpointData(t *testing.T) {
	ctx := context.Background()
	s := leaseFileStore(t)
	now := time.Now()
	if err := WriteLease(ctx, s, sampleLease(now, "n1")); err != nil {
		t.Fatal(err)
	}
	leasePut(t, s, testJob+"/leases/.tmp-n2.json-0123", "junk")
	if ids, err := ManifestIDs(ctx, s, testJob); err != nil || len(ids) != 0 {
		t.Fatalf("manifest ids %v %v", ids, err)
	}
	if ls, err := List(ctx, s, testJob); err != nil || len(ls) != 0 {
		t.Fatalf("list %v %v", ls, err)
	}
	if ms, errs, err := LoadIntact(ctx, s, testJob); err != nil || len(ms)+len(errs) != 0 {
		t.Fatalf("load intact %v %v %v", ms, errs, err)
	}
	rep, err := gcAt(ctx, s, testJob, 1, 0, now.Add(time.Second), false)
	if err != nil {
		t.Fatal(err)
	}
	if !leaseExists(t, s, LeasePath(testJob, "n1")) {
		t.Fatal("the orphan sweep deleted a live lease")
	}
	if leaseExists(t, s, testJob+"/leases/.tmp-n2.json-0123") || len(rep.Deleted) != 1 || rep.LeasesExpired != 0 {
		t.Fatalf("junk under leases/ not swept: %+v", rep)
	}
	ls, err := Leases(ctx, s, testJob)
	if err != nil || len(ls) != 1 || ls[0].Holder != "n1" {
		t.Fatalf("leases %+v %v", ls, err)
	}
}

// TestLeaseKeepsOrphan: the orphan sweep keeps an object a live lease
// lists, and deletes it once the lease is released.
func TestLeaseKeepsOrphan(t *testing.T) {
	ctx := context.Background()
	s := leaseFileStore(t)
	x, y := testJob+"/shared/aa/x.sst", testJob+"/chk-00000000000000000009/slot-0/OPTIONS-000003"
	leasePut(t, s, x, "xx")
	leasePut(t, s, y, "yy")
	now := time.Now()
	if err := WriteLease(ctx, s, sampleLease(now, "n1", x)); err != nil {
		t.Fatal(err)
	}
	rep, err := gcAt(ctx, s, testJob, 1, 0, now.Add(time.Second), false)
	if err != nil {
		t.Fatal(err)
	}
	if !leaseExists(t, s, x) || leaseExists(t, s, y) || rep.KeptByLease != 1 || len(rep.Deleted) != 1 {
		t.Fatalf("leased orphan x kept=%v, y kept=%v, %+v", leaseExists(t, s, x), leaseExists(t, s, y), rep)
	}
	if err := DeleteLease(ctx, s, testJob, "n1"); err != nil {
		t.Fatal(err)
	}
	rep, err = gcAt(ctx, s, testJob, 1, 0, now.Add(time.Second), false)
	if err != nil {
		t.Fatal(err)
	}
	if leaseExists(t, s, x) || rep.KeptByLease != 0 {
		t.Fatalf("released orphan kept: %+v", rep)
	}
}

// TestLeaseExpiredDoesNotProtect: an expired lease protects nothing and gc
// deletes its file (a dry run only reports it); a live one beside it still
// protects.
func TestLeaseExpiredDoesNotProtect(t *testing.T) {
	ctx := context.Background()
	s := leaseFileStore(t)
	a, b := testJob+"/shared/aa/a.sst", testJob+"/shared/bb/b.sst"
	leasePut(t, s, a, "a")
	leasePut(t, s, b, "b")
	now := time.Now()
	if err := WriteLease(ctx, s, sampleLease(now, "dead", a)); err != nil { // expires in 1 min
		t.Fatal(err)
	}
	live := sampleLease(now, "live", b)
	live.Expires = now.Add(MaxLeaseTTL)
	if err := WriteLease(ctx, s, live); err != nil {
		t.Fatal(err)
	}
	later := now.Add(10 * time.Minute)
	rep, err := gcAt(ctx, s, testJob, 1, 0, later, true)
	if err != nil {
		t.Fatal(err)
	}
	if rep.LeasesExpired != 1 || rep.KeptByLease != 1 || len(rep.Deleted) != 2 || !leaseExists(t, s, a) || !leaseExists(t, s, LeasePath(testJob, "dead")) {
		t.Fatalf("dry run: %+v", rep)
	}
	rep, err = gcAt(ctx, s, testJob, 1, 0, later, false)
	if err != nil {
		t.Fatal(err)
	}
	if rep.LeasesExpired != 1 || rep.KeptByLease != 1 {
		t.Fatalf("gc: %+v", rep)
	}
	if leaseExists(t, s, a) || leaseExists(t, s, LeasePath(testJob, "dead")) {
		t.Fatal("expired lease protected its object, or its file was kept")
	}
	if !leaseExists(t, s, b) || !leaseExists(t, s, LeasePath(testJob, "live")) {
		t.Fatal("live lease not honoured")
	}
}

// TestLeaseCorruptYoungBlocksDeletes: a lease file that does not decode
// (damaged, or a newer format) and was written less than MaxLeaseTTL ago
// stops every object deletion; once older it counts as expired.
func TestLeaseCorruptYoungBlocksDeletes(t *testing.T) {
	ctx := context.Background()
	s := leaseFileStore(t)
	a := testJob + "/shared/aa/a.sst"
	leasePut(t, s, a, "a")
	now := time.Now()
	good, err := sampleLease(now, "v2").Encode()
	if err != nil {
		t.Fatal(err)
	}
	leasePut(t, s, LeasePath(testJob, "v2"), strings.Replace(string(good), `"format_version": 1`, `"format_version": 2`, 1))
	leasePut(t, s, LeasePath(testJob, "torn"), `{"format_version":1,"job":"job1","hol`)
	_, err = gcAt(ctx, s, testJob, 1, 0, now.Add(time.Second), false)
	if !errors.Is(err, ErrLeaseUnreadable) || !errors.Is(err, ErrUnsupportedLeaseVersion) || !IsCorruption(err) {
		t.Fatalf("gc with unreadable young leases: %v", err)
	}
	if !leaseExists(t, s, a) {
		t.Fatal("orphan deleted despite an unreadable young lease")
	}
	if ls, err := Leases(ctx, s, testJob); len(ls) != 0 || !IsCorruption(err) {
		t.Fatalf("leases: %v %v", ls, err)
	}
	rep, err := gcAt(ctx, s, testJob, 1, 0, now.Add(MaxLeaseTTL+time.Minute), false)
	if err != nil {
		t.Fatal(err)
	}
	if leaseExists(t, s, a) || rep.LeasesExpired != 2 || leaseExists(t, s, LeasePath(testJob, "torn")) {
		t.Fatalf("old unreadable leases: %+v", rep)
	}
}

// leaseCheckpoints commits an incremental checkpoint then a full one with a
// Writer (Retain 1 unless retain is set); the second commit drops the
// first, whose SSTs no one else references. before runs between the two
// commits with the first manifest.
func leaseCheckpoints(t *testing.T, s Store, retain int, before func(m1 *Manifest)) (*Writer, *Manifest) {
	t.Helper()
	ctx := context.Background()
	dbs := openSlots(t, 16, 1)
	w, err := NewWriter(ctx, s, WriterConfig{Job: testJob, KeyGroups: 16, Slots: 1, Retain: retain, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(ctx) })
	write(t, dbs, 16, 0, 2000, 0)
	m1, err := w.Commit(ctx, w.NextID(), Meta{SourceSeq: 1}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	before(m1)
	write(t, dbs, 16, 0, 100, 1)
	if _, err := w.Commit(ctx, w.NextID(), Meta{SourceSeq: 2, Mode: ModeFull}, snapshot(t, dbs)); err != nil {
		t.Fatal(err)
	}
	return w, m1
}

// leaseVictims picks a shared SST and a private file of m.
func leaseVictims(t *testing.T, m *Manifest) (sst, private string) {
	t.Helper()
	for _, o := range m.Objects {
		switch {
		case o.Kind == KindSST && sst == "":
			sst = o.Path
		case o.Kind != KindSST && private == "":
			private = o.Path
		}
	}
	if sst == "" || private == "" {
		t.Fatalf("checkpoint %d has no SST or no private file: %+v", m.ID, m.Objects)
	}
	return sst, private
}

// TestLeaseRetention: the writer's retention and gc's drop a checkpoint's
// manifest but keep the shared SST and the private file a lease lists, and
// delete the rest; gc deletes the kept ones after the lease is released.
// An unreadable young lease makes retention keep every object.
func TestLeaseRetention(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, s Store, m1 *Manifest, keep map[string]bool) {
		t.Helper()
		if leaseExists(t, s, ManifestPath(testJob, 1)) {
			t.Fatal("checkpoint 1 not dropped")
		}
		for _, o := range m1.Objects {
			if got := leaseExists(t, s, o.Path); got != keep[o.Path] {
				t.Errorf("%s (%s): present %v, want %v", o.Path, o.Kind, got, keep[o.Path])
			}
		}
	}
	all := func(m *Manifest) map[string]bool {
		out := map[string]bool{}
		for _, o := range m.Objects {
			out[o.Path] = true
		}
		return out
	}
	for _, by := range []string{"writer", "gc"} {
		t.Run(by, func(t *testing.T) {
			s := leaseFileStore(t)
			retain := 1
			if by == "gc" {
				retain = 5 // the writer keeps both; gc drops
			}
			var sst, private string
			_, m1 := leaseCheckpoints(t, s, retain, func(m1 *Manifest) {
				sst, private = leaseVictims(t, m1)
				if err := WriteLease(ctx, s, sampleLease(time.Now(), "restorer", sst, private)); err != nil {
					t.Fatal(err)
				}
			})
			if by == "gc" {
				rep, err := GC(ctx, s, testJob, 1, time.Hour, false)
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Dropped) != 1 || rep.KeptByLease != 2 {
					t.Fatalf("gc: %+v", rep)
				}
			}
			check(t, s, m1, map[string]bool{sst: true, private: true})
			if err := DeleteLease(ctx, s, testJob, "restorer"); err != nil {
				t.Fatal(err)
			}
			rep, err := GC(ctx, s, testJob, 1, 0, false)
			if err != nil {
				t.Fatal(err)
			}
			if rep.KeptByLease != 0 {
				t.Fatalf("gc after release: %+v", rep)
			}
			check(t, s, m1, nil)
		})
	}
	t.Run("unreadable lease", func(t *testing.T) {
		s := leaseFileStore(t)
		_, m1 := leaseCheckpoints(t, s, 1, func(*Manifest) {
			leasePut(t, s, LeasePath(testJob, "torn"), "{")
		})
		check(t, s, m1, all(m1))
		rep, err := gcAt(ctx, s, testJob, 1, 0, time.Now().Add(MaxLeaseTTL+time.Minute), false)
		if err != nil || rep.LeasesExpired != 1 {
			t.Fatalf("gc once the lease is old: %v %+v", err, rep)
		}
		check(t, s, m1, nil)
	})
}

// failingPutStore fails every Put while fail is set.
type failingPutStore struct {
	Store
	fail atomic.Bool
}

func (f *failingPutStore) Put(ctx context.Context, name string, r io.Reader) error {
	if f.fail.Load() {
		return errors.New("injected put failure")
	}
	return f.Store.Put(ctx, name, r)
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestHoldLease: the holder renews the lease (Expires moves), survives a
// failing store (warns, renews again once the store is back), writes an
// update at once, and Release stops the renewals and deletes the lease.
func TestHoldLease(t *testing.T) {
	ctx := context.Background()
	fs := &failingPutStore{Store: leaseFileStore(t)}
	a, b := testJob+"/shared/aa/a.sst", testJob+"/shared/bb/b.sst"
	if _, err := HoldLease(ctx, fs, sampleLease(time.Time{}, "n1", a), MaxLeaseTTL+time.Second, nil); err == nil {
		t.Fatal("ttl above the maximum accepted")
	}
	fs.fail.Store(true)
	if _, err := HoldLease(ctx, fs, sampleLease(time.Time{}, "n1", a), time.Second, nil); err == nil {
		t.Fatal("HoldLease succeeded without writing")
	}
	fs.fail.Store(false)

	var logs lockedBuffer
	const ttl = 300 * time.Millisecond
	h, err := HoldLease(ctx, fs, sampleLease(time.Time{}, "n1", a), ttl, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	first := leaseRead(t, fs, testJob, "n1")
	if d := first.Expires.Sub(first.Written); d != ttl || len(first.Objects) != 1 || first.Objects[0] != a {
		t.Fatalf("first lease %+v", first)
	}
	leaseWaitFor(t, "a renewal", func() bool { return leaseRead(t, fs, testJob, "n1").Expires.After(first.Expires) })

	if err := h.Update(ctx, []string{b}); err != nil {
		t.Fatal(err)
	}
	if got := leaseRead(t, fs, testJob, "n1"); len(got.Objects) != 1 || got.Objects[0] != b {
		t.Fatalf("after update: %+v", got)
	}

	fs.fail.Store(true)
	leaseWaitFor(t, "a renewal warning", func() bool { return strings.Contains(logs.String(), "lease renewal failed") })
	failed := leaseRead(t, fs, testJob, "n1")
	fs.fail.Store(false)
	leaseWaitFor(t, "a renewal after the failure", func() bool { return leaseRead(t, fs, testJob, "n1").Expires.After(failed.Expires) })
	if got := leaseRead(t, fs, testJob, "n1"); len(got.Objects) != 1 || got.Objects[0] != b {
		t.Fatalf("renewal lost the update: %+v", got)
	}

	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if leaseExists(t, fs, LeasePath(testJob, "n1")) {
		t.Fatal("lease left after Release")
	}
	time.Sleep(ttl / 2)
	if leaseExists(t, fs, LeasePath(testJob, "n1")) {
		t.Fatal("lease renewed after Release")
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Update(ctx, []string{a}); err == nil || leaseExists(t, fs, LeasePath(testJob, "n1")) {
		t.Fatalf("update after release: %v", err)
	}
}
