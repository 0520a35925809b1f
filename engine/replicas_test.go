package engine

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// noPeersErr is the refusal a cluster sends when it cannot place a
// replicated stream, as the client library decodes it.
var noPeersErr = &jetstream.APIError{Code: 400, ErrorCode: errCodeClusterNoPeers, Description: "no suitable peers for placement, peer offline"}

func TestPlaceWaitingTriesAgainOnNoPeers(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	tries := 0
	create := func(context.Context, jetstream.StreamConfig) (jetstream.Stream, error) {
		tries++
		if tries <= 3 {
			return nil, noPeersErr
		}
		return nil, nil
	}
	if _, err := placeWaiting(context.Background(), jetstream.StreamConfig{Name: "S", Replicas: 3}, log, 10*time.Second, create); err != nil {
		t.Fatalf("create after three refusals: %v", err)
	}
	if tries != 4 {
		t.Fatalf("%d tries, want 4", tries)
	}
	if n := strings.Count(logged.String(), "cannot place a stream yet"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logged.String())
	}
}

func TestPlaceWaitingGivesUp(t *testing.T) {
	refuse := func(context.Context, jetstream.StreamConfig) (jetstream.Stream, error) { return nil, noPeersErr }
	// A cluster too small for the replicas asked: the refusal, after the wait.
	start := time.Now()
	if _, err := placeWaiting(context.Background(), jetstream.StreamConfig{Name: "S"}, nil, 600*time.Millisecond, refuse); !NoPeers(err) {
		t.Fatalf("after the wait: %v", err)
	}
	if since := time.Since(start); since < 600*time.Millisecond {
		t.Fatalf("gave up after %v, before the wait of 600ms", since)
	}
	// Or when the caller's context ends.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := placeWaiting(ctx, jetstream.StreamConfig{Name: "S"}, nil, time.Hour, refuse); !NoPeers(err) {
		t.Fatalf("after the context ended: %v", err)
	}
	// Any other error at once.
	other := errors.New("disk full")
	tries := 0
	fail := func(context.Context, jetstream.StreamConfig) (jetstream.Stream, error) { tries++; return nil, other }
	if _, err := placeWaiting(context.Background(), jetstream.StreamConfig{Name: "S"}, nil, time.Hour, fail); !errors.Is(err, other) || tries != 1 {
		t.Fatalf("another error: %v after %d tries", err, tries)
	}
}
