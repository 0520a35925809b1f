package group

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn/engine"
	"cairn/internal/testutil/natscluster"
	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/wait"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// testLog logs membership events when CAIRN_GROUP_LOG is set.
func testLog() *slog.Logger {
	if os.Getenv("CAIRN_GROUP_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

var testSubs = []SubTopology{{Name: "src", KeyGroups: 128}}

// app stands for the job runtime of one member: it applies the member's
// changes — runs what it gains, checkpoints and releases what it is asked
// to, stops what it loses — and records them.
type app struct {
	m     *Member
	mu    sync.Mutex
	owned map[kgKey]uint64
	// Every event, in order, for the checks.
	gained, released, lost []Owned
	// holdRelease, when set, keeps releases from completing (an owner
	// still checkpointing).
	holdRelease bool
	pending     []Owned
	done        chan struct{}
}

func runApp(t testing.TB, m *Member) *app {
	a := &app{m: m, owned: map[kgKey]uint64{}, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for c := range m.Changes() {
			a.mu.Lock()
			for _, o := range c.Lost {
				a.lost = append(a.lost, o)
				for kg := o.Lo; kg < o.Hi; kg++ {
					delete(a.owned, kgKey{o.Sub, kg})
				}
			}
			for _, o := range c.Gained {
				a.gained = append(a.gained, o)
				for kg := o.Lo; kg < o.Hi; kg++ {
					a.owned[kgKey{o.Sub, kg}] = o.Epoch
				}
			}
			hold := a.holdRelease
			if hold {
				a.pending = append(a.pending, c.Release...)
			}
			a.mu.Unlock()
			if !hold {
				a.release(t, c.Release)
			}
		}
	}()
	return a
}

// release checkpoints (here: nothing to write) and hands the ranges over.
func (a *app) release(t testing.TB, rs []Owned) {
	for _, o := range rs {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := a.m.Release(ctx, o.Range)
		cancel()
		if errors.Is(err, ErrNotMoving) || errors.Is(err, ErrClosed) {
			continue // the move was replanned, or the member stopped
		}
		if err != nil {
			// The member asks again (or reports the range lost).
			t.Logf("%s: release %v: %v", a.m.ID(), o.Range, err)
			continue
		}
		a.mu.Lock()
		a.released = append(a.released, o)
		for kg := o.Lo; kg < o.Hi; kg++ {
			// Only what moved: part of the range may have been replanned
			// to stay.
			if _, still := a.m.Epoch(o.Sub, kg); !still {
				delete(a.owned, kgKey{o.Sub, kg})
			}
		}
		a.mu.Unlock()
	}
}

func (a *app) snapshot() map[kgKey]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[kgKey]uint64, len(a.owned))
	for k, v := range a.owned {
		out[k] = v
	}
	return out
}

func (a *app) lostCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, o := range a.lost {
		n += o.Len()
	}
	return n
}

type fixture struct {
	tb  testing.TB
	c   *natscluster.Cluster
	js  jetstream.JetStream
	job string
	ttl time.Duration
	// subs every member is given (testSubs when nil).
	subs []SubTopology
}

func newFixture(t *testing.T, c *natscluster.Cluster, job string, ttl time.Duration) *fixture {
	js, err := jetstream.New(c.Connect())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{tb: t, c: c, js: js, job: job, ttl: ttl}
}

// join starts a member on its own connection (as a separate process would
// have) and its app.
func (f *fixture) join(id string) *app {
	f.tb.Helper()
	a, err := f.joinErr(id)
	if err != nil {
		f.tb.Fatal(err)
	}
	return a
}

// joinErr is join for a goroutine of the test's: it returns the error.
func (f *fixture) joinErr(id string) (*app, error) {
	js, err := jetstream.New(f.c.Connect())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := Join(ctx, js, Config{Job: f.job, Member: id, SubTopologies: f.subTopologies(), LeaseTTL: f.ttl, Replicas: 3, Log: testLog()})
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", id, err)
	}
	f.tb.Cleanup(m.Close)
	return runApp(f.tb, m), nil
}

