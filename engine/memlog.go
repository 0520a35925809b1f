package engine

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MemLog is the one in-memory log: named streams as a JetStream server
// holds them — each in sequence order, partitioned by subject, its output
// subjects one per key group with Cairn-Out, the expected-last-subject-
// sequence fence, watermarks and markers on repartition streams — plus the
// dead letters and a max_payload. Jobs run on it with no server: the trace
// tests and `cairn test` drive engines through it.
//
// A MemLog is itself the Broker of one job whose input is the stream
// "input" and whose output is the stream "output" (subjects out.<key
// group>): Append, Outputs, DeadLetters and Replayed read that job. View
// makes the Broker of one job (a sub-topology of a graph) over any streams
// of the log, so that one job's output stream is another's input.
//
// With HoldPublishes, what jobs publish stays pending until Release, and is
// then appended sorted by subject and output index: every stream holds its
// messages in one order that follows from the input alone, whatever the
// timing of the slots that wrote them.
type MemLog struct {
	maxPayload int64
	// self is the Broker of the log's own job.
	self *MemView

	mu struct {
		sync.Mutex
		streams map[string]*memStream
		// changed is closed (and replaced) whenever a stream gets visible
		// messages: the consumers wait on it.
		changed chan struct{}
		// hold keeps publishes pending until Release.
		hold bool
		// nowNs is the ingestion time given to the published messages
		// appended now.
		nowNs int64
		// dead are the dead letters, in publication order.
		dead []MemDeadLetter
	}
}

// memStream is one stream of a MemLog.
type memStream struct {
	// first is the sequence of msgs[0] less one: the messages consumed and
	// removed before it (StartAfter).
	first   uint64
	msgs    []memMsg // visible: sequence = first + index + 1
	pending []memMsg // published, not yet visible (no sequence yet)
	// last maps a subject to the index in msgs of its last message.
	last map[string]int
	// bySubject maps a key group subject to the indexes in msgs of its
	// messages, in order.
	bySubject map[string][]int
}

// memMsg is a message of a memStream, with what the log reads of it.
type memMsg struct {
	Message
	prefix string // the subject before its key group ("" for input messages)
	kg     int
	idx    uint64 // Cairn-Out
	marker bool
	fenced bool // published with the expected-last-sequence fence
}

// MemOutput is one output (or marker) on a key group subject of a MemLog.
type MemOutput struct {
	Seq        uint64 // stream sequence
	KeyGroup   int
	Index      uint64 // Cairn-Out
	Key, Value string
	Time       int64
	Wm         int64 // the watermark it carries (math.MinInt64: none)
	Marker     bool  // a watermark marker, not an output
	Fenced     bool  // published with the expected-last-sequence fence
}

// MemDeadLetter is a dead letter of a MemLog and the job that published it.
type MemDeadLetter struct {
	Job string
	Msg *nats.Msg
}

// MemTarget is an output target of a job on a MemLog: a stream and the
// subject prefix of its key groups. A repartition target's outputs carry
// their watermark.
type MemTarget struct {
	Stream, Subject string
	Repartition     bool
}

// The stream names and output subject of the log's own job.
const (
	memInput   = "input"
	memOutput  = "output"
	memSubject = "out"
)

var _ Broker = (*MemLog)(nil)

// NewMemLog returns an empty log whose max_payload is maxPayload (0: 1 MiB,
// the NATS default).
func NewMemLog(maxPayload int64) *MemLog {
	if maxPayload == 0 {
		maxPayload = 1 << 20
	}
	l := &MemLog{maxPayload: maxPayload}
	l.mu.streams, l.mu.changed = map[string]*memStream{}, make(chan struct{})
	l.self = l.View("", memInput, []MemTarget{{Stream: memOutput, Subject: memSubject, Repartition: true}})
	return l
}

// HoldPublishes keeps what jobs publish pending until Release.
func (l *MemLog) HoldPublishes() {
	l.mu.Lock()
	l.mu.hold = true
	l.mu.Unlock()
}

