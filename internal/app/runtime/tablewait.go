package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/job"
)

// Table bootstrapping: a lookup join whose stream side starts from nothing
// waits until its table is in the join's repartition stream, as Kafka
// Streams fills a GlobalKTable before it processes (docs/RATIONALE.md,
// "A table is loaded before the stream it enriches"). Without it, the two
// forwarders race on a first start and a record may reach the join before
// its key's row although the row was in the bucket long before.

// tableGates sets a gate on every writer of a two-input stage's stream side
// whose table side is a KV table and that restored nothing: it runs only
// once the table's forwarder has put the bucket's content at start into
// the stream. A writer that restored a checkpoint carries on where the
// stream already fixed the interleaving.
func tableGates(ctx context.Context, js jetstream.JetStream, j *job.Job, subs []job.SubTopology, all []*Running, log *slog.Logger) error {
	for k, sub := range subs {
		if sub.Sides != 2 {
			continue
		}
		ws := writers(j, subs, k)
		var table *Running
		var bucket string
		for _, w := range ws {
			if in, ok := j.InputNamed(subs[w.sub].Input); ok && w.side == 1 && in.Table != "" {
				table, bucket = all[w.sub], in.Table
			}
		}
		if table == nil {
			continue // no table; or, in a group, it is loaded by another member
		}
		stream, _ := engine.TableStream(bucket)
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return fmt.Errorf("table %s: %w", bucket, err)
		}
		last := s.CachedInfo().State.LastSeq
		if last == 0 {
			continue // an empty bucket: nothing to wait for
		}
		for _, w := range ws {
			if w.side != 0 || all[w.sub] == nil || all[w.sub].Restored != nil {
				continue
			}
			all[w.sub].gates = append(all[w.sub].gates, func(ctx context.Context) error {
				return waitTableLoaded(ctx, table, bucket, last, log)
			})
		}
	}
	return nil
}

// waitTableLoaded waits until the table's forwarder has processed the
// bucket's stream through sequence last and, with checkpoints, until a
// checkpoint past it has committed: a checkpoint waits for every output
// before its barrier to be acknowledged, so then the rows are in the
// repartition stream, ahead of anything the stream side writes later.
func waitTableLoaded(ctx context.Context, table *Running, bucket string, last uint64, log *slog.Logger) error {
	t0 := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for table.Engine.ProcessedSeq() < last {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	if table.committer != nil {
		for {
			id, ok := table.Engine.TriggerCheckpoint(ctx, engine.CheckpointRequest{})
			if ok {
				ev, err := table.Engine.WaitCheckpoint(ctx, id)
				if err != nil {
					return err
				}
				if ev.Err == nil && ev.SourceSeq >= last {
					break
				}
			}
			select { // one in flight, or it failed: again
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
	}
	log.Info("table loaded before the stream that reads it", "table", bucket, "through_seq", last, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// runGated runs the sub-topology's engine once its gates have passed; a
// stop while waiting is a clean stop (nothing ran, nothing to checkpoint).
func (r *Running) runGated(ctx context.Context) error {
	for _, g := range r.gates {
		if err := g(ctx); err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("waiting for a table: %w", err)
		}
	}
	return r.RunEngine(ctx)
}
