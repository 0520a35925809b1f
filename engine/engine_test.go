package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/internal/base/natsembed"
	"cairn/internal/testutil/wait"
	"cairn/state"
)

func startServer(t testing.TB) *nats.Conn {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// inputStream creates the input stream IN and publishes one message per
// key of keys (key = the last subject token), waiting for every ack.
func inputStream(t testing.TB, js jetstream.JetStream, keys []string) {
	t.Helper()
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := js.PublishAsync("in."+k, []byte("x"), jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
}

// runUntil runs e until every slot processed input through seq, then takes
// a checkpoint and stops it gracefully (which takes a final one).
func runUntil(t testing.TB, e *Engine, seq uint64) {
	t.Helper()
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(rctx) }()
	wait.For(t, time.Minute, fmt.Sprintf("input processed through seq %d", seq), func() bool { return e.Stats().ProcessedSeq >= seq })
	e.TriggerCheckpoint(context.Background(), CheckpointRequest{})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// snapCommitter checks, for every checkpoint, that the slot snapshots hold
// exactly the counts of the input up to the barrier's source sequence.
type snapCommitter struct {
	t      testing.TB
	keys   []string // key of input seq i+1
	kgs    int
	mu     sync.Mutex
	checks int
}

func (c *snapCommitter) Commit(_ context.Context, b Barrier) error {
	want := map[string]int{}
	for _, k := range c.keys[:b.SourceSeq] {
		want[k]++
	}
	got := map[string]int{}
	for _, s := range b.Slots {
		db, err := state.Open(s.Dir, state.Options{KeyGroups: c.kgs, Range: s.Range, ReadOnly: true})
		if err != nil {
			return err
		}
		for k := range want {
			kg := state.KeyGroup([]byte(k), c.kgs)
			if !s.Range.Contains(kg) {
				continue
			}
			v, ok, err := db.Get(KeyedStageID, kg, []byte(k), nil)
			if err != nil {
				db.Close()
				return err
			}
			if ok {
				got[k], _ = strconv.Atoi(string(v))
			}
		}
		db.Close()
	}
	for k, n := range want {
		if got[k] != n {
			c.t.Errorf("checkpoint %d at seq %d: key %s = %d in the snapshot, want %d", b.ID, b.SourceSeq, k, got[k], n)
		}
	}
	c.mu.Lock()
	c.checks++
	c.mu.Unlock()
	return nil
}

// TestNativeCountWithBarriers runs the native count on the real engine path
// while checkpoints are taken under load, and checks each snapshot equals
// the state at its barrier, and the final outputs.
func TestNativeCountWithBarriers(t *testing.T) {
	nc := startServer(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	const n = 20000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", (i*7919)%501)
	}
	inputStream(t, js, keys)
	com := &snapCommitter{t: t, keys: keys, kgs: 64}
	e, err := New(Config{
		Job: "native", KeyGroups: 64, Slots: 3, InputStream: "IN", OutputStream: "OUT", OutputSubject: "out",
		Stages:     []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
		DataDir:    t.TempDir(),
		BatchSize:  100,
		Checkpoint: &CheckpointConfig{Interval: 20 * time.Millisecond, Committer: com},
	}, nc)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, e, n)
	if com.checks == 0 {
		t.Fatal("no checkpoint was taken")
	}
	for _, c := range e.Checkpoints() {
		if c.Err != nil {
			t.Errorf("checkpoint %d failed: %v", c.ID, c.Err)
		}
	}
	t.Logf("%d checkpoints verified", com.checks)
	s, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	info, _ := s.Info(ctx)
	if info.State.Msgs != n {
		t.Fatalf("outputs %d, want %d", info.State.Msgs, n)
	}
}

// slowCommitter holds each commit for a while and records how far the
// slots got meanwhile.
type slowCommitter struct {
	e        *Engine
	hold     time.Duration
	mu       sync.Mutex
	advanced []uint64
}

func (c *slowCommitter) Commit(ctx context.Context, b Barrier) error {
	before := c.e.Stats().ProcessedSeq
	time.Sleep(c.hold)
	after := c.e.Stats().ProcessedSeq
	c.mu.Lock()
	c.advanced = append(c.advanced, after-before)
	c.mu.Unlock()
	return nil
}

// TestProcessingContinuesDuringUpload: while a checkpoint's asynchronous
// part runs, records keep flowing through the slots.
func TestProcessingContinuesDuringUpload(t *testing.T) {
	nc := startServer(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	com := &slowCommitter{hold: 300 * time.Millisecond}
	e, err := New(Config{
		Job: "slow", KeyGroups: 16, Slots: 2, InputStream: "IN", OutputStream: "OUT", OutputSubject: "out",
		Stages:     []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
		DataDir:    t.TempDir(),
		Checkpoint: &CheckpointConfig{Interval: 50 * time.Millisecond, Committer: com},
	}, nc)
	if err != nil {
		t.Fatal(err)
	}
	com.e = e
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(rctx) }()
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	go func() { // a steady input
		defer close(pubDone)
		for i := 0; ; i++ {
			select {
			case <-stopPub:
				return
			default:
			}
			_, _ = js.PublishAsync(fmt.Sprintf("in.k%d", i%97), []byte("x"))
			if i%100 == 0 {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}()
	wait.For(t, time.Minute, "3 checkpoints during the upload", func() bool { return len(e.Checkpoints()) >= 3 })
	close(stopPub)
	<-pubDone
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	com.mu.Lock()
	defer com.mu.Unlock()
	progressed := 0
	for _, a := range com.advanced {
		if a > 0 {
			progressed++
		}
	}
	if progressed == 0 {
		t.Fatalf("no record was processed while any of %d uploads ran: %v", len(com.advanced), com.advanced)
	}
}

// TestLeftoverLocalCheckpointIsSwept starts an engine whose data dir holds
// the local copy of a checkpoint with the id it will take next, as a process
// killed between snapshot and commit leaves it. The checkpoint must still be
// taken (it aborted with "file already exists" before the sweep), and only
// the newest committed checkpoint's local copy must stay, also over the one
// a restore kept (id 12 here).
func TestLeftoverLocalCheckpointIsSwept(t *testing.T) {
	nc := startServer(t)
	js, _ := jetstream.New(nc)
	const n = 500
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i%37)
	}
	inputStream(t, js, keys)
	dataDir := t.TempDir()
	e, err := New(Config{
		Job: "leftover", KeyGroups: 16, Slots: 2, InputStream: "IN", OutputStream: "OUT", OutputSubject: "out",
		Stages:     []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
		DataDir:    dataDir,
		Checkpoint: &CheckpointConfig{Interval: time.Hour, Committer: &snapCommitter{t: t, keys: keys, kgs: 16}},
	}, nc)
	if err != nil {
		t.Fatal(err)
	}
	e.SetNextCheckpointID(13)
	kept := e.localCheckpointDir(12)
	for _, d := range []string{filepath.Join(kept, "slot-0"), filepath.Join(e.localCheckpointDir(13), "slot-0"), filepath.Join(e.localCheckpointDir(14), "slot-1")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "MANIFEST-000001"), []byte("stale"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runUntil(t, e, n)
	cps := e.Checkpoints()
	if len(cps) == 0 {
		t.Fatal("no checkpoint was taken")
	}
	for _, c := range cps {
		if c.Err != nil {
			t.Errorf("checkpoint %d failed: %v", c.ID, c.Err)
		}
	}
	if cps[0].ID != 13 {
		t.Errorf("first checkpoint id %d, want 13", cps[0].ID)
	}
	// Only the newest committed checkpoint's local copy stays.
	entries, err := os.ReadDir(filepath.Join(dataDir, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	last := filepath.Base(e.localCheckpointDir(cps[len(cps)-1].ID))
	if len(entries) != 1 || entries[0].Name() != last {
		var names []string
		for _, ent := range entries {
			names = append(names, ent.Name())
		}
		t.Errorf("local checkpoint copies %v, want only %s", names, last)
	}
}

// failingCommitter fails its first failures commits.
type failingCommitter struct {
	mu       sync.Mutex
	failures int
	calls    int
}

var errStoreDown = errors.New("store down")

func (c *failingCommitter) Commit(context.Context, Barrier) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.calls <= c.failures {
		return errStoreDown
	}
	return nil
}

// TestFinalCheckpointRetriedThenReported: a graceful stop whose checkpoint
// fails once takes it again (with a new id) and stops cleanly; one whose
// checkpoints keep failing stops with ErrFinalCheckpoint naming the cause,
// so the process exits non-zero instead of pretending nothing replays.
func TestFinalCheckpointRetriedThenReported(t *testing.T) {
	for _, tc := range []struct {
		failures int
		wantErr  bool
	}{{1, false}, {finalAttempts, true}} {
		t.Run(fmt.Sprintf("failures-%d", tc.failures), func(t *testing.T) {
			nc := startServer(t)
			js, _ := jetstream.New(nc)
			keys := make([]string, 300)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%d", i%17)
			}
			inputStream(t, js, keys)
			com := &failingCommitter{failures: tc.failures}
			e, err := New(Config{
				Job: "final", KeyGroups: 16, Slots: 2, InputStream: "IN", OutputStream: "OUT", OutputSubject: "out",
				Stages:     []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
				DataDir:    t.TempDir(),
				Checkpoint: &CheckpointConfig{Interval: time.Hour, Committer: com},
			}, nc)
			if err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- e.Run(rctx) }()
			wait.For(t, time.Minute, "every input processed", func() bool { return e.Stats().ProcessedSeq >= uint64(len(keys)) })
			cancel()
			err = <-done
			if tc.wantErr {
				if !errors.Is(err, ErrFinalCheckpoint) || !errors.Is(err, errStoreDown) {
					t.Fatalf("Run: %v, want ErrFinalCheckpoint wrapping the store error", err)
				}
			} else if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if com.calls != tc.failures+boolInt(!tc.wantErr) {
				t.Fatalf("%d commits, want %d", com.calls, tc.failures+boolInt(!tc.wantErr))
			}
		})
	}
}

// TestFinalCheckpointCoversEverythingConsumed stops an engine while input
// streams in: the final checkpoint's source sequence must be the last
// sequence the pipeline consumed, so a restart replays nothing (before, the
// pipeline went on taking buffered messages after the final barrier).
func TestFinalCheckpointCoversEverythingConsumed(t *testing.T) {
	for round := range 3 {
		t.Run(fmt.Sprint("round-", round), func(t *testing.T) {
			nc := startServer(t)
			js, _ := jetstream.New(nc)
			keys := make([]string, 20000)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%d", i%97)
			}
			inputStream(t, js, keys)
			e, err := New(Config{
				Job: "drain", KeyGroups: 16, Slots: 2, InputStream: "IN", OutputStream: "OUT", OutputSubject: "out",
				Stages:     []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
				DataDir:    t.TempDir(),
				BatchSize:  64,
				Checkpoint: &CheckpointConfig{Interval: time.Hour, Committer: &failingCommitter{}},
			}, nc)
			if err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- e.Run(rctx) }()
			// Stop in the middle of the input, with messages buffered.
			wait.For(t, time.Minute, "a quarter of the input consumed", func() bool { return e.ConsumedSeq() >= uint64(len(keys))/4 })
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			cps := e.Checkpoints()
			if len(cps) == 0 {
				t.Fatal("no final checkpoint")
			}
			final := cps[len(cps)-1]
			if st := e.Stats(); final.SourceSeq != st.ConsumedSeq || st.ProcessedSeq != st.ConsumedSeq {
				t.Fatalf("final checkpoint at seq %d; consumed %d, processed %d", final.SourceSeq, st.ConsumedSeq, st.ProcessedSeq)
			}
		})
	}
}

