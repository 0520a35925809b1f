package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/state"
)

// Emit latest (Config.Emit): the trace testdata/trace-transactional-latest
// shows the coalesced outputs step by step; the tests here check them
// against a model over seeded random runs with crashes at every point of
// a transactional checkpoint, and pin the coalesced outbox's format.

// TestEmitLatestModel runs a keyed count with transactional delivery and
// emit latest over a Zipf-like input, with checkpoints, crashes before a
// commit, crashes between a commit and its publish, crashes in the middle
// of a publish and restarts on other slot counts, then a graceful stop.
// The output log must be exactly the model: per key group, for each
// checkpoint interval of the history that survived, in key order, each
// key's count and time at the interval's end, with the output indexes
// 1, 2, 3, ... Seeded: CAIRN_LATEST_SEED reruns a failure.
func TestEmitLatestModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CAIRN_LATEST_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			s := seed + uint64(round)
			t.Logf("seed %d (rerun: CAIRN_LATEST_SEED=%d go test ./engine -run 'TestEmitLatestModel/%d' -count=1)", s, s-uint64(round), round)
			runLatestModel(t, rand.New(rand.NewPCG(s, 15)))
		})
	}
}

func runLatestModel(t *testing.T, rng *rand.Rand) {
	r := newLatestRun(t, rng)
	defer r.close()
	r.start(1 + rng.IntN(3))
	kinds := map[string]int{}
	for step := 0; step < 14 || kinds["publish-crash"] == 0 || kinds["commit-crash"] == 0 || kinds["overlap"] == 0; step++ {
		r.publish(1 + rng.IntN(40))
		switch p := rng.IntN(10); {
		case p < 2:
			r.checkpoint()
			kinds["checkpoint"]++
		case p < 4:
			r.overlap(1+rng.IntN(40), rng.IntN(3) == 0)
			kinds["overlap"]++
		case p < 5:
			r.crash()
			kinds["crash"]++
		case p < 7:
			r.commitCrash()
			kinds["commit-crash"]++
		default:
			if r.publishCrash() {
				kinds["publish-crash"]++
			} else {
				kinds["checkpoint"]++
			}
		}
		if r.e == nil {
			r.start(1 + rng.IntN(3))
		}
	}
	r.publish(1 + rng.IntN(40))
	r.stop()
	t.Logf("%d inputs, %d outputs; %v", len(r.keys), r.outputs(), kinds)
	r.verify()
}

// latestRun drives one engine after another over one log and one store,
// and keeps the model: the input and the checkpoint barriers of the
// history that survived the crashes.
type latestRun struct {
	t   *testing.T
	rng *rand.Rand
	log *faultLog
	tr  *tracer // the store, restore and committer of the trace tests

	e      *Engine
	cancel context.CancelFunc
	done   chan error
	// gate, when set, holds every commit until it is closed.
	gateMu sync.Mutex
	gate   chan struct{}

	keys []string // input seq i+1 has key keys[i] and time i+1
	// barriers are the source seqs of the checkpoints whose outbox is
	// (or, once committed, will be) published; committed of them are.
	barriers  []uint64
	committed int
}

func newLatestRun(t *testing.T, rng *rand.Rand) *latestRun {
	log := &faultLog{MemLog: NewMemLog(0), left: -1}
	return &latestRun{t: t, rng: rng, log: log, tr: &tracer{t: t, b: log.MemLog, store: t.TempDir(), kgs: 8}}
}

func (r *latestRun) close() {
	if r.e != nil {
		r.crash()
	}
}

func (r *latestRun) start(slots int) {
	data := r.t.TempDir()
	_, startSeq := r.tr.restore(data, slots)
	r.tr.com = &traceCommitter{store: r.tr.store}
	r.log.com = r.tr.com
	cfg := Config{
		Job: "latest", KeyGroups: r.tr.kgs, Slots: slots,
		InputStream: "IN", InputSubjects: []string{"in.>"},
		Stages:       []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
		OutputStream: "OUT", OutputSubject: "out", Delivery: Transactional, Emit: EmitLatest,
		DataDir: data, StartSeq: startSeq, BatchSize: 1 + r.rng.IntN(8),
		Checkpoint:              &CheckpointConfig{Interval: time.Hour, Committer: gatedCommitter{r}},
		Logger:                  quietLogger(),
		Now:                     func() time.Time { return time.Unix(0, 0) },
		ProcessingTimerInterval: time.Hour,
		TTLSweepInterval:        time.Hour,
	}
	e, err := NewWithBroker(cfg, r.log)
	if err != nil {
		r.t.Fatal(err)
	}
	e.SetNextCheckpointID(r.tr.com.next())
	ctx, cancel := context.WithCancel(context.Background())
	r.e, r.cancel, r.done = e, cancel, make(chan error, 1)
	go func() { r.done <- e.Run(ctx) }()
}

