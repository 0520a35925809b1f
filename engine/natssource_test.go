package engine

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// sourceRig is a broker on an embedded server whose input stream IN
// holds messages on subjects in.k<i>.
type sourceRig struct {
	t  *testing.T
	js jetstream.JetStream
	b  *natsBroker
}

func newSourceRig(t *testing.T, job string) *sourceRig {
	nc := startServer(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Job: job, InputStream: "IN", Logger: slog.New(slog.DiscardHandler)}
	cfg.setDefaults()
	b, err := newNATSBroker(nc, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &sourceRig{t: t, js: js, b: b}
}

// publish publishes messages from to to-1.
func (g *sourceRig) publish(from, to int) {
	g.t.Helper()
	for i := from; i < to; i++ {
		if _, err := g.js.Publish(context.Background(), fmt.Sprintf("in.k%d", i), []byte("x")); err != nil {
			g.t.Fatal(err)
		}
	}
}

// TestSourceStallReplacesConsumer: a consumer the server stops delivering
// from while messages are pending for it (paused on the server, which the
// client library does not notice: its heartbeats go on) is replaced by the
// watchdog, and the source hands on every message once, in order, across
// the replacement.
func TestSourceStallReplacesConsumer(t *testing.T) {
	g := newSourceRig(t, "stall")
	js, b, publish, ctx := g.js, g.b, g.publish, context.Background()
	publish(0, 10)
	r := &sourceReader{b: b, stall: 300 * time.Millisecond}
	msgs := make(chan Message, 100)
	done, err := r.start(ctx, 3, msgs)
	if err != nil {
		t.Fatal(err)
	}
	go r.watch(ctx, done)
	defer func() { r.stop(); <-done }()

	next := uint64(3)
	receive := func(through uint64) {
		t.Helper()
		for next <= through {
			select {
			case m := <-msgs:
				if m.Seq != next {
					t.Fatalf("got seq %d, want %d", m.Seq, next)
				}
				next++
			case <-time.After(30 * time.Second):
				t.Fatalf("no message after seq %d in 30s (consumers replaced: %d)", next-1, r.replaced.Load())
			}
		}
	}
	receive(10)
	if n := r.replaced.Load(); n != 0 {
		t.Fatalf("%d consumers replaced while it delivered", n)
	}
	// Pause the consumer on the server, then give it messages.
	cons, _ := r.current()
	name := cons.CachedInfo().Name
	if _, err := js.PauseConsumer(ctx, "IN", name, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	publish(10, 30)
	receive(30)
	if n := r.replaced.Load(); n < 1 {
		t.Fatalf("messages came without a replacement: the pause did not stall the consumer")
	}
	select {
	case m := <-msgs:
		t.Fatalf("a message after the last: seq %d", m.Seq)
	case <-time.After(500 * time.Millisecond):
	}
}

// stuckIterator is an iterator stuck inside the client library: neither
// Next nor Stop returns until released (as when the library retries a
// consumer's recreation without end, holding the consumer's lock).
type stuckIterator struct {
	jetstream.MessagesContext
	release chan struct{}
}

func (s *stuckIterator) Next(...jetstream.NextOpt) (jetstream.Msg, error) {
	<-s.release
	return nil, jetstream.ErrMsgIteratorClosed
}

func (s *stuckIterator) Stop() {
	<-s.release
	s.MessagesContext.Stop()
}

// TestSourceStuckConsumerLeftBehind: the first consumer's reads hang
// inside the library, Stop included. The watchdog's new consumer
// delivers every message once, in order, and a stop of the source ends
// at once, with the stuck consumer still stuck.
func TestSourceStuckConsumerLeftBehind(t *testing.T) {
	g := newSourceRig(t, "stuck")
	g.publish(0, 20)
	b, ctx := g.b, context.Background()
	release := make(chan struct{})
	defer close(release)
	opened := 0
	r := &sourceReader{b: b, stall: 300 * time.Millisecond, wrap: func(it jetstream.MessagesContext) jetstream.MessagesContext {
		opened++ // open runs on one goroutine at a time: start, then the watchdog
		if opened == 1 {
			return &stuckIterator{MessagesContext: it, release: release}
		}
		return it
	}}
	msgs := make(chan Message, 100)
	done, err := r.start(ctx, 1, msgs)
	if err != nil {
		t.Fatal(err)
	}
	go r.watch(ctx, done)
	for want := uint64(1); want <= 20; want++ {
		select {
		case m := <-msgs:
			if m.Seq != want {
				t.Fatalf("got seq %d, want %d", m.Seq, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no message after seq %d in 30s (consumers replaced: %d)", want-1, r.replaced.Load())
		}
	}
	if n := r.replaced.Load(); n != 1 {
		t.Fatalf("%d consumers replaced, want 1", n)
	}
	r.stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the source's stop waited for the stuck consumer")
	}
}