func TestLatencyHistogram(t *testing.T) {
	var h latencyHist
	const now = int64(1e18)
	observe := func(ds ...time.Duration) {
		h.observeSince(now, func(yield func(int64)) {
			yield(0) // an unknown arrival is not counted
			for _, d := range ds {
				yield(now - int64(d))
			}
		})
	}
	observe(50*time.Microsecond, 300*time.Microsecond, 300*time.Microsecond, 2*time.Millisecond, 40*time.Millisecond, 90*time.Second, -time.Millisecond)
	l := h.snapshot()
	if l.Count() != 7 {
		t.Fatalf("count %d", l.Count())
	}
	// Sorted: 0, 0.05ms, 0.3, 0.3, 2, 40 ms, 90 s.
	if q := l.Quantile(0.5); q != 0.0005 {
		t.Fatalf("p50 %v, want the 0.5 ms bucket", q)
	}
	if q := l.Quantile(0.8); q != 0.05 {
		t.Fatalf("p80 %v, want the 50 ms bucket", q)
	}
	if q := l.Quantile(1); q < 60 {
		t.Fatalf("max %v, want past the last bound", q)
	}
	observe(time.Millisecond)
	d := h.snapshot().Sub(l)
	if d.Count() != 1 || d.Quantile(0.99) != 0.001 {
		t.Fatalf("delta %+v", d)
	}
}
