package devloop

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
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
)

// testLog is the log a job graph runs on in `cairn test`: named streams
// in memory, as a NATS server would hold them (the job's inputs, a table's
// changelog, the repartition streams, the outputs), each partitioned by
// subject and written with the sink's rules (Cairn-Out per key group
// subject, the expected-last-subject-sequence fence, watermarks and
// markers on repartition streams).
//
// What a sub-topology publishes is held back (pending) until the test's
// driver releases it, sorted by subject and output index: every stream
// then holds its messages in one order that follows from the input alone,
// whatever the timing of the slots that wrote them, so a run is a function
// of the input file (graphRun).
type testLog struct {
	mu struct {
		sync.Mutex
		// streams by name.
		streams map[string]*testStream
		// changed is closed (and replaced) whenever a stream gets visible
		// messages: the consumers wait on it.
		changed chan struct{}
		// nowNs is the ingestion time (JetStream timestamp) given to the
		// messages released now: the input record being processed.
		nowNs int64
		// dead are the dead letters, as cairn test prints them.
		dead []string
	}
}

// testStream is one stream of a testLog.
type testStream struct {
	msgs    []testMsg // visible to consumers; sequence = index + 1
	pending []testMsg // published, not yet visible (no sequence yet)
	// last maps a subject to the index in msgs of its last message.
	last map[string]int
	// bySubject maps a key group subject to the indexes in msgs of its
	// messages, in order.
	bySubject map[string][]int
}

// testMsg is a message of a testStream, with what the log reads of it.
type testMsg struct {
	engine.Message
	prefix string // the subject before its key group ("" for input messages)
	kg     int
	idx    uint64 // Cairn-Out
	marker bool
}

// testMaxPayload is the log's max_payload (the NATS default), and
// testHeaderBound what the envelope's headers take of it at most.
const (
	testMaxPayload  = 1 << 20
	testHeaderBound = 1 << 10
)

func newTestLog() *testLog {
	l := &testLog{}
	l.mu.streams, l.mu.changed = map[string]*testStream{}, make(chan struct{})
	return l
}

// streamLocked returns the stream called name, created when missing.
func (l *testLog) streamLocked(name string) *testStream {
	s, ok := l.mu.streams[name]
	if !ok {
		s = &testStream{last: map[string]int{}, bySubject: map[string][]int{}}
		l.mu.streams[name] = s
	}
	return s
}

// setNow sets the ingestion time of the messages released from now on.
func (l *testLog) setNow(ns int64) {
	l.mu.Lock()
	l.mu.nowNs = ns
	l.mu.Unlock()
}

// appendLocked makes m visible at the end of s.
func (s *testStream) appendLocked(m testMsg) {
	m.Seq = uint64(len(s.msgs)) + 1
	i := len(s.msgs)
	s.msgs = append(s.msgs, m)
	s.last[m.Subject] = i
	if m.prefix != "" {
		s.bySubject[m.Subject] = append(s.bySubject[m.Subject], i)
	}
}

func (l *testLog) signalLocked() {
	close(l.mu.changed)
	l.mu.changed = make(chan struct{})
}

// appendInput appends an input message (a record of the file, or a tick)
// to stream, visible at once.
func (l *testLog) appendInput(stream string, m engine.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.streamLocked(stream).appendLocked(testMsg{Message: m})
	l.signalLocked()
}

// release makes what was published into stream visible, sorted by
// subject and output index (a marker after the output it follows).
func (l *testLog) release(stream string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(stream)
}

func (l *testLog) releaseLocked(stream string) {
	s := l.streamLocked(stream)
	if len(s.pending) == 0 {
		return
	}
	slices.SortStableFunc(s.pending, func(a, b testMsg) int {
		return cmp.Or(strings.Compare(a.prefix, b.prefix), cmp.Compare(a.kg, b.kg), cmp.Compare(a.idx, b.idx), cmp.Compare(boolInt(a.marker), boolInt(b.marker)))
	})
	for _, m := range s.pending {
		m.TsNanos = l.mu.nowNs
		s.appendLocked(m)
	}
	clear(s.pending)
	s.pending = s.pending[:0]
	l.signalLocked()
}

