package engine

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MemLog is an in-memory log with the Broker contract of a JetStream
// server: an input stream in sequence order, an output stream with one
// subject per key group (and the expected-last-subject-sequence fence), a
// dead-letter subject, a max_payload. It runs a job with no server: the
// trace tests and `cairn test` drive the engine through it.
type MemLog struct {
	mu         sync.Mutex
	input      []Message // seq = index + 1
	appended   chan struct{}
	outSeq     uint64
	outputs    map[int][]MemOutput
	dead       []*nats.Msg
	maxPayload int64
	// skipped input sequences before the first message (StartAfter).
	skipped uint64
}

// MemOutput is one output in a MemLog.
type MemOutput struct {
	Seq        uint64 // stream sequence
	Index      uint64 // Cairn-Out
	Key, Value string
	Time       int64
	Wm         int64 // the watermark it carries (repartition streams)
	Marker     bool  // a watermark marker, not an output
	Fenced     bool  // published with the expected-last-sequence fence
}

var _ Broker = (*MemLog)(nil)

// NewMemLog returns an empty log whose max_payload is maxPayload (0: 1 MiB,
// the NATS default).
func NewMemLog(maxPayload int64) *MemLog {
	if maxPayload == 0 {
		maxPayload = 1 << 20
	}
	return &MemLog{appended: make(chan struct{}), outputs: map[int][]MemOutput{}, maxPayload: maxPayload}
}

// Append adds input messages (their Seq is assigned) and returns the last
// sequence.
func (b *MemLog) Append(msgs ...Message) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		m.Seq = b.skipped + uint64(len(b.input)) + 1
		b.input = append(b.input, m)
	}
	close(b.appended)
	b.appended = make(chan struct{})
	return b.skipped + uint64(len(b.input))
}

// LastSeq is the input's last sequence.
func (b *MemLog) LastSeq() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.skipped + uint64(len(b.input))
}

// StartAfter makes the input begin after sequence seq, as a stream whose
// earlier messages were consumed and removed: a job restored from a
// checkpoint at seq reads the log's first message next. Call it before
// Append.
func (b *MemLog) StartAfter(seq uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.skipped = seq
}

func (b *MemLog) Prepare(_ context.Context, tick string) (bool, string, error) {
	return true, tick, nil // publishes are synchronous: batching changes nothing
}

func (b *MemLog) LastOutputs(_ context.Context, target int) (map[int]LastOutput, error) {
	if target != 0 {
		return nil, fmt.Errorf("engine: the in-memory log has one output")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	last := map[int]LastOutput{}
	for kg, outs := range b.outputs {
		if n := len(outs); n > 0 {
			last[kg] = LastOutput{Index: outs[n-1].Index, SubjectSeq: outs[n-1].Seq, Wm: outs[n-1].Wm}
		}
	}
	return last, nil
}

func (b *MemLog) NewPublisher(target int, _ bool, _ func(error), _ <-chan struct{}) (Publisher, error) {
	if target != 0 {
		return nil, fmt.Errorf("engine: the in-memory log has one output")
	}
	return &memPublisher{b: b}, nil
}

func (b *MemLog) Consume(ctx context.Context, startSeq uint64, filters []string) (<-chan Message, func(), <-chan struct{}, error) {
	msgs := make(chan Message, 64)
	done := make(chan struct{})
	stopped := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(done)
		next := startSeq
		for {
			b.mu.Lock()
			var m *Message
			if next <= b.skipped {
				next = b.skipped + 1
			}
			if next <= b.skipped+uint64(len(b.input)) {
				m = &b.input[next-b.skipped-1]
			}
			wait := b.appended
			b.mu.Unlock()
			if m == nil {
				select {
				case <-wait:
					continue
				case <-stopped:
					return
				case <-ctx.Done():
					return
				}
			}
			next++
			if len(filters) > 0 && !anyMatches(filters, m.Subject) {
				continue
			}
			select {
			case msgs <- *m:
			case <-stopped:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return msgs, func() { once.Do(func() { close(stopped) }) }, done, nil
}

// Tick does nothing: in a MemLog the input's ticks are the caller's to
// append (a tick message on the tick subject), so that a run is a function
// of the log it was given, never of the wall clock.
func (b *MemLog) Tick(context.Context, string) error { return nil }

func (b *MemLog) CheckDuplicateWindow(context.Context, time.Duration) {}

// memPublisher publishes synchronously: everything is persisted on return.
type memPublisher struct{ b *MemLog }

func (p *memPublisher) Publish(kg int, idx uint64, key, value []byte, evTime, wm int64, fence uint64, _ OutputMeta) error {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if int64(len(key)+len(value)+outputHeaderBound/2) > b.maxPayload {
		return nats.ErrMaxPayload
	}
	outs := b.outputs[kg]
	if fence > 0 {
		var last uint64
		if n := len(outs); n > 0 {
			last = outs[n-1].Seq
		}
		if last != fence {
			return &jetstream.APIError{Code: 400, ErrorCode: fenceErrCode, Description: fmt.Sprintf("wrong last sequence: %d", last)}
		}
	}
	b.outSeq++
	b.outputs[kg] = append(outs, MemOutput{Seq: b.outSeq, Index: idx, Key: string(key), Value: string(value), Time: evTime, Wm: wm, Fenced: fence > 0})
	return nil
}

func (p *memPublisher) Marker(kg int, idx uint64, wm int64, fence uint64, _ uint64) error {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.outSeq++
	b.outputs[kg] = append(b.outputs[kg], MemOutput{Seq: b.outSeq, Index: idx, Wm: wm, Marker: true, Fenced: fence > 0})
	return nil
}

func (p *memPublisher) DeadLetter(h nats.Header, data []byte, stage string, seq uint64, reason error) error {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dead = append(b.dead, deadLetterMessage("dlq", h, data, stage, seq, reason, b.maxPayload))
	return nil
}

func (p *memPublisher) Fence() <-chan struct{}      { return closedChan }
func (p *memPublisher) Idle()                       {}
func (p *memPublisher) Flush(context.Context) error { return nil }
func (p *memPublisher) MaxPayload() int64           { return p.b.maxPayload }

// Outputs returns a copy of every key group's outputs, in stream order.
func (b *MemLog) Outputs() map[int][]MemOutput {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[int][]MemOutput, len(b.outputs))
	for kg, o := range b.outputs {
		out[kg] = append([]MemOutput(nil), o...)
	}
	return out
}

// DeadLetters returns the dead letters so far, in publication order.
func (b *MemLog) DeadLetters() []*nats.Msg {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*nats.Msg(nil), b.dead...)
}

// Replayed compares an output a restored job regenerated (and skipped,
// because the log holds its index) with the one the log holds: an error
// names the difference. A deterministic operator never makes one.
func (b *MemLog) Replayed(kg int, idx uint64, key, value []byte, evTime int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	outs := b.outputs[kg]
	i := sort.Search(len(outs), func(i int) bool { return outs[i].Index >= idx })
	if i == len(outs) || outs[i].Index != idx {
		return nil // dead-lettered the first time, or not in the log
	}
	o := outs[i]
	if o.Key != string(key) || o.Value != string(value) || o.Time != evTime {
		return fmt.Errorf("output %d of key group %d was (key %q, value %q, time %d) and is (key %q, value %q, time %d) after the restore", idx, kg, o.Key, o.Value, o.Time, key, value, evTime)
	}
	return nil
}
