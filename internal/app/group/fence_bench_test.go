package group

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cairn/engine"
	"cairn/internal/testutil/natscluster"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

var (
	fenceMsgs     = flag.Int("cairn.fence.msgs", 300000, "outputs per variant in BenchmarkFencePerPublish")
	fenceBatch    = flag.Int("cairn.fence.batch", 1000, "messages per atomic batch (the server allows 1000)")
	fenceInflight = flag.Int("cairn.fence.inflight", 4, "atomic batch commits outstanding")
	fenceVariants = flag.String("cairn.fence.variants", "unfenced,marker-each,pad-each,epoch-each,sampled,atomic,atomic-fenced", "variants BenchmarkFencePerPublish runs, in order")
	fenceEvery    = flag.Int("cairn.fence.every", 32, "the sampled variant checks the marker on every n-th message")
	fenceCluster  = flag.Bool("cairn.fence.cluster", false, "run on a three-node nats-server cluster with R3 streams instead of one embedded server")
)

// BenchmarkFencePerPublish compares, in one run on one embedded JetStream
// server, publishing outputs (engine envelope headers, 128 key-group
// subjects, file stream) four ways:
//
//   - unfenced: fast batches, as the engine publishes today after its
//     first fenced publish per key group (the baseline);
//   - marker-each: fast batches, every message expecting the writer's
//     epoch marker as the last message on a fence subject
//     (Nats-Expected-Last-Subject-Sequence + -Subject): fenced per publish,
//     one LoadLastMsg per message in the server;
//   - pad-each: unfenced fast batches whose messages carry two headers of
//     the fence headers' size that the server does not check (what the
//     fence's bytes cost, apart from its check);
//   - epoch-each: unfenced fast batches whose messages carry the writer's
//     epoch (Cairn-Epoch), what a reader-side fence needs;
//   - sampled: fast batches carrying the epoch, the first message and
//     every -cairn.fence.every-th one expecting the marker: a newer marker
//     refuses the next checked message and, the batch failing on a gap,
//     everything after it, so at most every-1 stale messages are stored,
//     each with an epoch below the marker's (a reader drops them);
//   - atomic: atomic batches, unfenced (what batching atomically costs);
//   - atomic-fenced: atomic batches whose first message carries the marker
//     expectation: the server checks it when the batch commits, and a failed
//     check refuses the whole batch, so every message is fenced at one check
//     per batch. Commits are pipelined (-cairn.fence.inflight); a clustered
//     stream refuses a second expectation on a subject whose first is still
//     being replicated, so batch i expects the marker on fence subject
//     i mod inflight, and a new writer writes one marker on each.
//
// It reports msgs/s of each and their ratios to unfenced, and checks that
// a newer marker refuses the fenced variants' next publish entirely.
//
//	go test ./internal/app/group -run '^$' -bench FencePerPublish -benchtime 1x -count 3
func BenchmarkFencePerPublish(b *testing.B) {
	var nc *nats.Conn
	replicas := 1
	// With the servers in this process, its CPU time is theirs and the
	// publisher's; with a cluster, the nodes' is added.
	cpu := cpuTime
	if *fenceCluster {
		c := natscluster.Start(b)
		nc, replicas = c.ConnectTo(0), 3
		cpu = func() time.Duration {
			d, err := c.CPUTime()
			if err != nil {
				b.Fatal(err)
			}
			return d + cpuTime()
		}
	} else {
		nc = startEmbedded(b)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	rates, cpus := map[string]float64{}, map[string]float64{}
	sampledChecks = 0
	variants := strings.Split(*fenceVariants, ",")
	k := 0
	for i := range b.N {
		// Each iteration starts with another variant, so that none always
		// runs first (on a fresh server, or a cluster still settling).
		for j := range variants {
			v := variants[(i+j)%len(variants)]
			k++
			c0 := cpu()
			rate := publishVariant(b, nc, js, fmt.Sprintf("OUT%d", k), v, *fenceMsgs, replicas)
			rates[v] += rate / float64(b.N)
			cpus[v] += float64(cpu()-c0) / float64(*fenceMsgs) / float64(b.N)
		}
	}
	if sampledChecks > 0 {
		b.ReportMetric(float64(*fenceMsgs*b.N)/float64(sampledChecks), "sampled-msgs/check")
	}
	for _, v := range variants {
		b.ReportMetric(rates[v], v+"-msgs/s")
		b.ReportMetric(cpus[v], v+"-cpu-ns/msg")
		if v != "unfenced" {
			b.ReportMetric(rates[v]/rates["unfenced"], v+"/unfenced")
			b.ReportMetric(cpus["unfenced"]/cpus[v], v+"/unfenced-by-cpu")
		}
	}
}

// cpuTime is the process's user and system CPU time: with the server
// embedded, it is the server's and the publisher's work together, which
// other load on the machine inflates far less than wall-clock time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startEmbedded(tb testing.TB) *nats.Conn {
	tb.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: tb.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		tb.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats not ready")
	}
	tb.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