// releaseAll releases every stream, in name order.
func (l *testLog) releaseAll() {
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

// publish adds a message to stream's pending ones. A non-zero fence must
// be the subject's last sequence, with nothing of it pending.
func (l *testLog) publish(stream string, m testMsg, fence uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(stream)
	if fence > 0 {
		var last uint64
		if i, ok := s.last[m.Subject]; ok {
			last = uint64(i) + 1
		}
		held := slices.ContainsFunc(s.pending, func(p testMsg) bool { return p.Subject == m.Subject })
		if last != fence || held {
			return fmt.Errorf("cairn test: stream %s: publish on %s expects last sequence %d, the subject's is %d (another writer appended)", stream, m.Subject, fence, last)
		}
	}
	s.pending = append(s.pending, m)
	return nil
}

// lastMatching is the sequence of the last visible message of stream on a
// subject that filters take (every subject without filters; 0: none).
func (l *testLog) lastMatching(stream string, filters []string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(stream)
	for i := len(s.msgs) - 1; i >= 0; i-- {
		if len(filters) == 0 || slices.ContainsFunc(filters, func(f string) bool { return engine.SubjectMatches(f, s.msgs[i].Subject) }) {
			return uint64(i) + 1
		}
	}
	return 0
}

// outputs returns the records (not markers) on the key group subjects of
// prefix in stream, in stream order.
func (l *testLog) outputs(stream, prefix string) []testMsg {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []testMsg
	for _, m := range l.streamLocked(stream).msgs {
		if m.prefix == prefix && !m.marker {
			out = append(out, m)
		}
	}
	return out
}

// replayed compares an output a restored sub-topology regenerated (and
// skipped, because the stream holds its index) with the one the stream
// holds: an error names the difference.
func (l *testLog) replayed(t testTarget, kg int, idx uint64, key, value []byte, evTime int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(t.stream)
	subject := t.subject + "." + strconv.Itoa(kg)
	ids := s.bySubject[subject]
	i, _ := slices.BinarySearchFunc(ids, idx, func(i int, idx uint64) int { return cmp.Compare(s.msgs[i].idx, idx) })
	if i == len(ids) || s.msgs[ids[i]].idx != idx || s.msgs[ids[i]].marker {
		return nil // dead-lettered the first time
	}
	m := s.msgs[ids[i]]
	k, v, tm := m.Header.Get(engine.HeaderKey), string(m.Data), m.Header.Get(engine.HeaderTime)
	if k != string(key) || v != string(value) || tm != strconv.FormatInt(evTime, 10) {
		return fmt.Errorf("output %d of key group %d on %s was (key %q, value %q, time %s) and is (key %q, value %q, time %d) after the restore", idx, kg, t.subject, k, v, tm, key, value, evTime)
	}
	return nil
}

// testTarget is one output target of a sub-topology: a stream and the
// subject prefix of its key groups.
type testTarget struct {
	stream, subject string
	repartition     bool
}

// testBroker is one sub-topology's engine.Broker on a testLog: its input
// stream and its output targets (engine.Config.targets' order).
type testBroker struct {
	log     *testLog
	name    string // the sub-topology's (dead letters name it)
	input   string
	targets []testTarget

	mu struct {
		sync.Mutex
		consuming bool     // Consume was called
		filters   []string // its filters
		tick      string   // the tick subject the engine logs ("": none)
	}
}

var _ engine.Broker = (*testBroker)(nil)

// Prepare takes the tick subject: the driver logs ticks for it.
func (b *testBroker) Prepare(_ context.Context, tick string) (bool, string, error) {
	b.mu.Lock()
	b.mu.tick = tick
	b.mu.Unlock()
	return true, tick, nil // publishes are synchronous: batching changes nothing
}

// tick is the tick subject the engine accepted ("": none).
func (b *testBroker) tick() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.tick
}

func (b *testBroker) LastOutputs(_ context.Context, target int) (map[int]engine.LastOutput, error) {
	t := b.targets[target]
	l := b.log
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(t.stream)
	if len(s.pending) > 0 {
		return nil, fmt.Errorf("cairn test: stream %s read for a restart with %d messages not released", t.stream, len(s.pending))
	}
	out := map[int]engine.LastOutput{}
	for _, i := range s.last {
		m := s.msgs[i]
		if m.prefix != t.subject {
			continue
		}
		lo := engine.LastOutput{Index: m.idx, SubjectSeq: m.Seq, Wm: math.MinInt64}
		if v := m.Header.Get(engine.HeaderSource); v != "" {
			lo.Source, _ = strconv.ParseUint(v, 10, 64)
		}
		if v := m.Header.Get(engine.HeaderWatermark); v != "" {
			lo.Wm, _ = strconv.ParseInt(v, 10, 64)
		}
		out[m.kg] = lo
	}
	return out, nil
}

