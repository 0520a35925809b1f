package engine

import (
	"context"

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