const fenceSubject = "fence.out"

// sampledChecks counts the sampled variant's checked messages.
var sampledChecks int

// headerEpoch carries the writer's epoch on each output in the sampled
// design, so that a reader can drop the few stale outputs stored between a
// newer marker and the stale writer's next checked message.
const headerEpoch = "Cairn-Epoch"

// publishVariant publishes n outputs to a new stream the way variant says
// and returns the rate from the first publish to the last acknowledgement.
func publishVariant(b *testing.B, nc *nats.Conn, js jetstream.JetStream, stream, variant string, n, replicas int) float64 {
	b.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{stream + ".>"}, Storage: jetstream.FileStorage,
		AllowBatchPublish: true, AllowAtomicPublish: true, Replicas: replicas,
	}); err != nil {
		b.Fatal(err)
	}
	defer js.DeleteStream(ctx, stream)
	fences := make([]string, *fenceInflight)
	marks := make([]uint64, *fenceInflight)
	for i := range fences {
		fences[i] = stream + "." + fenceSubject + "." + strconv.Itoa(i)
		ack, err := js.Publish(ctx, fences[i], []byte("writer-1"))
		if err != nil {
			b.Fatal(err)
		}
		marks[i] = ack.Sequence
	}
	fence, epoch := fences[0], marks[0]
	subjects := make([]string, 128)
	for i := range subjects {
		subjects[i] = stream + ".out." + strconv.Itoa(i)
	}
	value := make([]byte, 8)
	header := func(i int) nats.Header {
		return nats.Header{
			engine.HeaderKey:  {"key-" + strconv.Itoa(i%100000)},
			engine.HeaderTime: {"1700000000000"},
			engine.HeaderOut:  {strconv.Itoa(i/128 + 1)},
		}
	}
	fenceHeader := func(h nats.Header, fence string, seq uint64) {
		h[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(seq, 10)}
		h[jetstream.ExpectedLastSubjSeqSubjHeader] = []string{fence}
	}

	b.StartTimer()
	t0 := time.Now()
	switch variant {
	case "unfenced", "marker-each", "pad-each", "epoch-each", "sampled":
		var asyncErr error
		var asyncMu sync.Mutex
		fp, err := jetstreamext.NewFastPublisher(js, jetstreamext.FastPublishFlowControl{Flow: 500, MaxOutstandingAcks: 32, AckTimeout: 30 * time.Second},
			jetstreamext.WithFastPublisherErrorHandler(func(err error) {
				asyncMu.Lock()
				if asyncErr == nil {
					asyncErr = err
				}
				asyncMu.Unlock()
			}))
		if err != nil {
			b.Fatal(err)
		}
		var checked, acked uint64 // batch sequences of the last check and the last acknowledgement
		for i := range n {
			h := header(i)
			switch variant {
			case "marker-each":
				fenceHeader(h, fence, epoch)
			case "epoch-each":
				h[headerEpoch] = []string{"1"}
			case "sampled":
				h[headerEpoch] = []string{"1"}
				// A clustered stream refuses an expectation on a subject
				// whose previous one is not yet applied: the next check
				// waits until the previous one is acknowledged.
				if i%*fenceEvery == 0 && (checked == 0 || acked >= checked) {
					fenceHeader(h, fence, epoch)
					checked = uint64(i + 1)
					sampledChecks++
				}
			case "pad-each":
				h["Cairn-Pad-Last-Subject-Sequence"] = []string{strconv.FormatUint(epoch, 10)}
				h["Cairn-Pad-Last-Subject-Sequence-Subject"] = []string{fence}
			}
			ack, err := fp.AddMsg(&nats.Msg{Subject: subjects[i%128], Header: h, Data: value})
			if err == nil {
				acked = ack.AckSequence
			} else {
				asyncMu.Lock()
				defer asyncMu.Unlock()
				b.Fatalf("%s: message %d: %v (%v)", variant, i, err, asyncErr)
			}
		}
		if ack, err := fp.Close(ctx); err != nil || ack.BatchSize != uint64(n) {
			b.Fatalf("%s: close: %v %+v", variant, err, ack)
		}
	case "atomic", "atomic-fenced":
		ap := newAtomicPublisher(b, nc, *fenceInflight)
		for batch, lo := 0, 0; lo < n; batch, lo = batch+1, lo+*fenceBatch {
			hi := min(lo+*fenceBatch, n)
			msgs := make([]*nats.Msg, 0, hi-lo)
			for i := lo; i < hi; i++ {
				msgs = append(msgs, &nats.Msg{Subject: subjects[i%128], Header: header(i), Data: value})
			}
			if variant == "atomic-fenced" {
				j := batch % len(fences)
				fenceHeader(msgs[0].Header, fences[j], marks[j])
			}
			if err := ap.publish(msgs); err != nil {
				b.Fatal(err)
			}
		}
		if err := ap.wait(); err != nil {
			b.Fatalf("%s: %v", variant, err)
		}
	default:
		b.Fatalf("unknown variant %s", variant)
	}
	d := time.Since(t0)
	b.StopTimer()

	s, err := js.Stream(ctx, stream)
	if err != nil {
		b.Fatal(err)
	}
	want := uint64(n + len(fences))
	info, err := s.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if info.State.Msgs != want {
		b.Fatalf("%s: stored %d messages, want %d outputs + %d markers", variant, info.State.Msgs, n, len(fences))
	}
	if variant == "marker-each" || variant == "atomic-fenced" || variant == "sampled" {
		checkFenced(b, nc, js, stream, fence, subjects, epoch, header, fenceHeader, variant)
	}
	return float64(n) / d.Seconds()
}

