package engine

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cairn/internal/testutil/natscluster"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/internal/testutil/wait"
)

// Fast batches the server forgets: its batch timeout passes while a batch
// is open, or the server restarts under one. The sink must neither lose
// nor duplicate an output, and must not fail where the stream shows the
// batch whole. A real nats-server in process; the only fault injected by
// hand is a stored message deleted, standing for a batch's tail lost with
// the connection.

// batchServer is an embedded nats-server whose JetStream forgets an idle
// fast batch after batchTimeout (0: the server's default), restartable on
// the same port and store.
type batchServer struct {
	t            *testing.T
	dir          string
	port         int
	batchTimeout time.Duration
	srv          *server.Server
}

func startBatchServer(t *testing.T, batchTimeout time.Duration) *batchServer {
	t.Helper()
	b := &batchServer{t: t, dir: t.TempDir(), port: server.RANDOM_PORT, batchTimeout: batchTimeout}
	b.start()
	b.port = b.srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(b.stop)
	return b
}

func (b *batchServer) start() {
	b.t.Helper()
	opts := &server.Options{
		ServerName: "batchfault", Host: "127.0.0.1", Port: b.port,
		JetStream: true, StoreDir: filepath.Join(b.dir, "nats"),
		NoLog: true, NoSigs: true, DisableJetStreamBanner: true,
	}
	opts.JetStreamLimits.MaxBatchTimeout = b.batchTimeout
	srv, err := server.NewServer(opts)
	if err != nil {
		b.t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		b.t.Fatal("nats-server not ready")
	}
	b.srv = srv
}

func (b *batchServer) stop() {
	if b.srv != nil {
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
		b.srv = nil
	}
}

func (b *batchServer) restart() {
	b.t.Helper()
	b.stop()
	b.start()
}

// batchSink is a fast-batch sink of output stream OUT (subjects out.<kg>)
// on its own connection, and the first error it failed with.
type batchSink struct {
	*sink
	nc     *nats.Conn
	mu     sync.Mutex
	err    error
	failed chan struct{}
}

const batchKGs = 4

