// Package source runs a job on a Nexmark generator instead of an input
// stream, and on a discard output that counts outputs without publishing
// them: the like-for-like setting of Flink's and RisingWave's published
// Nexmark figures (generator inside the job, a blackhole sink).
package source

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	"cairn/nexmark"
)

// ErrNoInput is returned by Consume of a Discard broker that has no input
// broker behind it (a Generated broker supplies the input).
var ErrNoInput = errors.New("source: no input")

// Generated is an engine.Broker whose input is a Nexmark generator: input
// sequence n+1 is event n, its key the event's (Event.Key), its event and
// ingestion time the event's time, its subject nexmark.<kind>.<key>, its
// payload the event as JSON (nexmark.AppendJSON). Everything else — the
// outputs, dead letters, ticks — is Rest's.
//
// The input is a pure function of the configuration and the sequence, so a
// job restored at a checkpoint's position regenerates exactly what a stream
// would have delivered from there.
type Generated struct {
	Gen  *nexmark.Generator
	Rest engine.Broker
}

var _ engine.Broker = (*Generated)(nil)

// Prepare prepares Rest, without a tick subject: a generated input takes no
// ticks (its ingestion time is its event time, and it has no idle periods
// to tick through).
func (g *Generated) Prepare(ctx context.Context, req engine.PrepareRequest) (engine.Prepared, error) {
	req.Tick = ""
	p, err := g.Rest.Prepare(ctx, req)
	p.Tick, p.TickSubject = nil, ""
	return p, err
}

// LastOutputs is Rest's.
func (g *Generated) LastOutputs(ctx context.Context, target int) (map[int]engine.LastOutput, error) {
	return g.Rest.LastOutputs(ctx, target)
}

// NewPublisher is Rest's.
func (g *Generated) NewPublisher(target int, batched bool, fail func(error), failed <-chan struct{}) (engine.Publisher, error) {
	return g.Rest.NewPublisher(target, batched, fail, failed)
}

// slab is how many bytes of payload are allocated at a time: the records'
// payloads are carved from it, one allocation for hundreds of records.
const slab = 64 << 10

// Consume generates the events from sequence startSeq on (event
// startSeq-1), up to the configuration's Events. filters are ignored: a
// generated input has no subjects to filter.
func (g *Generated) Consume(ctx context.Context, startSeq uint64, _ []string) (<-chan engine.Message, func(), <-chan struct{}, error) {
	if startSeq == 0 {
		startSeq = 1
	}
	msgs := make(chan engine.Message, 1024)
	done := make(chan struct{})
	stopped := make(chan struct{})
	var once sync.Once
	limit := g.Gen.Config().Events
	if limit == 0 {
		limit = math.MaxUint64
	}
	go func() {
		defer close(done)
		var e nexmark.Event
		var buf []byte
		var subj []byte
		for n := startSeq - 1; n < limit; n++ {
			g.Gen.Event(n, &e)
			if cap(buf)-len(buf) < 2048 {
				buf = make([]byte, 0, slab)
			}
			start := len(buf)
			buf = nexmark.AppendJSON(buf, &e)
			data := buf[start:len(buf):len(buf)]
			subj = append(append(append(subj[:0], "nexmark."...), e.Kind.String()...), '.')
			subj = strconv.AppendInt(subj, e.Key(), 10)
			m := engine.Message{Seq: n + 1, TsNanos: e.Time() * int64(time.Millisecond), Subject: string(subj), Data: data}
			// A send with room in the channel does not wait: a one-case
			// select with a default is a plain non-blocking send, where
			// the three-way select locks all three channels per event.
			// Only a full channel waits on the three.
			select {
			case msgs <- m:
				continue
			default:
			}
			select {
			case msgs <- m:
			case <-stopped:
				return
			case <-ctx.Done():
				return
			}
		}
		select { // the end of a bounded input: nothing more, until stopped
		case <-stopped:
		case <-ctx.Done():
		}
	}()
	return msgs, func() { once.Do(func() { close(stopped) }) }, done, nil
}

// Discard is an engine.Broker whose outputs are counted and dropped. Its
// input, dead letters and streams are In's (nil: none; then dead letters
// are counted too, and the first one's reason kept).
type Discard struct {
	In engine.Broker

	outputs     atomic.Uint64
	deadLetters atomic.Uint64
	firstDead   atomic.Pointer[string]
}

