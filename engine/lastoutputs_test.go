package engine

import (
	"cairn/internal/base/natsembed"
	"cairn/internal/testutil/faultproxy"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publishOutputs creates the stream OUT and publishes n outputs (Cairn-Out
// 1..n) to each of the key groups kgs, round by round; it returns each key
// group's last stream sequence.
func publishOutputs(t testing.TB, js jetstream.JetStream, kgs []int, n int) map[int]uint64 {
	t.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}}); err != nil {
		t.Fatal(err)
	}
	last := map[int]uint64{}
	for i := 1; i <= n; i++ {
		for _, kg := range kgs {
			m := &nats.Msg{Subject: "out." + strconv.Itoa(kg), Header: nats.Header{HeaderOut: {strconv.Itoa(i)}}, Data: []byte("v")}
			ack, err := js.PublishMsg(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			last[kg] = ack.Sequence
		}
	}
	return last
}

// TestReadLastOutputs reads every key group's last output, across more key
// groups than one fetch asks for, and leaves out the key groups with none.
func TestReadLastOutputs(t *testing.T) {
	for _, c := range []struct {
		name      string
		keyGroups int
		kgs       []int
	}{
		{"more key groups than a fetch", 1500, kgRange(0, 1500, 1)},
		{"some key groups", 128, kgRange(3, 128, 5)},
		{"one key group", 128, []int{127}},
	} {
		t.Run(c.name, func(t *testing.T) {
			nc := startServer(t)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			want := publishOutputs(t, js, c.kgs, 3)
			cfg := &Config{KeyGroups: c.keyGroups, OutputStream: "OUT", OutputSubject: "out"}
			got, err := readLastOutputs(context.Background(), js, cfg, cfg.targets()[0])
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("read the last outputs of %d key groups, want %d", len(got), len(want))
			}
			for kg, s := range want {
				if lo := got[kg]; lo.Index != 3 || lo.SubjectSeq != s {
					t.Errorf("key group %d: last output %+v, want index 3 at stream sequence %d", kg, lo, s)
				}
			}
		})
	}
}