func (f *fixture) subTopologies() []SubTopology {
	if f.subs == nil {
		return testSubs
	}
	return f.subs
}

func (f *fixture) assignment() (Assignment, uint64) {
	f.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := f.js.KeyValue(ctx, Bucket(f.job))
	if err != nil {
		f.tb.Fatal(err)
	}
	e, err := kv.Get(ctx, keyAssignment)
	if err != nil {
		return Assignment{}, 0
	}
	a, err := decodeAssignment(e.Value())
	if err != nil {
		f.tb.Fatal(err)
	}
	return a, e.Revision()
}

// settled waits until the apps own every key group exactly once, split
// evenly (within one), each with the assignment's epoch and nothing in
// handoff.
func (f *fixture) settled(apps ...*app) {
	f.tb.Helper()
	wait.Until(f.tb, settleTimeout, "the group to settle", func() error {
		a, _ := f.assignment()
		seen := map[kgKey]string{}
		var counts []string
		lo, hi := 1<<30, 0
		for _, ap := range apps {
			own := ap.snapshot()
			lo, hi = min(lo, len(own)), max(hi, len(own))
			counts = append(counts, fmt.Sprintf("%s=%d", ap.m.ID(), len(own)))
			for k, e := range own {
				if prev, ok := seen[k]; ok {
					return fmt.Errorf("%v owned by %s and %s", k, prev, ap.m.ID())
				}
				seen[k] = ap.m.ID()
				if got, want := e, epochOf(a, k); got != want {
					return fmt.Errorf("%s holds %v at epoch %d, assignment says %d", ap.m.ID(), k, got, want)
				}
			}
		}
		for _, o := range a.Ranges {
			if o.Next != "" {
				return fmt.Errorf("%v still moving %s → %s", o.Range, o.Owner, o.Next)
			}
		}
		total := 0
		for _, s := range f.subTopologies() {
			total += s.KeyGroups
		}
		if len(seen) != total || hi-lo > 1 {
			return fmt.Errorf("owned %d of %d: %s", len(seen), total, strings.Join(counts, " "))
		}
		return nil
	})
}

var settleTimeout = 60 * time.Second

func epochOf(a Assignment, k kgKey) uint64 {
	for _, o := range a.Ranges {
		if o.Sub == k.sub && k.kg >= o.Lo && k.kg < o.Hi {
			return o.Epoch
		}
	}
	return 0
}

func coordinatorOf(apps ...*app) *app {
	for _, a := range apps {
		if a.m.IsCoordinator() {
			return a
		}
	}
	return nil
}

// TestGroup runs the group's membership cases on one three-node cluster,
// each case with its own job (bucket).
// cluster runs the tests on a three-node nats-server cluster: leases of
// seconds that a machine loaded by other test packages stretches, so they
// run alone; .ci/run runs them.
var cluster = flag.Bool("cairn.cluster", false, "run the group's tests on a three-node nats-server cluster (about 2 minutes); .ci/run runs them alone")

func needCluster(t *testing.T) {
	t.Helper()
	if !*cluster {
		t.Skip("a group test on a three-node cluster: run with -cairn.cluster (.ci/run does)")
	}
}

