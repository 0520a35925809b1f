package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
)

// graphSavepoint takes savepoint name of each sub-topology's Running in
// order, upstream first (as the savepoint action does), while they run,
// and returns the downstream's input position, +1: what the repartition
// stream must keep from.
func graphSavepoint(t *testing.T, store checkpoint.Store, name string, subs ...*runtime.Running) uint64 {
	t.Helper()
	ctx := context.Background()
	for _, r := range subs {
		if _, code, text := r.TakeCheckpoint(ctx, engine.CheckpointRequest{Savepoint: name}); code != http.StatusOK {
			t.Fatalf("savepoint %s of %s: HTTP %d %s", name, r.Job.Name, code, text)
		}
	}
	sps, err := checkpoint.ListSavepointInfo(ctx, store, "topwords.s1")
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range sps {
		if sp.Name == name {
			return sp.SourceSeq + 1
		}
	}
	t.Fatalf("savepoint %s of topwords.s1 not listed: %+v", name, sps)
	return 0
}

// TestJobGraphPurgeSavepointWhileRunning: a savepoint of the downstream
// taken while the graph runs pins its repartition stream from then on.
// The checkpoints after it purge the stream up to the savepoint's
// position and never past it, however far they go, and a restore of the
// savepoint is exact. (The pin was read only at start: later commits
// purged what a savepoint taken since needed, and its restore was
// refused.)
func TestJobGraphPurgeSavepointWhileRunning(t *testing.T) {
	js, j, storeURL := topWordsSetup(t)
	in := &lineInput{t: t, js: js, rng: rand.New(rand.NewPCG(11, 3)), step: 7}
	ctx := context.Background()
	store, err := checkpoint.OpenStore(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)

	in.publish(400)
	var pin uint64
	runUntil(t, j, runtime.Options{}, func(r *runtime.Running) {
		rp := mustStream(t, js, "CAIRN_RP_TOPWORDS_1")
		waitProcessed(t, r.Engine, uint64(len(in.lines)))
		waitCheckpoints(t, r.Downstream[0], 3)
		pin = graphSavepoint(t, store, "live", r.SubTopologies()...)
		// Run on past the savepoint: more input, more checkpoints than
		// the downstream retains.
		in.publish(800)
		waitProcessed(t, r.Engine, uint64(len(in.lines)))
		after := r.Downstream[0].Engine.Stats().Checkpoints
		waitCheckpoints(t, r.Downstream[0], after+8)
		wait.Until(t, time.Minute, "a purge up to the savepoint's position", func() error {
			info, err := rp.Info(ctx)
			if err != nil || info.State.FirstSeq < pin {
				return fmt.Errorf("first sequence %d, pin %d (%v)", info.State.FirstSeq, pin, err)
			}
			return nil
		})
		// A few more commits, each of which would purge further.
		waitCheckpoints(t, r.Downstream[0], r.Downstream[0].Engine.Stats().Checkpoints+4)
	})
	if info, _ := mustStream(t, js, "CAIRN_RP_TOPWORDS_1").Info(ctx); info.State.FirstSeq != pin {
		t.Fatalf("stream purged to %d, past the running savepoint's position %d", info.State.FirstSeq, pin)
	}

	restoreTopWords(t, js, j, in, "live")
}

// restoreTopWords runs the top-words graph j from savepoint name until
// every window of in's lines is out, then checks them: each exact, once.
func restoreTopWords(t *testing.T, js jetstream.JetStream, j *job.Job, in *lineInput, name string) {
	t.Helper()
	runUntil(t, j, runtime.Options{Restore: "savepoint:" + name}, func(r *runtime.Running) {
		if r.Downstream[0].Restored == nil || r.Downstream[0].Restored.Savepoint != name {
			t.Fatalf("downstream restored %+v, want savepoint %s", r.Downstream[0].Restored, name)
		}
		waitProcessed(t, r.Engine, uint64(len(in.lines)))
		in.closeWindows()
		waitTopWindows(t, js, topWordsModel(in.lines, in.times, in.times[len(in.times)-1]), time.Minute, nil)
	})
	checkTopWords(t, js, topWordsModel(in.lines, in.times, in.times[len(in.times)-1]))
}

