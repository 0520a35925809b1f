package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ctxCommitter takes a while per commit and gives up when its context ends.
type ctxCommitter struct{ hold time.Duration }

func (c ctxCommitter) Commit(ctx context.Context, _ Barrier) error {
	select {
	case <-time.After(c.hold):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestNoCheckpointAfterTheFinalOne: a graceful stop ends with its final
// checkpoint; the interval trigger stops when the stop begins, so no
// interval checkpoint starts after the final one only to be cancelled
// (and counted as failed) when the engine's work ends.
func TestNoCheckpointAfterTheFinalOne(t *testing.T) {
	nc := startServer(t)
	js, _ := jetstream.New(nc)
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i%97)
	}
	inputStream(t, js, keys)
	for round := range 10 {
		e, err := New(Config{
			Job: "stop", KeyGroups: 16, Slots: 2, InputStream: "IN", OutputStream: fmt.Sprintf("OUT%d", round), OutputSubject: fmt.Sprintf("out%d", round),
			Stages:     []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
			DataDir:    t.TempDir(),
			Checkpoint: &CheckpointConfig{Interval: time.Millisecond, Committer: ctxCommitter{hold: 5 * time.Millisecond}},
		}, nc)
		if err != nil {
			t.Fatal(err)
		}
		runUntil(t, e, uint64(len(keys)))
		cs := e.Checkpoints()
		for _, c := range cs {
			if c.Err != nil {
				t.Fatalf("round %d: checkpoint %d of %d failed: %v", round, c.ID, len(cs), c.Err)
			}
		}
	}
}
