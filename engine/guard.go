package engine

import (
	"github.com/nats-io/nats.go"
)

// guarded is a Publisher whose every publish first asks guard: a writer
// that may no longer own its outputs (a group member whose lease may have
// lapsed while it was paused) publishes nothing once guard says so, and
// the engine fails with guard's error.
type guarded struct {
	Publisher
	guard func() error
}

func guardPublisher(p Publisher, guard func() error) Publisher {
	if guard == nil {
		return p
	}
	return &guarded{Publisher: p, guard: guard}
}

func (g *guarded) Publish(o Output) error {
	if err := g.guard(); err != nil {
		return err
	}
	return g.Publisher.Publish(o)
}

func (g *guarded) DeadLetter(h nats.Header, data []byte, stage string, seq uint64, reason error) error {
	if err := g.guard(); err != nil {
		return err
	}
	return g.Publisher.DeadLetter(h, data, stage, seq, reason)
}