var _ engine.Broker = (*Discard)(nil)

// Outputs is how many outputs were discarded.
func (d *Discard) Outputs() uint64 { return d.outputs.Load() }

// DeadLetters is how many dead letters had no broker to go to, and the
// first one's reason ("" when none).
func (d *Discard) DeadLetters() (uint64, string) {
	if p := d.firstDead.Load(); p != nil {
		return d.deadLetters.Load(), *p
	}
	return d.deadLetters.Load(), ""
}

// Prepare prepares In (its input and dead-letter streams, its ticks);
// nothing is published to deduplicate, and discarding takes any batch.
func (d *Discard) Prepare(ctx context.Context, req engine.PrepareRequest) (engine.Prepared, error) {
	if d.In == nil {
		return engine.Prepared{Batch: true}, nil
	}
	req.DuplicateWindow = 0
	p, err := d.In.Prepare(ctx, req)
	p.Batch = true
	return p, err
}

// LastOutputs is empty: nothing was ever published.
func (d *Discard) LastOutputs(context.Context, int) (map[int]engine.LastOutput, error) {
	return map[int]engine.LastOutput{}, nil
}

// NewPublisher returns a publisher that counts outputs and sends dead
// letters to In's publisher.
func (d *Discard) NewPublisher(target int, batched bool, fail func(error), failed <-chan struct{}) (engine.Publisher, error) {
	p := &discardPublisher{d: d}
	if d.In != nil && target == 0 {
		in, err := d.In.NewPublisher(target, batched, fail, failed)
		if err != nil {
			return nil, err
		}
		p.dead = in
	}
	return p, nil
}

// Consume is In's.
func (d *Discard) Consume(ctx context.Context, startSeq uint64, filters []string) (<-chan engine.Message, func(), <-chan struct{}, error) {
	if d.In == nil {
		return nil, nil, nil, ErrNoInput
	}
	return d.In.Consume(ctx, startSeq, filters)
}

type discardPublisher struct {
	d    *Discard
	dead engine.Publisher // nil: dead letters are counted here
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (p *discardPublisher) Publish(o engine.Output) error {
	if !o.Marker {
		p.d.outputs.Add(1)
	}
	return nil
}

func (p *discardPublisher) DeadLetter(h nats.Header, data []byte, stage string, seq uint64, reason error) error {
	if p.dead != nil {
		return p.dead.DeadLetter(h, data, stage, seq, reason)
	}
	if p.d.deadLetters.Add(1) == 1 {
		s := fmt.Sprintf("stage %s, input sequence %d: %v", stage, seq, reason)
		p.d.firstDead.Store(&s)
	}
	return nil
}

func (p *discardPublisher) Fence() <-chan struct{} {
	if p.dead != nil {
		return p.dead.Fence()
	}
	return closed
}

func (p *discardPublisher) Idle() {
	if p.dead != nil {
		p.dead.Idle()
	}
}

func (p *discardPublisher) Flush(ctx context.Context) error {
	if p.dead != nil {
		return p.dead.Flush(ctx)
	}
	return nil
}

func (p *discardPublisher) MaxPayload() int64 {
	if p.dead != nil {
		return p.dead.MaxPayload()
	}
	return 0
}

// ForJob returns the broker of a job whose input is generated (nx not
// nil) or whose output is discarded, or both: nc, when not nil, serves the
// rest (the input stream when there is no generator, the output streams
// when outputs are published, the dead letters). cfg is the engine's
// configuration of the job.
func ForJob(cfg engine.Config, nc *nats.Conn, nx *nexmark.Config, discard bool) (engine.Broker, error) {
	var rest engine.Broker
	if nc != nil {
		c := cfg
		if nx != nil {
			c.InputStream, c.InputSubjects = "", nil // generated: no stream to create
		}
		if discard {
			c.Delivery = engine.Core // no output streams to create
		}
		var err error
		if rest, err = engine.NewNATSBroker(nc, c); err != nil {
			return nil, err
		}
	}
	if discard {
		rest = &Discard{In: rest}
	}
	if nx == nil {
		return rest, nil
	}
	if rest == nil {
		return nil, fmt.Errorf("source: a generated input needs a NATS connection for its outputs or a discard output")
	}
	gen, err := nexmark.New(*nx)
	if err != nil {
		return nil, err
	}
	return &Generated{Gen: gen, Rest: rest}, nil
}
