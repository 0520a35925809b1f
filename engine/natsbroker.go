package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsBroker is the Broker of a NATS server with JetStream.
type natsBroker struct {
	cfg      *Config
	nc       *nats.Conn
	js       jetstream.JetStream
	log      *slog.Logger
	subjects [][]string // per output target, per key group: <subject>.<kg>
	// fences: per output target, per slot, the marker its checks expect
	// (Config.FenceEpoch; nil when not fenced), made by Prepare; taken in
	// the order the engine makes the targets' batched publishers, one per
	// slot (next).
	fences [][]fenceCheck
	next   []int
}

var _ Broker = (*natsBroker)(nil)

// NewNATSBroker returns the Broker that New runs a job on, for a caller that
// wraps it (an input of its own, outputs discarded) and passes the wrapper to
// NewWithBroker. With cfg.InputStream empty, Prepare creates no input stream.
func NewNATSBroker(nc *nats.Conn, cfg Config) (Broker, error) {
	cfg.setDefaults()
	return newNATSBroker(nc, &cfg)
}

func newNATSBroker(nc *nats.Conn, cfg *Config) (*natsBroker, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var subjects [][]string
	for _, t := range cfg.targets() {
		s := make([]string, cfg.KeyGroups)
		for kg := range s {
			s[kg] = t.Subject + "." + strconv.Itoa(kg)
		}
		subjects = append(subjects, s)
	}
	return &natsBroker{cfg: cfg, nc: nc, js: js, log: cfg.Logger, subjects: subjects}, nil
}

// Prepare creates the streams that are missing and makes the input stream
// capture the tick subject.
func (b *natsBroker) Prepare(ctx context.Context, req PrepareRequest) (Prepared, error) {
	batchOK, err := ensureStreams(ctx, b.js, b.cfg)
	if err != nil {
		return Prepared{}, err
	}
	p := Prepared{Batch: batchOK}
	if err := b.claimFences(ctx); err != nil {
		return Prepared{}, err
	}
	if req.Tick != "" {
		if tick := b.ensureTickSubject(ctx, req.Tick); tick != "" {
			p.TickSubject = tick
			p.Tick = func(ctx context.Context) error {
				_, err := b.js.Publish(ctx, tick, nil) // an empty message
				return err
			}
		}
	}
	if req.DuplicateWindow > 0 {
		b.checkDuplicateWindow(ctx, req.DuplicateWindow)
	}
	return p, nil
}

// LastOutputs reads the last message of every key group's subject of an
// output target.
func (b *natsBroker) LastOutputs(ctx context.Context, target int) (map[int]LastOutput, error) {
	return readLastOutputs(ctx, b.js, b.cfg, b.cfg.targets()[target])
}

// NewPublisher makes a sink of an output target with its own JetStream
// context.
func (b *natsBroker) NewPublisher(target int, batched bool, fail func(error), failed <-chan struct{}) (Publisher, error) {
	s, err := newSink(b.nc, b.cfg, b.cfg.targets()[target], b.subjects[target], fail, failed, batched)
	if err != nil || !batched || b.fences == nil {
		return s, err
	}
	if b.next == nil {
		b.next = make([]int, len(b.fences))
	}
	i := b.next[target]
	if i >= len(b.fences[target]) {
		return nil, fmt.Errorf("engine: a fenced writer of %s has %d slots, and a publisher more was asked", b.cfg.targets()[target].Stream, len(b.fences[target]))
	}
	b.next[target]++
	s.setFence(b.fences[target][i])
	return s, nil
}

// claimFences claims every output target for the engine's epoch
// (Config.FenceEpoch), one marker per slot, before anything reads what the
// streams hold: a writer that lost them meanwhile has its next check
// refused from here on.
func (b *natsBroker) claimFences(ctx context.Context) error {
	if b.cfg.FenceEpoch == 0 || b.fences != nil {
		return nil
	}
	fences := make([][]fenceCheck, len(b.cfg.targets()))
	ep := strconv.FormatUint(b.cfg.FenceEpoch, 10)
	for t, tg := range b.cfg.targets() {
		marks, err := claimFence(ctx, b.js, tg.Stream, tg.Subject, b.cfg.FenceEpoch, b.cfg.Slots)
		if err != nil {
			return err
		}
		b.log.Info("output stream claimed", "stream", tg.Stream, "subjects", FenceSubjects(tg.Subject), "epoch", b.cfg.FenceEpoch, "slots", len(marks))
		for i, seq := range marks {
			fences[t] = append(fences[t], fenceCheck{subject: markerSubject(tg.Subject, i), seq: strconv.FormatUint(seq, 10), epoch: ep})
		}
	}
	b.fences = fences
	return nil
}

