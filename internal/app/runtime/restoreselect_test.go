package runtime

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/testutil/wait"
)

// listCounter counts the listings of a job's checkpoints.
type listCounter struct {
	checkpoint.Store
	prefix string
	n      *atomic.Int64
}

func (s listCounter) List(ctx context.Context, prefix string, fn func(checkpoint.ObjectInfo) error) error {
	if strings.HasPrefix(prefix, s.prefix) {
		s.n.Add(1)
	}
	return s.Store.List(ctx, prefix, fn)
}

// TestStartListsCheckpointsOnce: a start restores the newest checkpoint
// the checkpoint writer found when it read the store, without listing and
// reading the manifests a second time (on a remote store, round trips
// before the job processes).
func TestStartListsCheckpointsOnce(t *testing.T) {
	j := parseJob(t, t.TempDir(), "checkpoint: {interval: 1h, mode: incremental}\n")
	ml := engine.NewMemLog(0)
	ml.Append(engine.Message{Subject: "lines.a", Header: nats.Header{engine.HeaderKey: {"a"}}, Data: []byte("x"), TsNanos: time.Now().UnixNano()})

	// A first run commits a checkpoint as it stops.
	r, err := Start(context.Background(), j, Options{Broker: ml}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	wait.For(t, time.Minute, "the record processed", func() bool { return r.Engine.Stats().ProcessedSeq >= 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	last := r.Writer.Latest()
	r.Close()
	if last == nil {
		t.Fatal("the first run committed no checkpoint")
	}

	var lists atomic.Int64
	wrap := func(s checkpoint.Store) checkpoint.Store {
		return listCounter{Store: s, prefix: j.Name + "/chk-", n: &lists}
	}
	r, err = Start(context.Background(), j, Options{Broker: ml, WrapStore: wrap}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Restored == nil || r.Restored.ID != last.ID {
		t.Fatalf("restored %+v, want checkpoint %d", r.Restored, last.ID)
	}
	if n := lists.Load(); n != 1 {
		t.Fatalf("the start listed the checkpoints %d times, want once", n)
	}
}
