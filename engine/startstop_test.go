package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// leaderlessLog answers LastOutputs as a replicated output stream without
// a leader does: nothing until ctx ends, then no responders; with wait
// false it refuses at once.
type leaderlessLog struct {
	*MemLog
	wait bool
}

func (l *leaderlessLog) LastOutputs(ctx context.Context, target int) (map[int]LastOutput, error) {
	if l.wait {
		<-ctx.Done()
	}
	return nil, fmt.Errorf("engine: read last outputs of OUT: %w", nats.ErrNoResponders)
}

// TestStopWhileReadingLastOutputs: a graceful stop that comes while the
// engine still waits to read its output stream's last outputs (before it
// consumed anything) ends it cleanly; the same read failing on its own
// is the engine's error.
func TestStopWhileReadingLastOutputs(t *testing.T) {
	for _, wait := range []bool{true, false} {
		t.Run(fmt.Sprintf("stopped=%v", wait), func(t *testing.T) {
			cfg := Config{
				Job: "startstop", KeyGroups: 8, Slots: 2,
				InputStream: "IN", InputSubjects: []string{"in.>"},
				Stages:       []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
				OutputStream: "OUT", OutputSubject: "out",
				DataDir: t.TempDir(), BatchSize: 16,
				Logger: quietLogger(),
			}
			e, err := NewWithBroker(cfg, &leaderlessLog{MemLog: NewMemLog(0), wait: wait})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- e.Run(ctx) }()
			if wait {
				time.Sleep(50 * time.Millisecond)
				cancel()
			}
			select {
			case err := <-done:
				if wait && err != nil {
					t.Fatalf("stopped while reading the last outputs: %v, want a clean stop", err)
				}
				if !wait && !errors.Is(err, nats.ErrNoResponders) {
					t.Fatalf("the read failed on its own: engine ended with %v, want no responders", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the engine did not end")
			}
		})
	}
}