// TestReadLastOutputsEmpty reads an output stream that holds nothing.
func TestReadLastOutputsEmpty(t *testing.T) {
	nc := startServer(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	publishOutputs(t, js, nil, 0)
	cfg := &Config{KeyGroups: 16, OutputStream: "OUT", OutputSubject: "out"}
	got, err := readLastOutputs(context.Background(), js, cfg, cfg.targets()[0])
	if err != nil || len(got) != 0 {
		t.Fatalf("an empty output stream: %v, %v", got, err)
	}
}

// BenchmarkReadLastOutputs is a restart's read of the output stream under
// exactly once: 128 key groups, a few outputs each. It used to take the
// fetch's whole 300 ms wait whatever the number of key groups.
func BenchmarkReadLastOutputs(b *testing.B) {
	nc := startServer(b)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	publishOutputs(b, js, kgRange(0, 128, 1), 5)
	cfg := &Config{KeyGroups: 128, OutputStream: "OUT", OutputSubject: "out"}
	for b.Loop() {
		got, err := readLastOutputs(context.Background(), js, cfg, cfg.targets()[0])
		if err != nil || len(got) != 128 {
			b.Fatalf("read %d key groups' last outputs, want 128: %v", len(got), err)
		}
	}
}

func kgRange(from, to, step int) []int {
	var s []int
	for i := from; i < to; i += step {
		s = append(s, i)
	}
	return s
}

// TestReadLastOutputsSlowServer reads the last outputs over a link slower
// than a fetch's wait (a replicated stream on a loaded cluster answers
// like this): the first fetch ends empty, and the read goes on until the
// consumer has delivered what it had pending, instead of taking every key
// group for unwritten.
func TestReadLastOutputsSlowServer(t *testing.T) {
	srv, err := natsembed.Start(natsembed.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	direct, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	djs, err := jetstream.New(direct)
	if err != nil {
		t.Fatal(err)
	}
	want := publishOutputs(t, djs, kgRange(0, 16, 1), 2)

	proxy := faultproxy.Start(t, strings.TrimPrefix(srv.URL(), "nats://"))
	nc, err := nats.Connect(proxy.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	proxy.SetDelay(800 * time.Millisecond) // each way: a fetch's reply comes after the client gave up (its 300 ms wait + 1 s)
	cfg := &Config{KeyGroups: 16, OutputStream: "OUT", OutputSubject: "out"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got, err := readLastOutputs(ctx, js, cfg, cfg.targets()[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read the last outputs of %d key groups over a slow link, want %d", len(got), len(want))
	}
	for kg, s := range want {
		if lo := got[kg]; lo.Index != 2 || lo.SubjectSeq != s {
			t.Errorf("key group %d: last output %+v, want index 2 at stream sequence %d", kg, lo, s)
		}
	}
}

// faultyJS injects the faults a cluster shows a read of the last outputs,
// each for its first N calls: creations of the ordered consumer that time
// out (createFail: the stream's leader just died), fetches that fail with
// the client's request timeout (fetchTimeout: a fetch remaking the
// consumer meanwhile), and fetches answered "no responders" (unserved: a
// consumer just made whose leader is still being placed).
type faultyJS struct {
	jetstream.JetStream
	createFail, fetchTimeout, unserved int
	creates, fetches                   int
}

func (j *faultyJS) OrderedConsumer(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	j.creates++
	if j.createFail > 0 {
		j.createFail--
		return nil, context.DeadlineExceeded
	}
	c, err := j.JetStream.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, err
	}
	return &faultyConsumer{Consumer: c, js: j}, nil
}

type faultyConsumer struct {
	jetstream.Consumer
	js *faultyJS
}

func (c *faultyConsumer) Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	c.js.fetches++
	switch {
	case c.js.fetchTimeout > 0:
		c.js.fetchTimeout--
		return nil, fmt.Errorf("create consumer: %w", nats.ErrTimeout)
	case c.js.unserved > 0:
		c.js.unserved--
		return unservedBatch{}, nil
	}
	return c.Consumer.Fetch(batch, opts...)
}

type unservedBatch struct{}

func (unservedBatch) Messages() <-chan jetstream.Msg {
	ch := make(chan jetstream.Msg)
	close(ch)
	return ch
}

func (unservedBatch) Error() error { return nats.ErrNoResponders }

// TestReadLastOutputsUnserved: fetches that reach no consumer make the
// read start over (a group member's start failed on the first one); a
// stop meanwhile ends it with the stop, not with "no responders".
func TestReadLastOutputsUnserved(t *testing.T) {
	nc := startServer(t)
	real, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	want := publishOutputs(t, real, kgRange(0, 16, 1), 2)
	cfg := &Config{KeyGroups: 16, OutputStream: "OUT", OutputSubject: "out"}
	js := &faultyJS{JetStream: real, unserved: 3}
	got, err := readLastOutputs(context.Background(), js, cfg, cfg.targets()[0])
	if err != nil {
		t.Fatal(err)
	}
	if js.fetches < 4 || len(got) != len(want) {
		t.Fatalf("after %d fetches: the last outputs of %d key groups, want %d", js.fetches, len(got), len(want))
	}
	for kg, s := range want {
		if lo := got[kg]; lo.Index != 2 || lo.SubjectSeq != s {
			t.Errorf("key group %d: last output %+v, want index 2 at stream sequence %d", kg, lo, s)
		}
	}
	// Never served, and stopped: the stop's error.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	js = &faultyJS{JetStream: real, unserved: 1 << 30}
	if _, err := readLastOutputs(ctx, js, cfg, cfg.targets()[0]); !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped while unserved: %v, want context.Canceled", err)
	}
}

// TestReadLastOutputsLeaderLost: requests that time out while the read
// still runs (the output stream between leaders) make it try again; a
// resumed job once stopped on the first of them ("context deadline
// exceeded") right after a cluster node was killed.
func TestReadLastOutputsLeaderLost(t *testing.T) {
	nc := startServer(t)
	real, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	want := publishOutputs(t, real, kgRange(0, 16, 1), 2)
	cfg := &Config{KeyGroups: 16, OutputStream: "OUT", OutputSubject: "out"}
	js := &faultyJS{JetStream: real, createFail: 2, fetchTimeout: 2}
	got, err := readLastOutputs(context.Background(), js, cfg, cfg.targets()[0])
	if err != nil {
		t.Fatal(err)
	}
	if js.creates < 5 || js.fetches < 3 || len(got) != len(want) {
		t.Fatalf("after %d creations and %d fetches: the last outputs of %d key groups, want %d", js.creates, js.fetches, len(got), len(want))
	}
	for kg, s := range want {
		if lo := got[kg]; lo.Index != 2 || lo.SubjectSeq != s {
			t.Errorf("key group %d: last output %+v, want index 2 at stream sequence %d", kg, lo, s)
		}
	}
	// A timeout once the read is stopped is the stop.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	js = &faultyJS{JetStream: real, createFail: 1 << 30}
	if _, err := readLastOutputs(ctx, js, cfg, cfg.targets()[0]); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stopped: %v, want the timeout, not a retry", err)
	}
}
