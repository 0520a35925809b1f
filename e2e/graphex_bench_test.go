package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/demo"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
)

var graphexEvents = flag.Int("cairn.graphex-events", 200000,
	"input messages per case of BenchmarkGraphExamples (keyed events, orders + payments, clicks; the line cases get a quarter as many lines)")

// BenchmarkGraphExamples measures, in one run on one embedded NATS server
// (the same machine state for every case), each example job graph's
// events/s end to end next to the source ceiling and the single-stage word
// count, and what one repartition hop costs:
//
//	go test ./e2e -run '^$' -bench GraphExamples -benchtime=1x -timeout 20m
//
// (it prints the run's table with the ratios; -cairn.graphex-events sets
// the size, default 200,000, -cairn.slots the slots of every job.) Every input
// is published, and given 2 s to settle, before the first clock starts; a
// job's module compile and slot opening happen before its clock too
// (runtime.Start); the clock stops when the last sub-topology's output stream
// holds every expected output, and the output is then checked to hold
// exactly that many. CPU per event is the process's CPU time (getrusage:
// user + system) over the case divided by its input events: it includes
// the embedded server, which stores the outputs and the repartition
// streams, and the polling of the output stream. The cases:
//
//   - ceiling: a bare ordered consumer draining the keyed events (the
//     pipeline benchmark's ceiling, BenchmarkPipeline), at the start and
//     again at the end of the run (ceiling-end).
//   - hop-none, hop-one: BenchmarkGraphHop's two cases over the same events:
//     the keyed count, then count -> count as a graph of two sub-topologies
//     (no checkpoints, deadline off, as there).
//   - wordcount, topwords: split -> count (one sub-topology), and split ->
//     count -> rekey -> top_n (10 words per 10 s of event time: two) over
//     the same lines (events = lines). top_n's windows close with the
//     upstream's watermark markers, at checkpoints, so both have checkpoints
//     every second to a file store, as have the two joins.
//   - orderpay: orders ⋈ payments within 10 minutes (three sub-topologies:
//     two forwarders and the interval join), events = orders + payments.
//   - clicks: clicks enriched from a NATS KV bucket filled first (three
//     sub-topologies: the stream's forwarder, the table's, the lookup
//     join), events = clicks + table rows; missing: emit, so every click
//     is one output whichever side reaches the join first.
func BenchmarkGraphExamples(b *testing.B) {
	url := startNATS(b)
	_, js := connectJS(b, url)
	n := *graphexEvents
	in := graphexInputs(b, js, n)
	time.Sleep(2 * time.Second) // the server's writes of the inputs settle
	goruntime.GC()
	res := map[string]graphexResult{}
	record := func(b *testing.B, name string, r graphexResult) {
		res[name] = r
		b.ReportMetric(float64(r.events)/r.el.Seconds(), "events/s")
		b.ReportMetric(float64(r.cpu.Nanoseconds())/float64(r.events), "cpu-ns/event")
		b.ReportMetric(r.cpu.Seconds()/r.el.Seconds(), "cores")
	}
	ceiling := func(name string) {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				record(b, name, graphexCeiling(b, js, "EVENTS", n))
			}
		})
	}
	ceiling("ceiling")

	count := job.Stage{Name: "count", Module: "builtin:count", Keyed: true, Deadline: &job.Duration{Off: true}}
	again := job.Stage{Name: "again", Module: "builtin:count", Keyed: true, Deadline: &job.Duration{Off: true}}
	for _, tc := range []struct {
		name   string
		stages []job.Stage
	}{{"hop-none", []job.Stage{count}}, {"hop-one", []job.Stage{count, again}}} {
		b.Run(tc.name, func(b *testing.B) {
			for i := range b.N {
				name := fmt.Sprintf("gx%s%d", strings.ReplaceAll(tc.name, "-", ""), i)
				j := &job.Job{Name: name, NATS: url,
					Input:  job.Input{Stream: "EVENTS", Subjects: []string{"events.>"}},
					Stages: tc.stages,
					Output: job.Output{Stream: strings.ToUpper(name), Subject: name, Delivery: "exactly_once"},
					// BenchmarkGraphHop's configuration: no checkpoints.
					KeyGroups: 128, Slots: *benchSlots, DataDir: b.TempDir(), BatchSize: 512,
				}
				record(b, tc.name, graphexRun(b, js, j, n, n))
			}
		})
	}

	// The examples' jobs, as examples/*.yaml but at one size for all: 128
	// key groups, -cairn.slots slots, batches of 512, checkpoints every
	// second (incremental, file store).
	example := func(name string, i int, inputs []job.Input, stages []job.Stage) *job.Job {
		name = fmt.Sprintf("gx%s%d", name, i)
		j := &job.Job{Name: name, NATS: url, Stages: stages,
			Output:    job.Output{Stream: strings.ToUpper(name), Subject: name, Delivery: "exactly_once"},
			KeyGroups: 128, Slots: *benchSlots, DataDir: b.TempDir(), BatchSize: 512,
			Checkpoint: &job.Checkpoint{Store: "file://" + b.TempDir() + "?create_dir=true", Interval: time.Second, Mode: "incremental"},
		}
		if len(inputs) == 1 {
			j.Input = inputs[0]
		} else {
			j.Inputs = inputs
		}
		return j
	}
	lines := []job.Input{{Stream: "LINES", Subjects: []string{"lines.>"}}}
	split := job.Stage{Name: "split", Module: "builtin:split"}
	wcount := job.Stage{Name: "count", Module: "builtin:count", Keyed: true}
	b.Run("wordcount", func(b *testing.B) {
		for i := range b.N {
			j := example("wordcount", i, lines, []job.Stage{split, wcount})
			record(b, "wordcount", graphexRun(b, js, j, in.lines, in.words))
		}
	})
	b.Run("topwords", func(b *testing.B) {
		for i := range b.N {
			j := example("topwords", i, lines, []job.Stage{split, wcount,
				{Name: "all", Module: "builtin:rekey", Config: map[string]any{"key": "all"}},
				{Name: "top", Module: "builtin:top_n", Keyed: true, Config: map[string]any{"n": 10, "size_ms": graphexWindow}},
			})
			record(b, "topwords", graphexRun(b, js, j, in.lines, in.windows))
		}
	})
	b.Run("orderpay", func(b *testing.B) {
		for i := range b.N {
			j := example("orderpay", i, []job.Input{
				{Name: "orders", Stream: "ORDERS", Subjects: []string{"orders.>"}},
				{Name: "payments", Stream: "PAYMENTS", Subjects: []string{"payments.>"}},
			}, []job.Stage{{Name: "join", Module: "builtin:interval_join", Keyed: true, From: []string{"orders", "payments"},
				Config: map[string]any{"lower_ms": 0, "upper_ms": 600_000}}})
			record(b, "orderpay", graphexRun(b, js, j, in.orderPay, in.paid))
		}
	})
	b.Run("clicks", func(b *testing.B) {
		for i := range b.N {
			j := example("clicks", i, []job.Input{
				{Name: "clicks", Stream: "CLICKS", Subjects: []string{"clicks.>"}},
				{Name: "users", Table: "USERS"},
			}, []job.Stage{{Name: "enrich", Module: "builtin:lookup_join", Keyed: true, From: []string{"clicks", "users"},
				Config: map[string]any{"separator": "|", "missing": "emit"}}})
			record(b, "clicks", graphexRun(b, js, j, in.clicks+in.rows, in.clicks))
		}
	})
	ceiling("ceiling-end")

	// The table of the run, with the ratios measured in it.
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nBenchmarkGraphExamples, %d slots:\n\n| case | input events | events/s | CPU µs/event | cores busy | ÷ ceiling | ÷ wordcount |\n|---|---:|---:|---:|---:|---:|---:|\n", *benchSlots)
	base, wc := res["ceiling"], res["wordcount"]
	for _, name := range []string{"ceiling", "hop-none", "hop-one", "wordcount", "topwords", "orderpay", "clicks", "ceiling-end"} {
		r, ok := res[name]
		if !ok {
			continue
		}
		ratio := func(o graphexResult) string {
			if o.events == 0 {
				return "–"
			}
			return fmt.Sprintf("%.3f", r.rate()/o.rate())
		}
		fmt.Fprintf(&sb, "| %s | %d | %.0f | %.2f | %.2f | %s | %s |\n", name, r.events, r.rate(),
			float64(r.cpu.Nanoseconds())/float64(r.events)/1000, r.cpu.Seconds()/r.el.Seconds(), ratio(base), ratio(wc))
	}
	fmt.Fprintf(&sb, "lines: %d (%d words, %d windows of top_n); orders + payments: %d (%d pairs); clicks: %d, table rows: %d\n",
		in.lines, in.words, in.windows, in.orderPay, in.paid, in.clicks, in.rows)
	// Printed, not logged: a parent benchmark's log shows only with -v,
	// which also turns on every job's log.
	fmt.Print(sb.String())
}

