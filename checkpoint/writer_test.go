package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"cairn/state"
)

const testJob = "job1"

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// slotDB is one slot's state DB for tests.
type slotDB struct {
	db  *state.DB
	dir string
	r   state.KeyGroupRange
}

func openSlots(t *testing.T, keyGroups, slots int) []*slotDB {
	var out []*slotDB
	for i := range slots {
		r := state.SlotRange(i, slots, keyGroups)
		dir := filepath.Join(t.TempDir(), fmt.Sprint("db-", i))
		db, err := state.Open(dir, state.Options{KeyGroups: keyGroups, Range: r})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		out = append(out, &slotDB{db: db, dir: dir, r: r})
	}
	return out
}

// write puts keys [from, to) with a value derived from gen, into the slot
// owning each key.
func write(t *testing.T, dbs []*slotDB, keyGroups, from, to, gen int) {
	batches := make([]*state.Batch, len(dbs))
	for i, d := range dbs {
		batches[i] = d.db.NewBatch()
	}
	for k := from; k < to; k++ {
		key := fmt.Appendf(nil, "key-%08d", k)
		kg := state.KeyGroup(key, keyGroups)
		slot := state.SlotOf(kg, len(dbs), keyGroups)
		batches[slot].Put(1, kg, key, nil, fmt.Appendf(nil, "value-%d-%d-%s", k, gen, bytes.Repeat([]byte("x"), 60)))
		if batches[slot].Len() >= 1000 {
			if err := batches[slot].Commit(); err != nil {
				t.Fatal(err)
			}
			batches[slot].Reset()
		}
	}
	for _, b := range batches {
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
}

// snapshot takes a local checkpoint of every slot.
func snapshot(t *testing.T, dbs []*slotDB) []state.SlotSnapshot {
	base := t.TempDir()
	var out []state.SlotSnapshot
	for i, d := range dbs {
		dir := filepath.Join(base, fmt.Sprint("slot-", i))
		start := time.Now()
		if err := d.db.Checkpoint(dir); err != nil {
			t.Fatal(err)
		}
		out = append(out, state.SlotSnapshot{Slot: i, Range: d.r, Dir: dir, SyncDuration: time.Since(start)})
	}
	return out
}

func sstNames(t *testing.T, snaps []state.SlotSnapshot) map[string]bool {
	out := map[string]bool{}
	for _, s := range snaps {
		es, err := os.ReadDir(s.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if isSST(e.Name()) {
				out[fmt.Sprint(s.Slot, "/", e.Name())] = true
			}
		}
	}
	return out
}

func uploadedSSTs(m *Manifest, reusable map[string]bool) map[string]bool {
	out := map[string]bool{}
	for _, o := range m.Objects {
		if o.Kind == KindSST && !reusable[o.Path] {
			out[fmt.Sprint(o.Slot, "/", o.File)] = true
		}
	}
	return out
}

func TestIncrementalUploadsOnlyNewSSTs(t *testing.T) {
	ctx := context.Background()
	const kgs, slots, keys = 32, 2, 40000
	dbs := openSlots(t, kgs, slots)
	store, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	write(t, dbs, kgs, 0, keys, 0)
	snap1 := snapshot(t, dbs)
	m1, err := w.Commit(ctx, w.NextID(), Meta{SourceStream: "in", SourceSeq: 100}, snap1)
	if err != nil {
		t.Fatal(err)
	}
	if m1.ID != 1 || m1.ChainLength != 1 || m1.Parent != 0 || m1.Figures.FilesReused != 0 {
		t.Fatalf("first checkpoint: %+v", m1)
	}
	// Update 1% of the keys.
	write(t, dbs, kgs, 0, keys/100, 1)
	snap2 := snapshot(t, dbs)
	m2, err := w.Commit(ctx, w.NextID(), Meta{SourceStream: "in", SourceSeq: 200}, snap2)
	if err != nil {
		t.Fatal(err)
	}
	old, cur := sstNames(t, snap1), sstNames(t, snap2)
	wantNew := map[string]bool{}
	for n := range cur {
		if !old[n] {
			wantNew[n] = true
		}
	}
	reusable := map[string]bool{}
	for _, o := range m1.Objects {
		reusable[o.Path] = true
	}
	got := uploadedSSTs(m2, reusable)
	if fmt.Sprint(sorted(got)) != fmt.Sprint(sorted(wantNew)) {
		t.Fatalf("uploaded SSTs %v, new since previous checkpoint %v", sorted(got), sorted(wantNew))
	}
	if len(wantNew) == 0 || m2.Figures.FilesReused == 0 {
		t.Fatalf("test is vacuous: new %d reused %d", len(wantNew), m2.Figures.FilesReused)
	}
	if m2.Parent != 1 || m2.ChainLength != 2 {
		t.Fatalf("chain: parent %d length %d", m2.Parent, m2.ChainLength)
	}
	// Every checkpoint after a measured upload (>= 1 MiB) carries its
	// predicted restore time: referenced bytes / measured bandwidth.
	if m1.Figures.BytesUploaded >= minBandwidthSample {
		for _, m := range []*Manifest{m1, m2} {
			f := m.Figures
			if f.StoreBandwidth <= 0 || f.PredictedRestore <= 0 {
				t.Fatalf("checkpoint %d: no predicted restore (%+v)", m.ID, f)
			}
			want := time.Duration(float64(f.FullStateSize) / float64(f.StoreBandwidth) * float64(time.Second))
			if d := f.PredictedRestore - want; d > time.Millisecond || d < -time.Millisecond {
				t.Fatalf("checkpoint %d: predicted %v, want %v", m.ID, f.PredictedRestore, want)
			}
		}
	} else {
		t.Fatalf("test is vacuous: first upload only %d bytes", m1.Figures.BytesUploaded)
	}
	t.Logf("checkpoint 2: uploaded %d files %d bytes, reused %d files %d bytes, full %d bytes",
		m2.Figures.FilesUploaded, m2.Figures.BytesUploaded, m2.Figures.FilesReused, m2.Figures.BytesReused, m2.Figures.FullStateSize)

	// Nothing changed: a third checkpoint reuses every SST.
	// (Background compactions may still produce new SSTs: compare sets.)
	snap3 := snapshot(t, dbs)
	m3, err := w.Commit(ctx, w.NextID(), Meta{}, snap3)
	if err != nil {
		t.Fatal(err)
	}
	checkNew(t, m3, allPaths(m1, m2), snap2, snap3)
	// A new writer (restart) sees the committed checkpoints, uploads nothing
	// already stored.
	var ends []Stats
	w2, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(),
		Events: EventListener{CheckpointEnd: func(s Stats) { ends = append(ends, s) }}})
	if err != nil {
		t.Fatal(err)
	}
	if w2.NextID() != 4 {
		t.Fatalf("next id after restart %d", w2.NextID())
	}
	snap4 := snapshot(t, dbs)
	m4, err := w2.Commit(ctx, 4, Meta{}, snap4)
	if err != nil {
		t.Fatal(err)
	}
	checkNew(t, m4, allPaths(m1, m2, m3), snap3, snap4)
	for _, id := range []uint64{2, 3, 4} {
		probs, err := Verify(ctx, store, testJob, id)
		if err != nil || len(probs) != 0 {
			t.Fatalf("verify %d: %v %v", id, err, probs)
		}
	}
	// Retention kept 3.
	if _, err := Load(ctx, store, testJob, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("checkpoint 1 not dropped by retention: %v", err)
	}
	ls, err := List(ctx, store, testJob)
	if err != nil || len(ls) != 3 {
		t.Fatalf("list: %v %+v", err, ls)
	}
	for _, e := range ls {
		m, _ := Load(ctx, store, testJob, e.ID)
		others := map[string]bool{}
		for _, o := range ls {
			if o.ID != e.ID {
				om, _ := Load(ctx, store, testJob, o.ID)
				for p := range allPaths(om) {
					others[p] = true
				}
			}
		}
		var shared int64
		for p, size := range objectSizes(m) {
			if others[p] {
				shared += size
			}
		}
		if e.RetainedShared != shared || e.RetainedExclusive+e.RetainedShared != e.Figures.FullStateSize {
			t.Fatalf("list entry %+v: shared should be %d", e, shared)
		}
	}
	if len(ends) != 1 || ends[0].ID != 4 || ends[0].Err != nil {
		t.Fatalf("checkpoint events %+v", ends)
	}
}