// Consume reads the input with an ordered consumer from startSeq.
//
// A pull iterator, not a Consume callback: when the pipeline is slow, a
// blocked callback stalls the subscription (heartbeats included) and the
// ordered consumer resets after missed heartbeats (seconds of stall); the
// iterator just stops pulling when its buffer is full.
func (b *natsBroker) Consume(ctx context.Context, startSeq uint64, filters []string) (<-chan Message, func(), <-chan struct{}, error) {
	cfg := b.cfg
	// A filter that takes every subject of the stream is dropped: the
	// server matches a consumer with several filters message by message
	// (a fifth of the CPU of a job graph's downstream, measured), while an
	// unfiltered consumer reads the stream as it is. Other jobs' tick
	// subjects on the same stream do not count: the pipeline drops their
	// messages without effect (Engine.foreignTick), so a second job on a
	// stream does not pay for the first one's ticks (0.2-0.3 µs of the
	// server's CPU per message, docs/bench/throughput.md, "The passthrough
	// ceiling").
	if st, err := b.js.Stream(ctx, cfg.InputStream); err == nil && len(filters) > 0 && ReadsWholeStream(filters, st.CachedInfo().Config.Subjects) {
		filters = nil
	}
	r := &sourceReader{b: b, filters: filters, stall: sourceStallAfter}
	msgs := make(chan Message, 4*cfg.BatchSize)
	done, err := r.start(ctx, startSeq, msgs)
	if err != nil {
		return nil, nil, nil, err
	}
	go r.watch(ctx, done)
	return msgs, r.stop, done, nil
}

// checkDuplicateWindow warns when dedupe delivery cannot cover a restore:
// a replay older than the output stream's duplicate window is stored twice.
func (b *natsBroker) checkDuplicateWindow(ctx context.Context, need time.Duration) {
	st, err := b.js.Stream(ctx, b.cfg.OutputStream)
	if err != nil {
		return
	}
	info, err := st.Info(ctx)
	if err != nil {
		return
	}
	if w := info.Config.Duplicates; w < need {
		b.log.Warn("dedupe delivery: the output stream's duplicate window is shorter than checkpoint interval + expected restore time; a replay older than the window will be stored twice",
			"stream", b.cfg.OutputStream, "duplicate_window", w, "needed", need)
	}
}

// ensureTickSubject makes the input stream capture the tick subject and
// returns it, or "" when the stream may not be changed (permissions, a
// stream managed elsewhere): idle ticks are then lost and timers fire
// with the next record.
func (b *natsBroker) ensureTickSubject(ctx context.Context, tick string) string {
	st, err := b.js.Stream(ctx, b.cfg.InputStream)
	if err != nil {
		return ""
	}
	sc := st.CachedInfo().Config
	if anyMatches(sc.Subjects, tick) {
		return tick
	}
	sc.Subjects = append(sc.Subjects, tick)
	if _, err := b.js.UpdateStream(ctx, sc); err != nil {
		b.log.Warn("input stream does not take processing-time ticks: on an idle input, processing-time timers fire only with the next record",
			"stream", b.cfg.InputStream, "subject", tick, "err", err)
		return ""
	}
	return tick
}