// checkFenced writes a newer writer's marker and shows the older writer's
// next publish (a whole atomic batch) is refused: nothing of it is stored.
func checkFenced(b *testing.B, nc *nats.Conn, js jetstream.JetStream, stream, fence string, subjects []string, epoch uint64,
	header func(int) nats.Header, fenceHeader func(nats.Header, string, uint64), variant string) {
	ctx := context.Background()
	if variant == "sampled" {
		checkSampled(b, js, stream, fence, subjects, epoch, header, fenceHeader)
		return
	}
	if _, err := js.Publish(ctx, fence, []byte("writer-2")); err != nil {
		b.Fatal(err)
	}
	s, _ := js.Stream(ctx, stream)
	before, _ := s.Info(ctx)
	var err error
	if variant == "marker-each" {
		h := header(0)
		fenceHeader(h, fence, epoch)
		_, err = js.PublishMsg(ctx, &nats.Msg{Subject: subjects[0], Header: h, Data: []byte("stale")})
	} else {
		ap := newAtomicPublisher(b, nc, 1)
		msgs := make([]*nats.Msg, 10)
		for i := range msgs {
			msgs[i] = &nats.Msg{Subject: subjects[i], Header: header(i), Data: []byte("stale")}
		}
		fenceHeader(msgs[0].Header, fence, epoch)
		if err = ap.publish(msgs); err == nil {
			err = ap.wait()
		}
	}
	if err == nil {
		b.Fatalf("%s: a publish fenced on epoch %d was accepted after a newer marker", variant, epoch)
	}
	after, _ := s.Info(ctx)
	if after.State.Msgs != before.State.Msgs {
		b.Fatalf("%s: refused publish stored %d messages", variant, after.State.Msgs-before.State.Msgs)
	}
}