// checkNew checks that m uploaded exactly the SSTs of cur not in prev.
func checkNew(t *testing.T, m *Manifest, stored map[string]bool, prev, cur []state.SlotSnapshot) {
	t.Helper()
	old, now := sstNames(t, prev), sstNames(t, cur)
	want := map[string]bool{}
	for n := range now {
		if !old[n] {
			want[n] = true
		}
	}
	if got := uploadedSSTs(m, stored); fmt.Sprint(sorted(got)) != fmt.Sprint(sorted(want)) {
		t.Fatalf("checkpoint %d uploaded SSTs %v, new since previous %v", m.ID, sorted(got), sorted(want))
	}
}

func allPaths(ms ...*Manifest) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		for _, o := range m.Objects {
			out[o.Path] = true
		}
	}
	return out
}

func sorted(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestFullRoundTrip(t *testing.T) {
	ctx := context.Background()
	const kgs, slots, keys = 16, 2, 5000
	dbs := openSlots(t, kgs, slots)
	write(t, dbs, kgs, 0, keys, 0)
	write(t, dbs, kgs, 0, keys/10, 1)
	store := newMemStore(time.Now)
	w, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Mode: ModeFull, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	m, err := w.Commit(ctx, w.NextID(), Meta{}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	if m.Mode != ModeFull || len(m.Objects) != 2*slots {
		t.Fatalf("manifest %+v", m)
	}
	total := 0
	for slot, d := range dbs {
		for kg := d.r.First; kg <= d.r.Last; kg++ {
			var want, got []string
			if err := d.db.ScanRaw(state.KeyGroupRange{First: kg, Last: kg}, func(k, v []byte) error {
				want = append(want, fmt.Sprintf("%x=%x", k, v))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := ReadKeyGroup(ctx, store, m, slot, kg, func(k, v []byte) error {
				got = append(got, fmt.Sprintf("%x=%x", k, v))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("key group %d: %d entries read, %d in DB", kg, len(got), len(want))
			}
			total += len(got)
		}
	}
	if total != keys {
		t.Fatalf("read %d entries, wrote %d keys", total, keys)
	}
	if err := ReadKeyGroup(ctx, store, m, 0, dbs[1].r.First, func(k, v []byte) error { return nil }); err == nil {
		t.Fatal("read a key group outside the slot")
	}
	// Corrupt a segment: typed error naming the object.
	data, _ := findObject(m, 0, KindFullData)
	b, _ := readAll(ctx, store, data.Path)
	b[len(b)/2] ^= 0xff
	store.Put(ctx, data.Path, bytes.NewReader(b))
	var corrupt error
	for kg := dbs[0].r.First; kg <= dbs[0].r.Last && corrupt == nil; kg++ {
		corrupt = ReadKeyGroup(ctx, store, m, 0, kg, func(k, v []byte) error { return nil })
	}
	if !IsCorruption(corrupt) {
		t.Fatalf("corrupt segment read: %v", corrupt)
	}
	probs, err := Verify(ctx, store, testJob, m.ID)
	if err != nil || len(probs) != 1 || probs[0].Object != data.Path {
		t.Fatalf("verify: %v %v", err, probs)
	}
}

func TestFullEvery(t *testing.T) {
	ctx := context.Background()
	const kgs, slots = 8, 1
	dbs := openSlots(t, kgs, slots)
	write(t, dbs, kgs, 0, 100, 0)
	store := newMemStore(time.Now)
	w, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, FullEvery: 2, Retain: 10, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var modes []string
	for range 6 {
		m, err := w.Commit(ctx, w.NextID(), Meta{}, snapshot(t, dbs))
		if err != nil {
			t.Fatal(err)
		}
		modes = append(modes, fmt.Sprint(m.Mode, m.ChainLength))
	}
	want := "[incremental1 incremental2 full1 incremental1 incremental2 full1]"
	if fmt.Sprint(modes) != want {
		t.Fatalf("modes %v, want %s", modes, want)
	}
}

// faultStore fails every operation after budget operations; with partial
// set, the failing mutation is applied before the error (a lost answer).
type faultStore struct {
	Store
	mu      sync.Mutex
	budget  int
	partial bool
}

var errInjected = errors.New("injected crash")

// step spends one operation: fail says the operation fails, apply that a
// failing mutation is applied anyway.
func (f *faultStore) step() (fail, apply bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.budget--
	return f.budget < 0, f.partial && f.budget == -1
}

func (f *faultStore) crashed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.budget < 0
}

func (f *faultStore) Put(ctx context.Context, name string, r io.Reader) error {
	if fail, apply := f.step(); fail {
		if apply {
			f.Store.Put(ctx, name, r)
		}
		return errInjected
	}
	return f.Store.Put(ctx, name, r)
}

func (f *faultStore) Create(ctx context.Context, name string, data []byte) error {
	if fail, apply := f.step(); fail {
		if apply {
			f.Store.Create(ctx, name, data)
		}
		return errInjected
	}
	return f.Store.Create(ctx, name, data)
}

func (f *faultStore) Delete(ctx context.Context, name string) error {
	if fail, apply := f.step(); fail {
		if apply {
			f.Store.Delete(ctx, name)
		}
		return errInjected
	}
	return f.Store.Delete(ctx, name)
}

func (f *faultStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	if f.crashed() {
		return errInjected
	}
	return f.Store.List(ctx, prefix, fn)
}

func (f *faultStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if f.crashed() {
		return nil, errInjected
	}
	return f.Store.Get(ctx, name)
}

// fakeDB produces synthetic slot checkpoint directories: SSTs are
// immutable, named by a growing number, compacted away at random.
type fakeDB struct {
	next  int
	files map[int][]string // slot -> live SST names
}

func (d *fakeDB) step(rng *rand.Rand, slots int) {
	for s := range slots {
		live := d.files[s][:0:0]
		for _, f := range d.files[s] {
			if rng.IntN(4) != 0 {
				live = append(live, f)
			}
		}
		for range 1 + rng.IntN(3) {
			d.next++
			live = append(live, fmt.Sprintf("%06d.sst", d.next))
		}
		d.files[s] = live
	}
}

func (d *fakeDB) snapshot(t *testing.T, base string, kgs, slots int) []state.SlotSnapshot {
	var out []state.SlotSnapshot
	for s := range slots {
		dir, err := os.MkdirTemp(base, "snap")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range d.files[s] {
			os.WriteFile(filepath.Join(dir, f), []byte("sst content "+f), 0o644)
		}
		os.WriteFile(filepath.Join(dir, "MANIFEST-000001"), fmt.Appendf(nil, "manifest %v", d.files[s]), 0o644)
		os.WriteFile(filepath.Join(dir, "OPTIONS-000002"), []byte("options"), 0o644)
		out = append(out, state.SlotSnapshot{Slot: s, Range: state.SlotRange(s, slots, kgs), Dir: dir})
	}
	return out
}

// TestGCProperty runs random sequences of checkpoints, crashes at any store
// operation, restarts and GC runs with a fake clock, and checks after each
// step: every committed manifest in the store verifies clean, the newest
// successful commit survives, and after a completed GC no unreferenced
// object older than the grace period remains.
func TestGCProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CAIRN_SEED"); s != "" {
		fmt.Sscan(s, &seed)
	}
	iters := 60
	if testing.Short() {
		iters = 15
	}
	for it := range iters {
		runGCProperty(t, seed+uint64(it))
		if t.Failed() {
			return
		}
	}
}

func runGCProperty(t *testing.T, seed uint64) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0))
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d (rerun with CAIRN_SEED=%d): %s", seed, seed, fmt.Sprintf(format, args...))
	}
	const kgs, slots, grace = 8, 2, time.Hour
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	mem := newMemStore(clock)
	retain := 1 + rng.IntN(3)
	base := t.TempDir()
	db := &fakeDB{files: map[int][]string{}}
	fs := &faultStore{Store: mem, budget: 1 << 30}
	var w *Writer
	newWriter := func() *Writer {
		if w != nil {
			w.Close(ctx) // the old process is gone: its scrub too
		}
		fs.budget = 1 << 30
		w, err := NewWriter(ctx, fs, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Retain: retain,
			OrphanGrace: grace, Logger: quietLogger(), Now: clock, FullEvery: 0, Scrub: ScrubConfig{Disabled: true}})
		if err != nil {
			fail("new writer: %v", err)
		}
		return w
	}
	w = newWriter()
	defer func() { w.Close(ctx) }()
	var lastOK uint64
	for step := range 40 {
		now = now.Add(time.Duration(rng.IntN(40)) * time.Minute)
		switch op := rng.IntN(10); {
		case op < 6: // checkpoint, maybe crashing
			db.step(rng, slots)
			snaps := db.snapshot(t, base, kgs, slots)
			crash := rng.IntN(3) == 0
			if crash {
				fs.budget = rng.IntN(12)
				fs.partial = rng.IntN(2) == 0
			}
			m, err := w.Commit(ctx, w.NextID(), Meta{SourceSeq: uint64(step)}, snaps)
			if err == nil {
				lastOK = m.ID
			} else if !crash {
				fail("step %d: commit: %v", step, err)
			}
			if crash {
				w = newWriter() // the process died; a new one starts
			}
		case op < 8: // GC, maybe crashing
			crash := rng.IntN(2) == 0
			if crash {
				fs.budget = rng.IntN(6)
				fs.partial = rng.IntN(2) == 0
			}
			r := retain
			rep, err := gcAt(ctx, fs, testJob, r, grace, now, false)
			fs.budget = 1 << 30
			if err == nil {
				checkSwept(t, mem, now, grace, fail)
			} else if !crash {
				fail("step %d: gc: %v", step, err)
			}
			_ = rep
			w = newWriter()
		default: // time passes
			now = now.Add(time.Duration(rng.IntN(3)) * time.Hour)
		}
		// INVARIANT: every manifest in the store is complete.
		ms, _, err := loadCheckpoints(ctx, mem, testJob)
		if err != nil {
			fail("step %d: load: %v", step, err)
		}
		found := false
		for _, m := range ms {
			if p := VerifyManifest(ctx, mem, m, 1); len(p) > 0 {
				fail("step %d: committed checkpoint %d broken: %v", step, m.ID, p)
			}
			found = found || m.ID == lastOK
		}
		if lastOK != 0 && !found {
			// The newest successful commit may only be dropped by
			// retention in favour of newer committed ones.
			if len(ms) == 0 || ms[len(ms)-1].ID < lastOK {
				fail("step %d: newest committed checkpoint %d vanished (have %d)", step, lastOK, len(ms))
			}
		}
	}
	// Finally: after a clean GC beyond the grace period only referenced
	// objects remain.
	now = now.Add(2 * grace)
	if _, err := gcAt(ctx, mem, testJob, retain, grace, now, false); err != nil {
		fail("final gc: %v", err)
	}
	checkSwept(t, mem, now, grace, fail)
	ms, _, _ := loadCheckpoints(ctx, mem, testJob)
	if len(ms) > retain {
		fail("%d checkpoints retained, retain=%d", len(ms), retain)
	}
}

