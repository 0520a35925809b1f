package engine

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestPublishGuard: once the guard refuses, nothing more is published and
// the engine fails with the guard's error; before, everything goes out.
func TestPublishGuard(t *testing.T) {
	errLapsed := errors.New("lease lapsed")
	var refuse atomic.Bool
	b := NewMemLog(0)
	cfg := Config{
		Job: "guard", KeyGroups: 8, Slots: 2,
		InputStream: "IN", InputSubjects: []string{"in.>"},
		Stages:       []Stage{{Name: "count", Keyed: true, New: NewNativeCount}},
		OutputStream: "OUT", OutputSubject: "out",
		DataDir: t.TempDir(), BatchSize: 16,
		Logger: quietLogger(),
		PublishGuard: func() error {
			if refuse.Load() {
				return errLapsed
			}
			return nil
		},
	}
	e, err := NewWithBroker(cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Run(context.Background()) }()
	appendKeys := func(from, n int) {
		var msgs []Message
		for i := from; i < from+n; i++ {
			msgs = append(msgs, Message{Subject: "in.k" + strconv.Itoa(i%13), Header: nats.Header{}, Data: []byte("x")})
		}
		b.Append(msgs...)
	}
	outputs := func() int {
		n := 0
		for _, kg := range b.Outputs() {
			for _, o := range kg {
				if !o.Marker {
					n++
				}
			}
		}
		return n
	}
	appendKeys(0, 200)
	deadline := time.Now().Add(10 * time.Second)
	for outputs() < 200 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 200 outputs before the guard refused", outputs())
		}
		time.Sleep(time.Millisecond)
	}
	refuse.Store(true)
	appendKeys(200, 200)
	select {
	case err := <-done:
		if !errors.Is(err, errLapsed) {
			t.Fatalf("engine ended with %v, want the guard's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the engine went on after the guard refused")
	}
	if n := outputs(); n != 200 {
		t.Fatalf("%d outputs, want the 200 published before the guard refused", n)
	}
}