// graphexResult is one case: input events, the time until the last output,
// and the process CPU time over it.
type graphexResult struct {
	events  int
	el, cpu time.Duration
}

func (r graphexResult) rate() float64 { return float64(r.events) / r.el.Seconds() }

// cpuTime is the process's CPU time so far (user + system, every thread:
// cairn, the embedded NATS server, the test).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// graphexCeiling is BenchmarkPipeline's ceiling: a bare ordered consumer
// draining n messages of stream, doing nothing.
func graphexCeiling(b *testing.B, js jetstream.JetStream, stream string, n int) graphexResult {
	cpu0 := cpuTime(b)
	el := drainCeiling(b, js, stream, n)
	return graphexResult{events: n, el: el, cpu: cpuTime(b) - cpu0}
}

// graphexRun starts j (module compile and slot opening before the clock),
// runs it until its output stream holds want messages, stops it and checks
// the output holds exactly want (no duplicate, nothing missing).
func graphexRun(b *testing.B, js jetstream.JetStream, j *job.Job, events, want int) graphexResult {
	b.Helper()
	yaml, err := j.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	pj, err := job.Parse(yaml)
	if err != nil {
		b.Fatal(err)
	}
	r, err := runtime.Start(context.Background(), pj, runtime.Options{}, testLogger(b))
	if err != nil {
		b.Fatal(err)
	}
	out := j.Output.Stream
	cpu0 := cpuTime(b)
	start := time.Now()
	stop := runStarted(b, r)
	wait.Until(b, 10*time.Minute, fmt.Sprintf("%d outputs on %s", want, out), func() error {
		s, err := js.Stream(context.Background(), out) // one API call: the stream's info now
		if err != nil {
			return err
		}
		if got := s.CachedInfo().State.Msgs; got < uint64(want) {
			return fmt.Errorf("%d outputs", got)
		}
		return nil
	})
	el := time.Since(start)
	cpu := cpuTime(b) - cpu0
	if err := stop(); err != nil {
		b.Fatal(err)
	}
	if got := streamMsgs(b, js, out); got != want {
		b.Fatalf("%s: %d outputs after the stop, want exactly %d", j.Name, got, want)
	}
	return graphexResult{events: events, el: el, cpu: cpu}
}

