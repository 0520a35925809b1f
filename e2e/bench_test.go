package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"cairn/engine"
	"cairn/internal/app/demo"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/state"
)

var (
	benchMsgs  = flag.Int("cairn.msgs", 300000, "input messages per pipeline benchmark run")
	benchSlots = flag.Int("cairn.slots", 2, "slots of the pipeline benchmarks' job")
)

// keyedInput publishes n events, one per message, key in Cairn-Key, drawn
// Zipf-skewed from 100k distinct keys.
func keyedInput(b *testing.B, js jetstream.JetStream, n int) {
	b.Helper()
	createStream(b, js, "EVENTS", "events.>")
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.2, 1, 100000-1)
	payload := []byte(strings.Repeat("v", 64))
	for i := range n {
		h := nats.Header{engine.HeaderKey: []string{fmt.Sprintf("key-%d", zipf.Uint64())}}
		if _, err := js.PublishMsgAsync(&nats.Msg{Subject: "events.in", Header: h, Data: payload}); err != nil {
			b.Fatal(err)
		}
		if i%50000 == 0 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
}

// BenchmarkPipeline measures, on one in-process NATS server and one input
// stream: the ceiling (a bare ordered consumer draining the stream, doing
// nothing), then the keyed count job end to end (WASM in exactly_once and
// dedupe, native Go in exactly_once). Run with -benchtime=1x. The passthrough
// and the jobs also report cpu-ns/msg: the whole process's CPU per input.
func BenchmarkPipeline(b *testing.B) {
	url := startNATS(b)
	_, js := connectJS(b, url)
	n := *benchMsgs
	keyedInput(b, js, n)

	b.Run("ceiling", func(b *testing.B) {
		for range b.N {
			b.ReportMetric(float64(n)/drainCeiling(b, js, "EVENTS", n).Seconds(), "msgs/s")
		}
	})
	// passthrough: the second ceiling, the fair limit for a job that
	// persists one output per input (the bare consumer persists nothing): read the input
	// with a bare ordered consumer and publish one persisted output per
	// input, in fast batches as the engine does (one flow ack per 500, 32
	// outstanding), and nothing else; done when the output stream holds
	// every message. passthrough-format publishes what an exactly_once job
	// must (docs/DESIGN.md): Cairn-Key, Cairn-Time and a per-key-group Cairn-Out
	// on the key group's subject, one of 128 — the baseline that does the
	// job's publishing work.
	b.Run("passthrough", func(b *testing.B) {
		for j := range b.N {
			passthrough(b, js, n, fmt.Sprintf("PASS%d", j), false)
		}
	})
	b.Run("passthrough-format", func(b *testing.B) {
		for j := range b.N {
			passthrough(b, js, n, fmt.Sprintf("PASSF%d", j), true)
		}
	})
	for i, tc := range []struct {
		name, module, delivery, deadline string
		publish                          engine.PublishMode
	}{
		{"wasm-exactly_once", "builtin:count", "exactly_once", "5s", ""},
		{"wasm-exactly_once-nodeadline", "builtin:count", "exactly_once", "off", ""},
		{"wasm-exactly_once-nodeadline-async", "builtin:count", "exactly_once", "off", engine.PublishAsync},
		{"wasm-dedupe", "builtin:count", "dedupe", "5s", ""},
		{"wasm-dedupe-async", "builtin:count", "dedupe", "5s", engine.PublishAsync},
		{"wasm-dedupe-batch", "builtin:count", "dedupe", "5s", engine.PublishBatch},
		{"native-exactly_once", "native:count", "exactly_once", "5s", ""},
		{"wasm-core", "builtin:count", "core", "off", ""},
		{"native-exactly_once-async", "native:count", "exactly_once", "5s", engine.PublishAsync},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for j := range b.N {
				out := fmt.Sprintf("OUT%d_%d", i, j)
				yaml := fmt.Sprintf(`
name: bench%d_%d
nats: %s
input:  {stream: EVENTS, subjects: ["events.>"]}
stages:
  - {name: count, module: "%s", keyed: true, deadline: %s}
output: {stream: %s, subject: %s, delivery: %s}
key_groups: 128
slots: %d
data_dir: %s
batch_size: 1024
`, i, j, url, tc.module, tc.deadline, out, strings.ToLower(out), tc.delivery, *benchSlots, b.TempDir())
				r, stop := runJobTimed(b, yaml, tc.publish)
				host, cpu := readHostTicks(), cpuTime(b)
				start := time.Now()
				waitProcessed(b, r.Engine, uint64(n))
				el := time.Since(start)
				// Processed is not yet persisted: also time until the
				// output stream holds every output (what a consumer sees).
				if tc.delivery != "core" { // core outputs are not stored
					waitStored(b, js, out, uint64(n))
				}
				stored := time.Since(start)
				// The whole process's CPU (the embedded server included)
				// per input, over the same time as stored/s.
				b.ReportMetric(float64(cpuTime(b)-cpu)/float64(n), "cpu-ns/msg")
				reportSteal(b, host)
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(n)/el.Seconds(), "msgs/s")
				b.ReportMetric(float64(n)/stored.Seconds(), "stored/s")
				b.ReportMetric(float64(el.Nanoseconds())/float64(n), "ns/msg")
			}
		})
	}
}