// streamLocked returns the stream called name, created when missing.
func (l *MemLog) streamLocked(name string) *memStream {
	s, ok := l.mu.streams[name]
	if !ok {
		s = &memStream{last: map[string]int{}, bySubject: map[string][]int{}}
		l.mu.streams[name] = s
	}
	return s
}

func (l *MemLog) signalLocked() {
	close(l.mu.changed)
	l.mu.changed = make(chan struct{})
}

// appendLocked makes m visible at the end of s.
func (s *memStream) appendLocked(m memMsg) {
	i := len(s.msgs)
	m.Seq = s.first + uint64(i) + 1
	s.msgs = append(s.msgs, m)
	s.last[m.Subject] = i
	if m.prefix != "" {
		s.bySubject[m.Subject] = append(s.bySubject[m.Subject], i)
	}
}

// lastSeq is the stream's last sequence.
func (s *memStream) lastSeq() uint64 { return s.first + uint64(len(s.msgs)) }

// SetNow sets the ingestion time (JetStream timestamp) of the published
// messages appended from now on.
func (l *MemLog) SetNow(ns int64) {
	l.mu.Lock()
	l.mu.nowNs = ns
	l.mu.Unlock()
}

// AppendTo appends input messages to stream, visible at once (their Seq is
// assigned), and returns the stream's last sequence.
func (l *MemLog) AppendTo(stream string, msgs ...Message) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(stream)
	for _, m := range msgs {
		s.appendLocked(memMsg{Message: m})
	}
	l.signalLocked()
	return s.lastSeq()
}

// Append appends input messages to the log's own job's input.
func (l *MemLog) Append(msgs ...Message) uint64 { return l.AppendTo(memInput, msgs...) }

// LastSeq is the last sequence of the log's own job's input.
func (l *MemLog) LastSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.streamLocked(memInput).lastSeq()
}

// StartAfter makes the own job's input begin after sequence seq, as a
// stream whose earlier messages were consumed and removed: a job restored
// from a checkpoint at seq reads the log's first message next. Call it
// before Append.
func (l *MemLog) StartAfter(seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.streamLocked(memInput).first = seq
}

// Release makes what was published into stream visible, sorted by subject
// and output index (a marker after the output it follows).
func (l *MemLog) Release(stream string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(stream)
}

func (l *MemLog) releaseLocked(stream string) {
	s := l.streamLocked(stream)
	if len(s.pending) == 0 {
		return
	}
	slices.SortStableFunc(s.pending, func(a, b memMsg) int {
		return cmp.Or(strings.Compare(a.prefix, b.prefix), cmp.Compare(a.kg, b.kg), cmp.Compare(a.idx, b.idx), cmp.Compare(boolInt(a.marker), boolInt(b.marker)))
	})
	for _, m := range s.pending {
		m.TsNanos = l.mu.nowNs // the time the messages become visible
		s.appendLocked(m)
	}
	clear(s.pending)
	s.pending = s.pending[:0]
	l.signalLocked()
}