// graphexWindow is top_n's window in the benchmark (examples/topwords.yaml's).
const graphexWindow = 10_000

// graphexInput is what graphexInputs published, and the outputs each case
// must produce.
type graphexInput struct {
	lines, words, windows int // LINES: messages; word count's outputs; top_n's
	orderPay, paid        int // ORDERS + PAYMENTS: messages; joined pairs
	clicks, rows          int // CLICKS messages; USERS entries
}

// graphexInputs publishes every case's input: n keyed events (EVENTS, the
// pipeline benchmark's), n/4 lines of the word count benchmark's corpus
// with event times 10 ms apart and a last line 2 windows later that closes
// every window before it (LINES), n/2 orders with 0-2 payments each
// (ORDERS, PAYMENTS, as TestJobGraphJoin's), n/20 users in the KV bucket
// USERS and n clicks keyed Zipf-skewed over them (CLICKS).
func graphexInputs(b *testing.B, js jetstream.JetStream, n int) graphexInput {
	b.Helper()
	var in graphexInput
	keyedInput(b, js, n)

	createStream(b, js, "LINES", "lines.>")
	corpus := demo.NewCorpus(5, 20000)
	const t0, step = int64(1_700_000_000_000), int64(10)
	windows := map[int64]bool{}
	var msgs []*nats.Msg
	for i := range max(n/4, 1) {
		line, _ := corpus.Line()
		tm := t0 + int64(i)*step
		in.words += len(splitWords(line))
		windows[tm/graphexWindow] = true
		msgs = append(msgs, &nats.Msg{Subject: "lines.in", Header: nats.Header{engine.HeaderTime: {strconv.FormatInt(tm, 10)}}, Data: []byte(line)})
	}
	last := t0 + int64(len(msgs)-1)*step
	msgs = append(msgs, &nats.Msg{Subject: "lines.in", Header: nats.Header{engine.HeaderTime: {strconv.FormatInt(last+2*graphexWindow, 10)}}, Data: []byte("zzz")})
	in.lines, in.words, in.windows = len(msgs), in.words+1, len(windows)
	graphexPublish(b, js, msgs)

	createStream(b, js, "ORDERS", "orders.>")
	createStream(b, js, "PAYMENTS", "payments.>")
	op := newOrderPayInput(b, js, rand.New(rand.NewPCG(3, 4)), max(n/2, 1))
	msgs = msgs[:0]
	msg := func(subject string, e opEvent) *nats.Msg {
		return &nats.Msg{Subject: subject, Header: nats.Header{engine.HeaderKey: {e.key}, engine.HeaderTime: {strconv.FormatInt(e.time, 10)}}, Data: []byte(e.value)}
	}
	for _, o := range op.orders {
		msgs = append(msgs, msg("orders.new", o))
	}
	for _, p := range op.payments {
		msgs = append(msgs, msg("payments.new", p))
	}
	op.nextO, op.nextP = len(op.orders), len(op.payments)
	graphexPublish(b, js, interleave(op.rng, msgs))
	in.orderPay = len(msgs)
	for _, c := range op.model() {
		in.paid += c
	}

	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "USERS"}); err != nil {
		b.Fatal(err)
	}
	in.rows = max(n/20, 1)
	msgs = msgs[:0]
	for u := range in.rows {
		msgs = append(msgs, &nats.Msg{Subject: fmt.Sprintf("$KV.USERS.u%d", u), Data: fmt.Appendf(nil, "user %d, city %d", u, u%97)})
	}
	graphexPublish(b, js, msgs)
	createStream(b, js, "CLICKS", "clicks.>")
	rng := rand.New(rand.NewPCG(5, 6))
	zipf := rand.NewZipf(rng, 1.1, 1, uint64(in.rows-1))
	msgs = msgs[:0]
	for i := range n {
		msgs = append(msgs, &nats.Msg{Subject: "clicks.web", Header: nats.Header{engine.HeaderKey: {fmt.Sprintf("u%d", zipf.Uint64())}}, Data: fmt.Appendf(nil, "/page/%d", i%500)})
	}
	graphexPublish(b, js, msgs)
	in.clicks = n
	return in
}

// graphexPublish publishes msgs asynchronously in chunks, waiting for each
// chunk's acks (the client's window of pending publishes is bounded).
func graphexPublish(b *testing.B, js jetstream.JetStream, msgs []*nats.Msg) {
	b.Helper()
	for i, m := range msgs {
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
		if i%2000 == 1999 || i == len(msgs)-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("publishes not acknowledged")
			}
		}
	}
}