// waitCheckpoints waits until r has committed n checkpoints in this run.
func waitCheckpoints(t *testing.T, r *runtime.Running, n int) {
	t.Helper()
	wait.Until(t, time.Minute, fmt.Sprintf("%d checkpoints of %s", n, r.Job.Name), func() error {
		if got := r.Engine.Stats().Checkpoints; got < n {
			return fmt.Errorf("%d", got)
		}
		return nil
	})
}

// apartSetup starts a NATS server with the LINES stream and returns the
// top-words graph's job on it (parse: each its own data directory, one
// file store for all) and a start of one of its sub-topologies in a
// runtime of its own, as a group member runs it, with the store wrapped
// by wrap when set.
func apartSetup(t *testing.T) (js jetstream.JetStream, storeURL string, parse func() *job.Job, start func(sub int, wrap func(checkpoint.Store) checkpoint.Store) (*runtime.Running, func() error)) {
	url := startNATS(t)
	_, js = connectJS(t, url)
	createStream(t, js, "LINES", "lines.>")
	storeURL = "file://" + t.TempDir() + "?create_dir=true"
	parse = func() *job.Job {
		j, err := job.Parse([]byte(topWordsJob(t, url, t.TempDir(), storeURL, 2)))
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	start = func(sub int, wrap func(checkpoint.Store) checkpoint.Store) (*runtime.Running, func() error) {
		j := parse()
		plan, err := runtime.NewPlan(j)
		if err != nil {
			t.Fatal(err)
		}
		r, err := runtime.Start(context.Background(), j, runtime.Options{Assignment: plan.Parts(sub), WrapStore: wrap}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		return r, runStarted(t, r)
	}
	return js, storeURL, parse, start
}

// TestJobGraphPurgeAcrossProcesses runs the top-words graph's two
// sub-topologies in two processes' runtimes (as two group members do:
// each its own data directory, one store), so that neither runs both ends
// of the repartition stream. The writer's process purges it anyway, from
// the reader's checkpoints and savepoints in the shared store: below the
// reader's oldest retained position, never past a savepoint the reader
// took while running; and the whole graph restored from that savepoint in
// one process is exact.
func TestJobGraphPurgeAcrossProcesses(t *testing.T) {
	js, storeURL, parse, start := apartSetup(t)
	ctx := context.Background()
	store, err := checkpoint.OpenStore(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	in := &lineInput{t: t, js: js, rng: rand.New(rand.NewPCG(12, 4)), step: 7}

	writer, stopWriter := start(0, nil)
	reader, stopReader := start(1, nil)
	if len(writer.SubTopologies()) != 1 || len(reader.SubTopologies()) != 1 || reader.Job.Name != "topwords.s1" {
		t.Fatalf("writer runs %d sub-topologies, reader %d (%s): want one each", len(writer.SubTopologies()), len(reader.SubTopologies()), reader.Job.Name)
	}
	rp := mustStream(t, js, "CAIRN_RP_TOPWORDS_1")

	in.publish(400)
	waitProcessed(t, writer.Engine, uint64(len(in.lines)))
	waitCheckpoints(t, reader, 4)
	wait.Until(t, time.Minute, "the writer's process purging the stream", func() error {
		info, err := rp.Info(ctx)
		if err != nil || info.State.FirstSeq <= 1 {
			return fmt.Errorf("first sequence %d (%v)", info.State.FirstSeq, err)
		}
		return nil
	})
	// Never past what the reader's oldest retained checkpoint reads from.
	cps, err := checkpoint.List(ctx, store, "topwords.s1")
	if err != nil || len(cps) == 0 {
		t.Fatalf("reader's checkpoints: %v %v", cps, err)
	}
	info, _ := rp.Info(ctx)
	if oldest := cps[0].SourceSeq + 1; info.State.FirstSeq > oldest {
		t.Fatalf("stream purged to %d, past the reader's oldest retained position %d", info.State.FirstSeq, oldest)
	}

	pin := graphSavepoint(t, store, "apart", writer, reader)
	in.publish(800)
	waitProcessed(t, writer.Engine, uint64(len(in.lines)))
	waitCheckpoints(t, reader, reader.Engine.Stats().Checkpoints+8)
	wait.Until(t, time.Minute, "a purge up to the savepoint's position", func() error {
		info, err := rp.Info(ctx)
		if err != nil || info.State.FirstSeq < pin {
			return fmt.Errorf("first sequence %d, pin %d (%v)", info.State.FirstSeq, pin, err)
		}
		return nil
	})
	waitCheckpoints(t, writer, writer.Engine.Stats().Checkpoints+4)
	if info, _ := rp.Info(ctx); info.State.FirstSeq != pin {
		t.Fatalf("stream purged to %d, past the reader's savepoint at %d", info.State.FirstSeq, pin)
	}
	if err := stopWriter(); err != nil {
		t.Fatal(err)
	}
	if err := stopReader(); err != nil {
		t.Fatal(err)
	}

	restoreTopWords(t, js, parse(), in, "apart")
}

// hangingStore makes every List under prefix hang, ignoring its context,
// while hang is set, until released: a store that stops answering.
type hangingStore struct {
	checkpoint.Store
	prefix  string
	mu      sync.Mutex
	hang    chan struct{} // closed to release; nil: no hang
	hanging chan struct{} // gets a value when a List starts hanging
}

func (s *hangingStore) List(ctx context.Context, prefix string, fn func(checkpoint.ObjectInfo) error) error {
	s.mu.Lock()
	hang := s.hang
	s.mu.Unlock()
	if hang != nil && strings.HasPrefix(prefix, s.prefix) {
		select {
		case s.hanging <- struct{}{}:
		default:
		}
		<-hang
	}
	return s.Store.List(ctx, prefix, fn)
}

// TestJobGraphPurgeStoreHangs: the writer's purge of a repartition stream
// whose reader runs in another process reads the reader's checkpoints
// from the store off the writer's commits. A store that stops answering
// those reads leaves the writer checkpointing; once it answers again, the
// purge goes on. (The reads ran in the commit: the writer's checkpoints
// stopped with them.)
func TestJobGraphPurgeStoreHangs(t *testing.T) {
	js, _, _, start := apartSetup(t)
	ctx := context.Background()
	in := &lineInput{t: t, js: js, rng: rand.New(rand.NewPCG(13, 5)), step: 7}
	hs := &hangingStore{prefix: "topwords.s1/", hanging: make(chan struct{}, 1)}
	writer, stopWriter := start(0, func(s checkpoint.Store) checkpoint.Store { hs.Store = s; return hs })
	reader, stopReader := start(1, nil)
	rp := mustStream(t, js, "CAIRN_RP_TOPWORDS_1")
	firstSeq := func() uint64 {
		info, err := rp.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.FirstSeq
	}

	in.publish(400)
	waitProcessed(t, writer.Engine, uint64(len(in.lines)))
	waitCheckpoints(t, reader, 4)
	wait.Until(t, time.Minute, "a first purge", func() error {
		if f := firstSeq(); f <= 1 {
			return fmt.Errorf("first sequence %d", f)
		}
		return nil
	})

	// Past the writer's first retention (its first drop lists every
	// chain once), the store stops answering the reader's listings.
	waitCheckpoints(t, writer, 8)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unhang := func() {
		releaseOnce.Do(func() {
			hs.mu.Lock()
			hs.hang = nil
			hs.mu.Unlock()
			close(release)
		})
	}
	t.Cleanup(unhang) // before the stops (cleanups run last first)
	hs.mu.Lock()
	hs.hang = release
	hs.mu.Unlock()
	<-hs.hanging
	purged := firstSeq()
	in.publish(400)
	waitProcessed(t, writer.Engine, uint64(len(in.lines)))
	waitCheckpoints(t, writer, writer.Engine.Stats().Checkpoints+5)
	if f := firstSeq(); f != purged {
		t.Fatalf("purged to %d while the store hung, from %d", f, purged)
	}

	// It answers again: the purge goes on.
	unhang()
	waitCheckpoints(t, reader, reader.Engine.Stats().Checkpoints+4)
	wait.Until(t, time.Minute, "the purge going on", func() error {
		if f := firstSeq(); f <= purged {
			return fmt.Errorf("first sequence %d, was %d", f, purged)
		}
		return nil
	})
	if err := stopWriter(); err != nil {
		t.Fatal(err)
	}
	if err := stopReader(); err != nil {
		t.Fatal(err)
	}
}
