package nexmarkq_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	nexmarkq "cairn/examples/nexmark"
	"cairn/internal/app/job"
	"cairn/internal/app/nexmarkcmd"
	"cairn/internal/app/runtime"
	"cairn/internal/base/natsembed"
	"cairn/nexmark"
	"cairn/nexmark/source"
)

// testSeed is the seed of a test's events: CAIRN_NEXMARK_SEED, else random;
// logged with the command that reruns it.
func testSeed(t *testing.T) uint64 {
	s := rand.Uint64()
	if v := os.Getenv("CAIRN_NEXMARK_SEED"); v != "" {
		s, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (rerun: CAIRN_NEXMARK_SEED=%d go test ./examples/nexmark -run '^%s$')", s, s, t.Name())
	return s
}

// events generates what the model reads.
func events(t testing.TB, cfg nexmark.Config) ([]nexmark.Event, int64) {
	g, err := nexmark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]nexmark.Event, cfg.Events)
	for n := range evs {
		g.Event(uint64(n), &evs[n])
	}
	return evs, evs[len(evs)-1].Time() - 1
}

// loadQuery loads query q's job file with the test's generator, slots and
// data directory, its outputs to the stream OUT.
func loadQuery(t testing.TB, q string, cfg nexmark.Config, slots int, dir string) *job.Job {
	t.Helper()
	b, err := nexmarkq.Job(q)
	if err != nil {
		t.Fatal(err)
	}
	j, err := job.Parse(b)
	if err != nil {
		t.Fatalf("%s.yaml: %v", q, err)
	}
	j.Input.Nexmark = &cfg
	j.Output = job.Output{Stream: "OUT", Subject: "out"}
	j.Slots = slots
	j.DataDir = dir
	j.Checkpoint = nil
	j.SetDefaults()
	if err := j.Validate(); err != nil {
		t.Fatal(err)
	}
	return j
}

