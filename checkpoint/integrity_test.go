package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cairn/internal/testutil/testservers"
	"cairn/state"
)

// events records a writer's object events.
type events struct {
	mu  sync.Mutex
	all []ObjectEvent
}

func (e *events) add(ev ObjectEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

// find returns the first event of kind for object (by "" = anyone).
func (e *events) find(kind ObjectEventKind, object, by string) (ObjectEvent, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.all {
		if ev.Kind == kind && ev.Object == object && (by == "" || ev.By == by) {
			return ev, true
		}
	}
	return ObjectEvent{}, false
}

func (e *events) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.all)
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	for _, ev := range e.all {
		fmt.Fprintf(&b, "%s %s by %s (checkpoint %d): %v\n", ev.Kind, ev.Object, ev.By, ev.Checkpoint, ev.Err)
	}
	return b.String()
}

// testStores are the stores the integrity tests run on: a file store (whose
// objects are damaged in place on disk) and gofakes3 over HTTP (damaged
// through the S3 API).
func testStores(t *testing.T) map[string]func(t *testing.T) (Store, string) {
	return map[string]func(t *testing.T) (Store, string){
		"file": func(t *testing.T) (Store, string) {
			root := t.TempDir()
			s, err := OpenStore(context.Background(), "file://"+root)
			if err != nil {
				t.Fatal(err)
			}
			return s, root
		},
		"s3": func(t *testing.T) (Store, string) {
			s, err := OpenStore(context.Background(), testservers.StartGoFakeS3(t)) // sets AWS_EC2_METADATA_DISABLED=true
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close(context.Background()) })
			return s, ""
		},
	}
}

