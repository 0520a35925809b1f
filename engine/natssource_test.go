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
	if err := r.open(ctx, 3); err != nil {
		t.Fatal(err)
	}
	r.lastSeq.Store(2)
	msgs := make(chan Message, 100)
	done := make(chan struct{})
	go r.read(ctx, msgs, done)
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
