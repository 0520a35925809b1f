package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// memBroker is an in-memory log with the Broker contract of a JetStream
// server: an input stream in sequence order, an output stream with one
// subject per key group (and the expected-last-subject-sequence fence), a
// dead-letter subject, a max_payload. It lets the trace tests drive the
// engine with no server.
type memBroker struct {
	mu         sync.Mutex
	input      []Message // seq = index + 1
	appended   chan struct{}
	outSeq     uint64
	outputs    map[int][]memOutput
	dead       []*nats.Msg
	maxPayload int64
}

type memOutput struct {
	seq        uint64
	idx        uint64
	key, value string
	time       int64
	fence      uint64
}

var _ Broker = (*memBroker)(nil)

func newMemBroker() *memBroker {
	return &memBroker{appended: make(chan struct{}), outputs: map[int][]memOutput{}, maxPayload: 1 << 20}
}

// append adds input messages and returns the last sequence.
func (b *memBroker) append(msgs ...Message) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		m.Seq = uint64(len(b.input) + 1)
		b.input = append(b.input, m)
	}
	close(b.appended)
	b.appended = make(chan struct{})
	return uint64(len(b.input))
}

func (b *memBroker) lastSeq() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return uint64(len(b.input))
}

func (b *memBroker) Prepare(_ context.Context, tick string) (bool, string, error) {
	return false, tick, nil
}

func (b *memBroker) LastOutputs(context.Context) (map[int]LastOutput, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	last := map[int]LastOutput{}
	for kg, outs := range b.outputs {
		if n := len(outs); n > 0 {
			last[kg] = LastOutput{Index: outs[n-1].idx, SubjectSeq: outs[n-1].seq}
		}
	}
	return last, nil
}

func (b *memBroker) NewPublisher(bool, func(error), <-chan struct{}) (Publisher, error) {
	return &memPublisher{b: b}, nil
}

func (b *memBroker) Consume(ctx context.Context, startSeq uint64, filters []string) (<-chan Message, func(), <-chan struct{}, error) {
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
			if next <= uint64(len(b.input)) {
				m = &b.input[next-1]
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

func (b *memBroker) Tick(context.Context, string) error {
	return errors.New("membroker: ticks are logged by the trace")
}

func (b *memBroker) CheckDuplicateWindow(context.Context, time.Duration) {}

// memPublisher publishes synchronously: everything is persisted on return.
type memPublisher struct{ b *memBroker }

func (p *memPublisher) Publish(kg int, idx uint64, key, value []byte, evTime int64, fence uint64) error {
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
			last = outs[n-1].seq
		}
		if last != fence {
			return &jetstream.APIError{Code: 400, ErrorCode: fenceErrCode, Description: fmt.Sprintf("wrong last sequence: %d", last)}
		}
	}
	b.outSeq++
	b.outputs[kg] = append(outs, memOutput{seq: b.outSeq, idx: idx, key: string(key), value: string(value), time: evTime, fence: fence})
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

// memCursor remembers what a trace printed already.
type memCursor struct {
	outputs map[int]int
	dead    int
}

// newSince prints the outputs and dead letters appended since the cursor,
// outputs by (key group, index), dead letters by input sequence.
func (b *memBroker) newSince(c *memCursor) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.outputs == nil {
		c.outputs = map[int]int{}
	}
	var sb strings.Builder
	kgs := make([]int, 0, len(b.outputs))
	for kg := range b.outputs {
		kgs = append(kgs, kg)
	}
	sort.Ints(kgs)
	for _, kg := range kgs {
		outs := b.outputs[kg]
		for _, o := range outs[c.outputs[kg]:] {
			fmt.Fprintf(&sb, "out kg=%d idx=%d key=%s value=%s time=%d", kg, o.idx, o.key, o.value, o.time)
			if o.fence > 0 {
				sb.WriteString(" fenced")
			}
			sb.WriteByte('\n')
		}
		c.outputs[kg] = len(outs)
	}
	dead := append([]*nats.Msg(nil), b.dead[c.dead:]...)
	c.dead = len(b.dead)
	seq := func(m *nats.Msg) uint64 { n, _ := strconv.ParseUint(m.Header.Get(HeaderSeq), 10, 64); return n }
	sort.SliceStable(dead, func(i, j int) bool { return seq(dead[i]) < seq(dead[j]) })
	for _, m := range dead {
		fmt.Fprintf(&sb, "dead seq=%s stage=%s key=%.20s", m.Header.Get(HeaderSeq), m.Header.Get(HeaderStage), m.Header.Get(HeaderKey))
		var extra []string
		for k, v := range m.Header {
			if strings.HasPrefix(k, HeaderOrigPrefix) || k == HeaderTruncated {
				extra = append(extra, k+":"+strings.Join(v, ","))
			}
		}
		sort.Strings(extra)
		for _, x := range extra {
			sb.WriteString(" " + x)
		}
		fmt.Fprintf(&sb, " error=%s\n", m.Header.Get(HeaderError))
	}
	return sb.String()
}

// check reports a key group whose outputs are not exactly 1, 2, 3, ...
func (b *memBroker) check() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for kg, outs := range b.outputs {
		for i, o := range outs {
			if o.idx != uint64(i+1) {
				return fmt.Errorf("key group %d: output %d has index %d", kg, i+1, o.idx)
			}
		}
	}
	return nil
}