func checkSwept(t *testing.T, mem *memStore, now time.Time, grace time.Duration, fail func(string, ...any)) {
	t.Helper()
	ctx := context.Background()
	ms, _, err := loadCheckpoints(ctx, mem, testJob)
	if err != nil {
		fail("load: %v", err)
	}
	refs := map[string]bool{}
	for _, m := range ms {
		refs[ManifestPath(testJob, m.ID)] = true
		for _, o := range m.Objects {
			refs[o.Path] = true
		}
	}
	objs, _ := listAll(ctx, mem, testJob+"/")
	for _, o := range objs {
		if !refs[o.Name] && !o.ModTime.After(now.Add(-grace)) {
			fail("unreferenced object %s (mod %v) older than grace survived GC at %v", o.Name, o.ModTime, now)
		}
	}
}

func TestCrashBeforeManifest(t *testing.T) {
	ctx := context.Background()
	const kgs, slots = 8, 2
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	mem := newMemStore(clock)
	db := &fakeDB{files: map[int][]string{}}
	db.step(rand.New(rand.NewPCG(1, 2)), slots)
	snaps := db.snapshot(t, t.TempDir(), kgs, slots)
	// Count the data uploads, then fail exactly at the manifest.
	probe := &faultStore{Store: newMemStore(clock), budget: 1 << 30}
	// The test moves its clock by hand: no background scrub reads it meanwhile.
	pw, _ := NewWriter(ctx, probe, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(), Now: clock, Scrub: ScrubConfig{Disabled: true}})
	if _, err := pw.Commit(ctx, 1, Meta{}, snaps); err != nil {
		t.Fatal(err)
	}
	dataOps := (1 << 30) - probe.budget - 1
	fs := &faultStore{Store: mem, budget: dataOps}
	w, _ := NewWriter(ctx, fs, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(), Now: clock, Scrub: ScrubConfig{Disabled: true}})
	if _, err := w.Commit(ctx, 1, Meta{}, snaps); !errors.Is(err, errInjected) {
		t.Fatalf("commit: %v", err)
	}
	objs, _ := listAll(ctx, mem, testJob+"/")
	if len(objs) != dataOps {
		t.Fatalf("%d objects stored, want the %d data objects", len(objs), dataOps)
	}
	if _, err := Latest(ctx, mem, testJob); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a checkpoint is visible: %v", err)
	}
	if ls, _ := List(ctx, mem, testJob); len(ls) != 0 {
		t.Fatalf("list shows %v", ls)
	}
	// Within the grace period the sweep keeps the data (it may be an upload
	// in flight); after it, the data is gone.
	now = now.Add(30 * time.Minute)
	rep, err := gcAt(ctx, mem, testJob, 3, time.Hour, now, false)
	if err != nil || len(rep.Deleted) != 0 {
		t.Fatalf("gc within grace: %v deleted %v", err, rep.Deleted)
	}
	now = now.Add(31 * time.Minute)
	rep, err = gcAt(ctx, mem, testJob, 3, time.Hour, now, true)
	if err != nil || len(rep.Deleted) != dataOps || !rep.DryRun {
		t.Fatalf("dry run: %v %+v", err, rep)
	}
	if objs, _ := listAll(ctx, mem, testJob+"/"); len(objs) != dataOps {
		t.Fatal("dry run deleted")
	}
	rep, err = gcAt(ctx, mem, testJob, 3, time.Hour, now, false)
	if err != nil || len(rep.Deleted) != dataOps || rep.BytesFreed == 0 {
		t.Fatalf("gc after grace: %v %+v", err, rep)
	}
	if objs, _ := listAll(ctx, mem, testJob+"/"); len(objs) != 0 {
		t.Fatalf("left %v", objs)
	}
	// The next writer does not reuse the failed attempt's id.
	w2, _ := NewWriter(ctx, mem, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(), Now: clock, Scrub: ScrubConfig{Disabled: true}})
	if w2.NextID() != 1 {
		t.Fatalf("next id %d", w2.NextID()) // folder fully swept, so 1 is free again
	}
}

