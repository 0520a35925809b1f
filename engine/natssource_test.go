package engine

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestSourceStallReplacesConsumer: a consumer the server stops delivering
// from while messages are pending for it (paused on the server, which the
// client library does not notice: its heartbeats go on) is replaced by the
// watchdog, and the source hands on every message once, in order, across
// the replacement.
func TestSourceStallReplacesConsumer(t *testing.T) {
	nc := startServer(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, fmt.Sprintf("in.k%d", i), []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0, 10)
	cfg := Config{Job: "stall", InputStream: "IN", Logger: slog.New(slog.DiscardHandler)}
	cfg.setDefaults()
	b, err := newNATSBroker(nc, &cfg)
	if err != nil {
		t.Fatal(err)
	}
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
	nc := startServer(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := js.Publish(ctx, fmt.Sprintf("in.k%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{Job: "stuck", InputStream: "IN", Logger: slog.New(slog.DiscardHandler)}
	cfg.setDefaults()
	b, err := newNATSBroker(nc, &cfg)
	if err != nil {
		t.Fatal(err)
	}
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
