package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/cli"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
)

// TestJobGraphRepartitionStreamDeleted deletes a running graph's
// repartition stream: the job stops with an error naming the stream; a
// restart refuses, naming the stream and the checkpoints that need it,
// and leaves it uncreated; a restart with --restore none then reprocesses
// the input into a fresh stream and the output is exactly the model's (the
// windows published before the deletion are skipped, not repeated). A
// stream purged outside cairn is refused the same way.
func TestJobGraphRepartitionStreamDeleted(t *testing.T) {
	// Mostly waiting on processes and servers: run beside another.
	t.Parallel()
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "LINES", "lines.>")
	data, store := t.TempDir(), "file://"+t.TempDir()+"?create_dir=true"
	j, err := job.Parse([]byte(topWordsJob(t, url, data, store, 2)))
	if err != nil {
		t.Fatal(err)
	}
	in := &lineInput{t: t, js: js, rng: rand.New(rand.NewPCG(7, 7)), step: 7}
	in.publish(600)
	ctx := context.Background()

	r, err := runtime.Start(ctx, j, runtime.Options{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitProcessed(t, r.Engine, uint64(len(in.lines)))
	wait.Until(t, time.Minute, "a checkpoint of each sub-topology after the input", func() error {
		for _, s := range r.SubTopologies() {
			if st := s.Engine.Stats(); st.Checkpoints < 2 || st.ProcessedSeq == 0 {
				return fmt.Errorf("%s: %+v", s.Job.Name, st)
			}
		}
		return nil
	})
	if err := js.DeleteStream(ctx, "CAIRN_RP_TOPWORDS_1"); err != nil {
		t.Fatal(err)
	}
	in.publish(200)
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the job kept running for a minute without its repartition stream")
	}
	r.Close()
	if !errors.Is(runErr, engine.ErrStreamDeleted) || !strings.Contains(runErr.Error(), "CAIRN_RP_TOPWORDS_1") {
		t.Fatalf("run error %v, want ErrStreamDeleted naming the repartition stream", runErr)
	}
	t.Logf("running job stopped: %v", runErr)

	// A restart refuses and creates nothing.
	_, err = runtime.Start(ctx, j, runtime.Options{}, testLogger(t))
	var re *runtime.RepartitionError
	if !errors.As(err, &re) || re.Stream != "CAIRN_RP_TOPWORDS_1" {
		t.Fatalf("restart: %v, want a RepartitionError naming the stream", err)
	}
	t.Logf("restart refused: %v", err)
	if _, err := js.Stream(ctx, "CAIRN_RP_TOPWORDS_1"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("the refused restart left the stream behind: %v", err)
	}

	// --restore none: everything again from the first input message.
	r, err = runtime.Start(ctx, j, runtime.Options{Restore: "none"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done = make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	waitProcessed(t, r.Engine, uint64(len(in.lines)))
	in.closeWindows()
	model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
	waitTopWindows(t, js, model, time.Minute, nil)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.Close()
	checkTopWords(t, js, model)

	// Purged outside cairn while stopped: the key groups' last messages
	// (the restored upstream's skip points) are gone, so a restart refuses.
	st, err := js.Stream(ctx, "CAIRN_RP_TOPWORDS_1")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = runtime.Start(ctx, j, runtime.Options{}, testLogger(t))
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "purged outside cairn") {
		t.Fatalf("restart after an outside purge: %v, want a RepartitionError", err)
	}
}

// TestJobGraphSavepoint stops a graph with a savepoint, runs it on (its
// repartition stream purged after commits, but never past what the
// downstream's savepoint reads from), then restores the savepoint: every
// window exact, each once. cairn savepoint ls and rm cover both
// sub-topologies.
func TestJobGraphSavepoint(t *testing.T) {
	js, j, storeURL := topWordsSetup(t)
	in := &lineInput{t: t, js: js, rng: rand.New(rand.NewPCG(9, 9)), step: 7}
	ctx := context.Background()
	run := func(ro runtime.Options, until func(r *runtime.Running)) { t.Helper(); runUntil(t, j, ro, until) }
	drained := func(r *runtime.Running) {
		waitProcessed(t, r.Engine, uint64(len(in.lines)))
		wait.Until(t, time.Minute, "the downstream at the stream's end", func() error {
			st := r.Downstream[0].Engine.Stats()
			info, err := mustStream(t, js, "CAIRN_RP_TOPWORDS_1").Info(ctx)
			if err != nil || st.ProcessedSeq < info.State.LastSeq-100 || st.Checkpoints < 5 {
				return fmt.Errorf("downstream %+v, stream %v", st, err)
			}
			return nil
		})
	}

	in.publish(400)
	run(runtime.Options{SavepointOnStop: "sp1"}, drained)
	store, err := checkpoint.OpenStore(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	sps, err := checkpoint.ListSavepointInfo(ctx, store, "topwords.s1")
	if err != nil || len(sps) != 1 {
		t.Fatalf("downstream savepoints %v: %v", sps, err)
	}
	pin := sps[0].SourceSeq + 1

	// Run on: commits purge the stream, but not past the savepoint's
	// position.
	in.publish(800)
	run(runtime.Options{}, func(r *runtime.Running) {
		drained(r)
		wait.Until(t, time.Minute, "a purge up to the savepoint's position", func() error {
			info, err := mustStream(t, js, "CAIRN_RP_TOPWORDS_1").Info(ctx)
			if err != nil || info.State.FirstSeq < pin {
				return fmt.Errorf("first sequence %d, pin %d (%v)", info.State.FirstSeq, pin, err)
			}
			return nil
		})
	})
	if info, _ := mustStream(t, js, "CAIRN_RP_TOPWORDS_1").Info(ctx); info.State.FirstSeq != pin {
		t.Fatalf("stream purged to %d, past the savepoint's position %d", info.State.FirstSeq, pin)
	}

	var out, errb bytes.Buffer
	if code := cli.Main([]string{"savepoint", "ls", "--store", storeURL, "--job", "topwords"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "SUB-TOPOLOGY 1: topwords.s1") || strings.Count(out.String(), "sp1") != 2 {
		t.Fatalf("savepoint ls: %d\n%s%s", code, out.String(), errb.String())
	}

	// Back to the savepoint: the outputs since are regenerated and skipped.
	run(runtime.Options{Restore: "savepoint:sp1"}, func(r *runtime.Running) {
		if r.Restored == nil || r.Restored.Savepoint != "sp1" || r.Downstream[0].Restored == nil || r.Downstream[0].Restored.Savepoint != "sp1" {
			t.Fatalf("restored %+v / %+v, want savepoint sp1 in both", r.Restored, r.Downstream[0].Restored)
		}
		waitProcessed(t, r.Engine, uint64(len(in.lines)))
		in.closeWindows()
		model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
		waitTopWindows(t, js, model, time.Minute, nil)
	})
	checkTopWords(t, js, topWordsModel(in.lines, in.times, in.times[len(in.times)-1]))

	out.Reset()
	if code := cli.Main([]string{"savepoint", "rm", "sp1", "--store", storeURL, "--job", "topwords"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "removed savepoint sp1 of topwords.s1") {
		t.Fatalf("savepoint rm: %d\n%s%s", code, out.String(), errb.String())
	}
}

func mustStream(t *testing.T, js jetstream.JetStream, name string) jetstream.Stream {
	t.Helper()
	st, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestJobGraphCheckpoints checks the graph checkpoints of a running graph:
// each names a committed checkpoint of both sub-topologies, older ones go
// with the checkpoints retention drops, and `checkpoints ls|show|verify`
// show them. Restoring the oldest one with --restore ID restores each
// sub-topology's part of it (a point older than both chains' newest), and
// the output is still every window exactly once. An id that names no graph
// checkpoint is refused before anything is restored.
func TestJobGraphCheckpoints(t *testing.T) {
	js, j, storeURL := topWordsSetup(t)
	in := &lineInput{t: t, js: js, rng: rand.New(rand.NewPCG(11, 11)), step: 7}
	ctx := context.Background()
	store, err := checkpoint.OpenStore(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	graphs := func() []*checkpoint.GraphManifest {
		t.Helper()
		gs, bad, err := checkpoint.ListGraphs(ctx, store, "topwords")
		if err != nil || len(bad) > 0 {
			t.Fatalf("graph checkpoints: %v %v", err, bad)
		}
		return gs
	}
	run := func(ro runtime.Options, until func(r *runtime.Running)) { t.Helper(); runUntil(t, j, ro, until) }

	in.publish(500)
	var oldest *checkpoint.GraphManifest
	index := &graphIndexCheck{job: "topwords"}
	run(runtime.Options{WrapStore: index.wrap}, func(r *runtime.Running) {
		waitProcessed(t, r.Engine, uint64(len(in.lines)))
		// Retention (3 per chain) drops checkpoints: wait until graph
		// checkpoints have outlived some.
		wait.Until(t, time.Minute, "graph checkpoints after retention dropped some", func() error {
			if gs, c := graphs(), r.Writer.Committed(); len(gs) < 2 || len(c) == 0 || c[0].ID < 4 {
				return fmt.Errorf("%d graph checkpoints, %d checkpoints", len(gs), len(c))
			}
			return nil
		})
		// What the dashboard and /api/stats show: the newest committed here.
		if g := r.GraphCheckpoint(); g == nil || g.ID < graphs()[0].ID || len(g.Parts) != 2 {
			t.Fatalf("the running job's graph checkpoint: %+v", g)
		}
	})
	// At every drop, no graph checkpoint named the checkpoint going: a kill
	// at any moment leaves none that --restore would refuse.
	if drops, bad := index.result(); drops == 0 || len(bad) > 0 {
		t.Fatalf("%d checkpoints dropped; graph checkpoints still naming one as its manifest was deleted: %v", drops, bad)
	}
	// Stopped: each graph checkpoint left names checkpoints that exist, and
	// those naming dropped ones are gone.
	first, err := checkpoint.ManifestIDs(ctx, store, "topwords")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range graphs() {
		if g.ID < first[0] {
			t.Errorf("graph checkpoint %d kept, though retention dropped checkpoint %d of topwords (oldest kept: %d)", g.ID, g.ID, first[0])
		}
		for _, p := range g.Parts {
			if _, err := checkpoint.Load(ctx, store, p.Name, p.Checkpoint); err != nil {
				t.Errorf("graph checkpoint %d names %s:%d: %v", g.ID, p.Name, p.Checkpoint, err)
			}
		}
	}
	gs := graphs()
	oldest = gs[0]
	newest := gs[len(gs)-1]
	if p := oldest.Parts[1]; p.Name != "topwords.s1" || oldest.Parts[0].Checkpoint != oldest.ID || oldest.ID == newest.ID ||
		oldest.Parts[1].Checkpoint >= newest.Parts[1].Checkpoint {
		t.Fatalf("graph checkpoints %+v ... %+v: want the oldest before the newest in both parts", oldest, newest)
	}

	var out, errb bytes.Buffer
	id := fmt.Sprint(oldest.ID)
	if code := cli.Main([]string{"checkpoints", "ls", "--store", storeURL, "--job", "topwords"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "GRAPH CHECKPOINTS") || !strings.Contains(out.String(), fmt.Sprintf("topwords.s1:%d", oldest.Parts[1].Checkpoint)) {
		t.Fatalf("checkpoints ls: %d\n%s%s", code, out.String(), errb.String())
	}
	t.Logf("checkpoints ls:\n%s", out.String())
	out.Reset()
	if code := cli.Main([]string{"checkpoints", "show", id, "--store", storeURL, "--job", "topwords"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "graph checkpoint "+id+" (") || !strings.Contains(out.String(), fmt.Sprintf("topwords.s1: checkpoint %d ", oldest.Parts[1].Checkpoint)) {
		t.Fatalf("checkpoints show: %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := cli.Main([]string{"checkpoints", "verify", id, "--store", storeURL, "--job", "topwords"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "graph checkpoint "+id+" (topwords:"+id+", topwords.s1:") {
		t.Fatalf("checkpoints verify: %d\n%s%s", code, out.String(), errb.String())
	}

	// An id that names no graph checkpoint: refused, nothing restored.
	if _, err := runtime.Start(ctx, j, runtime.Options{Restore: "999999"}, testLogger(t)); err == nil || !strings.Contains(err.Error(), "no graph checkpoint 999999") {
		t.Fatalf("--restore 999999: %v", err)
	}

	// Back to the oldest graph checkpoint, with more input since.
	in.publish(300)
	run(runtime.Options{Restore: id}, func(r *runtime.Running) {
		for k, s := range r.SubTopologies() {
			if s.Restored == nil || s.Restored.ID != oldest.Parts[k].Checkpoint || s.Restored.SourceSeq != oldest.Parts[k].SourceSeq {
				t.Fatalf("%s restored %+v, want checkpoint %d through %d", s.Job.Name, s.Restored, oldest.Parts[k].Checkpoint, oldest.Parts[k].SourceSeq)
			}
		}
		waitProcessed(t, r.Engine, uint64(len(in.lines)))
		in.closeWindows()
		model := topWordsModel(in.lines, in.times, in.times[len(in.times)-1])
		waitTopWindows(t, js, model, time.Minute, nil)
	})
	checkTopWords(t, js, topWordsModel(in.lines, in.times, in.times[len(in.times)-1]))

	// gc keeping one checkpoint per chain: the graph checkpoints naming the
	// dropped ones go too (a dry run names them first, removing nothing).
	before := graphs()
	out.Reset()
	if code := cli.Main([]string{"checkpoints", "gc", "--retain", "1", "--dry-run", "--store", storeURL, "--job", "topwords"}, &out, &errb); code != 0 ||
		len(graphs()) != len(before) {
		t.Fatalf("checkpoints gc --dry-run: %d\n%s%s", code, out.String(), errb.String())
	}
	dry := out.String()
	out.Reset()
	if code := cli.Main([]string{"checkpoints", "gc", "--retain", "1", "--store", storeURL, "--job", "topwords"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "graph checkpoints removed") {
		t.Fatalf("checkpoints gc: %d\n%s%s", code, out.String(), errb.String())
	}
	after := graphs()
	if len(after) >= len(before) || len(after) > 1 {
		t.Fatalf("gc --retain 1 left %d of %d graph checkpoints\n%s", len(after), len(before), out.String())
	}
	var removed []uint64
	for _, g := range before {
		if !slices.ContainsFunc(after, func(a *checkpoint.GraphManifest) bool { return a.ID == g.ID }) {
			removed = append(removed, g.ID)
		}
	}
	if !strings.Contains(dry, fmt.Sprintf("graph checkpoints that would be removed (a checkpoint they name would be dropped): %v", removed)) {
		t.Fatalf("the dry run did not name the graph checkpoints gc removed (%v):\n%s", removed, dry)
	}
	for _, g := range after {
		for _, p := range g.Parts {
			if _, err := checkpoint.Load(ctx, store, p.Name, p.Checkpoint); err != nil {
				t.Fatalf("after gc, graph checkpoint %d names %s:%d: %v", g.ID, p.Name, p.Checkpoint, err)
			}
		}
	}
	t.Logf("gc --retain 1: graph checkpoints %d -> %d\n%s", len(before), len(after), out.String())

	// One left naming dropped checkpoints (as an earlier version, which
	// removed them after the drop, could leave): ls says it is not
	// restorable, and gc removes it.
	stale := before[0]
	if err := checkpoint.CommitGraph(ctx, store, stale); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := cli.Main([]string{"checkpoints", "ls", "--store", storeURL, "--job", "topwords"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), fmt.Sprintf("not restorable (topwords:%d gone, topwords.s1:%d gone)", stale.Parts[0].Checkpoint, stale.Parts[1].Checkpoint)) {
		t.Fatalf("checkpoints ls with graph checkpoint %d naming dropped ones: %d\n%s%s", stale.ID, code, out.String(), errb.String())
	}
	out.Reset()
	if code := cli.Main([]string{"checkpoints", "gc", "--retain", "1", "--store", storeURL, "--job", "topwords"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), fmt.Sprintf("graph checkpoints removed (a checkpoint they name was already gone): [%d]", stale.ID)) {
		t.Fatalf("checkpoints gc with graph checkpoint %d naming dropped ones: %d\n%s%s", stale.ID, code, out.String(), errb.String())
	}
}

// graphIndexCheck wraps a job graph's checkpoint store: at every
// checkpoint manifest's delete it reads the graph checkpoints and notes
// each that still names the checkpoint going.
type graphIndexCheck struct {
	job string

	mu    sync.Mutex
	drops int
	bad   []string
}

func (c *graphIndexCheck) wrap(s checkpoint.Store) checkpoint.Store {
	return &graphIndexStore{Store: s, c: c}
}

func (c *graphIndexCheck) result() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drops, c.bad
}

type graphIndexStore struct {
	checkpoint.Store
	c *graphIndexCheck
}

var manifestName = regexp.MustCompile(`^(.+)/chk-0*([0-9]+)/MANIFEST\.json$`)

func (s *graphIndexStore) Delete(ctx context.Context, name string) error {
	if m := manifestName.FindStringSubmatch(name); m != nil {
		id, _ := strconv.ParseUint(m[2], 10, 64)
		gs, _, err := checkpoint.ListGraphs(ctx, s.Store, s.c.job)
		s.c.mu.Lock()
		s.c.drops++
		if err != nil {
			s.c.bad = append(s.c.bad, fmt.Sprintf("list graph checkpoints before dropping %s:%d: %v", m[1], id, err))
		}
		for _, g := range gs {
			if p, ok := g.Part(m[1]); ok && p.Checkpoint == id {
				s.c.bad = append(s.c.bad, fmt.Sprintf("graph checkpoint %d names %s:%d", g.ID, m[1], id))
			}
		}
		s.c.mu.Unlock()
	}
	return s.Store.Delete(ctx, name)
}

// runUntil starts job j, runs it until until returns, then stops it
// gracefully (each sub-topology takes its final checkpoint).
func runUntil(t *testing.T, j *job.Job, ro runtime.Options, until func(r *runtime.Running)) {
	t.Helper()
	ctx := context.Background()
	r, err := runtime.Start(ctx, j, ro, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	until(r)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.Close()
}

// topWordsSetup starts a NATS server with the LINES stream and parses the
// top-words graph job on it, checkpointing to a file store.
func topWordsSetup(t *testing.T) (jetstream.JetStream, *job.Job, string) {
	t.Helper()
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "LINES", "lines.>")
	storeURL := "file://" + t.TempDir() + "?create_dir=true"
	j, err := job.Parse([]byte(topWordsJob(t, url, t.TempDir(), storeURL, 2)))
	if err != nil {
		t.Fatal(err)
	}
	return js, j, storeURL
}
