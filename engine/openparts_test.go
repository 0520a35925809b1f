package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn/state"
	"cairn/wasm"
)

// idleOp is a stateless stage that never gets a record.
type idleOp struct{}

func (idleOp) Process(context.Context, *wasm.Batch, wasm.State) (*wasm.Output, error) {
	return nil, errors.New("idleOp: no record expected")
}
func (idleOp) Close(context.Context) error { return nil }

func openPartsConfig(t *testing.T, stateless, keyed OperatorFactory) Config {
	return Config{
		Job: "open", KeyGroups: 8, Slots: 2,
		InputStream: "IN", InputSubjects: []string{"in.>"},
		Stages:       []Stage{{Name: "pass", New: stateless}, {Name: "count", Keyed: true, New: keyed}},
		OutputStream: "OUT", OutputSubject: "out", Delivery: ExactlyOnce,
		DataDir: t.TempDir(), BatchSize: 16, Logger: quietLogger(),
	}
}

// TestRunOpensItsPartsAtOnce: both slots' keyed instances and the
// stateless stage's instance are made at the same time (each waits until
// all three are being made; one after another, the first would wait in
// vain), so a restart waits for the slowest part, not for the sum.
func TestRunOpensItsPartsAtOnce(t *testing.T) {
	var making sync.WaitGroup
	making.Add(3)
	all := make(chan struct{})
	go func() { making.Wait(); close(all) }()
	meet := func() error {
		making.Done()
		select {
		case <-all:
			return nil
		case <-time.After(20 * time.Second):
			return errors.New("the parts were opened one after another")
		}
	}
	cfg := openPartsConfig(t,
		func(context.Context, int) (Operator, error) {
			if err := meet(); err != nil {
				return nil, err
			}
			return idleOp{}, nil
		},
		func(ctx context.Context, slot int) (Operator, error) {
			if err := meet(); err != nil {
				return nil, err
			}
			return NewNativeCount(ctx, slot)
		})
	e, err := NewWithBroker(cfg, NewMemLog(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	select {
	case <-all:
	case err := <-done:
		t.Fatalf("the engine ended before its parts opened together: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// TestRunOpenFailureClosesWhatOpened: a stateless stage that cannot be
// made fails the run with the stage's name, and the slots that opened
// beside it are closed (their DBs open again).
func TestRunOpenFailureClosesWhatOpened(t *testing.T) {
	errNoInstance := errors.New("no instance")
	cfg := openPartsConfig(t,
		func(context.Context, int) (Operator, error) { return nil, errNoInstance },
		NewNativeCount)
	e, err := NewWithBroker(cfg, NewMemLog(0))
	if err != nil {
		t.Fatal(err)
	}
	err = e.Run(context.Background())
	if !errors.Is(err, errNoInstance) || !strings.Contains(err.Error(), "stage pass (stages[0])") {
		t.Fatalf("Run: %v, want the stateless stage's failure by name", err)
	}
	for i := range cfg.Slots {
		db, err := state.Open(e.cfg.SlotDir(i), state.Options{KeyGroups: cfg.KeyGroups, Range: state.SlotRange(i, cfg.Slots, cfg.KeyGroups)})
		if err != nil {
			t.Fatalf("slot %d's DB after the failed run: %v", i, err)
		}
		db.Close()
	}
}