// runInProcess runs query q over cfg's events on slots slots, in this
// process, its outputs into an in-memory log, and returns them as the
// model writes them. Each key group's Cairn-Out indexes must be 1, 2, ....
func runInProcess(t *testing.T, q string, cfg nexmark.Config, slots int, want int) []string {
	t.Helper()
	j := loadQuery(t, q, cfg, slots, t.TempDir())
	if len(j.Graph()) > 1 {
		return runGraph(t, j, cfg, want)
	}
	gen, err := nexmark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ml := engine.NewMemLog(0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := runtime.Start(ctx, j, runtime.Options{Broker: &source.Generated{Gen: gen, Rest: ml}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Engine.Run(ctx) }()
	stopped := false
	defer func() { // before the data directory goes, also when the test fails
		cancel()
		if !stopped {
			<-done
		}
		r.Close()
	}()
	count := func() int {
		n := 0
		for _, outs := range ml.Outputs() {
			for _, o := range outs {
				if !o.Marker {
					n++
				}
			}
		}
		return n
	}
	deadline := time.Now().Add(2 * time.Minute)
	for r.Engine.Stats().ProcessedSeq < cfg.Events || count() < want {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("the job stopped: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
		if d := ml.DeadLetters(); len(d) > 0 {
			t.Fatalf("%d dead letters, the first: %s", len(d), d[0].Header.Get(engine.HeaderError))
		}
		if time.Now().After(deadline) {
			t.Fatalf("processed %d of %d events, %d of %d outputs, in 2 minutes", r.Engine.Stats().ProcessedSeq, cfg.Events, count(), want)
		}
	}
	cancel()
	stopped = true
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if d := ml.DeadLetters(); len(d) > 0 {
		t.Fatalf("%d dead letters, the first: %s", len(d), d[0].Header.Get(engine.HeaderError))
	}
	var got []string
	for kg, outs := range ml.Outputs() {
		idx := uint64(0)
		for _, o := range outs {
			if o.Marker {
				continue
			}
			if idx++; o.Index != idx {
				t.Fatalf("key group %d: output index %d after %d", kg, o.Index, idx-1)
			}
			got = append(got, fmt.Sprintf("%s|%s|%d", o.Key, o.Value, o.Time))
		}
	}
	return sorted(got)
}

// compare fails the test with the first difference between got and want
// (both sorted), and the outputs missing and extra (one the model has once
// and got twice is extra).
func compare(t *testing.T, got, want []string) {
	t.Helper()
	if len(want) == 0 {
		t.Fatal("the model has no outputs: the test would prove nothing")
	}
	if slices.Equal(got, want) {
		return
	}
	first := ""
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			first = fmt.Sprintf("; the first difference, output %d (sorted):\n got %s\nwant %s", i, got[i], want[i])
			break
		}
	}
	count := map[string]int{}
	for _, w := range want {
		count[w]++
	}
	for _, g := range got {
		count[g]--
	}
	var missing, extra []string
	for _, w := range want {
		if count[w] > 0 {
			missing = append(missing, w)
			count[w]--
		}
	}
	for _, g := range got {
		if count[g] < 0 {
			extra = append(extra, g)
			count[g]++
		}
	}
	show := func(s []string) string { return strings.Join(s[:min(len(s), 10)], "\n  ") }
	t.Fatalf("%d outputs, the model has %d%s\n%d missing (the first 10):\n  %s\n%d extra (the first 10):\n  %s",
		len(got), len(want), first, len(missing), show(missing), len(extra), show(extra))
}

// TestQueries runs every query in process over a random seed's events on
// one or two slots and compares its outputs with the model's, exactly.
func TestQueries(t *testing.T) {
	seed := testSeed(t)
	cfg := nexmark.Config{Seed: seed, Events: 12_000, Rate: 300}
	evs, wm := events(t, cfg)
	for i, q := range nexmarkq.Queries() {
		m, ok := models[q]
		if !ok {
			t.Errorf("query %s has no model", q)
			continue
		}
		t.Run(q, func(t *testing.T) {
			want := m(evs, wm)
			got := runInProcess(t, q, cfg, 1+i%2, len(want))
			compare(t, got, want)
			t.Logf("%d outputs equal the model's", len(want))
		})
	}
}

// TestFromJetStream publishes the events with `cairn nexmark gen`'s code
// to JetStream and runs q9 (a join with timers) and q19 on that stream
// instead of the generated input: the outputs equal the model's.
func TestFromJetStream(t *testing.T) {
	seed := testSeed(t)
	srv, err := natsembed.Start(natsembed.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cfg := nexmark.Config{Seed: seed, Events: 10_000, Rate: 500}
	cfg.SetDefaults()
	if err := nexmarkcmd.Gen(context.Background(), nc, nexmarkcmd.GenConfig{Nexmark: cfg, Stream: "NEXMARK", Subject: "nexmark"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	evs, wm := events(t, cfg)
	for _, q := range []string{"q9", "q19"} {
		t.Run(q, func(t *testing.T) {
			want := models[q](evs, wm)
			j := loadQuery(t, q, cfg, 2, t.TempDir())
			j.Name += "-js"
			j.Input = job.Input{Stream: "NEXMARK", Subjects: []string{"nexmark.>"}}
			j.Output = job.Output{Stream: "OUT_" + strings.ToUpper(q), Subject: "out." + q}
			j.NATS = srv.URL()
			j.SetDefaults()
			if err := j.Validate(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, err := runtime.Start(ctx, j, runtime.Options{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Engine.Run(ctx) }()
			defer func() {
				cancel()
				<-done
				r.Close()
			}()
			deadline := time.Now().Add(2 * time.Minute)
			for r.Engine.Stats().RecordsOut < uint64(len(want)) || r.Engine.Stats().ProcessedSeq < cfg.Events {
				if time.Now().After(deadline) {
					t.Fatalf("stats %+v after 2 minutes, want %d outputs", r.Engine.Stats(), len(want))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if st := r.Engine.Stats(); st.DeadLetters > 0 {
				t.Fatalf("%d dead letters", st.DeadLetters)
			}
			got := readStream(t, srv.URL(), j.Output.Stream)
			for ; len(got) < len(want) && time.Now().Before(deadline); got = readStream(t, srv.URL(), j.Output.Stream) {
				time.Sleep(50 * time.Millisecond) // published, not yet all stored
			}
			compare(t, got, want)
			t.Logf("%d outputs equal the model's", len(want))
		})
	}
}

// TestQueriesAcrossMidnight runs the queries that keep per-day state (q15,
// q16, q17) over events that cross a UTC midnight: each key's rows of both
// days equal the model's (q17 moves an auction's row of the day before
// under a sub-key when the new day's first bid comes).
func TestQueriesAcrossMidnight(t *testing.T) {
	seed := testSeed(t)
	cfg := nexmark.Config{Seed: seed, Events: 12_000, Rate: 300, BaseTime: nexmark.DefaultBaseTime + 86_400_000 - 20_000}
	evs, wm := events(t, cfg)
	for i, q := range []string{"q15", "q16", "q17"} {
		t.Run(q, func(t *testing.T) {
			want := models[q](evs, wm)
			days := map[bool]bool{}
			for _, w := range want {
				days[strings.Contains(w, `"2026-01-02"`)] = true
			}
			if len(days) != 2 {
				t.Fatalf("the model's outputs are not of two days: the test would prove nothing")
			}
			got := runInProcess(t, q, cfg, 1+i%2, len(want))
			compare(t, got, want)
			t.Logf("%d outputs equal the model's", len(want))
		})
	}
}