// damage breaks a stored object: truncate (half of it), delete, or flip
// (one byte changed, same size). root is the file store's folder ("" for
// another store: the object is rewritten through the store).
func damage(t *testing.T, s Store, root, name, how string) {
	t.Helper()
	ctx := context.Background()
	if root != "" {
		p := filepath.Join(root, filepath.FromSlash(name))
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		switch how {
		case "truncate":
			err = os.Truncate(p, st.Size()/2)
		case "delete":
			err = os.Remove(p)
		case "flip":
			var b []byte
			if b, err = os.ReadFile(p); err == nil {
				b[len(b)/2] ^= 0x20
				err = os.WriteFile(p, b, 0o644)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if how == "delete" {
		if err := s.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := readAll(ctx, s, name)
	if err != nil {
		t.Fatal(err)
	}
	if how == "truncate" {
		b = b[:len(b)/2]
	} else {
		b[len(b)/2] ^= 0x20
	}
	if err := s.Put(ctx, name, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
}

// retainedClean checks that every checkpoint in the store verifies clean.
func retainedClean(t *testing.T, s Store) []uint64 {
	t.Helper()
	ctx := context.Background()
	list, err := List(ctx, s, testJob)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, e := range list {
		probs, err := Verify(ctx, s, testJob, e.ID)
		if err != nil {
			t.Fatalf("verify %d: %v", e.ID, err)
		}
		for _, p := range probs {
			t.Errorf("checkpoint %d: %v", e.ID, p)
		}
		ids = append(ids, e.ID)
	}
	return ids
}

// victimIn picks a shared SST that manifest m references and that the
// snapshot next also holds (so the next checkpoint references it again).
func victimIn(t *testing.T, m *Manifest, next []state.SlotSnapshot) Object {
	t.Helper()
	var best Object
	for _, o := range m.Objects {
		if o.Kind != KindSST {
			continue
		}
		if _, err := os.Stat(filepath.Join(next[o.Slot].Dir, o.File)); err == nil && o.Size > best.Size {
			best = o
		}
	}
	if best.Path == "" {
		t.Fatal("no SST of the last checkpoint is in the next snapshot")
	}
	return best
}

// TestCorruptSharedObjectDoesNotSpread reproduces how one damaged object
// used to spoil every later checkpoint: a job
// checkpoints, one shared SST is damaged in the store, and the job restarts
// on its intact data directory. Before the fix the new writer reused the
// damaged object in every new checkpoint. Now the start check (size) or
// the check before reuse (checksum) finds it, the first checkpoint uploads
// it again from the local snapshot, which heals it for the older
// checkpoints too: every retained checkpoint verifies.
func TestCorruptSharedObjectDoesNotSpread(t *testing.T) {
	for storeName, open := range testStores(t) {
		for _, tc := range []struct{ how, foundBy string }{
			{"truncate", "start"}, // a size the List shows
			{"delete", "start"},
			{"flip", "commit"}, // same size: only the checksum tells
		} {
			t.Run(storeName+"/"+tc.how, func(t *testing.T) {
				ctx := context.Background()
				const kgs, slots = 32, 2
				store, root := open(t)
				dbs := openSlots(t, kgs, slots)
				w1, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger()})
				if err != nil {
					t.Fatal(err)
				}
				var last *Manifest
				for i := range 3 {
					write(t, dbs, kgs, i*3000, (i+1)*3000, i)
					if last, err = w1.Commit(ctx, w1.NextID(), Meta{SourceStream: "in", SourceSeq: uint64(i + 1)}, snapshot(t, dbs)); err != nil {
						t.Fatal(err)
					}
				}
				w1.Close(ctx) // the process ends

				// The next snapshot of the same DBs (the restart restores
				// them locally), and one of its SSTs damaged in the store.
				write(t, dbs, kgs, 0, 100, 9)
				next := snapshot(t, dbs)
				victim := victimIn(t, last, next)
				damage(t, store, root, victim.Path, tc.how)
				if probs, _ := Verify(ctx, store, testJob, last.ID); len(probs) == 0 {
					t.Fatal("the damage is not visible to verify")
				}

				var ev events
				w2, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(),
					Events: EventListener{Object: ev.add}, Scrub: ScrubConfig{Disabled: true}})
				if err != nil {
					t.Fatal(err)
				}
				defer w2.Close(ctx)
				m, err := w2.Commit(ctx, w2.NextID(), Meta{SourceStream: "in", SourceSeq: 4}, next)
				if err != nil {
					t.Fatal(err)
				}
				if e, ok := ev.find(ObjectDamaged, victim.Path, tc.foundBy); !ok || !isDamage(e.Err) {
					t.Fatalf("no damaged event by %s for %s:\n%s", tc.foundBy, victim.Path, &ev)
				}
				if _, ok := ev.find(ObjectHealed, victim.Path, "commit"); !ok {
					t.Fatalf("no healed event for %s:\n%s", victim.Path, &ev)
				}
				if n := ev.count(); n != 2 {
					t.Fatalf("events for other objects:\n%s", &ev)
				}
				if m.Figures.FilesUploaded < 1 || m.Figures.FilesReused < 1 {
					t.Fatalf("figures %+v", m.Figures)
				}
				if ids := retainedClean(t, store); len(ids) != 3 || ids[2] != m.ID {
					t.Fatalf("retained %v", ids)
				}
			})
		}
	}
}

// TestScrubHealsUnderRunningWriter damages a shared object while a writer,
// fed by real Pebble DBs, commits a checkpoint after every write: the
// background scrub finds it and re-uploads it from the local copy; every
// retained checkpoint verifies once it has.
func TestScrubHealsUnderRunningWriter(t *testing.T) {
	ctx := context.Background()
	const kgs, slots = 32, 2
	root := t.TempDir()
	store, err := OpenStore(ctx, "file://"+root)
	if err != nil {
		t.Fatal(err)
	}
	dbs := openSlots(t, kgs, slots)
	var ev events
	w, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(), Events: EventListener{Object: ev.add},
		Scrub: ScrubConfig{Every: time.Millisecond, BytesPerSecond: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)

	var latest atomic.Pointer[Manifest]
	stop, done := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			write(t, dbs, kgs, (i%20)*500, (i%20+1)*500, i)
			m, err := w.Commit(ctx, w.NextID(), Meta{SourceStream: "in", SourceSeq: uint64(i + 1)}, snapshot(t, dbs))
			if err != nil {
				done <- err
				return
			}
			latest.Store(m)
		}
	}()
	waitUntil(t, func() bool { m := latest.Load(); return m != nil && m.ID >= 3 })
	m := latest.Load()
	var victim Object
	for _, o := range m.Objects {
		if o.Kind == KindSST && o.Size > victim.Size {
			victim = o
		}
	}
	damage(t, store, root, victim.Path, "truncate")
	waitUntil(t, func() bool { _, ok := ev.find(ObjectHealed, victim.Path, ""); return ok })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok := ev.find(ObjectDamaged, victim.Path, "scrub"); !ok {
		t.Fatalf("the damage was not found by the scrub:\n%s", &ev)
	}
	if err := verifyObject(ctx, store, victim); err != nil {
		t.Fatalf("the store was not healed: %v", err)
	}
	if ids := retainedClean(t, store); len(ids) != 3 {
		t.Fatalf("retained %v", ids)
	}
}