// ReleaseAll releases every stream, in name order.
func (l *MemLog) ReleaseAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(l.mu.streams)) {
		l.releaseLocked(name)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// publish appends m to stream (pending while the log holds publishes). A
// non-zero fence must be the subject's last sequence, with nothing of it
// pending: the server's answer to another writer is a fence error.
func (l *MemLog) publish(stream string, m memMsg, fence uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(stream)
	if fence > 0 {
		var last uint64
		if i, ok := s.last[m.Subject]; ok {
			last = s.msgs[i].Seq
		}
		held := slices.ContainsFunc(s.pending, func(p memMsg) bool { return p.Subject == m.Subject })
		if last != fence || held {
			return &jetstream.APIError{Code: 400, ErrorCode: fenceErrCode, Description: fmt.Sprintf("stream %s: wrong last sequence on %s: %d, expected %d", stream, m.Subject, last, fence)}
		}
		m.fenced = true
	}
	m.TsNanos = l.mu.nowNs
	if l.mu.hold {
		s.pending = append(s.pending, m)
		return nil
	}
	s.appendLocked(m)
	l.signalLocked()
	return nil
}

// lastMatching is the sequence of the last visible message of stream on a
// subject that filters take (every subject without filters; 0: none).
func (l *MemLog) lastMatching(stream string, filters []string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(stream)
	for i := len(s.msgs) - 1; i >= 0; i-- {
		if len(filters) == 0 || anyMatches(filters, s.msgs[i].Subject) {
			return s.msgs[i].Seq
		}
	}
	return 0
}

// StreamOutputs returns the outputs and markers on the key group subjects
// of prefix in stream, in stream order.
func (l *MemLog) StreamOutputs(stream, prefix string) []MemOutput {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []MemOutput
	for _, m := range l.streamLocked(stream).msgs {
		if m.prefix == prefix {
			out = append(out, m.output())
		}
	}
	return out
}

// output is m as a MemOutput.
func (m memMsg) output() MemOutput {
	o := MemOutput{Seq: m.Seq, KeyGroup: m.kg, Index: m.idx, Key: m.Header.Get(HeaderKey), Value: string(m.Data), Marker: m.marker, Fenced: m.fenced, Wm: math.MinInt64}
	o.Time, _ = strconv.ParseInt(m.Header.Get(HeaderTime), 10, 64)
	if v := m.Header.Get(HeaderWatermark); v != "" {
		o.Wm, _ = strconv.ParseInt(v, 10, 64)
	}
	return o
}

// Outputs returns a copy of every key group's outputs of the log's own
// job, in stream order.
func (l *MemLog) Outputs() map[int][]MemOutput {
	out := map[int][]MemOutput{}
	for _, o := range l.StreamOutputs(memOutput, memSubject) {
		out[o.KeyGroup] = append(out[o.KeyGroup], o)
	}
	return out
}

// DeadLetters returns the dead letters so far, in publication order.
func (l *MemLog) DeadLetters() []*nats.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*nats.Msg, len(l.mu.dead))
	for i, d := range l.mu.dead {
		out[i] = d.Msg
	}
	return out
}

// JobDeadLetters returns the dead letters so far with the job that
// published each, in publication order.
func (l *MemLog) JobDeadLetters() []MemDeadLetter {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.mu.dead)
}

// Replayed compares an output the log's own job regenerated after a
// restore (and skipped, because the log holds its index) with the one the
// log holds: an error names the difference. A deterministic operator never
// makes one.
func (l *MemLog) Replayed(kg int, idx uint64, key, value []byte, evTime int64) error {
	return l.self.Replayed(0, kg, idx, key, value, evTime)
}

// The log's own job's Broker.

func (l *MemLog) Prepare(ctx context.Context, req PrepareRequest) (Prepared, error) {
	return l.self.Prepare(ctx, req)
}

func (l *MemLog) LastOutputs(ctx context.Context, target int) (map[int]LastOutput, error) {
	return l.self.LastOutputs(ctx, target)
}

func (l *MemLog) NewPublisher(target int, batched bool, fail func(error), failed <-chan struct{}) (Publisher, error) {
	return l.self.NewPublisher(target, batched, fail, failed)
}

func (l *MemLog) Consume(ctx context.Context, startSeq uint64, filters []string) (<-chan Message, func(), <-chan struct{}, error) {
	return l.self.Consume(ctx, startSeq, filters)
}

// MemView is the Broker of one job on a MemLog: its input stream and its
// output targets (in the engine's target order).
type MemView struct {
	log     *MemLog
	name    string // the job's (dead letters name it)
	input   string
	targets []MemTarget

	mu struct {
		sync.Mutex
		consuming bool     // Consume was called
		filters   []string // its filters
		tick      string   // the tick subject the engine logs ("": none)
	}
}

var _ Broker = (*MemView)(nil)

