package e2e

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/wait"
)

var (
	latencyFor     = flag.Duration("cairn.latency-for", 10*time.Second, "how long BenchmarkLatency publishes per case")
	latencyNATSDir = flag.String("cairn.latency-nats-dir", "", "BenchmarkLatency: the embedded NATS server's data under this directory (default: the benchmark's temp dir)")
	latencyJobDir  = flag.String("cairn.latency-job-dir", "", "BenchmarkLatency: the job's data directory under this directory (default: the benchmark's temp dir)")
	latencyProcs   = flag.Bool("cairn.latency-processes", false, "BenchmarkLatency: run the NATS server as a nats-server process and the job as `cairn run`, each with its own runtime (the kill-restore cases are skipped)")
)

// BenchmarkLatency measures end-to-end latency from outside: a publisher
// sends events at a fixed rate (paced every millisecond), each with a unique key and its send time
// (ns) as the value; builtin:dedupe (keyed, with state) passes each first
// sighting through; a subscriber on the output subjects takes receive time
// minus send time. p50/p90/p99/max per case: rate x delivery x checkpoints
// (off, incremental every 1 s and 10 s, full every 10 s), and a restore's
// catch-up: halfway through, the job is killed (no final checkpoint) and
// started again on its data directory, restoring its last checkpoint, while
// the publisher goes on; the events sent meanwhile wait for the restart and
// the catch-up (restore-ms: the restore; down-ms: kill to the first output of
// an event sent after it; catchup-ms: kill until such an output's latency
// is back under 10 ms). Each case also splits its p99 at the input's stream
// timestamp (ingest-p99-ms: publisher and the server's store;
// after-store-p99-ms: the consumer, the job and the output), which tells a
// stall of the server's store from one in the job. -cairn.latency-nats-dir
// and -cairn.latency-job-dir put either on another file system (tmpfs);
// -cairn.latency-processes runs the server as nats-server and the job as
// `cairn run`, each a process of its own.
//
//	go test ./e2e -run '^$' -bench Latency -benchtime=1x -cairn.latency-for=10s
func BenchmarkLatency(b *testing.B) {
	type tc struct {
		rate     int
		delivery string
		mode     string // "" = no checkpoints
		interval time.Duration
		restore  bool // kill and restore halfway
	}
	var cases []tc
	for _, rate := range []int{2000, 20000} {
		cases = append(cases,
			tc{rate, "exactly_once", "", 0, false},
			tc{rate, "exactly_once", "incremental", time.Second, false},
			tc{rate, "exactly_once", "incremental", 10 * time.Second, false},
			tc{rate, "exactly_once", "full", 10 * time.Second, false},
			tc{rate, "dedupe", "incremental", time.Second, false},
			tc{rate, "core", "incremental", time.Second, false},
		)
	}
	cases = append(cases, tc{2000, "transactional", "incremental", time.Second, false},
		tc{2000, "exactly_once", "incremental", time.Second, true},
		tc{20000, "exactly_once", "incremental", time.Second, true})
	for i, c := range cases {
		name := fmt.Sprintf("%d-per-s/%s/%s", c.rate, c.delivery, "no-checkpoints")
		if c.mode != "" {
			name = fmt.Sprintf("%d-per-s/%s/%s-%s", c.rate, c.delivery, c.mode, c.interval)
		}
		if c.restore {
			name += "-kill-restore"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				host := readHostTicks()
				lat, rs, split := latencyRun(b, i, c.rate, c.delivery, c.mode, c.interval, c.restore)
				reportSteal(b, host)
				b.ReportMetric(float64(split.ingestP99.Microseconds())/1e3, "ingest-p99-ms")
				b.ReportMetric(float64(split.afterP99.Microseconds())/1e3, "after-store-p99-ms")
				if c.restore {
					b.ReportMetric(float64(rs.restore.Milliseconds()), "restore-ms")
					b.ReportMetric(float64(rs.down.Milliseconds()), "down-ms")
					b.ReportMetric(float64(rs.catchUp.Milliseconds()), "catchup-ms")
				}
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

// restoreFigures are a kill-restore case's restart: the restore's duration,
// kill to the first output after it, and kill to the first output whose
// latency is under 10 ms again.
type restoreFigures struct{ restore, down, catchUp time.Duration }

// pathSplit is the p99 of each half of the path: from the publisher to
// the input's stream timestamp (the server stored it), and from there to
// the subscriber (the consumer, the job, the output). Stream timestamps
// reach the job in milliseconds, so each half is ±1 ms.
type pathSplit struct{ ingestP99, afterP99 time.Duration }

func latencyRun(b *testing.B, i, rate int, delivery, mode string, interval time.Duration, restore bool) ([]time.Duration, restoreFigures, pathSplit) {
	if *latencyProcs && restore {
		b.Skip("-cairn.latency-processes: the kill-restore cases run in-process only")
	}
	var url string
	if *latencyProcs {
		url = startExternalNATS(b)
	} else {
		url = startNATSIn(b, benchDir(b, *latencyNATSDir))
	}
	nc, js := connectJS(b, url)
	createStream(b, js, "EVENTS", "events.>")
	j := &job.Job{Name: fmt.Sprintf("lat%d", i), NATS: url,
		Input:     job.Input{Stream: "EVENTS", Subjects: []string{"events.>"}},
		Stages:    []job.Stage{{Name: "first", Module: "builtin:dedupe", Keyed: true, Deadline: &job.Duration{Off: true}}},
		Output:    job.Output{Stream: "FIRST", Subject: "first", Delivery: delivery},
		KeyGroups: 128, Slots: 2, DataDir: benchDir(b, *latencyJobDir),
	}
	if mode != "" {
		j.Checkpoint = &job.Checkpoint{Interval: interval, Mode: mode}
		if restore {
			j.Checkpoint.Store = "file://" + b.TempDir() + "?create_dir=true"
		}
	}
	yaml, err := j.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	var r *runtime.Running
	var stop func() error
	if *latencyProcs {
		stop = startJobProcess(b, yaml)
	} else {
		r, stop = runJob(b, string(yaml))
	}

	var mu sync.Mutex
	var lat, ingest, after []time.Duration
	var killed time.Time // when the job was killed (zero: not yet)
	var rs restoreFigures
	sub, err := nc.Subscribe("first.>", func(m *nats.Msg) {
		now := time.Now().UnixNano()
		sent, err := strconv.ParseInt(string(m.Data), 10, 64)
		if err != nil {
			return
		}
		mu.Lock()
		d := time.Duration(now - sent)
		lat = append(lat, d)
		if ms, err := strconv.ParseInt(m.Header.Get(engine.HeaderTime), 10, 64); err == nil {
			// The input's stream timestamp (ms): before it, the
			// publisher and the server's store; after it, the
			// rest of the path.
			stored := ms * 1e6
			ingest = append(ingest, time.Duration(max(stored-sent, 0)))
			after = append(after, time.Duration(max(now-stored, 0)))
		}
		if !killed.IsZero() && sent > killed.UnixNano() {
			// Outputs of events sent before the kill may still arrive
			// after it: only events sent after it time the restart.
			since := time.Duration(now - killed.UnixNano())
			if rs.down == 0 {
				rs.down = since
			}
			if rs.catchUp == 0 && d < 10*time.Millisecond {
				rs.catchUp = since
			}
		}
		mu.Unlock()
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	// Warm up (module compile, slots open) before the clock counts.
	time.Sleep(500 * time.Millisecond)
	n := 0
	published := make(chan error, 1)
	go func() {
		// Paced every millisecond to the count the rate says is due, so
		// events arrive evenly (20 a millisecond at 20,000/s), not in
		// bursts whose last event waits for the burst to be processed.
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		end := start.Add(*latencyFor)
		for now := range tick.C {
			if now.After(end) {
				break
			}
			for due := int(float64(rate) * now.Sub(start).Seconds()); n < due; n++ {
				m := &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: {"k" + strconv.Itoa(n)}}, Data: strconv.AppendInt(nil, time.Now().UnixNano(), 10)}
				if _, err := js.PublishMsgAsync(m); err != nil {
					published <- err
					return
				}
			}
		}
		<-js.PublishAsyncComplete()
		published <- nil
	}()
	if restore {
		time.Sleep(*latencyFor / 2)
		r.Engine.Kill() // no final checkpoint: what is published stays, state rolls back
		mu.Lock()
		killed = time.Now()
		mu.Unlock()
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		r, stop = runJob(b, string(yaml))
		if r.Restored == nil {
			b.Fatal("the restart restored nothing")
		}
		rs.restore = r.Restored.Duration
	}
	if err := <-published; err != nil {
		b.Fatal(err)
	}
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
	slices.Sort(ingest)
	slices.Sort(after)
	var split pathSplit
	if len(ingest) > 0 {
		split = pathSplit{ingest[len(ingest)*99/100], after[len(after)*99/100]}
	}
	return lat, rs, split
}

// benchDir is a new directory under parent, removed after the benchmark, or
// the benchmark's temp dir when parent is "".
func benchDir(b *testing.B, parent string) string {
	if parent == "" {
		return b.TempDir()
	}
	d, err := os.MkdirTemp(parent, "lat")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startJobProcess runs the job as the cairn binary (`cairn run`) and
// returns its graceful stop (SIGTERM, then the exit status).
func startJobProcess(b *testing.B, yaml []byte) func() error {
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		b.Fatal(err)
	}
	p := filepath.Join(b.TempDir(), "job.yaml")
	if err := os.WriteFile(p, yaml, 0o644); err != nil {
		b.Fatal(err)
	}
	c := &cairnBinary{t: b, bin: bin, env: os.Environ()}
	c.args = func() []string { return []string{"--job", p} }
	c.start()
	wait.Until(b, time.Minute, "the job's /metrics", func() error {
		c.alive()
		resp, err := http.Get("http://" + c.httpAddr + "/metrics")
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
	return func() error {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		if err := <-c.done; err != nil {
			return fmt.Errorf("cairn run: %w\n%s", err, tail(c.logs.String(), 4000))
		}
		return nil
	}
}
