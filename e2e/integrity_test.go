package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/cli"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
)

// integrityJob is wordcount (split -> count) checkpointing every 200 ms,
// incrementally, to the store given.
const integrityJob = `
name: wordcount
nats: %s
input:  {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: COUNTS, subject: counts, delivery: exactly_once}
key_groups: 128
slots: 2
data_dir: %s
batch_size: 256
checkpoint: {store: "%s", interval: 200ms, mode: incremental, retain: 3}
`

// logBuffer is a log destination that tests read while the job writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startIntegrityJob starts the job in-process with its log in logs.
func startIntegrityJob(t *testing.T, natsURL, dataDir, storeURL string, logs *logBuffer) (*runtime.Running, func() error) {
	t.Helper()
	j, err := job.Parse(fmt.Appendf(nil, integrityJob, natsURL, dataDir, storeURL))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.Start(context.Background(), j, runtime.Options{}, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return r, runStarted(t, r)
}

// checkpointCovering triggers checkpoints until one covering seq committed.
func checkpointCovering(t *testing.T, r *runtime.Running, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.Engine.Stats().LastChkSeq < seq {
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint covers seq %d: %+v", seq, r.Engine.Stats())
		}
		r.Engine.TriggerCheckpoint(context.Background(), engine.CheckpointRequest{})
		time.Sleep(20 * time.Millisecond)
	}
}

// waitCommitted waits until the job has committed n checkpoints.
func waitCommitted(t *testing.T, r *runtime.Running, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok := 0
		for _, c := range r.Engine.Checkpoints() {
			if c.Err == nil {
				ok++
			}
		}
		if ok >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d checkpoints committed in a minute, want %d: %+v", ok, n, r.Engine.Checkpoints())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mergeModel adds the counts of b to a.
func mergeModel(a, b map[string]int) {
	for k, n := range b {
		a[k] += n
	}
}

// TestCorruptSharedObjectHealsOnRestart reproduces, end to end, how one
// damaged object used to spoil every later checkpoint: a shared SST of the latest checkpoint is truncated in the file store,
// and the job restarts on its intact data directory (local restore, nothing
// downloaded). The restarted job must not reference the broken object: its
// start check names it, its first checkpoint uploads it again from the
// restored state (which heals the older checkpoints too), every retained
// checkpoint verifies, and a new node with an empty data directory restores
// from the store exactly.
func TestCorruptSharedObjectHealsOnRestart(t *testing.T) {
	ctx := context.Background()
	natsURL := startNATS(t)
	_, js := connectJS(t, natsURL)
	createStream(t, js, "LINES", "lines.>")
	msgs, model := lineCorpus(21, 400, 3000)
	publishAll(t, js, msgs)
	root, data := t.TempDir(), t.TempDir()
	storeURL := "file://" + root + "?create_dir=true"

	var logsA logBuffer
	rA, stopA := startIntegrityJob(t, natsURL, data, storeURL, &logsA)
	waitProcessed(t, rA.Engine, 3000)
	checkpointCovering(t, rA, 3000)
	if err := stopA(); err != nil {
		t.Fatal(err)
	}

	store, err := checkpoint.OpenStore(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	latest, err := checkpoint.Latest(ctx, store, "wordcount")
	if err != nil {
		t.Fatal(err)
	}
	var victim checkpoint.Object
	for _, o := range latest.Objects {
		if o.Kind == checkpoint.KindSST && o.Size > victim.Size {
			victim = o
		}
	}
	if err := os.Truncate(filepath.Join(root, filepath.FromSlash(victim.Path)), victim.Size/2); err != nil {
		t.Fatal(err)
	}
	if probs, err := checkpoint.Verify(ctx, store, "wordcount", latest.ID); err != nil || len(probs) == 0 {
		t.Fatalf("the truncation is not visible to verify: %v %v", probs, err)
	}

	// Restart on the intact data directory.
	var logsB logBuffer
	rB, stopB := startIntegrityJob(t, natsURL, data, storeURL, &logsB)
	if rB.Restored == nil || rB.Restored.ID != latest.ID || rB.Restored.BytesDownloaded != 0 {
		t.Fatalf("restart did not restore checkpoint %d locally: %+v", latest.ID, rB.Restored)
	}
	// Its first checkpoint, before any new input could compact the
	// restored SSTs away, then more input.
	waitCommitted(t, rB, 1)
	more, moreModel := lineCorpus(22, 400, 1000)
	publishAll(t, js, more)
	mergeModel(model, moreModel)
	waitProcessed(t, rB.Engine, 4000)
	checkpointCovering(t, rB, 4000)
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	// Every retained checkpoint verifies, with the CLI too.
	list, err := checkpoint.List(ctx, store, "wordcount")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		var out bytes.Buffer
		if code := cli.Main([]string{"checkpoints", "verify", fmt.Sprint(e.ID), "--store", storeURL, "--job", "wordcount"}, &out, &out); code != 0 || e.Corrupt != "" {
			t.Errorf("checkpoint %d does not verify (exit %d):\n%s", e.ID, code, out.String())
		}
	}
	if probs := checkpoint.VerifyManifest(ctx, store, &checkpoint.Manifest{Objects: []checkpoint.Object{victim}}, 1); len(probs) != 0 {
		t.Errorf("the truncated object is not healed in the store: %v", probs)
	}

	logs := logsB.String()
	named := func(msg, extra string) bool {
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, msg) && strings.Contains(line, victim.Path) && strings.Contains(line, extra) {
				return true
			}
		}
		return false
	}
	if !named("checkpoint store object damaged", "found_by=start") || !named("checkpoint store object healed", "by=commit") {
		t.Fatalf("the restarted job's log does not name %s as damaged and healed:\n%s", victim.Path, logs)
	}

	// A new node restores from the store alone.
	dataC := t.TempDir()
	var logsC logBuffer
	rC, stopC := startIntegrityJob(t, natsURL, dataC, storeURL, &logsC)
	if rC.Restored == nil || rC.Restored.BytesDownloaded == 0 || rC.Restored.SourceSeq != 4000 {
		t.Fatalf("new node: restore %+v", rC.Restored)
	}
	if err := stopC(); err != nil {
		t.Fatal(err)
	}
	checkOutputs(t, js, "COUNTS", "counts", 128, model)
	checkState(t, dataC, 128, 2, model)
}