// View is the Broker of job name reading stream input and publishing to
// targets.
func (l *MemLog) View(name, input string, targets []MemTarget) *MemView {
	return &MemView{log: l, name: name, input: input, targets: slices.Clone(targets)}
}

// Input is the view's input stream.
func (v *MemView) Input() string { return v.input }

// Targets are the view's output targets.
func (v *MemView) Targets() []MemTarget { return slices.Clone(v.targets) }

// Prepare takes the tick subject. Its Tick does nothing: in a MemLog the
// input's ticks are the caller's to append (a tick message on the tick
// subject), so that a run is a function of the log it was given, never of
// the wall clock.
func (v *MemView) Prepare(_ context.Context, req PrepareRequest) (Prepared, error) {
	v.mu.Lock()
	v.mu.tick = req.Tick
	v.mu.Unlock()
	// Publishes are synchronous: batching changes nothing.
	p := Prepared{Batch: true, TickSubject: req.Tick}
	if req.Tick != "" {
		p.Tick = func(context.Context) error { return nil }
	}
	return p, nil
}

// TickSubject is the tick subject the engine accepted ("": none).
func (v *MemView) TickSubject() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.mu.tick
}

func (v *MemView) target(i int) (MemTarget, error) {
	if i < 0 || i >= len(v.targets) {
		return MemTarget{}, fmt.Errorf("engine: in-memory job %q has %d output targets, not %d", v.name, len(v.targets), i+1)
	}
	return v.targets[i], nil
}

func (v *MemView) LastOutputs(_ context.Context, target int) (map[int]LastOutput, error) {
	t, err := v.target(target)
	if err != nil {
		return nil, err
	}
	l := v.log
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(t.Stream)
	if len(s.pending) > 0 {
		return nil, fmt.Errorf("engine: in-memory stream %s read for a restart with %d messages not released", t.Stream, len(s.pending))
	}
	out := map[int]LastOutput{}
	for _, i := range s.last {
		m := s.msgs[i]
		if m.prefix != t.Subject {
			continue
		}
		o := m.output()
		lo := LastOutput{Index: o.Index, SubjectSeq: o.Seq, Wm: o.Wm}
		if src := m.Header.Get(HeaderSource); src != "" {
			lo.Source, _ = strconv.ParseUint(src, 10, 64)
		}
		out[m.kg] = lo
	}
	return out, nil
}

func (v *MemView) NewPublisher(target int, _ bool, _ func(error), _ <-chan struct{}) (Publisher, error) {
	t, err := v.target(target)
	if err != nil {
		return nil, err
	}
	return &memPublisher{v: v, t: t}, nil
}

