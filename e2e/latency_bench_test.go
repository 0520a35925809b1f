package e2e

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	"cairn/internal/app/job"
)

var latencyFor = flag.Duration("cairn.latency-for", 10*time.Second, "how long BenchmarkLatency publishes per case")

// BenchmarkLatency measures end-to-end latency from outside: a publisher
// sends events at a fixed rate, each with a unique key and its send time
// (ns) as the value; builtin:dedupe (keyed, with state) passes each first
// sighting through; a subscriber on the output subjects takes receive time
// minus send time. p50/p90/p99/max per case: rate x delivery x checkpoints
// (off, incremental every 1 s and 10 s, full every 10 s).
//
//	go test ./e2e -run '^$' -bench Latency -benchtime=1x -cairn.latency-for=10s
func BenchmarkLatency(b *testing.B) {
	type tc struct {
		rate     int
		delivery string
		mode     string // "" = no checkpoints
		interval time.Duration
	}
	var cases []tc
	for _, rate := range []int{2000, 20000} {
		cases = append(cases,
			tc{rate, "exactly_once", "", 0},
			tc{rate, "exactly_once", "incremental", time.Second},
			tc{rate, "exactly_once", "incremental", 10 * time.Second},
			tc{rate, "exactly_once", "full", 10 * time.Second},
		)
	}
	cases = append(cases, tc{2000, "transactional", "incremental", time.Second})
	for i, c := range cases {
		name := fmt.Sprintf("%d-per-s/%s/%s", c.rate, c.delivery, "no-checkpoints")
		if c.mode != "" {
			name = fmt.Sprintf("%d-per-s/%s/%s-%s", c.rate, c.delivery, c.mode, c.interval)
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				lat := latencyRun(b, i, c.rate, c.delivery, c.mode, c.interval)
				q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
				b.ReportMetric(q(0.50), "p50-ms")
				b.ReportMetric(q(0.90), "p90-ms")
				b.ReportMetric(q(0.99), "p99-ms")
				b.ReportMetric(q(1), "max-ms")
				b.ReportMetric(float64(len(lat)), "events")
			}
		})
	}
}

func latencyRun(b *testing.B, i, rate int, delivery, mode string, interval time.Duration) []time.Duration {
	url := startNATS(b)
	nc, js := connectJS(b, url)
	createStream(b, js, "EVENTS", "events.>")
	j := &job.Job{Name: fmt.Sprintf("lat%d", i), NATS: url,
		Input:     job.Input{Stream: "EVENTS", Subjects: []string{"events.>"}},
		Stages:    []job.Stage{{Name: "first", Module: "builtin:dedupe", Keyed: true, Deadline: &job.Duration{Off: true}}},
		Output:    job.Output{Stream: "FIRST", Subject: "first", Delivery: delivery},
		KeyGroups: 128, Slots: 2, DataDir: b.TempDir(),
	}
	if mode != "" {
		j.Checkpoint = &job.Checkpoint{Interval: interval, Mode: mode}
	}
	yaml, err := j.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	_, stop := runJob(b, string(yaml))

	var mu sync.Mutex
	var lat []time.Duration
	sub, err := nc.Subscribe("first.>", func(m *nats.Msg) {
		now := time.Now().UnixNano()
		sent, err := strconv.ParseInt(string(m.Data), 10, 64)
		if err != nil {
			return
		}
		mu.Lock()
		lat = append(lat, time.Duration(now-sent))
		mu.Unlock()
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	// Warm up (module compile, slots open) before the clock counts.
	time.Sleep(500 * time.Millisecond)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	perTick := rate / 100
	n := 0
	end := time.Now().Add(*latencyFor)
	for time.Now().Before(end) {
		<-tick.C
		for range perTick {
			m := &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: {"k" + strconv.Itoa(n)}}, Data: strconv.AppendInt(nil, time.Now().UnixNano(), 10)}
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	<-js.PublishAsyncComplete()
	// Outputs of the last events (transactional: after the next commit).
	deadline := time.Now().Add(interval + 5*time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		got := len(lat)
		mu.Unlock()
		if got >= n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := stop(); err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lat) < n*99/100 {
		b.Fatalf("%d of %d outputs received", len(lat), n)
	}
	slices.Sort(lat)
	return lat
}