// publish appends n records with Zipf-like keys (a few hot ones).
func (r *latestRun) publish(n int) {
	msgs := make([]Message, n)
	for i := range msgs {
		k := fmt.Sprintf("k%d", int(math.Pow(r.rng.Float64(), 3)*24))
		seq := len(r.keys) + 1
		r.keys = append(r.keys, k)
		msgs[i] = Message{Subject: "in." + k, Header: nats.Header{}, Data: []byte(k), TsNanos: int64(seq) * int64(time.Millisecond)}
	}
	r.log.Append(msgs...)
}

func (r *latestRun) waitProcessed() {
	want := r.log.LastSeq()
	deadline := time.Now().Add(20 * time.Second)
	for r.e.Stats().ProcessedSeq < want {
		if time.Now().After(deadline) {
			r.t.Fatalf("input not processed through seq %d within 20s", want)
		}
		select {
		case err := <-r.done:
			r.t.Fatalf("the job stopped: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
}

// gatedCommitter is the run's committer: the trace committer, behind the
// run's gate.
type gatedCommitter struct{ r *latestRun }

func (c gatedCommitter) Commit(ctx context.Context, b Barrier) error {
	c.r.gateMu.Lock()
	g := c.r.gate
	c.r.gateMu.Unlock()
	if g != nil {
		<-g
	}
	return c.r.tr.com.Commit(ctx, b)
}

func (r *latestRun) setGate(g chan struct{}) {
	r.gateMu.Lock()
	r.gate = g
	r.gateMu.Unlock()
}

// trigger takes a checkpoint after every input and waits for its end.
func (r *latestRun) trigger() CheckpointEvent {
	r.waitProcessed()
	id, ok := r.e.TriggerCheckpoint(context.Background(), CheckpointRequest{})
	if !ok {
		r.t.Fatal("a checkpoint is in flight")
	}
	return r.await(id)
}

// await waits for checkpoint id's end and notes its barrier.
func (r *latestRun) await(id uint64) CheckpointEvent {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ev, err := r.e.WaitCheckpoint(ctx, id)
	if err != nil {
		r.t.Fatalf("checkpoint %d: %v", id, err)
	}
	r.barriers = append(r.barriers, ev.SourceSeq)
	return ev
}

// checkpoint commits a checkpoint and waits for its outbox to be published.
func (r *latestRun) checkpoint() {
	ev := r.trigger()
	if ev.Err != nil {
		// Not committed, but the job goes on: its epoch is published with
		// the next commit (the barrier stays in the model).
		r.t.Logf("checkpoint %d failed: %v", ev.ID, ev.Err)
		return
	}
	r.committed = len(r.barriers)
	r.awaitPublished(ev.ID)
}

func (r *latestRun) awaitPublished(id uint64) {
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range r.e.slots {
		for s.outboxThrough.Load() < id {
			if time.Now().After(deadline) {
				r.t.Fatalf("slot %d did not publish the outbox of checkpoint %d", s.idx, id)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// overlap takes a checkpoint whose commit waits until n more records were
// processed after its barrier (they go to the next epoch while the
// sealed one waits), then commits it, or (crash) crashes after the commit
// before the job learns of it.
func (r *latestRun) overlap(n int, crash bool) {
	r.waitProcessed()
	gate := make(chan struct{})
	r.setGate(gate)
	id, ok := r.e.TriggerCheckpoint(context.Background(), CheckpointRequest{})
	if !ok {
		r.t.Fatal("a checkpoint is in flight")
	}
	r.publish(n)
	r.waitProcessed()
	if crash {
		r.tr.com.mu.Lock()
		r.tr.com.failAfterCommit = true
		r.tr.com.mu.Unlock()
	}
	r.setGate(nil)
	close(gate)
	ev := r.await(id)
	if crash != (ev.Err != nil) {
		r.t.Fatalf("checkpoint %d: %v", id, ev.Err)
	}
	r.committed = len(r.barriers)
	if crash {
		r.crash()
		return
	}
	r.awaitPublished(id)
}

// crash stops the job with no commit after the last one: the barriers
// since it are lost with the state.
func (r *latestRun) crash() {
	r.tr.com.crash()
	r.cancel()
	err := <-r.done
	r.e = nil
	if err != nil && !errors.Is(err, ErrFinalCheckpoint) {
		r.t.Fatalf("crash: %v", err)
	}
	r.barriers = r.barriers[:r.committed]
}

// commitCrash commits a checkpoint in the store and crashes before the job
// learns of it: nothing of its outbox is published.
func (r *latestRun) commitCrash() {
	r.tr.com.mu.Lock()
	r.tr.com.failAfterCommit = true
	r.tr.com.mu.Unlock()
	if ev := r.trigger(); ev.Err == nil {
		r.t.Fatalf("checkpoint %d: want it committed and reported failed", ev.ID)
	}
	r.committed = len(r.barriers)
	r.crash()
}

// publishCrash commits a checkpoint and makes the publish of its outbox
// fail after a random number of its outputs: the job stops with the
// error. It reports false (and only checkpoints) when the checkpoint has
// no output to publish.
func (r *latestRun) publishCrash() bool {
	r.waitProcessed()
	from := uint64(0)
	if len(r.barriers) > 0 {
		from = r.barriers[len(r.barriers)-1]
	}
	n := len(r.coalesce(from, r.log.LastSeq()))
	if n == 0 {
		r.checkpoint()
		return false
	}
	r.log.arm(r.rng.IntN(n))
	ev := r.trigger()
	if ev.Err != nil {
		r.t.Fatalf("checkpoint %d: %v", ev.ID, ev.Err)
	}
	r.committed = len(r.barriers)
	select {
	case err := <-r.done:
		if !errors.Is(err, errInjected) {
			r.t.Fatalf("the job stopped with %v, want the injected publish error", err)
		}
	case <-time.After(20 * time.Second):
		r.t.Fatalf("the publish of checkpoint %d did not fail within 20s", ev.ID)
	}
	r.e = nil
	return true
}

func (r *latestRun) stop() {
	r.waitProcessed()
	r.cancel()
	err := <-r.done
	r.e = nil
	if err != nil {
		r.t.Fatalf("stop: %v", err)
	}
	if last := r.log.LastSeq(); len(r.barriers) == 0 || r.barriers[len(r.barriers)-1] != last {
		r.barriers = append(r.barriers, last) // the final checkpoint
	}
	r.committed = len(r.barriers)
}

// latestOut is one output of the model.
type latestOut struct {
	key   string
	value string
	time  int64
}

// coalesce is the model of one checkpoint interval (from, to]: per key
// group, its keys in key order with their count and last time at to.
func (r *latestRun) coalesce(from, to uint64) map[int][]latestOut {
	last := map[string]int64{}
	for seq := from + 1; seq <= to; seq++ {
		last[r.keys[seq-1]] = int64(seq)
	}
	keys := make([]string, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := map[int][]latestOut{}
	for _, k := range keys {
		n := 0
		for _, x := range r.keys[:to] {
			if x == k {
				n++
			}
		}
		kg := state.KeyGroup([]byte(k), r.tr.kgs)
		out[kg] = append(out[kg], latestOut{key: k, value: strconv.Itoa(n), time: last[k]})
	}
	return out
}

func (r *latestRun) outputs() int {
	n := 0
	for _, o := range r.log.Outputs() {
		n += len(o)
	}
	return n
}

// verify compares the log with the model, and checks the indexes.
func (r *latestRun) verify() {
	want := map[int][]latestOut{}
	from := uint64(0)
	for _, b := range r.barriers {
		for kg, outs := range r.coalesce(from, b) {
			want[kg] = append(want[kg], outs...)
		}
		from = b
	}
	if err := checkIndexes(r.log.MemLog); err != nil {
		r.t.Error(err)
	}
	got := r.log.Outputs()
	for kg := range r.tr.kgs {
		var g []latestOut
		for _, o := range got[kg] {
			g = append(g, latestOut{key: o.Key, value: o.Value, time: o.Time})
		}
		if !slices.Equal(g, want[kg]) {
			r.t.Errorf("key group %d: outputs\n%v\nwant (barriers at %v)\n%v", kg, g, r.barriers, want[kg])
		}
	}
}

var errInjected = errors.New("test: publish failed")

// faultLog is a MemLog whose output publishes fail once armed: after arm(n),
// n more succeed, the next fails with errInjected (and the committer
// refuses from then on, as the process it models is gone).
type faultLog struct {
	*MemLog
	mu   sync.Mutex
	left int // -1: not armed
	com  *traceCommitter
}

func (f *faultLog) arm(n int) {
	f.mu.Lock()
	f.left = n
	f.mu.Unlock()
}

func (f *faultLog) NewPublisher(target int, batched bool, fail func(error), failed <-chan struct{}) (Publisher, error) {
	p, err := f.MemLog.NewPublisher(target, batched, fail, failed)
	return &faultPublisher{Publisher: p, f: f}, err
}

type faultPublisher struct {
	Publisher
	f *faultLog
}

func (p *faultPublisher) Publish(o Output) error {
	if o.Marker {
		return p.Publisher.Publish(o) // the faults are in the outputs
	}
	f := p.f
	f.mu.Lock()
	fire := f.left == 0
	if f.left > 0 {
		f.left--
	} else if fire {
		f.left = -1
	}
	f.mu.Unlock()
	if fire {
		f.com.crash()
		return errInjected
	}
	return p.Publisher.Publish(o)
}

// TestEmitLatestOlderCheckpoint restores a checkpoint older than the
// newest one whose outbox was published (as restore.fallback or a
// savepoint may): its replay coalesces at other barriers, so its outputs
// take indexes after the stream's instead of being skipped by index. The
// indexes stay gap-free and every key's last output is its count.
func TestEmitLatestOlderCheckpoint(t *testing.T) {
	r := newLatestRun(t, rand.New(rand.NewPCG(1, 2)))
	defer r.close()
	r.start(2)
	r.publish(30)
	r.checkpoint()
	older, err := os.ReadFile(filepath.Join(r.tr.store, "NEWEST"))
	if err != nil {
		t.Fatal(err)
	}
	r.publish(30)
	r.checkpoint()
	r.publish(30)
	r.checkpoint()
	r.crash()
	// The newer checkpoints are gone from the store (a fallback past a
	// damaged one); their outputs are in the stream.
	for _, id := range []int{2, 3} {
		if err := os.RemoveAll(filepath.Join(r.tr.store, fmt.Sprintf("chk-%020d", id))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(r.tr.store, "NEWEST"), older, 0o644); err != nil {
		t.Fatal(err)
	}
	r.start(1)
	r.publish(10)
	r.stop()
	if err := checkIndexes(r.log.MemLog); err != nil {
		t.Fatal(err)
	}
	lastValue := map[string]string{}
	for _, outs := range r.log.Outputs() {
		for _, o := range outs {
			lastValue[o.Key] = o.Value
		}
	}
	counts := map[string]int{}
	for _, k := range r.keys {
		counts[k]++
	}
	for k, n := range counts {
		if lastValue[k] != strconv.Itoa(n) {
			t.Errorf("key %s: last output %q, want its count %d", k, lastValue[k], n)
		}
	}
}

// The coalesced outbox's entry fixtures (format 1 of outboxLatestKey),
// under the same RULE as the outbox's (outbox_fixture_test.go): written
// once, decoded forever; "-rewrite" writes only missing ones.
const latestFixtureDir = "testdata/format-1/outbox-latest"

var latestFixtures = []outboxFixture{
	{name: "basic", value: "17", time: 1767323045123},
	{name: "empty", value: "", time: 0},
	{name: "negative-time", value: "\x00\xff", time: -1},
	{name: "min-time", value: strings.Repeat("\xfe", 300), time: math.MinInt64}, // 10-byte varint time
}

func TestEmitLatestFixtures(t *testing.T) {
	if *rewrite {
		for _, f := range latestFixtures {
			path := filepath.Join(latestFixtureDir, f.name+".bin")
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err := os.MkdirAll(latestFixtureDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, appendLatestEntry(nil, f.time, []byte(f.value)), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", path)
		}
	}
	for _, f := range latestFixtures {
		t.Run("outbox-latest-v1/"+f.name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(latestFixtureDir, f.name+".bin"))
			if err != nil {
				t.Fatal(err)
			}
			value, tm, err := decodeLatestEntry(data)
			if err != nil {
				t.Fatalf("the committed entry no longer decodes: %v", err)
			}
			if tm != f.time || string(value) != f.value {
				t.Errorf("decoded (time %d, value %q), want (%d, %q)", tm, value, f.time, f.value)
			}
			if enc := appendLatestEntry(nil, f.time, []byte(f.value)); !bytes.Equal(enc, data) {
				t.Errorf("appendLatestEntry no longer writes format 1:\n got %x\nwant %x", enc, data)
			}
		})
	}
	// Where an entry lives is part of the format: the system stage's user
	// key "outbox-latest", the epoch as 8 bytes big-endian, the output key.
	t.Run("outbox-latest-v1/key", func(t *testing.T) {
		got := state.ValueKey(5, state.SystemStage, outboxLatestKey, appendLatestSub(nil, 7, []byte("k")))
		want := append([]byte{0x00, 0x05, 0x00, 0x01, 0x0d}, "outbox-latest"...)
		want = append(want, 0, 0, 0, 0, 0, 0, 0, 7, 'k')
		if !bytes.Equal(got, want) {
			t.Errorf("entry key %x, want %x", got, want)
		}
	})
	if _, _, err := decodeLatestEntry(nil); err == nil {
		t.Error("an empty entry decodes")
	}
}