func (v *MemView) Consume(ctx context.Context, startSeq uint64, filters []string) (<-chan Message, func(), <-chan struct{}, error) {
	v.mu.Lock()
	v.mu.consuming, v.mu.filters = true, filters
	v.mu.Unlock()
	msgs := make(chan Message, 64)
	done := make(chan struct{})
	stopped := make(chan struct{})
	var once sync.Once
	l := v.log
	go func() {
		defer close(done)
		next := max(startSeq, 1)
		for {
			l.mu.Lock()
			s := l.streamLocked(v.input)
			next = max(next, s.first+1)
			var m *Message
			if next <= s.lastSeq() {
				c := s.msgs[next-s.first-1].Message
				m = &c
			}
			wait := l.mu.changed
			l.mu.Unlock()
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

// CaughtUpTo is the input sequence the engine must have processed to have
// taken everything visible to it (ok false: not consuming yet).
func (v *MemView) CaughtUpTo() (seq uint64, ok bool) {
	v.mu.Lock()
	consuming, filters := v.mu.consuming, v.mu.filters
	v.mu.Unlock()
	if !consuming {
		return 0, false
	}
	return v.log.lastMatching(v.input, filters), true
}

// Replayed compares an output of target the job regenerated after a
// restore (and skipped, because the stream holds its index) with the one
// the stream holds: an error names the difference.
func (v *MemView) Replayed(target, kg int, idx uint64, key, value []byte, evTime int64) error {
	t, err := v.target(target)
	if err != nil {
		return err
	}
	l := v.log
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(t.Stream)
	ids := s.bySubject[t.Subject+"."+strconv.Itoa(kg)]
	i, _ := slices.BinarySearchFunc(ids, idx, func(i int, idx uint64) int { return cmp.Compare(s.msgs[i].idx, idx) })
	if i == len(ids) || s.msgs[ids[i]].idx != idx || s.msgs[ids[i]].marker {
		return nil // dead-lettered the first time, or not in the log
	}
	o := s.msgs[ids[i]].output()
	if o.Key != string(key) || o.Value != string(value) || o.Time != evTime {
		return fmt.Errorf("output %d of key group %d on %s was (key %q, value %q, time %d) and is (key %q, value %q, time %d) after the restore", idx, kg, t.Subject, o.Key, o.Value, o.Time, key, value, evTime)
	}
	return nil
}

// memPublisher publishes one target's outputs synchronously: everything is
// persisted (or pending, while the log holds publishes) on return.
type memPublisher struct {
	v *MemView
	t MemTarget
}

func (p *memPublisher) Publish(o Output) error {
	if o.Marker {
		return p.marker(o.KeyGroup, o.Index, o.Wm, o.Fence, o.Meta.Source)
	}
	kg, idx, key, value, evTime, wm, fence, meta := o.KeyGroup, o.Index, o.Key, o.Value, o.Time, o.Wm, o.Fence, o.Meta
	if int64(len(key)+len(value)+outputHeaderBound/2) > p.v.log.maxPayload {
		return nats.ErrMaxPayload
	}
	h := nats.Header{
		HeaderKey:  {string(key)},
		HeaderTime: {strconv.FormatInt(evTime, 10)},
		HeaderOut:  {strconv.FormatUint(idx, 10)},
	}
	if meta.Delete {
		h.Set(HeaderDelete, "1")
	}
	if meta.Source > 0 {
		h.Set(HeaderSource, strconv.FormatUint(meta.Source, 10))
	}
	if p.t.Repartition && wm != math.MinInt64 {
		h.Set(HeaderWatermark, strconv.FormatInt(wm, 10))
	}
	return p.v.log.publish(p.t.Stream, p.msg(kg, idx, h, slices.Clone(value), false), fence)
}

func (p *memPublisher) marker(kg int, idx uint64, wm int64, fence uint64, src uint64) error {
	h := nats.Header{HeaderMarker: {"wm"}, HeaderOut: {strconv.FormatUint(idx, 10)}}
	if src > 0 {
		h.Set(HeaderSource, strconv.FormatUint(src, 10))
	}
	if wm != math.MinInt64 {
		h.Set(HeaderWatermark, strconv.FormatInt(wm, 10))
	}
	return p.v.log.publish(p.t.Stream, p.msg(kg, idx, h, nil, true), fence)
}

func (p *memPublisher) msg(kg int, idx uint64, h nats.Header, data []byte, marker bool) memMsg {
	return memMsg{
		Message: Message{Subject: p.t.Subject + "." + strconv.Itoa(kg), Header: h, Data: data},
		prefix:  p.t.Subject, kg: kg, idx: idx, marker: marker,
	}
}

func (p *memPublisher) DeadLetter(h nats.Header, data []byte, stage string, seq uint64, reason error) error {
	l := p.v.log
	m := deadLetterMessage("dlq", h, data, stage, seq, reason, l.maxPayload)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.dead = append(l.mu.dead, MemDeadLetter{Job: p.v.name, Msg: m})
	return nil
}

func (p *memPublisher) Fence() <-chan struct{}      { return closedChan }
func (p *memPublisher) Idle()                       {}
func (p *memPublisher) Flush(context.Context) error { return nil }
func (p *memPublisher) MaxPayload() int64           { return p.v.log.maxPayload }