func newBatchSink(t *testing.T, srv *batchServer, repartition bool) *batchSink {
	t.Helper()
	nc, err := nats.Connect(srv.srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := Config{Job: "batchfault", KeyGroups: batchKGs, OutputStream: "OUT", OutputSubject: "out", Delivery: ExactlyOnce, Repartition: repartition}
	br, err := NewNATSBroker(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := br.Prepare(context.Background(), PrepareRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Batch {
		t.Fatal("the output stream does not allow fast batches")
	}
	bs := &batchSink{nc: nc, failed: make(chan struct{})}
	pub, err := br.NewPublisher(0, true, func(err error) {
		bs.mu.Lock()
		defer bs.mu.Unlock()
		if bs.err == nil {
			bs.err = err
			close(bs.failed)
		}
	}, bs.failed)
	if err != nil {
		t.Fatal(err)
	}
	bs.sink = pub.(*sink)
	return bs
}

func (bs *batchSink) failure() error {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.err
}

// round publishes n outputs per key group after next[kg] (and, on a
// repartition stream, a marker per key group after them, as a checkpoint
// does).
func (bs *batchSink) round(t *testing.T, next []uint64, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		for kg := range batchKGs {
			next[kg]++
			o := Output{KeyGroup: kg, Index: next[kg], Key: []byte("k" + strconv.Itoa(kg)), Value: []byte(strconv.FormatUint(next[kg], 10)), Time: int64(next[kg]), Wm: math.MinInt64}
			if err := bs.Publish(o); err != nil {
				t.Fatalf("publish kg %d output %d: %v (sink failure: %v)", kg, next[kg], err, bs.failure())
			}
		}
	}
	if bs.repartition {
		for kg := range batchKGs {
			if err := bs.Publish(Output{KeyGroup: kg, Index: next[kg], Wm: int64(next[kg]), Marker: true}); err != nil {
				t.Fatalf("marker kg %d: %v (sink failure: %v)", kg, err, bs.failure())
			}
		}
	}
}

// fence waits until every output so far is stored, or the sink fails.
func (bs *batchSink) fence(t *testing.T) error {
	t.Helper()
	select {
	case <-bs.Fence():
		return nil
	case <-bs.failed:
		return bs.failure()
	case <-time.After(2 * time.Minute):
		t.Fatal("fence: neither stored nor failed after 2 minutes")
		return nil
	}
}

// storedOutputs reads OUT: per key group, the output indexes in stream
// order (markers left out).
func storedOutputs(t *testing.T, nc *nats.Conn) map[int][]uint64 {
	t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int][]uint64{}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for got := uint64(0); got < info.State.Msgs; {
		batch, err := cons.Fetch(1024, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			got++
			if m.Headers().Get(HeaderMarker) != "" {
				continue
			}
			kg, err := strconv.Atoi(strings.TrimPrefix(m.Subject(), "out."))
			if err != nil {
				t.Fatalf("subject %s", m.Subject())
			}
			idx, err := strconv.ParseUint(m.Headers().Get(HeaderOut), 10, 64)
			if err != nil {
				t.Fatalf("%s: %s header: %v", m.Subject(), HeaderOut, err)
			}
			out[kg] = append(out[kg], idx)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
	}
	return out
}

// checkExact fails unless every key group holds exactly outputs 1..next[kg],
// in order, once each.
func checkExact(t *testing.T, nc *nats.Conn, next []uint64) {
	t.Helper()
	got := storedOutputs(t, nc)
	for kg := range batchKGs {
		idx := got[kg]
		if uint64(len(idx)) != next[kg] {
			t.Errorf("key group %d: %d outputs stored, want %d", kg, len(idx), next[kg])
		}
		for i, v := range idx {
			if v != uint64(i+1) {
				t.Errorf("key group %d: output #%d is index %d, want %d (lost or duplicated)", kg, i+1, v, i+1)
				break
			}
		}
	}
}

// sleepPast waits d, long enough for the server's batch timer to have
// fired. Not an assertion: a server slower to forget makes the test pass
// without reaching the fault, never fail.
func sleepPast(d time.Duration) { time.Sleep(d) }

// TestFastBatchIdlePastServerTimeout: a batch left idle past the server's
// batch timeout, then added to, then committed. The server forgot it; its
// messages are all stored, and the sink goes on with a new batch.
func TestFastBatchIdlePastServerTimeout(t *testing.T) {
	for _, repartition := range []bool{false, true} {
		t.Run(fmt.Sprintf("repartition=%v", repartition), func(t *testing.T) {
			const timeout = 300 * time.Millisecond
			srv := startBatchServer(t, timeout)
			bs := newBatchSink(t, srv, repartition)
			// The server's timeout is below the sink's default bound
			// (as an operator's lower max_batch_timeout would be).
			bs.idleMax = timeout / 3
			next := make([]uint64, batchKGs)

			bs.round(t, next, 300)
			sleepPast(3 * timeout)
			// Into a batch the server forgot: a new batch instead.
			bs.round(t, next, 300)
			sleepPast(3 * timeout)
			// The commit of a forgotten batch: decided from the stream.
			if err := bs.fence(t); err != nil {
				t.Fatalf("fence after the server forgot the batch: %v", err)
			}
			bs.round(t, next, 10)
			if err := bs.fence(t); err != nil {
				t.Fatalf("fence: %v", err)
			}
			checkExact(t, bs.nc, next)
		})
	}
}

// TestFastBatchServerRestart: the server restarts (same store) under an
// open batch whose messages it had stored. The commit and the next
// outputs go on without a failure, exactly.
func TestFastBatchServerRestart(t *testing.T) {
	for _, repartition := range []bool{false, true} {
		t.Run(fmt.Sprintf("repartition=%v", repartition), func(t *testing.T) {
			srv := startBatchServer(t, 0)
			bs := newBatchSink(t, srv, repartition)
			next := make([]uint64, batchKGs)
			js, err := jetstream.New(bs.nc)
			if err != nil {
				t.Fatal(err)
			}

			restartStored := func(total uint64) {
				wait.For(t, time.Minute, fmt.Sprintf("OUT holds %d messages", total), func() bool {
					st, err := js.Stream(context.Background(), "OUT")
					return err == nil && st.CachedInfo().State.Msgs == total
				})
				gen := bs.nc.Stats().Reconnects
				srv.restart()
				wait.For(t, time.Minute, "the client reconnected", func() bool {
					return bs.nc.IsConnected() && bs.nc.Stats().Reconnects > gen
				})
			}
			perRound := func(n int) uint64 {
				m := uint64(n * batchKGs)
				if repartition {
					m += batchKGs
				}
				return m
			}

			// The batch open across the restart, then added to.
			bs.round(t, next, 500)
			total := perRound(500)
			restartStored(total)
			bs.round(t, next, 500)
			total += perRound(500)
			if err := bs.fence(t); err != nil {
				t.Fatalf("fence after a restart under an open batch: %v", err)
			}
			// The batch open across the restart, then committed.
			bs.round(t, next, 500)
			total += perRound(500)
			restartStored(total)
			if err := bs.fence(t); err != nil {
				t.Fatalf("commit of a batch the restarted server forgot: %v", err)
			}
			bs.round(t, next, 10)
			if err := bs.fence(t); err != nil {
				t.Fatalf("fence: %v", err)
			}
			checkExact(t, bs.nc, next)
		})
	}
}

// TestFastBatchLostTailFails: a batch the server forgot whose last output
// is not in the stream (here deleted, as a tail lost with the connection
// would be) is not taken for stored: the sink fails with ErrBatchLost, an
// outcome the runtime resumes from the last checkpoint.
func TestFastBatchLostTailFails(t *testing.T) {
	for _, repartition := range []bool{false, true} {
		t.Run(fmt.Sprintf("repartition=%v", repartition), func(t *testing.T) {
			srv := startBatchServer(t, 0)
			bs := newBatchSink(t, srv, repartition)
			next := make([]uint64, batchKGs)
			bs.round(t, next, 50)
			ctx := context.Background()
			js, err := jetstream.New(bs.nc)
			if err != nil {
				t.Fatal(err)
			}
			total := uint64(50*batchKGs + map[bool]int{false: 0, true: batchKGs}[repartition])
			var st jetstream.Stream
			wait.For(t, time.Minute, "OUT holds the batch", func() bool {
				st, err = js.Stream(ctx, "OUT")
				return err == nil && st.CachedInfo().State.Msgs == total
			})
			last := st.CachedInfo().State.LastSeq
			if err := st.DeleteMsg(ctx, last); err != nil {
				t.Fatal(err)
			}
			gen := bs.nc.Stats().Reconnects
			srv.restart()
			wait.For(t, time.Minute, "the client reconnected", func() bool {
				return bs.nc.IsConnected() && bs.nc.Stats().Reconnects > gen
			})
			err = bs.fence(t)
			if !errors.Is(err, ErrBatchLost) {
				t.Fatalf("fence over a batch missing its last output: %v, want ErrBatchLost", err)
			}
			if !strings.Contains(err.Error(), "batch publish ID unknown") {
				t.Fatalf("error %q does not carry the server's phrase the runtime resumes on", err)
			}
		})
	}
}

// BenchmarkSinkBatchPublish measures an output through the sink's fast
// batch (per op: one Publish; a fence every 100,000), and
// BenchmarkBatchAddChecks the checks every add makes before it goes into
// the open batch (idle bound, the connection's reconnect count), to put
// the checks' share beside the publish.
//
//	go test ./engine -run '^$' -bench 'SinkBatchPublish|BatchAddChecks' -count 3
func BenchmarkSinkBatchPublish(b *testing.B) { benchSinkPublish(b, 0) }

// BenchmarkSinkFencedPublish puts the fence's cost beside the unfenced
// publish, alternating in one run: the same outputs through the sink's
// fast batch, unfenced and fenced (Config.FenceEpoch: the epoch on every
// message, a check of the slot's marker on a batch's first message and
// then once a message after the last check is acknowledged, 32 messages
// apart at least). cpu-ns/op is the process's (the embedded server runs
// in it), plus the nodes' with -cairn.sink.cluster (an R3 stream on a
// three-node cluster of nats-server processes); msgs/check is how often
// the fenced sink checked.
//
//	go test ./engine -run '^$' -bench SinkFencedPublish -benchtime 1000000x -count 4 [-cairn.sink.cluster]
func BenchmarkSinkFencedPublish(b *testing.B) {
	for range 2 {
		b.Run("unfenced", func(b *testing.B) { benchSinkPublish(b, 0) })
		b.Run("fenced", func(b *testing.B) { benchSinkPublish(b, 7) })
	}
}

var sinkCluster = flag.Bool("cairn.sink.cluster", false, "BenchmarkSinkFencedPublish: publish to an R3 stream on a three-node cluster")

func benchSinkPublish(b *testing.B, epoch uint64) {
	var nc *nats.Conn
	cpu := func() int64 { return processCPU(b) }
	if *sinkCluster {
		c := natscluster.Start(b)
		nc = c.ConnectTo(0)
		js, _ := jetstream.New(nc)
		c.CreateStream(js, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Storage: jetstream.FileStorage, AllowBatchPublish: true, Replicas: 3})
		cpu = func() int64 {
			d, err := c.CPUTime()
			if err != nil {
				b.Fatal(err)
			}
			return processCPU(b) + d.Nanoseconds()
		}
	} else {
		nc = benchServer(b, true)
	}
	cfg := Config{Job: "bench", KeyGroups: 128, OutputStream: "OUT", OutputSubject: "out", Delivery: ExactlyOnce, FenceEpoch: epoch, Logger: quietLogger()}
	br, err := NewNATSBroker(nc, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := br.Prepare(context.Background(), PrepareRequest{}); err != nil {
		b.Fatal(err)
	}
	failed := make(chan struct{})
	var once sync.Once
	var ferr error
	pub, err := br.NewPublisher(0, true, func(err error) { once.Do(func() { ferr = err; close(failed) }) }, failed)
	if err != nil {
		b.Fatal(err)
	}
	s := pub.(*sink)
	next := make([]uint64, 128)
	value := make([]byte, 8)
	fence := func() {
		select {
		case <-s.Fence():
		case <-failed:
			b.Fatal(ferr)
		}
	}
	cpu0 := cpu()
	b.ResetTimer()
	for i := range b.N {
		kg := i % 128
		next[kg]++
		if err := s.Publish(Output{KeyGroup: kg, Index: next[kg], Key: []byte("key"), Value: value, Time: 1, Wm: math.MinInt64}); err != nil {
			b.Fatal(err)
		}
		if i%100000 == 99999 {
			fence()
		}
	}
	fence()
	b.StopTimer()
	b.ReportMetric(float64(cpu()-cpu0)/float64(b.N), "cpu-ns/op")
	if epoch > 0 && b.N >= 1000 {
		if s.fence.subject == "" || s.checks == 0 {
			b.Fatalf("the sink is not fenced (%d checks)", s.checks)
		}
		b.ReportMetric(float64(b.N)/float64(s.checks), "msgs/check")
	}
}

// processCPU is the process's user and system CPU time so far, in ns.
func processCPU(tb testing.TB) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func BenchmarkBatchAddChecks(b *testing.B) {
	nc := benchServer(b, false)
	s := &sink{nc: nc, idleMax: batchIdleMax}
	fb := &fastBatch{gen: nc.Stats().Reconnects, last: time.Now()}
	n := 0
	b.ResetTimer()
	for range b.N {
		now := time.Now()
		if now.Sub(fb.last) >= s.idleMax || fb.forgotten.Load() || s.reconnectedSince(fb.gen) {
			n++
		}
		fb.last = now
	}
	if n != 0 {
		b.Fatalf("%d adds took the batch for forgotten", n)
	}
}

// benchServer starts an embedded server (with JetStream when js) that
// stops with the benchmark, and connects to it.
func benchServer(b *testing.B, js bool) *nats.Conn {
	b.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true}
	if js {
		opts.JetStream, opts.StoreDir, opts.DisableJetStreamBanner = true, b.TempDir(), true
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		b.Fatal(err)
	}
	srv.Start()
	b.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		b.Fatal("not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	return nc
}