// ensureStreams creates the output and dead-letter streams when missing.
// It reports whether the output stream allows fast-batch publishing.
func ensureStreams(ctx context.Context, js jetstream.JetStream, cfg *Config) (batchOK bool, err error) {
	// The dead-letter stream's duplicate window is what makes a dead
	// letter published once however often a restore replays its record
	// (deadLetterID): an hour covers a crash and its restart; dead letters
	// are few, so the ids the server keeps for it cost little.
	want := []jetstream.StreamConfig{{Name: cfg.DeadLetterStream, Subjects: []string{cfg.DeadLetterSubject}, Storage: jetstream.FileStorage, Duplicates: DeadLetterDuplicateWindow}}
	outputs := map[string]bool{} // output streams: batchOK needs every one to allow batches
	if cfg.Delivery != Core {
		for _, t := range cfg.targets() {
			if !outputs[t.Stream] {
				outputs[t.Stream] = true
				want = append(want, jetstream.StreamConfig{Name: t.Stream, Subjects: []string{t.Subject + ".>"}, Storage: jetstream.FileStorage, AllowBatchPublish: true})
			}
		}
	}
	batchOK = len(outputs) > 0
	if cfg.InputTable != "" {
		// A KV bucket is the user's: never created (a plain stream of its
		// name would not be a bucket).
		if _, err := js.Stream(ctx, cfg.InputStream); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return false, fmt.Errorf("%w: table input: KV bucket %s (stream %s) does not exist: create it first (nats kv add %s)", ErrConfig, cfg.InputTable, cfg.InputStream, cfg.InputTable)
			}
			return false, fmt.Errorf("engine: table input %s: %w", cfg.InputTable, err)
		}
	} else if cfg.InputStream != "" {
		want = append(want, jetstream.StreamConfig{Name: cfg.InputStream, Subjects: cfg.InputSubjects, Storage: jetstream.FileStorage})
	}
	replicas := StreamReplicas(ctx, js, cfg.InputStream)
	for _, sc := range want {
		sc.Replicas = replicas
		if st, err := js.Stream(ctx, sc.Name); err == nil {
			if outputs[sc.Name] {
				batchOK = batchOK && st.CachedInfo().Config.AllowBatchPublish
			}
			continue
		}
		if len(sc.Subjects) == 0 {
			return false, fmt.Errorf("%w: stream %s does not exist and no subjects are configured to create it", ErrConfig, sc.Name)
		}
		st, err := CreateStream(ctx, js, sc, cfg.Logger)
		if err != nil && !isExists(err) {
			return false, fmt.Errorf("engine: create stream %s: %w", sc.Name, err)
		}
		if outputs[sc.Name] {
			if err == nil {
				batchOK = batchOK && st.CachedInfo().Config.AllowBatchPublish
			} else if st, err := js.Stream(ctx, sc.Name); err == nil {
				batchOK = batchOK && st.CachedInfo().Config.AllowBatchPublish
			}
		}
	}
	return batchOK, nil
}
func isExists(err error) bool {
	return err != nil && errors.Is(err, jetstream.ErrStreamNameAlreadyInUse)
}

// lastOutputsWait bounds how long readLastOutputs tries again after reads
// that ended short of what their consumer had pending.
const lastOutputsWait = 30 * time.Second

// errShortRead is a read of the last outputs whose fetch ended empty
// before its consumer delivered what it had pending.
var errShortRead = errors.New("a fetch ended empty before the consumer delivered what it had pending")

// readLastOutputs reads the last message of every key group's output
// subject in one pass (a last-per-subject ordered consumer).
//
// A fetch that ends empty before the consumer delivered what it had
// pending when it was made is a slow server (a replicated stream on a
// loaded cluster, a slow link), not the end: taking it for the end would
// make those key groups look unwritten. The messages such a fetch was
// sent arrive after the client gave up on it and are lost to this
// consumer, so the read starts over with a new consumer and a fetch wait
// twice as long, for up to lastOutputsWait.
//
// A fetch answered "no responders" reached no consumer: the one just made
// is not served yet (on a cluster its leader is still being placed; the
// ordered consumer makes a new one for every fetch), or the stream's
// leader moved. The read starts over too, after a pause. It once ended a
// group member's start, 30 ms after it began, as the member's failure.
func readLastOutputs(ctx context.Context, js jetstream.JetStream, cfg *Config, t OutputTarget) (map[int]LastOutput, error) {
	deadline := time.Now().Add(lastOutputsWait)
	pause := 50 * time.Millisecond
	for wait := 300 * time.Millisecond; ; wait = min(2*wait, 10*time.Second) {
		out, err := readLastOutputsOnce(ctx, js, cfg, t, wait)
		short, unserved := errors.Is(err, errShortRead), errors.Is(err, errUnserved)
		if !short && !unserved {
			return out, err
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return nil, fmt.Errorf("engine: read last outputs of %s: %w (tried again for %v)", t.Stream, err, lastOutputsWait)
		}
		if unserved {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("engine: read last outputs of %s: stopped while it was not served (%v): %w", t.Stream, err, ctx.Err())
			case <-time.After(pause):
			}
			pause = min(2*pause, time.Second)
		}
	}
}

// errUnserved is a fetch of the last outputs that no consumer answered
// (the server's "no responders").
var errUnserved = errors.New("a fetch reached no consumer")