// checkSampled shows the bound of the sampled fence: a writer's fast batch
// that is open when a newer marker lands stores at most every-1 more
// messages, all with the old epoch, then fails.
func checkSampled(b *testing.B, js jetstream.JetStream, stream, fence string, subjects []string, epoch uint64,
	header func(int) nats.Header, fenceHeader func(nats.Header, string, uint64)) {
	ctx := context.Background()
	s, _ := js.Stream(ctx, stream)
	// Acknowledged one by one, so the marker lands between two known
	// messages.
	fp, err := jetstreamext.NewFastPublisher(js, jetstreamext.FastPublishFlowControl{Flow: 1, MaxOutstandingAcks: 1, AckTimeout: 2 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	var failed error
	var markerSeq uint64
	for i := range 10 * *fenceEvery {
		if i == *fenceEvery+5 {
			// Mid-stride, another writer takes over.
			ack, err := js.Publish(ctx, fence, []byte("writer-2"))
			if err != nil {
				b.Fatal(err)
			}
			markerSeq = ack.Sequence
		}
		h := header(i)
		h[headerEpoch] = []string{"1"}
		if i%*fenceEvery == 0 {
			fenceHeader(h, fence, epoch)
		}
		if _, err := fp.AddMsg(&nats.Msg{Subject: subjects[i%128], Header: h, Data: []byte("stale")}); err != nil {
			failed = err
			break
		}
	}
	if _, err := fp.Close(ctx); failed == nil {
		failed = err
	}
	if failed == nil {
		b.Fatalf("sampled: a stale writer's batch went through a newer marker")
	}
	info, _ := s.Info(ctx)
	stale := info.State.LastSeq - markerSeq
	if markerSeq == 0 || stale >= uint64(*fenceEvery) {
		b.Fatalf("sampled: %d stale messages stored after the newer marker at %d (bound %d)", stale, markerSeq, *fenceEvery-1)
	}
	for seq := markerSeq + 1; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil || m.Header.Get(headerEpoch) != "1" {
			b.Fatalf("sampled: stale message %d: %v %v", seq, m, err)
		}
	}
	b.Logf("sampled: the stale writer stored %d messages after the newer marker, then failed: %v", stale, failed)
}

// atomicPublisher sends atomic batches (Nats-Batch-Id/-Sequence/-Commit)
// with up to inflight commits outstanding: only the commit asks for a
// reply, so a batch costs one round trip, overlapped with the next ones.
type atomicPublisher struct {
	nc    *nats.Conn
	inbox string
	sub   *nats.Subscription
	slots chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	err   error
	seq   int
}

func newAtomicPublisher(b *testing.B, nc *nats.Conn, inflight int) *atomicPublisher {
	ap := &atomicPublisher{nc: nc, inbox: nats.NewInbox(), slots: make(chan struct{}, inflight)}
	sub, err := nc.Subscribe(ap.inbox+".*", func(m *nats.Msg) {
		defer ap.wg.Done()
		defer func() { <-ap.slots }()
		if bytes.Contains(m.Data, []byte(`"error"`)) {
			ap.mu.Lock()
			if ap.err == nil {
				ap.err = fmt.Errorf("atomic batch commit: %s", m.Data)
			}
			ap.mu.Unlock()
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sub.Unsubscribe() })
	ap.sub = sub
	return ap
}

var errCommitTimeout = errors.New("atomic batch commit: no reply")

func (ap *atomicPublisher) publish(msgs []*nats.Msg) error {
	ap.mu.Lock()
	err := ap.err
	ap.seq++
	seq := ap.seq
	ap.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case ap.slots <- struct{}{}:
	case <-time.After(30 * time.Second):
		return errCommitTimeout
	}
	ap.wg.Add(1)
	id := strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix)
	for i, m := range msgs {
		m.Header[jetstreamext.BatchIDHeader] = []string{id}
		m.Header[jetstreamext.BatchSeqHeader] = []string{strconv.Itoa(i + 1)}
		if i == len(msgs)-1 {
			m.Header[jetstreamext.BatchCommitHeader] = []string{"1"}
			m.Reply = ap.inbox + "." + strconv.Itoa(seq)
		}
		if err := ap.nc.PublishMsg(m); err != nil {
			return err
		}
	}
	return nil
}

func (ap *atomicPublisher) wait() error {
	done := make(chan struct{})
	go func() { ap.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		return errCommitTimeout
	}
	ap.mu.Lock()
	defer ap.mu.Unlock()
	return ap.err
}