// waitUntil polls cond; the deadline only guards against a hang.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 2 minutes")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countingStore counts the bytes of shared objects read with Get.
type countingStore struct {
	Store
	gets, bytes atomic.Int64
}

func (c *countingStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	rc, err := c.Store.Get(ctx, name)
	if err != nil || !strings.Contains(name, "/shared/") {
		return rc, err
	}
	c.gets.Add(1)
	return &countingReader{ReadCloser: rc, n: &c.bytes}, nil
}

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n.Add(int64(n))
	return n, err
}

// TestReuseAfterRestartReadsBackOnce: a restarted writer reads each shared
// object it reuses back once, in its first checkpoint, and trusts it after;
// an object the scrub finds damaged without a local copy is not reused, and
// the next checkpoint that holds it uploads it.
func TestReuseAfterRestartReadsBackOnce(t *testing.T) {
	ctx := context.Background()
	const kgs, slots = 32, 2
	root := t.TempDir()
	fs, err := NewFileStore(root, true)
	if err != nil {
		t.Fatal(err)
	}
	dbs := openSlots(t, kgs, slots)
	w1, _ := NewWriter(ctx, fs, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger()})
	write(t, dbs, kgs, 0, 20000, 0)
	m1, err := w1.Commit(ctx, w1.NextID(), Meta{}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	w1.Close(ctx)
	var shared int64
	var victim Object
	for _, o := range m1.Objects {
		if o.Kind == KindSST {
			shared += o.Size
			victim = o
		}
	}

	cs := &countingStore{Store: fs}
	var ev events
	w2, err := NewWriter(ctx, cs, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(), Events: EventListener{Object: ev.add},
		Scrub: ScrubConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close(ctx)
	// The scrub, with no local copy known yet: found, not healed.
	damage(t, cs, root, victim.Path, "flip")
	start := cs.bytes.Load()
	rep, err := w2.ScrubOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Damaged) != 1 || rep.Damaged[0] != victim.Path || len(rep.Healed) != 0 {
		t.Fatalf("scrub report %+v", rep)
	}
	readByScrub := cs.bytes.Load()
	if readByScrub-start != shared {
		t.Fatalf("scrub read %d bytes, the shared objects are %d", readByScrub-start, shared)
	}
	// The first checkpoint reads nothing back (the scrub checked all) and
	// uploads the damaged one.
	m2, err := w2.Commit(ctx, w2.NextID(), Meta{}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	if cs.bytes.Load() != readByScrub {
		t.Fatalf("commit read %d bytes back after a scrub", cs.bytes.Load()-readByScrub)
	}
	if m2.Figures.BytesUploaded < victim.Size {
		t.Fatalf("the damaged object was not uploaded: %+v", m2.Figures)
	}
	if _, ok := ev.find(ObjectHealed, victim.Path, "commit"); !ok {
		t.Fatalf("not healed by the commit:\n%s", &ev)
	}
	retainedClean(t, fs)

	// A third writer, no scrub: its first checkpoint reads back every
	// shared object it reuses, its second reads nothing.
	cs3 := &countingStore{Store: fs}
	w3, err := NewWriter(ctx, cs3, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer w3.Close(ctx)
	before := cs3.bytes.Load()
	m3, err := w3.Commit(ctx, w3.NextID(), Meta{}, snapshot(t, dbs))
	if err != nil {
		t.Fatal(err)
	}
	if got := cs3.bytes.Load() - before; got != m3.Figures.BytesReused || got == 0 {
		t.Fatalf("first commit read back %d bytes, reused %d", got, m3.Figures.BytesReused)
	}
	before = cs3.bytes.Load()
	if _, err := w3.Commit(ctx, w3.NextID(), Meta{}, snapshot(t, dbs)); err != nil {
		t.Fatal(err)
	}
	if got := cs3.bytes.Load() - before; got != 0 {
		t.Fatalf("second commit read back %d bytes", got)
	}
}

// holdStore blocks the manifest commit while armed, with the checkpoint's
// data uploaded: a checkpoint in flight.
type holdStore struct {
	Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (h *holdStore) Create(ctx context.Context, name string, data []byte) error {
	if h.armed.Load() && isManifest(name) {
		close(h.entered)
		<-h.release
	}
	return h.Store.Create(ctx, name, data)
}

// TestGCFloorProtectsCheckpointInFlight runs gc while a checkpoint's data
// is uploaded and its manifest not yet written. With the floor the
// checkpoint commits whole; with no grace (what `gc --grace 0s` did) it
// commits with missing objects: the floor is what makes the difference.
func TestGCFloorProtectsCheckpointInFlight(t *testing.T) {
	for _, tc := range []struct {
		grace  time.Duration
		broken bool
	}{{MinGCGrace, false}, {0, true}} {
		t.Run(tc.grace.String(), func(t *testing.T) {
			ctx := context.Background()
			const kgs, slots = 32, 2
			fs, err := NewFileStore(t.TempDir(), true)
			if err != nil {
				t.Fatal(err)
			}
			hs := &holdStore{Store: fs, entered: make(chan struct{}), release: make(chan struct{})}
			dbs := openSlots(t, kgs, slots)
			w, err := NewWriter(ctx, hs, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close(ctx)
			for i := range 2 {
				write(t, dbs, kgs, i*4000, (i+1)*4000, i)
				if _, err := w.Commit(ctx, w.NextID(), Meta{}, snapshot(t, dbs)); err != nil {
					t.Fatal(err)
				}
			}
			write(t, dbs, kgs, 8000, 12000, 2)
			snap := snapshot(t, dbs)
			hs.armed.Store(true)
			res := make(chan *Manifest, 1)
			go func() {
				m, err := w.Commit(ctx, w.NextID(), Meta{}, snap)
				if err != nil {
					t.Error(err)
				}
				res <- m
			}()
			<-hs.entered
			rep, err := GC(ctx, fs, testJob, 3, tc.grace, false)
			if err != nil {
				t.Fatal(err)
			}
			close(hs.release)
			m := <-res
			if m == nil {
				t.FailNow()
			}
			probs := VerifyManifest(ctx, fs, m, 4)
			if broken := len(probs) > 0; broken != tc.broken {
				t.Fatalf("grace %v: gc deleted %d objects; checkpoint %d broken=%v, want %v: %v", tc.grace, len(rep.Deleted), m.ID, broken, tc.broken, probs)
			}
		})
	}
}

// TestGCLoopBesideLiveWriter: gc must never delete what a checkpoint about
// to commit needs. gc (at the floor) runs again and again while a writer commits a checkpoint after every write to
// real Pebble DBs. Every checkpoint verifies right after its commit, and
// every retained one at the end.
func TestGCLoopBesideLiveWriter(t *testing.T) {
	ctx := context.Background()
	const kgs, slots, commits = 32, 2, 25
	fs, err := NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	dbs := openSlots(t, kgs, slots)
	w, err := NewWriter(ctx, fs, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Logger: quietLogger(), OrphanGrace: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	stop := make(chan struct{})
	var runs atomic.Int64
	gcErr := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				gcErr <- nil
				return
			default:
			}
			if _, err := GC(ctx, fs, testJob, 3, MinGCGrace, false); err != nil {
				gcErr <- err
				return
			}
			runs.Add(1)
			time.Sleep(time.Millisecond) // leave the CPU to the writer
		}
	}()
	for i := range commits {
		write(t, dbs, kgs, (i%10)*2000, (i%10+1)*2000, i)
		m, err := w.Commit(ctx, w.NextID(), Meta{SourceSeq: uint64(i)}, snapshot(t, dbs))
		if err != nil {
			t.Fatal(err)
		}
		if probs := VerifyManifest(ctx, fs, m, 4); len(probs) > 0 {
			t.Fatalf("checkpoint %d committed broken: %v", m.ID, probs)
		}
	}
	close(stop)
	if err := <-gcErr; err != nil {
		t.Fatal(err)
	}
	retainedClean(t, fs)
	t.Logf("%d gc runs beside %d checkpoints", runs.Load(), commits)
}

func TestCheckGCGrace(t *testing.T) {
	for _, g := range []time.Duration{0, time.Second, time.Minute, MinGCGrace - time.Nanosecond} {
		if err := CheckGCGrace(g); !errors.Is(err, ErrGraceTooShort) {
			t.Errorf("grace %v: %v", g, err)
		}
	}
	for _, g := range []time.Duration{MinGCGrace, time.Hour} {
		if err := CheckGCGrace(g); err != nil {
			t.Errorf("grace %v: %v", g, err)
		}
	}
}

// TestListMarksCorruptManifest: one corrupt manifest is listed as such,
// between the intact ones.
func TestListMarksCorruptManifest(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	mem := newMemStore(func() time.Time { return now })
	db := &fakeDB{files: map[int][]string{}}
	w, _ := NewWriter(ctx, mem, WriterConfig{Job: testJob, KeyGroups: 8, Slots: 2, Logger: quietLogger(), Retain: 5, Scrub: ScrubConfig{Disabled: true}})
	defer w.Close(ctx)
	for i := range 3 {
		db.step(rand.New(rand.NewPCG(1, 2)), 2)
		if _, err := w.Commit(ctx, w.NextID(), Meta{SourceSeq: uint64(i)}, db.snapshot(t, t.TempDir(), 8, 2)); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := readAll(ctx, mem, ManifestPath(testJob, 2))
	b[len(b)/3] ^= 0x01
	if err := mem.Put(ctx, ManifestPath(testJob, 2), bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	list, err := List(ctx, mem, testJob)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[0].Corrupt != "" || list[1].ID != 2 || list[1].Corrupt == "" || list[2].Corrupt != "" || list[2].SourceSeq != 2 {
		t.Fatalf("list %+v", list)
	}
}

// TestFindUnreferenced: junk anywhere under the job's prefix is listed;
// what a manifest or savepoint references is not.
func TestFindUnreferenced(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	mem := newMemStore(func() time.Time { return now })
	db := &fakeDB{files: map[int][]string{}}
	w, _ := NewWriter(ctx, mem, WriterConfig{Job: testJob, KeyGroups: 8, Slots: 2, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}})
	defer w.Close(ctx)
	db.step(rand.New(rand.NewPCG(1, 2)), 2)
	if _, err := w.Commit(ctx, w.NextID(), Meta{}, db.snapshot(t, t.TempDir(), 8, 2)); err != nil {
		t.Fatal(err)
	}
	junk := []string{
		SharedPath(testJob, strings.Repeat("ab", 32)),
		CheckpointDir(testJob, 7) + "/slot-0/MANIFEST-000001",
		testJob + "/shared/ab/.tmp-x.sst-0011",
		testJob + "/stray.txt",
		SavepointDir(testJob, "never-committed") + "/slot-0/data.zst",
	}
	for _, j := range junk {
		if err := mem.Put(ctx, j, strings.NewReader("junk")); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := FindUnreferenced(ctx, mem, testJob)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range rep.Objects {
		got = append(got, o.Name)
	}
	want := append([]string(nil), junk...)
	sort.Strings(want)
	if fmt.Sprint(got) != fmt.Sprint(want) || len(rep.Corrupt) != 0 {
		t.Fatalf("unreferenced %v, want %v (corrupt %v)", got, want, rep.Corrupt)
	}
}