func TestGroup(t *testing.T) {
	needCluster(t)
	c := natscluster.Start(t)
	const ttl = 2 * time.Second

	t.Run("FormAndSplit", func(t *testing.T) {
		f := newFixture(t, c, "form", ttl)
		a, b, d := f.join("a"), f.join("b"), f.join("c")
		f.settled(a, b, d)
		if n := a.lostCount() + b.lostCount() + d.lostCount(); n != 0 {
			t.Fatalf("%d key groups lost while forming", n)
		}
		// Stored R3.
		s, err := f.js.Stream(context.Background(), "KV_"+Bucket("form"))
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().Config.Replicas != 3 {
			t.Fatalf("bucket replicas %d", s.CachedInfo().Config.Replicas)
		}
		// What `cairn group status` would show.
		st, err := ReadStatus(context.Background(), f.js, "form")
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, m := range st.Members {
			total += m.KeyGroups
		}
		if len(st.Members) != 3 || total != 128 || st.Coordinator == "" || len(st.Orphaned) != 0 || st.AssignmentRevision == 0 {
			t.Fatalf("status: %+v", st)
		}
		if _, err := ReadStatus(context.Background(), f.js, "nosuchjob"); !errors.Is(err, ErrNoGroup) {
			t.Fatalf("status of a job without a group: %v", err)
		}
	})

	t.Run("StartTogether", func(t *testing.T) {
		// Members that start at once all create the group's bucket: one
		// create, and each joins (a create followed by an update of the
		// bucket's stream used to hang on the cluster).
		f := newFixture(t, c, "together", ttl)
		apps := make([]*app, 3)
		var wg sync.WaitGroup
		for i, id := range []string{"a", "b", "c"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if apps[i], err = f.joinErr(id); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		f.settled(apps...)
	})

	t.Run("MemberStopsHeartbeating", func(t *testing.T) {
		f := newFixture(t, c, "crash", ttl)
		apps := []*app{f.join("a"), f.join("b"), f.join("c")}
		f.settled(apps...)
		before, _ := f.assignment()
		// Crash one that is not the coordinator (the coordinator case is
		// next).
		var victim *app
		var rest []*app
		for _, a := range apps {
			if victim == nil && !a.m.IsCoordinator() {
				victim = a
			} else {
				rest = append(rest, a)
			}
		}
		lostRanges := before.Of(victim.m.ID())
		t0 := time.Now()
		victim.m.Close()
		f.settled(rest...)
		t.Logf("takeover of a crashed member after %v (lease TTL %v)", time.Since(t0), ttl)
		if st, err := ReadStatus(context.Background(), f.js, "crash"); err != nil || len(st.Members) != 2 || len(st.Orphaned) != 0 {
			t.Fatalf("status after the crash: %+v %v", st, err)
		}
		after, _ := f.assignment()
		for _, o := range lostRanges {
			for kg := o.Lo; kg < o.Hi; kg++ {
				if e := epochOf(after, kgKey{o.Sub, kg}); e <= before.Epoch {
					t.Fatalf("%s/%d taken over at epoch %d, not above %d", o.Sub, kg, e, before.Epoch)
				}
			}
		}
	})

	t.Run("CoordinatorDies", func(t *testing.T) {
		f := newFixture(t, c, "coord", ttl)
		apps := []*app{f.join("a"), f.join("b"), f.join("c")}
		f.settled(apps...)
		old := coordinatorOf(apps...)
		if old == nil {
			t.Fatal("no coordinator")
		}
		var rest []*app
		for _, a := range apps {
			if a != old {
				rest = append(rest, a)
			}
		}
		old.m.Close()
		wait.For(t, 30*time.Second, "another member to take the coordinator lease", func() bool {
			return coordinatorOf(rest...) != nil
		})
		f.settled(rest...)
	})

	t.Run("PausedMemberRejoins", func(t *testing.T) {
		f := newFixture(t, c, "pause", ttl)
		apps := []*app{f.join("a"), f.join("b"), f.join("c")}
		f.settled(apps...)
		var victim *app
		var rest []*app
		for _, a := range apps {
			if victim == nil && !a.m.IsCoordinator() {
				victim = a
			} else {
				rest = append(rest, a)
			}
		}
		held := victim.snapshot()
		if err := victim.m.LeaseValid(); err != nil {
			t.Fatalf("lease of a live member: %v", err)
		}
		resume := victim.m.pause()
		// Its lease expires; the others take its key groups.
		f.settled(rest...)
		taken, _ := f.assignment()
		// Before its loop runs again, its engines' publishes are refused.
		if err := victim.m.LeaseValid(); !errors.Is(err, ErrLeaseLapsed) {
			t.Fatalf("lease check of a member paused past its lease: %v", err)
		}
		close(resume)
		// It finds it lost everything it held, then rejoins and gets a
		// third back, under new epochs.
		wait.For(t, 30*time.Second, "the paused member to report its key groups lost", func() bool {
			return victim.lostCount() >= len(held)
		})
		f.settled(apps...)
		if err := victim.m.LeaseValid(); err != nil {
			t.Fatalf("lease check after rejoining: %v", err)
		}
		for k, e := range victim.snapshot() {
			if e <= taken.Epoch {
				t.Fatalf("rejoined member holds %v at epoch %d, not above %d", k, e, taken.Epoch)
			}
		}
	})

	t.Run("JoinAndLeaveHandOver", func(t *testing.T) {
		f := newFixture(t, c, "handoff", ttl)
		a, b := f.join("a"), f.join("b")
		f.settled(a, b)
		// A joiner gets key groups only after their owners released them.
		a.mu.Lock()
		a.holdRelease = true
		a.mu.Unlock()
		d := f.join("c")
		wait.For(t, 30*time.Second, "a to be asked to release", func() bool {
			a.mu.Lock()
			defer a.mu.Unlock()
			return len(a.pending) > 0
		})
		time.Sleep(ttl) // several heartbeats: nothing of a's moves meanwhile
		aOwned := a.snapshot()
		for k := range d.snapshot() {
			if _, ok := aOwned[k]; ok {
				t.Fatalf("joiner holds %v before its owner released it", k)
			}
		}
		a.mu.Lock()
		a.holdRelease = false
		pending := a.pending
		a.pending = nil
		a.mu.Unlock()
		a.release(t, pending)
		f.settled(a, b, d)

		// A graceful leave hands everything over: no key group is lost.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.m.Leave(ctx); err != nil {
			t.Fatal(err)
		}
		f.settled(a, d)
		for _, ap := range []*app{a, b, d} {
			if n := ap.lostCount(); n != 0 {
				t.Fatalf("%s lost %d key groups in handoffs", ap.m.ID(), n)
			}
		}
		if err := b.m.Leave(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("second leave: %v", err)
		}
	})

	t.Run("StaleCoordinatorCannotWrite", func(t *testing.T) {
		f := newFixture(t, c, "stalecoord", ttl)
		apps := []*app{f.join("a"), f.join("b")}
		f.settled(apps...)
		old := coordinatorOf(apps...)
		if old == nil {
			t.Fatal("no coordinator")
		}
		before, rev0 := f.assignment()
		// The coordinator stalls; meanwhile its lease passes to another
		// holder (written here directly, as if it had expired and been
		// taken).
		resume := old.m.pause()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		kv, err := f.js.KeyValue(ctx, Bucket("stalecoord"))
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, keyCoordinator)
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: "$KV." + Bucket("stalecoord") + "." + keyCoordinator, Data: []byte("intruder")}
		if _, err := f.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(e.Revision()), jetstream.WithMsgTTL(ttl)); err != nil {
			t.Fatal(err)
		}
		// Waking up, its write of a plan is refused as a whole.
		plan := Rebalance(testSubs, []string{old.m.ID()}, map[string]bool{old.m.ID(): true}, Assignment{})
		b, _ := json.Marshal(plan)
		if _, err := old.m.writeAsCoordinator(ctx, b); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			t.Fatalf("stale coordinator's write: %v", err)
		}
		if after, rev := f.assignment(); rev != rev0 || !after.equal(before) {
			t.Fatalf("assignment written by a stale coordinator: revision %d → %d", rev0, rev)
		}
		if e, err := kv.Get(ctx, keyCoordinator); err != nil || string(e.Value()) != "intruder" {
			t.Fatalf("coordinator lease after the refused write: %v %v", e, err)
		}
		close(resume)
		// The intruder's lease expires; a member takes over and the group
		// goes on.
		wait.For(t, 30*time.Second, "a member to hold the coordinator lease again", func() bool {
			return coordinatorOf(apps...) != nil
		})
		apps = append(apps, f.join("c"))
		f.settled(apps...)
	})

	t.Run("CASConflictsRetried", func(t *testing.T) {
		f := newFixture(t, c, "cas", ttl)
		a, b := f.join("a"), f.join("b")
		f.settled(a, b)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		kv, err := f.js.KeyValue(ctx, Bucket("cas"))
		if err != nil {
			t.Fatal(err)
		}
		// Before each member's next assignment write, another writer
		// rewrites the assignment (same value, new revision): the write
		// conflicts and must be retried on the fresh revision.
		var mu sync.Mutex
		interfered := 0
		interfere := func() {
			mu.Lock()
			defer mu.Unlock()
			if interfered >= 4 {
				return
			}
			interfered++
			e, err := kv.Get(ctx, keyAssignment)
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := kv.Update(ctx, keyAssignment, e.Value(), e.Revision()); err != nil {
				t.Error(err)
			}
		}
		a.m.beforeWrite, b.m.beforeWrite = interfere, interfere
		d := f.join("c")
		f.settled(a, b, d)
		conflicts := a.m.Stats().Conflicts + b.m.Stats().Conflicts
		if interfered == 0 || conflicts == 0 {
			t.Fatalf("interfered %d times, %d conflicts seen", interfered, conflicts)
		}
		t.Logf("%d interfering writes, %d conflicts retried", interfered, conflicts)
	})
}

