package nexmarkq_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	nexmarkq "cairn/examples/nexmark"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/base/natsembed"
	"cairn/nexmark"
)

// runGraph runs a query that is a job graph (q4, q6: two keyed stages)
// on its generated input: the sub-topologies are joined by repartition
// streams, so it runs on an embedded NATS server, the last one's outputs
// into the stream OUT_<query>, and returns them as the model writes them.
func runGraph(t *testing.T, j *job.Job, cfg nexmark.Config, want int) []string {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	j.NATS = srv.URL()
	// Two slots: the second stage then reads what two upstream slots wrote,
	// in an order of arrival that is not fixed (the operators must not
	// depend on it).
	j.Slots = 2
	// A repartition stream carries the upstream's watermark with each
	// output and, for every key group, in a marker at each checkpoint: the
	// downstream's event time (its windows, its ordered closings) moves
	// with the upstream's checkpoints.
	j.Checkpoint = &job.Checkpoint{Store: "file://" + filepath.Join(t.TempDir(), "store") + "?create_dir=true", Interval: 200 * time.Millisecond, Mode: "incremental"}
	j.Output = job.Output{Stream: "OUT_" + strings.ToUpper(strings.TrimPrefix(j.Name, "nexmark-")), Subject: "out"}
	j.Output.Delivery = ""
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
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		r.Close()
	}()
	last := r.SubTopologies()[len(r.SubTopologies())-1]
	deadline := time.Now().Add(2 * time.Minute)
	for r.Engine.Stats().ProcessedSeq < cfg.Events || last.Engine.Stats().RecordsOut < uint64(want) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the job stopped: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		for _, s := range r.SubTopologies() {
			if st := s.Engine.Stats(); st.DeadLetters > 0 {
				t.Fatalf("%s: %d dead letters", s.Job.Name, st.DeadLetters)
			}
		}
		if time.Now().After(deadline) {
			var subs []string
			for _, s := range r.SubTopologies() {
				subs = append(subs, fmt.Sprintf("%s: %+v", s.Job.Name, s.Engine.Stats()))
			}
			t.Fatalf("processed %d of %d events, %d of %d outputs, in 2 minutes; %s", r.Engine.Stats().ProcessedSeq, cfg.Events, last.Engine.Stats().RecordsOut, want, strings.Join(subs, "; "))
		}
	}
	got := readStream(t, srv.URL(), j.Output.Stream)
	for ; len(got) < want && time.Now().Before(deadline); got = readStream(t, srv.URL(), j.Output.Stream) {
		time.Sleep(50 * time.Millisecond) // published, not yet all stored
	}
	return got
}

// TestGraphDiscardsAtItsEnd checks how q4's job file (a generated input,
// two keyed stages, a discard output) is cut: the first sub-topology reads
// the generator and publishes to its repartition stream, the last one
// reads that stream and discards.
func TestGraphDiscardsAtItsEnd(t *testing.T) {
	b, err := nexmarkq.Job("q4")
	if err != nil {
		t.Fatal(err)
	}
	j, err := job.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	p, err := runtime.NewPlan(j)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Subs) != 2 {
		t.Fatalf("%d sub-topologies, want 2", len(p.Subs))
	}
	first, last := p.SubJob(0), p.SubJob(1)
	stream, _ := runtime.RepartitionStream(j.Name, 1)
	if first.Input.Nexmark == nil || first.Output.Discard || first.Output.Stream != stream {
		t.Fatalf("first: input %+v, output %+v: want the generator, publishing to %s", first.Input, first.Output, stream)
	}
	if last.Input.Nexmark != nil || last.Input.Stream != stream || !last.Output.Discard {
		t.Fatalf("last: input %+v, output %+v: want %s, discarding", last.Input, last.Output, stream)
	}
}
