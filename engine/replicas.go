package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamReplicas is the largest replica count of the given streams that
// exist (1 when none does). The streams cairn creates for a job (outputs,
// dead letters, repartition) take its inputs' count: on a cluster, a user
// who replicated the input wants the job's streams to outlive a node too,
// and on a single server it is 1.
func StreamReplicas(ctx context.Context, js jetstream.JetStream, streams ...string) int {
	n := 1
	for _, name := range streams {
		if name == "" {
			continue
		}
		st, err := js.Stream(ctx, name)
		if err != nil {
			continue
		}
		n = max(n, st.CachedInfo().Config.Replicas)
	}
	return n
}

// PlacementWait bounds how long CreateStream waits for a NATS cluster to
// have enough peers online to place a replicated stream.
const PlacementWait = 30 * time.Second

// CreateStream creates stream cfg. A cluster that refuses it for want of
// online peers (JetStream's error 10005, "no suitable peers for
// placement") is asked again for up to PlacementWait, with a warning on
// log: the meta leader counts a node offline for a moment when its
// heartbeats come late (a loaded machine), or while it restarts. A
// cluster too small for the replicas asked is refused the same way, and
// that refusal is returned after the wait.
func CreateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, log *slog.Logger) (jetstream.Stream, error) {
	return placeWaiting(ctx, cfg, log, PlacementWait, js.CreateStream)
}

// CreateOrUpdateStream is CreateStream for a stream that may exist and
// takes cfg's settings.
func CreateOrUpdateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, log *slog.Logger) (jetstream.Stream, error) {
	return placeWaiting(ctx, cfg, log, PlacementWait, js.CreateOrUpdateStream)
}

func placeWaiting(ctx context.Context, cfg jetstream.StreamConfig, log *slog.Logger, wait time.Duration, create func(context.Context, jetstream.StreamConfig) (jetstream.Stream, error)) (jetstream.Stream, error) {
	deadline := time.Now().Add(wait)
	warned := false
	for {
		st, err := create(ctx, cfg)
		if err == nil || !NoPeers(err) || time.Now().After(deadline) {
			return st, err
		}
		if !warned && log != nil {
			warned = true
			log.Warn("the NATS cluster cannot place a stream yet, waiting for its peers", "stream", cfg.Name, "replicas", cfg.Replicas, "wait", wait, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// NoPeers reports a cluster's refusal to place a replicated stream for
// want of suitable peers (JetStream's error 10005).
func NoPeers(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeClusterNoPeers
}

// errCodeClusterNoPeers is JetStream's JSClusterNoPeersErr; the client
// library names no constant for it.
const errCodeClusterNoPeers jetstream.ErrorCode = 10005