func (b *testBroker) NewPublisher(target int, _ bool, _ func(error), _ <-chan struct{}) (engine.Publisher, error) {
	return &testPublisher{b: b, t: b.targets[target]}, nil
}

func (b *testBroker) Consume(ctx context.Context, startSeq uint64, filters []string) (<-chan engine.Message, func(), <-chan struct{}, error) {
	b.mu.Lock()
	b.mu.consuming, b.mu.filters = true, filters
	b.mu.Unlock()
	msgs := make(chan engine.Message, 64)
	done := make(chan struct{})
	stopped := make(chan struct{})
	var once sync.Once
	l := b.log
	go func() {
		defer close(done)
		next := max(startSeq, 1)
		for {
			l.mu.Lock()
			s := l.streamLocked(b.input)
			var m *engine.Message
			if next <= uint64(len(s.msgs)) {
				c := s.msgs[next-1].Message
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
			if len(filters) > 0 && !slices.ContainsFunc(filters, func(f string) bool { return engine.SubjectMatches(f, m.Subject) }) {
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

// caughtUpTo is the input sequence the engine must have processed to
// have taken everything visible to it (ok false: not consuming yet).
func (b *testBroker) caughtUpTo() (seq uint64, ok bool) {
	b.mu.Lock()
	consuming, filters := b.mu.consuming, b.mu.filters
	b.mu.Unlock()
	if !consuming {
		return 0, false
	}
	return b.log.lastMatching(b.input, filters), true
}

// Tick does nothing: the driver logs ticks where the input file has them.
func (b *testBroker) Tick(context.Context, string) error { return nil }

func (b *testBroker) CheckDuplicateWindow(context.Context, time.Duration) {}

// testPublisher publishes one target's outputs into the log's pending
// messages; everything is persisted on return.
type testPublisher struct {
	b *testBroker
	t testTarget
}

func (p *testPublisher) Publish(kg int, idx uint64, key, value []byte, evTime, wm int64, fence uint64, meta engine.OutputMeta) error {
	if len(key)+len(value)+testHeaderBound > testMaxPayload {
		return nats.ErrMaxPayload
	}
	h := nats.Header{
		engine.HeaderKey:  {string(key)},
		engine.HeaderTime: {strconv.FormatInt(evTime, 10)},
		engine.HeaderOut:  {strconv.FormatUint(idx, 10)},
	}
	if meta.Delete {
		h.Set(engine.HeaderDelete, "1")
	}
	if meta.Source > 0 {
		h.Set(engine.HeaderSource, strconv.FormatUint(meta.Source, 10))
	}
	if p.t.repartition && wm != math.MinInt64 {
		h.Set(engine.HeaderWatermark, strconv.FormatInt(wm, 10))
	}
	return p.b.log.publish(p.t.stream, p.msg(kg, idx, h, append([]byte(nil), value...), false), fence)
}

func (p *testPublisher) Marker(kg int, idx uint64, wm int64, fence uint64, src uint64) error {
	h := nats.Header{engine.HeaderMarker: {"wm"}, engine.HeaderOut: {strconv.FormatUint(idx, 10)}}
	if src > 0 {
		h.Set(engine.HeaderSource, strconv.FormatUint(src, 10))
	}
	if wm != math.MinInt64 {
		h.Set(engine.HeaderWatermark, strconv.FormatInt(wm, 10))
	}
	return p.b.log.publish(p.t.stream, p.msg(kg, idx, h, nil, true), fence)
}

func (p *testPublisher) msg(kg int, idx uint64, h nats.Header, data []byte, marker bool) testMsg {
	return testMsg{
		Message: engine.Message{Subject: p.t.subject + "." + strconv.Itoa(kg), Header: h, Data: data},
		prefix:  p.t.subject, kg: kg, idx: idx, marker: marker,
	}
}

func (p *testPublisher) DeadLetter(_ nats.Header, _ []byte, stage string, seq uint64, reason error) error {
	l := p.b.log
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.dead = append(l.mu.dead, fmt.Sprintf("sub-topology %s seq %d stage %s: %v", p.b.name, seq, stage, reason))
	return nil
}

func (p *testPublisher) Fence() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
func (p *testPublisher) Idle()                       {}
func (p *testPublisher) Flush(context.Context) error { return nil }
func (p *testPublisher) MaxPayload() int64           { return testMaxPayload }