// blockingStore holds every Put until release is closed.
type blockingStore struct {
	Store
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingStore) Put(ctx context.Context, name string, r io.Reader) error {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	return b.Store.Put(ctx, name, r)
}

// TestCheckpointEndAfterUpload: the CheckpointEnd event comes once the
// commit is done, not while it uploads (a subscriber never waits on an
// upload: the writer keeps no history to poll).
func TestCheckpointEndAfterUpload(t *testing.T) {
	ctx := context.Background()
	dbs := openSlots(t, 16, 1)
	fs, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	bs := &blockingStore{Store: fs, entered: make(chan struct{}), release: make(chan struct{})}
	ends := make(chan Stats, 4)
	w, err := NewWriter(ctx, bs, WriterConfig{Job: testJob, KeyGroups: 16, Slots: 1, Logger: quietLogger(),
		Events: EventListener{CheckpointEnd: func(s Stats) { ends <- s }}})
	if err != nil {
		t.Fatal(err)
	}
	write(t, dbs, 16, 0, 1000, 0)
	done := make(chan error, 1)
	go func() {
		_, err := w.Commit(ctx, w.NextID(), Meta{SourceStream: "in", SourceSeq: 1}, snapshot(t, dbs))
		done <- err
	}()
	<-bs.entered
	select {
	case s := <-ends:
		t.Fatalf("checkpoint %d ended while its upload was blocked", s.ID)
	default:
	}
	close(bs.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := <-ends; s.Err != nil || s.ID != 1 {
		t.Fatalf("event %+v", s)
	}
}

// TestBeforeDrop: retention calls the hook with the checkpoints it drops
// while their manifests still exist (on the sweep's path and the cheap
// one), and a failing hook keeps them all until a later round succeeds.
func TestBeforeDrop(t *testing.T) {
	ctx := context.Background()
	const kgs, slots = 8, 1
	dbs := openSlots(t, kgs, slots)
	write(t, dbs, kgs, 0, 100, 0)
	now := time.Now()
	store := newMemStore(func() time.Time { return now })
	w, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Retain: 2, OrphanGrace: time.Hour,
		Now: func() time.Time { return now }, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var calls [][]uint64
	failing := false
	w.SetBeforeDrop(func(ctx context.Context, ids []uint64) error {
		for _, id := range ids {
			if _, err := store.Stat(ctx, ManifestPath(testJob, id)); err != nil {
				t.Errorf("before dropping %d: its manifest: %v", id, err)
			}
		}
		calls = append(calls, ids)
		if failing {
			return errInjected
		}
		return nil
	})
	commit := func() {
		t.Helper()
		write(t, dbs, kgs, 0, 10, int(w.NextID()))
		if _, err := w.Commit(ctx, w.NextID(), Meta{}, snapshot(t, dbs)); err != nil {
			t.Fatal(err)
		}
	}
	ids := func() []uint64 {
		t.Helper()
		got, err := ManifestIDs(ctx, store, testJob)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// The first drop runs on the sweep's path (its first round), the next
	// on the cheap one (the sweep is not due for half the grace).
	for range 4 {
		commit()
	}
	if want := "[[1] [2]]"; fmt.Sprint(calls) != want || fmt.Sprint(ids()) != "[3 4]" {
		t.Fatalf("calls %v, checkpoints %v; want calls %s, checkpoints [3 4]", calls, ids(), want)
	}
	// A failing hook: nothing is dropped, on either path.
	failing, calls = true, nil
	commit()
	now = now.Add(time.Hour) // the sweep is due
	commit()
	if got := ids(); fmt.Sprint(got) != "[3 4 5 6]" || len(calls) == 0 {
		t.Fatalf("with the hook failing: checkpoints %v (calls %v), want [3 4 5 6] kept", got, calls)
	}
	// It succeeds again: the backlog goes in one round.
	failing, calls = false, nil
	commit()
	if got := ids(); fmt.Sprint(got) != "[6 7]" || fmt.Sprint(calls) != "[[3 4 5]]" {
		t.Fatalf("after the hook recovered: checkpoints %v, calls %v; want [6 7] after [[3 4 5]]", got, calls)
	}
}