// unanswered reports a request to a stream that got no answer while ctx
// still runs: "no responders", or the client's own request timeout (the
// stream's leader died and no new one is elected yet).
func unanswered(ctx context.Context, err error) bool {
	return ctx.Err() == nil && (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded))
}

func readLastOutputsOnce(ctx context.Context, js jetstream.JetStream, cfg *Config, t OutputTarget, fetchWait time.Duration) (map[int]LastOutput, error) {
	out := map[int]LastOutput{}
	prefix := t.Subject + "."
	var cons jetstream.Consumer
	var err error
	// A stream just created on a cluster answers nothing until its leader
	// is elected (no responders): seconds, more for a replicated stream on a
	// loaded cluster (the waits add up to about 40 s). A stream whose
	// leader just died (a cluster node killed) lets the creation's request
	// time out instead, until a new leader is elected.
	for wait := 50 * time.Millisecond; ; wait *= 2 {
		cons, err = js.OrderedConsumer(ctx, t.Stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{prefix + ">"},
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
		if err == nil || !unanswered(ctx, err) || wait > 20*time.Second {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("engine: read last outputs of %s: stopped while waiting for its leader (%v): %w", t.Stream, err, ctx.Err())
		case <-time.After(wait):
		}
	}
	if err != nil {
		return nil, fmt.Errorf("engine: read last outputs of %s: %w", t.Stream, err)
	}
	// What the consumer had to deliver when it was made.
	var expect uint64
	if info := cons.CachedInfo(); info != nil {
		expect = info.NumPending
	}
	got := uint64(0)
	for {
		batch, err := cons.Fetch(1024, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			if unanswered(ctx, err) {
				// A fetch that remakes the ordered consumer (its first
				// one was deleted) is a request to a stream that may be
				// between leaders.
				return nil, fmt.Errorf("%w: %w", errUnserved, err)
			}
			return nil, fmt.Errorf("engine: read last outputs of %s: %w", t.Stream, err)
		}
		// The message that says nothing is pending is the last one: the
		// read ends with it rather than when the fetch's wait runs out (a
		// job has fewer key groups than a fetch asks for, so every fetch
		// used to wait its whole 300 ms, on every restart's way to its
		// first output).
		n, pending := 0, uint64(1)
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			pending = md.NumPending
			if IsFenceSubject(m.Subject()) && m.Headers().Get(HeaderFence) != "" {
				// A writer's claim of the stream (fence.go), not an output.
				if pending == 0 {
					break
				}
				continue
			}
			kg, err := strconv.Atoi(strings.TrimPrefix(m.Subject(), prefix))
			if err != nil || kg < 0 || kg >= cfg.KeyGroups {
				return nil, fmt.Errorf("engine: output stream %s holds subject %s, which is not <%s>.<key group < %d>: is it shared with another job or key_groups?", t.Stream, m.Subject(), t.Subject, cfg.KeyGroups)
			}
			idx, err := strconv.ParseUint(m.Headers().Get(HeaderOut), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("engine: output %s seq %d has no valid %s header", m.Subject(), md.Sequence.Stream, HeaderOut)
			}
			var src uint64
			if v := m.Headers().Get(HeaderSource); v != "" {
				if src, err = strconv.ParseUint(v, 10, 64); err != nil {
					return nil, fmt.Errorf("engine: output %s seq %d: header %s=%q", m.Subject(), md.Sequence.Stream, HeaderSource, v)
				}
			}
			wm := int64(math.MinInt64)
			if v := m.Headers().Get(HeaderWatermark); v != "" {
				if wm, err = strconv.ParseInt(v, 10, 64); err != nil {
					return nil, fmt.Errorf("engine: output %s seq %d: header %s=%q", m.Subject(), md.Sequence.Stream, HeaderWatermark, v)
				}
			}
			out[kg] = LastOutput{Index: idx, SubjectSeq: md.Sequence.Stream, Source: src, Wm: wm}
			if pending == 0 {
				break
			}
		}
		if pending == 0 && n > 0 {
			return out, nil
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			if errors.Is(err, nats.ErrNoResponders) {
				return nil, fmt.Errorf("%w: %w", errUnserved, err)
			}
			return nil, fmt.Errorf("engine: read last outputs of %s: %w", t.Stream, err)
		}
		got += uint64(n)
		if n == 0 && got < expect {
			return nil, fmt.Errorf("%w: %d of %d read with a fetch wait of %v", errShortRead, got, expect, fetchWait)
		}
		if n == 0 || pending == 0 {
			return out, nil
		}
	}
}
