package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
)

func TestStoreFull(t *testing.T) {
	for _, c := range []struct {
		err    string
		full   bool
		stream string
	}{
		{"engine: fast-batch publish to stream COUNTS: error processing batch at sequence 71: nats: API error: code=503 err_code=10077 description=maximum messages exceeded", true, "COUNTS"},
		{"engine: publish to counts.3: nats: API error: code=503 err_code=10077 description=maximum bytes exceeded", true, "subject:counts.3"},
		{"engine: publish to counts.3: nats: API error: code=400 err_code=10002 description=resource limits exceeded for account", true, "subject:counts.3"},
		{"runtime: something: insufficient resources", true, ""},
		{"engine: fast-batch publish: commit: nats: API error: code=400 err_code=10208 description=batch publish ID unknown", false, ""},
	} {
		full, stream := storeFull(fmt.Errorf("sub: %w", errors.New(c.err)))
		if full != c.full || stream != c.stream {
			t.Errorf("storeFull(%q) = %v, %q; want %v, %q", c.err, full, stream, c.full, c.stream)
		}
	}
}

// TestKeepListener: one address serves two servers in turn; the first's
// shutdown does not close it.
func TestKeepListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := NewKeepListener(ln)
	defer k.Close()
	for i, want := range []string{"one", "two"} {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, want) })}
		go func() { _ = srv.Serve(k.Next()) }()
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			t.Fatalf("server %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != want {
			t.Errorf("server %d answered %q, want %q", i, b, want)
		}
		http.DefaultClient.CloseIdleConnections()
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFenced: a publish the server refuses for a wrong last subject
// sequence is a fence, known by its error code however it is wrapped, and
// by its text when only the text came back (a fast batch's refusal);
// other refusals are not.
func TestFenced(t *testing.T) {
	_, js := startJetStream(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "out.1", []byte("a")); err != nil {
		t.Fatal(err)
	}
	_, fence := js.Publish(ctx, "out.1", []byte("b"), jetstream.WithExpectLastSequencePerSubject(7))
	if fence == nil {
		t.Fatal("a publish with a wrong expected last subject sequence was stored")
	}
	_, full := js.Publish(ctx, "out.2", []byte("c"))
	if full == nil {
		t.Fatal("a publish past max_msgs with discard new was stored")
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"the server's refusal", fence, true},
		{"wrapped", fmt.Errorf("engine: publish to out.1: %w", fence), true},
		{"as text only", errors.New("engine: fast-batch publish to stream OUT: " + fence.Error()), true},
		{"a full stream", fmt.Errorf("engine: publish to out.2: %w", full), false},
	} {
		if got := fenced(c.err); got != c.want {
			t.Errorf("%s: fenced(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestBrokerMoment: a resumed start tries again when it failed because the
// broker did not answer in time (the read of the last outputs timing out
// while a stream's leader is elected), not when it was refused or the
// server stayed unreachable past the limit.
func TestBrokerMoment(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"a request timed out", fmt.Errorf("sub-topology orderpay: engine: read last outputs of RP: %w", context.DeadlineExceeded), true},
		{"no responders", fmt.Errorf("engine: create consumer: %w", nats.ErrNoResponders), true},
		{"the client's timeout", fmt.Errorf("engine: stream info: %w", nats.ErrTimeout), true},
		{"unreachable past the limit", fmt.Errorf("%w: 127.0.0.1:4222 for 5m", ErrNATSUnreachable), false},
		{"a configuration the server refused", fmt.Errorf("%w: the output stream takes no fast batches", engine.ErrConfig), false},
		{"another writer", errors.New("engine: publish: nats: API error: code=400 err_code=10071 description=wrong last sequence: 7"), false},
		{"a corrupt checkpoint", errors.New("restore latest: checkpoint 7: manifest checksum mismatch"), false},
	} {
		if got := brokerMoment(c.err); got != c.want {
			t.Errorf("%s: brokerMoment(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