// TestGroupNATSNodeKilled kills the node leading the group's KV stream and
// brings it back: the group keeps its assignment, nobody loses key groups,
// and a member crash afterwards is taken over as usual.
func TestGroupNATSNodeKilled(t *testing.T) {
	needCluster(t)
	c := natscluster.Start(t)
	// Longer than a leader election on a loaded machine (several seconds).
	const ttl = 12 * time.Second
	f := newFixture(t, c, "nodekill", ttl)
	apps := []*app{f.join("a"), f.join("b"), f.join("c")}
	f.settled(apps...)
	before, _ := f.assignment()

	stream := "KV_" + Bucket("nodekill")
	leader := c.WaitStreamLeader(f.js, stream, -1, 30*time.Second)
	t0 := time.Now()
	c.Kill(leader)
	c.WaitStreamLeader(f.js, stream, leader, 60*time.Second)
	t.Logf("new KV leader after %v", time.Since(t0))
	// Heartbeats go through: every lease renewed after the election.
	time.Sleep(ttl)
	c.Restart(leader)
	f.settled(apps...)
	after, _ := f.assignment()
	if !after.equal(before) {
		t.Fatalf("assignment changed across the node kill:\n%+v\n%+v", before, after)
	}
	for _, a := range apps {
		if n := a.lostCount(); n != 0 {
			t.Fatalf("%s lost %d key groups", a.m.ID(), n)
		}
	}
	// The group still acts: a member crash is taken over.
	apps[0].m.Close()
	f.settled(apps[1:]...)
	ids := []string{apps[1].m.ID(), apps[2].m.ID()}
	sort.Strings(ids)
	t.Logf("after the node kill, %v took over a crashed member", ids)
}

// TestGroupBucketNoPeers asks the three-node cluster for a bucket of five
// replicas: the server's refusal is the one a member waits through
// (engine.NoPeers), and the wait ends with the member's context, naming
// the refusal.
func TestGroupBucketNoPeers(t *testing.T) {
	needCluster(t)
	c := natscluster.Start(t)
	js, err := jetstream.New(c.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = Join(ctx, js, Config{Job: "nopeers", Member: "a", SubTopologies: testSubs, LeaseTTL: 2 * time.Second, Replicas: 5, Log: testLog()})
	if !engine.NoPeers(err) || !strings.Contains(err.Error(), "no suitable peers") {
		t.Fatalf("join asking 5 replicas of 3 nodes: %v, want the cluster's no-peers refusal", err)
	}
}
