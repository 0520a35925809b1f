// Package e2e holds end-to-end tests of cairn with real parts: a real NATS
// server with JetStream (in-process, and a separate process), real Pebble on
// disk and the real builtin WebAssembly operators.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/base/natsembed"
	"cairn/internal/testutil/wait"
	"cairn/state"
)

// startNATS starts an embedded JetStream server for one test.
func startNATS(t testing.TB) string {
	t.Helper()
	return startNATSIn(t, t.TempDir())
}

// startNATSIn starts an embedded server whose data is in dir.
func startNATSIn(t testing.TB, dir string) string {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv.URL()
}

func connectJS(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// streamReplicas is the replica count of the streams createStream makes:
// 1, or 3 while a test runs on a three-node cluster (the tests of this
// package do not run in parallel).
var streamReplicas = 1

func createStream(t testing.TB, js jetstream.JetStream, name string, subjects ...string) {
	t.Helper()
	// A cluster just started (or loaded) may not answer a replicated
	// create within the client's 5 s, or cannot place it yet: ask again
	// for up to 30 s (a create of the same config is idempotent).
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage, Replicas: streamReplicas})
		var apiErr *jetstream.APIError
		retry := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
			(errors.As(err, &apiErr) && apiErr.ErrorCode == 10005) // no suitable peers for placement
		if err == nil {
			return
		}
		if !retry || time.Now().After(deadline) {
			t.Fatalf("create stream %s: %v", name, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// publishAll publishes msgs and waits for every ack.
//
// A publish the server refused or did not answer fails the test, naming it
// as the test's input: a model that counts an event the stream never
// stored would report the job's outputs short (seen on a three-node
// cluster electing a stream leader while a round was published).
func publishAll(t testing.TB, js jetstream.JetStream, msgs []*nats.Msg) {
	t.Helper()
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, m := range msgs {
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		t.Fatal("publishes not acknowledged")
	}
	var failed int
	var first error
	settled := time.After(30 * time.Second)
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if failed++; first == nil {
				first = fmt.Errorf("%s: %w", f.Msg().Subject, err)
			}
		case <-settled:
			t.Fatal("publishes acknowledged, but their outcomes not delivered in 30 s")
		}
	}
	if failed > 0 {
		t.Fatalf("the test's input: %d of %d publishes failed (the broker refused or lost them; not cairn's outputs): first %v", failed, len(msgs), first)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// runJob starts the job in-process and returns a stop function that stops
// it gracefully and returns Run's error.
func runJob(t testing.TB, jobYAML string) (*runtime.Running, func() error) {
	t.Helper()
	j, err := job.Parse([]byte(jobYAML))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.Start(context.Background(), j, runtime.Options{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return r, runStarted(t, r)
}

// runStarted runs a started job's engine and returns the graceful stop.
func runStarted(t testing.TB, r *runtime.Running) func() error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	var runErr error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(60 * time.Second):
				runErr = fmt.Errorf("engine did not stop within 60s")
			}
			r.Close()
		}
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// waitProcessed polls until every slot has processed input up to seq.
func waitProcessed(t testing.TB, e *engine.Engine, seq uint64) {
	t.Helper()
	wait.Until(t, 2*time.Minute, fmt.Sprintf("input processed through seq %d", seq), func() error {
		if st := e.Stats(); st.ProcessedSeq < seq {
			return fmt.Errorf("processed through %d (stats %+v)", st.ProcessedSeq, st)
		}
		return nil
	})
}

// outputs reads a whole stream and returns every message, in order.
func readStream(t testing.TB, js jetstream.JetStream, stream string, want int) []jetstream.Msg {
	t.Helper()
	return readStreamBatch(t, js, stream, want, 4096)
}

// readStreamBatch is readStream fetching at most fetch messages at a time.
func readStreamBatch(t testing.TB, js jetstream.JetStream, stream string, want, fetch int) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var total uint64
	wait.Until(t, time.Minute, fmt.Sprintf("%d messages in stream %s", want, stream), func() error {
		// Each request bounded: one lost with a node that died must not
		// take the whole wait.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := js.Stream(rctx, stream)
		if err != nil {
			return err
		}
		// A group member's claims and markers of the stream
		// (engine.FenceSubjects) are not outputs: they are neither counted
		// nor returned.
		info, err := s.Info(rctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			return err
		}
		var claims uint64
		for subj, n := range info.State.Subjects {
			if engine.IsFenceSubject(subj) {
				claims += n
			}
		}
		if int(info.State.Msgs-claims) < want {
			return fmt.Errorf("%d messages (and %d claims)", info.State.Msgs-claims, claims)
		}
		total = info.State.Msgs
		return nil
	})
	return withoutClaims(readStreamAll(t, ctx, js, stream, total, fetch))
}

// withoutClaims drops a fenced writer's claims and markers
// (engine.HeaderFence).
func withoutClaims(msgs []jetstream.Msg) []jetstream.Msg {
	out := msgs[:0]
	for _, m := range msgs {
		if m.Headers().Get(engine.HeaderFence) == "" {
			out = append(out, m)
		}
	}
	return out
}

// readStreamAll reads the total messages stream held, and any since.
func readStreamAll(t testing.TB, ctx context.Context, js jetstream.JetStream, stream string, total uint64, fetch int) []jetstream.Msg {
	t.Helper()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// Every message the stream held is read: a consumer just created on a
	// replicated stream can answer a first no-wait fetch with nothing.
	// Past those, one no-wait fetch takes what came since.
	var out []jetstream.Msg
	for {
		var batch jetstream.MessageBatch
		if uint64(len(out)) < total {
			batch, err = cons.Fetch(fetch, jetstream.FetchMaxWait(time.Second))
		} else {
			batch, err = cons.FetchNoWait(fetch)
		}
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			out = append(out, m)
			n++
		}
		if n > 0 {
			continue
		}
		if uint64(len(out)) >= total {
			return out
		}
		// Fewer than counted: a purge meanwhile (a repartition stream
		// read while its job runs) leaves nothing pending.
		if len(out) > 0 {
			if md, err := out[len(out)-1].Metadata(); err == nil && md.NumPending == 0 {
				return out
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("stream %s: read %d of the %d messages it held", stream, len(out), total)
		}
	}
}

// lastValues checks the Cairn-Out sequence of every key group (1, 2, 3, ...
// with no gap or repeat) and returns the last value per Cairn-Key.
func lastValues(t testing.TB, msgs []jetstream.Msg, subject string, keyGroups int) map[string]string {
	t.Helper()
	last := map[string]string{}
	next := map[string]uint64{}
	for _, m := range msgs {
		idx, err := strconv.ParseUint(m.Headers().Get(engine.HeaderOut), 10, 64)
		if err != nil {
			t.Fatalf("output on %s without a valid %s header: %v", m.Subject(), engine.HeaderOut, m.Headers())
		}
		if want := next[m.Subject()] + 1; idx != want {
			t.Fatalf("output index on %s: got %d, want %d", m.Subject(), idx, want)
		}
		next[m.Subject()] = idx
		key := m.Headers().Get(engine.HeaderKey)
		kg := state.KeyGroup([]byte(key), keyGroups)
		if want := fmt.Sprintf("%s.%d", subject, kg); m.Subject() != want {
			t.Fatalf("output of key %q on %s, want its key group's subject %s", key, m.Subject(), want)
		}
		last[key] = string(m.Data())
	}
	return last
}

// stateCounts opens every slot DB of a stopped job and returns the keyed
// stage's value (sub-key "") of each key in keys.
func stateValues(t testing.TB, dataDir string, keyGroups, slots int, keys []string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for i := range slots {
		rng := state.SlotRange(i, slots, keyGroups)
		db, err := state.Open(filepath.Join(dataDir, "state", fmt.Sprintf("slot-%d", i)), state.Options{KeyGroups: keyGroups, Range: rng, ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			kg := state.KeyGroup([]byte(k), keyGroups)
			if !rng.Contains(kg) {
				continue
			}
			v, ok, err := db.Get(engine.KeyedStageID, kg, []byte(k), nil)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				got[k] = string(v)
			}
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// checkOutputs is the output half of the invariant: the output stream holds
// exactly one message per input event counted by model (the sum of its
// counts), with gap-free Cairn-Out indexes per key group on the right
// subjects, and every key's last value is its count. It returns the keys.
func checkOutputs(t testing.TB, js jetstream.JetStream, stream, subject string, keyGroups int, model map[string]int) []string {
	t.Helper()
	total := 0
	for _, n := range model {
		total += n
	}
	out := readStream(t, js, stream, total)
	if len(out) != total {
		t.Fatalf("output stream %s holds %d messages, want exactly %d (one per input event)", stream, len(out), total)
	}
	last := lastValues(t, out, subject, keyGroups)
	keys := make([]string, 0, len(model))
	for k, n := range model {
		keys = append(keys, k)
		if last[k] != strconv.Itoa(n) {
			t.Errorf("key %q: last output %q, want %d", k, last[k], n)
		}
	}
	if len(last) != len(model) {
		t.Errorf("outputs carry %d distinct keys, want %d", len(last), len(model))
	}
	return keys
}

// checkState is the state half of the invariant: every key's value in the
// slot DBs of a stopped job equals its count.
func checkState(t testing.TB, dataDir string, keyGroups, slots int, model map[string]int) {
	t.Helper()
	keys := make([]string, 0, len(model))
	for k := range model {
		keys = append(keys, k)
	}
	st := stateValues(t, dataDir, keyGroups, slots, keys)
	for k, n := range model {
		if st[k] != strconv.Itoa(n) {
			t.Errorf("key %q: state %q, want %d", k, st[k], n)
		}
	}
}