// drainCeiling is the pipelines' ceiling: a bare ordered consumer draining
// n messages of stream, doing nothing. It returns how long that took.
func drainCeiling(b *testing.B, js jetstream.JetStream, stream string, n int) time.Duration {
	b.Helper()
	start := time.Now()
	cons, err := js.OrderedConsumer(context.Background(), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	got := 0
	done := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		got++
		if got == n {
			close(done)
		}
	}, jetstream.PullMaxMessages(2048))
	if err != nil {
		b.Fatal(err)
	}
	<-done
	el := time.Since(start)
	cc.Stop()
	return el
}

// waitStored polls until stream holds at least n messages.
func waitStored(b *testing.B, js jetstream.JetStream, stream string, n uint64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			b.Fatal(err)
		}
		if s.CachedInfo().State.Msgs >= n {
			return
		}
		select {
		case <-ctx.Done():
			b.Fatalf("stream %s holds %d messages, want %d", stream, s.CachedInfo().State.Msgs, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// runJobTimed is runJob for benchmarks: the module compile and slot opening
// happen before the clock starts (Start), the consumer starts in Run.
// A non-empty publish overrides the engine's publish mode.
func runJobTimed(b *testing.B, yaml string, publish engine.PublishMode) (*runtime.Running, func() error) {
	b.Helper()
	j, err := job.Parse([]byte(yaml))
	if err != nil {
		b.Fatal(err)
	}
	r, err := runtime.Start(context.Background(), j, runtime.Options{}, testLogger(b))
	if err != nil {
		b.Fatal(err)
	}
	r.Engine.SetPublishMode(publish)
	return r, runStarted(b, r)
}

// BenchmarkWordcount: split -> count end to end, lines/s and words/s.
func BenchmarkWordcount(b *testing.B) {
	url := startNATS(b)
	_, js := connectJS(b, url)
	createStream(b, js, "LINES", "lines.>")
	n := *benchMsgs / 4
	corpus := demo.NewCorpus(5, 20000)
	words := 0
	for i := range n {
		line, _ := corpus.Line()
		words += len(splitWords(line))
		if _, err := js.PublishAsync("lines.in", []byte(line)); err != nil {
			b.Fatal(err)
		}
		if i%50000 == 0 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	for j := range b.N {
		r, stop := runJob(b, fmt.Sprintf(wordcountJob, url, "exactly_once", 2, b.TempDir()))
		_ = j
		start := time.Now()
		waitProcessed(b, r.Engine, uint64(n))
		el := time.Since(start)
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(n)/el.Seconds(), "lines/s")
		b.ReportMetric(float64(words)/el.Seconds(), "words/s")
	}
}

var benchInterval = flag.Duration("cairn.checkpoint-interval", 10*time.Second, "checkpoint interval of BenchmarkCheckpointOverhead")

// BenchmarkCheckpointOverhead: the keyed count end to end with checkpoints
// off, then with incremental and full checkpoints every
// -cairn.checkpoint-interval to a local file store, over the same input in
// the same run. Use enough messages for several intervals:
//
//	go test ./e2e -run '^$' -bench CheckpointOverhead -benchtime=1x -cairn.msgs=3000000
func BenchmarkCheckpointOverhead(b *testing.B) {
	url := startNATS(b)
	_, js := connectJS(b, url)
	n := *benchMsgs
	keyedInput(b, js, n)
	for i, mode := range []string{"off", "incremental", "full"} {
		b.Run("checkpoints-"+mode, func(b *testing.B) {
			for j := range b.N {
				out := fmt.Sprintf("CHK%d_%d", i, j)
				chk := ""
				if mode != "off" {
					chk = fmt.Sprintf("checkpoint: {store: \"file://%s?create_dir=true\", interval: %s, mode: %s}\n", b.TempDir(), *benchInterval, mode)
				}
				yaml := fmt.Sprintf(`
name: chk%d_%d
nats: %s
input:  {stream: EVENTS, subjects: ["events.>"]}
stages:
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: %s, subject: %s, delivery: exactly_once}
key_groups: 128
slots: 2
data_dir: %s
batch_size: 1024
%s`, i, j, url, out, strings.ToLower(out), b.TempDir(), chk)
				r, stop := runJobTimed(b, yaml, "")
				start := time.Now()
				waitProcessed(b, r.Engine, uint64(n))
				el := time.Since(start)
				chks := r.Engine.Stats().Checkpoints
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(n)/el.Seconds(), "msgs/s")
				b.ReportMetric(float64(chks), "checkpoints")
			}
		})
	}
}

// passthrough drains n messages of EVENTS into the new stream out and
// reports msgs/s, cpu-ns/msg and steal-% (see BenchmarkPipeline).
func passthrough(b *testing.B, js jetstream.JetStream, n int, out string, format bool) {
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: out, Subjects: []string{strings.ToLower(out) + ".>"}, Storage: jetstream.FileStorage, AllowBatchPublish: true}); err != nil {
		b.Fatal(err)
	}
	const keyGroups = 128
	subjects := make([]string, keyGroups)
	for kg := range subjects {
		subjects[kg] = strings.ToLower(out) + "." + strconv.Itoa(kg)
	}
	var counts [keyGroups]uint64
	// Reused as the engine's sink reuses its header: AddMsg encodes the
	// message before it returns.
	hdr := nats.Header{engine.HeaderKey: {""}, engine.HeaderTime: {""}, engine.HeaderOut: {""}}
	host, cpu := readHostTicks(), cpuTime(b)
	start := time.Now()
	cons, err := js.OrderedConsumer(ctx, "EVENTS", jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	fp, err := jetstreamext.NewFastPublisher(js, jetstreamext.FastPublishFlowControl{Flow: 500, MaxOutstandingAcks: 32, AckTimeout: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2048))
	if err != nil {
		b.Fatal(err)
	}
	for got := 0; got < n; got++ {
		m, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		msg := &nats.Msg{Subject: subjects[0], Header: m.Headers(), Data: m.Data()}
		if format {
			key := m.Headers().Get(engine.HeaderKey)
			kg := state.KeyGroup([]byte(key), keyGroups)
			counts[kg]++
			hdr[engine.HeaderKey][0] = key
			hdr[engine.HeaderTime][0] = strconv.FormatInt(time.Now().UnixMilli(), 10)
			hdr[engine.HeaderOut][0] = strconv.FormatUint(counts[kg], 10)
			msg.Subject, msg.Header = subjects[kg], hdr
		}
		if _, err := fp.AddMsg(msg); err != nil {
			b.Fatal(err)
		}
	}
	it.Stop()
	if _, err := fp.Close(ctx); err != nil {
		b.Fatal(err)
	}
	waitStored(b, js, out, uint64(n))
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(n), "cpu-ns/msg")
	reportSteal(b, host)
}