// TestGCBesideRunningJob: gc must not break a running job's checkpoints.
// `cairn checkpoints gc` runs
// again and again while the job checkpoints every 200 ms with new input
// arriving. --grace 0s is refused; at the floor, every checkpoint seen in
// the store verifies unless retention dropped it meanwhile, and so does
// every retained one at the end; the outputs are exact.
func TestGCBesideRunningJob(t *testing.T) {
	ctx := context.Background()
	natsURL := startNATS(t)
	_, js := connectJS(t, natsURL)
	createStream(t, js, "LINES", "lines.>")
	root := t.TempDir()
	storeURL := "file://" + root + "?create_dir=true"
	gc := func(grace string) (string, int) {
		var out bytes.Buffer
		code := cli.Main([]string{"checkpoints", "gc", "--grace", grace, "--store", storeURL, "--job", "wordcount"}, &out, &out)
		return out.String(), code
	}
	if out, code := gc("0s"); code == 0 || !strings.Contains(out, "safe floor") {
		t.Fatalf("gc --grace 0s: exit %d\n%s", code, out)
	}

	var logs logBuffer
	r, stop := startIntegrityJob(t, natsURL, t.TempDir(), storeURL, &logs)
	store, err := checkpoint.OpenStore(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	model := map[string]int{}
	published, gcRuns, verified := 0, 0, 0
	for i := range 25 {
		msgs, m := lineCorpus(uint64(100+i), 400, 200)
		publishAll(t, js, msgs)
		mergeModel(model, m)
		published += len(msgs)
		before := r.Engine.Stats().Checkpoints
		deadline := time.Now().Add(time.Minute)
		for r.Engine.Stats().Checkpoints == before { // a checkpoint between two gc runs
			if time.Now().After(deadline) {
				t.Fatalf("no checkpoint in a minute: %+v", r.Engine.Stats())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if out, code := gc(checkpoint.MinGCGrace.String()); code != 0 {
			t.Fatalf("gc: exit %d\n%s", code, out)
		}
		gcRuns++
		ids, err := checkpoint.ManifestIDs(ctx, store, "wordcount")
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			probs, err := checkpoint.Verify(ctx, store, "wordcount", id)
			if errors.Is(err, checkpoint.ErrNotFound) {
				continue // dropped by retention since the listing
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(probs) > 0 {
				// Retention deletes the manifest before the files: a
				// checkpoint whose manifest is still there is committed.
				if _, err := store.Stat(ctx, checkpoint.ManifestPath("wordcount", id)); err == nil {
					t.Fatalf("checkpoint %d is committed with broken objects after gc: %v", id, probs)
				}
				continue
			}
			verified++
		}
	}
	waitProcessed(t, r.Engine, uint64(published))
	checkpointCovering(t, r, uint64(published))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	list, err := checkpoint.List(ctx, store, "wordcount")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if probs, err := checkpoint.Verify(ctx, store, "wordcount", e.ID); err != nil || len(probs) > 0 {
			t.Errorf("retained checkpoint %d: %v %v", e.ID, probs, err)
		}
	}
	checkOutputs(t, js, "COUNTS", "counts", 128, model)
	t.Logf("%d gc runs beside %d checkpoints; %d checkpoint verifications clean", gcRuns, r.Engine.Stats().Checkpoints, verified)
}
