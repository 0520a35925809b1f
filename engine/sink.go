package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// PublishMode is how a JetStream sink publishes outputs.
type PublishMode string

const (
	// PublishAuto uses fast batches for exactly_once and transactional when
	// the output stream allows them, else async publishes. The default.
	PublishAuto PublishMode = ""
	// PublishAsync publishes every output with its own acknowledgement
	// (jetstream PublishMsgAsync).
	PublishAsync PublishMode = "async"
	// PublishBatch publishes outputs in fast batches (AllowBatchPublish,
	// orbit.go jetstreamext): one flow acknowledgement per many messages.
	// Falls back to async when the stream does not allow batches, and for
	// dedupe delivery (a batch cannot start with a duplicate).
	PublishBatch PublishMode = "batch"
)

// Fast-batch flow control: the server acknowledges every batchFlow messages
// at most (it lowers this when several batches share a stream), and a batch
// stalls with batchMaxOutstandingAcks acknowledgements outstanding. The
// library's default window (100 x 2) stalls the slot on every round trip
// through the stream's store loop; measured on 2 cores, 500 x 32 was the
// fastest (the stream's ingest queue holds 100k messages, far above).
const (
	batchFlow               = 500
	batchMaxOutstandingAcks = 32
)

// publishTimeout bounds a stalled publish or a batch commit.
const publishTimeout = 30 * time.Second

// batchAckTimeout bounds a fast batch's wait for a flow acknowledgement
// (the library pings for a lost one every third of it, but waits for a
// batch's first acknowledgement without pinging). An acknowledgement lost
// with the connection (a server restart) otherwise held the slot, and the
// checkpoint behind it, for the whole publishTimeout before the job could
// resume; a healthy server acknowledges in milliseconds.
const batchAckTimeout = 10 * time.Second

// sink publishes one slot's outputs (or the pipeline's dead letters). Each
// sink has its own JetStream context so that a barrier can wait for exactly
// its own pending acknowledgements. Outputs of a key group are published by
// one sink, in order.
//
// A sink is used by one goroutine at a time (its slot, or the pipeline).
type sink struct {
	job      string
	stream   string // the output stream
	nc       *nats.Conn
	js       jetstream.JetStream
	delivery Delivery
	subjects []string // per key group: <output.subject>.<kg>
	dlq      string
	fail     func(error)
	failed   <-chan struct{}
	// maxPayload is the server's max_payload (headers + payload): dead
	// letters are cut to fit it.
	maxPayload int64
	// repartition: the output is a repartition stream; outputs carry the
	// watermark (HeaderWatermark).
	repartition bool

	// Fast-batch publishing (batched): outputs go into an open batch; a
	// fence detaches it and commits it in the background.
	batched bool
	open    *fastBatch // the open batch (nil: none)
	// committed is the last batch detached (nil: none yet); its done
	// closes once it and every batch detached before it are stored.
	committed *batchDone
	// openGen is the connection's reconnect count when the last batch
	// opened.
	openGen uint64
	// awaitPrev makes the next batch open only once the batches detached
	// before it are stored: set whenever a batch is detached (a fence,
	// idleness, a reconnect, a failed add).
	awaitPrev bool
	// idleMax is batchIdleMax (lowered by tests whose server forgets
	// batches sooner).
	idleMax time.Duration
	// floor, floorKnown: the output stream's last sequence before this
	// sink's first batch (for checking a lost batch that ends in a
	// marker, see batchStored).
	floor      uint64
	floorKnown bool
	floorTried bool

	// fence: the marker its fast batches check (fence.go); checks counts
	// the checks sent.
	fence  fenceCheck
	checks uint64
	// firstUnsafe: the last batch's last message checked the marker, and
	// the server may still be applying it: the next batch's first message
	// does not check (fenceCheck.due).
	firstUnsafe bool

	// Reused for synchronous publishes (fast batch, core): the message is
	// serialised before PublishMsg returns, so nothing retains it.
	msg     nats.Msg
	hdr     nats.Header
	scratch []byte
}

func newSink(nc *nats.Conn, cfg *Config, t OutputTarget, subjects []string, fail func(error), failed <-chan struct{}, batched bool) (*sink, error) {
	s := &sink{job: cfg.Job, stream: t.Stream, nc: nc, delivery: cfg.Delivery, subjects: subjects, dlq: cfg.DeadLetterSubject, failed: failed, batched: batched, maxPayload: nc.MaxPayload(), repartition: t.Repartition}
	s.openGen = nc.Stats().Reconnects
	s.idleMax = batchIdleMax
	s.fail = func(err error) { fail(asFenced(s.stream, s.explain(err))) }
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(8192),
		jetstream.WithPublishAsyncTimeout(publishTimeout),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			if messageFault(err) {
				// The server refused this one message (its size, its
				// headers): it becomes a dead letter, the job goes on. Not
				// on this callback's goroutine: a publish may stall.
				go s.refused(m, err)
				return
			}
			s.fail(fmt.Errorf("engine: publish to %s: %w", m.Subject, err))
		}))
	if err != nil {
		return nil, err
	}
	s.js = js
	s.hdr = nats.Header{HeaderKey: {""}, HeaderTime: {""}, HeaderOut: {""}}
	s.msg.Header = s.hdr
	return s, nil
}

// ErrStreamDeleted is a publish that failed because its stream was deleted
// while the job ran (the client's own error is a timeout or an empty reply).
var ErrStreamDeleted = errors.New("engine: stream deleted while the job ran")

// explain names the cause of a failed publish when the output stream no
// longer exists.
func (s *sink) explain(err error) error {
	if s.js == nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, serr := s.js.Stream(ctx, s.stream); errors.Is(serr, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: %s: %w", ErrStreamDeleted, s.stream, err)
	}
	return err
}

// Publish sends one output (or, o.Marker, a watermark marker).
// A non-zero fence is the subject's expected last sequence
// (Nats-Expected-Last-Subject-Sequence): the publish fails if another writer
// appended to the key group since.
func (s *sink) Publish(o Output) error {
	return asFenced(s.stream, s.publish(o))
}

func (s *sink) publish(o Output) error {
	if o.Marker {
		return s.marker(o.KeyGroup, o.Index, o.Wm, o.Fence, o.Meta.Source)
	}
	kg, idx, key, value, evTime, wm, fence, meta := o.KeyGroup, o.Index, o.Key, o.Value, o.Time, o.Wm, o.Fence, o.Meta
	if !s.repartition {
		wm = math.MinInt64
	}
	if s.delivery == Core || s.batched {
		return s.publishReused(kg, idx, key, value, evTime, wm, fence, meta)
	}
	h := make(nats.Header, 8)
	meta.set(h)
	if wm != math.MinInt64 {
		h[HeaderWatermark] = []string{strconv.FormatInt(wm, 10)}
	}
	h[HeaderKey] = []string{string(key)}
	h[HeaderTime] = []string{strconv.FormatInt(evTime, 10)}
	out := strconv.FormatUint(idx, 10)
	h[HeaderOut] = []string{out}
	if s.delivery == Dedupe {
		h[HeaderMsgID] = []string{s.job + "/" + strconv.Itoa(kg) + "/" + out}
	}
	if fence > 0 {
		h[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(fence, 10)}
	}
	_, err := s.js.PublishMsgAsync(&nats.Msg{Subject: s.subjects[kg], Header: h, Data: value}, jetstream.WithStallWait(publishTimeout))
	return err
}

// publishReused publishes through the sink's reused message and header:
// their strings point into scratch, valid until the next publish.
// INVARIANT: only for publishes that serialise the message before returning
// (core PublishMsg, FastPublisher.AddMsg); an async publish keeps the
// message for retries. Dedupe delivery never comes here (it publishes
// asynchronously, see Run), so there is no Nats-Msg-Id to build.
func (s *sink) publishReused(kg int, idx uint64, key, value []byte, evTime, wm int64, fence uint64, meta OutputMeta) error {
	if meta != (OutputMeta{}) {
		meta.set(s.hdr)
		defer delete(s.hdr, HeaderDelete)
		defer delete(s.hdr, HeaderSource)
	}
	b := s.scratch[:0]
	b = append(b, key...)
	nKey := len(b)
	b = strconv.AppendInt(b, evTime, 10)
	nTime := len(b)
	b = strconv.AppendUint(b, idx, 10)
	nOut := len(b)
	if fence > 0 {
		b = strconv.AppendUint(b, fence, 10)
	}
	nFence := len(b)
	if wm != math.MinInt64 {
		b = strconv.AppendInt(b, wm, 10)
	}
	s.scratch = b
	str := func(from, to int) string {
		if from == to {
			return ""
		}
		return unsafe.String(&b[from], to-from)
	}
	s.hdr[HeaderKey][0] = str(0, nKey)
	s.hdr[HeaderTime][0] = str(nKey, nTime)
	s.hdr[HeaderOut][0] = str(nTime, nOut)
	if fence > 0 {
		s.hdr[jetstream.ExpectedLastSubjSeqHeader] = []string{str(nOut, nFence)}
		defer delete(s.hdr, jetstream.ExpectedLastSubjSeqHeader)
	}
	if wm != math.MinInt64 {
		s.hdr[HeaderWatermark] = []string{str(nFence, len(b))}
		defer delete(s.hdr, HeaderWatermark)
	}
	s.msg.Subject, s.msg.Reply, s.msg.Data = s.subjects[kg], "", value
	defer func() { s.msg.Data = nil }()
	if s.delivery == Core {
		return s.nc.PublishMsg(&s.msg)
	}
	return s.addToBatch(&s.msg, idx, false)
}

// marker publishes a watermark marker on key group kg, in order with the
// key group's outputs (through the open batch when batched).
func (s *sink) marker(kg int, idx uint64, wm int64, fence uint64, src uint64) error {
	h := nats.Header{
		HeaderMarker: {"wm"},
		HeaderOut:    {strconv.FormatUint(idx, 10)},
	}
	OutputMeta{Source: src}.set(h)
	if wm != math.MinInt64 {
		h[HeaderWatermark] = []string{strconv.FormatInt(wm, 10)}
	}
	if fence > 0 {
		h[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(fence, 10)}
	}
	if s.fence.subject != "" {
		h[HeaderEpoch] = []string{s.fence.epoch}
	}
	m := &nats.Msg{Subject: s.subjects[kg], Header: h}
	if s.batched {
		return s.addToBatch(m, idx, true)
	}
	_, err := s.js.PublishMsgAsync(m, jetstream.WithStallWait(publishTimeout))
	return err
}

// set writes the meta's headers into h.
func (m OutputMeta) set(h nats.Header) {
	if m.Delete {
		h[HeaderDelete] = []string{"1"}
	}
	if m.Source > 0 {
		h[HeaderSource] = []string{strconv.FormatUint(m.Source, 10)}
	}
}

// batchIdleMax bounds how long an open fast batch goes without a message.
// The server forgets a fast batch that got nothing for its batch timeout
// (the JetStream limit max_batch_timeout, 10 s by default) and answers
// every later message of it, and its commit, with "batch publish ID
// unknown", storing none of them. The slot's idle tick commits a batch
// unused for a tick, but a slot held up for longer (a long checkpoint, a
// stalled catch-up) would then add to a batch the server dropped: a batch
// last added to this long ago is committed and a new one opened instead.
// Half the server's default leaves room for queueing in the server.
const batchIdleMax = 5 * time.Second

// jsErrBatchUnknown is the server's "batch publish ID unknown": it no
// longer knows the fast batch (its batch timeout passed, the server
// restarted, or a new stream leader never saw the batch). The client
// library names no constant for it.
const jsErrBatchUnknown jetstream.ErrorCode = 10208

// ErrBatchLost is a fast batch the server lost before all of it was
// stored: the outputs from its first unstored one on are neither in the
// stream nor can be sent again without regenerating them, so the job
// resumes from its last checkpoint (which skips what the stream holds).
// The text keeps the server's phrase, by which the runtime knows the
// outcome for unknown rather than refused.
var ErrBatchLost = errors.New("engine: fast batch lost by the server (batch publish ID unknown) before all of it was stored")

// batchUnknown reports the server's "batch publish ID unknown".
func batchUnknown(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrBatchUnknown
}

// serverAnswer reports whether a failed commit is the server's own answer
// (an API error), as against no answer in time, a failed ping or an answer
// the client could not read.
func serverAnswer(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr)
}

// batchUnanswered reports an answer to a batch message that is no answer
// of the stream: an empty one (the server's "no responders" while the
// stream is not up yet after a restart, or has no leader), which the
// client library fails to parse. The message it answers was not stored;
// the batch cannot go on, and whether what came before is stored is for
// the stream to say, as for a batch the server forgot.
func batchUnanswered(err error) bool {
	var syntax *json.SyntaxError
	return errors.As(err, &syntax)
}

// fastBatch is one fast batch of a sink.
type fastBatch struct {
	fp   jetstreamext.FastPublisher
	n    uint64    // messages added
	used bool      // got a message since the last idle check
	last time.Time // when the last message was added
	gen  uint64    // the connection's reconnect count when it opened
	// The last message added: its subject, output index, and whether it
	// is a watermark marker (batchStored).
	lastSubject string
	lastIdx     uint64
	lastMarker  bool
	// checked is the batch sequence of the last message that checked the
	// writer's fence claim, acked the highest one acknowledged (fence.go).
	checked, acked uint64
	// forgotten: the server answered the batch with "batch publish ID
	// unknown", an empty answer or a gap (set on the client's callback
	// goroutine).
	forgotten atomic.Bool
	// troubled: an add failed while the server lost the batch; whether
	// its message is stored is decided at the commit.
	troubled bool
}

// batchDone is a detached batch's outcome: done closes once it, and
// every batch detached before it, is stored; seq is then the stream
// sequence of its last message (or of a later one of this sink).
type batchDone struct {
	done chan struct{}
	seq  uint64
}

// addToBatch adds a message (output or marker idx) to the open fast
// batch, opening one if needed.
func (s *sink) addToBatch(m *nats.Msg, idx uint64, marker bool) error {
	return s.addMsgToBatch(m, idx, marker, false)
}

func (s *sink) addMsgToBatch(m *nats.Msg, idx uint64, marker, retried bool) error {
	now := time.Now()
	if b := s.open; b != nil && (now.Sub(b.last) >= s.idleMax || b.forgotten.Load() || s.reconnectedSince(b.gen)) {
		// Never into a batch the server may have forgotten: commit it
		// (a commit the server cannot answer is decided from what the
		// stream holds, batchStored) and open the next one once it is
		// known to be stored.
		s.detachBatch()
	}
	if s.open == nil {
		if err := s.awaitBatchesAcrossReconnect(); err != nil {
			return err
		}
		if s.repartition && !s.floorTried {
			s.readFloor()
		}
		b := &fastBatch{gen: s.openGen}
		fp, err := jetstreamext.NewFastPublisher(s.js,
			jetstreamext.FastPublishFlowControl{Flow: batchFlow, MaxOutstandingAcks: batchMaxOutstandingAcks, AckTimeout: batchAckTimeout},
			jetstreamext.WithFastPublisherErrorHandler(func(err error) {
				if batchUnknown(err) || batchUnanswered(err) || errors.Is(err, jetstreamext.ErrFastBatchGapDetected) {
					// Messages lost with the batch show at its commit,
					// which looks at the stream (detachBatch). A gap: a
					// new stream leader that knew the batch up to a
					// message before one lost with the old leader ended
					// it there, storing nothing after.
					b.forgotten.Store(true)
					return
				}
				s.fail(fmt.Errorf("engine: fast-batch publish to stream %s: %w", s.stream, err))
			}))
		if err != nil {
			return err
		}
		b.fp = fp
		s.open = b
	}
	b := s.open
	prevSubject, prevIdx, prevMarker := b.lastSubject, b.lastIdx, b.lastMarker
	// A message fenced on its key group's subject (a first publish) checks
	// that; the claim's check waits for the next one.
	check := s.fence.due(b.n, b.checked, b.acked, !s.firstUnsafe) && m.Header.Get(jetstream.ExpectedLastSubjSeqHeader) == ""
	if check {
		s.checks++
		s.fence.set(m.Header)
		defer delete(m.Header, jetstream.ExpectedLastSubjSeqHeader)
		defer delete(m.Header, jetstream.ExpectedLastSubjSeqSubjHeader)
	}
	b.n++
	b.used = true
	b.last = now
	b.lastSubject, b.lastIdx, b.lastMarker = m.Subject, idx, marker
	ack, err := b.fp.AddMsg(m)
	if err == nil {
		b.acked = max(b.acked, ack.AckSequence)
		if check {
			b.checked = b.n
		}
	}
	if err != nil {
		if !b.forgotten.Load() && !s.reconnectedSince(b.gen) {
			return err
		}
		if b.n > 1 && errors.Is(err, jetstreamext.ErrBatchClosed) && !retried {
			// The server's "unknown" closed the batch just before this
			// add, which sent nothing: the message goes into the next
			// batch, after the commit of this one without it.
			b.n--
			b.lastSubject, b.lastIdx, b.lastMarker = prevSubject, prevIdx, prevMarker
			if check {
				// The next batch decides its own check.
				delete(m.Header, jetstream.ExpectedLastSubjSeqHeader)
				delete(m.Header, jetstream.ExpectedLastSubjSeqSubjHeader)
			}
			s.detachBatch()
			return s.addMsgToBatch(m, idx, marker, true)
		}
		// The server lost the batch under this add: whether this message
		// and those before it are stored is decided at the commit.
		b.troubled = true
		s.detachBatch()
	}
	return nil
}

// reconnectedSince reports whether the connection was lost since its
// reconnect count was gen (or is lost now).
func (s *sink) reconnectedSince(gen uint64) bool {
	return !s.nc.IsConnected() || s.nc.Stats().Reconnects != gen
}

// readFloor reads the output stream's last sequence before the sink's
// first batch: no message of its batches lies at or below it. Read once;
// when it cannot be read, a lost batch that ends in a marker is not
// decided from the stream (the job resumes from its checkpoint).
func (s *sink) readFloor() {
	s.floorTried = true
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	st, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		return
	}
	s.floor, s.floorKnown = st.CachedInfo().State.LastSeq, true
}

// awaitBatchesAcrossReconnect, before a batch opens, waits for the
// batches detached before it (every detach asks it, awaitPrev), and for
// them too when the connection was lost since the last one opened (or is
// lost now). Batches are not atomic with each other: a batch lost with
// the connection (a server restart) or with a stream leader, and the next
// one, sent after it and stored, would leave a gap below a key group's
// last output index, and a restore skips regenerated outputs up to that
// index, so the gap would be lost for good. Waiting means the new batch opens only once
// the earlier ones are known to be stored; a lost one fails the engine
// first (ErrBatchLost), and the restart from the last checkpoint
// regenerates it.
func (s *sink) awaitBatchesAcrossReconnect() error {
	gen := s.nc.Stats().Reconnects
	interrupted := s.awaitPrev || gen != s.openGen || !s.nc.IsConnected()
	s.openGen, s.awaitPrev = gen, false
	if !interrupted || s.committed == nil {
		return nil
	}
	select {
	case <-s.committed.done:
		s.openGen = s.nc.Stats().Reconnects
		return nil
	case <-s.failed:
		return fmt.Errorf("engine: publish to stream %s: an earlier batch was not stored across a reconnect", s.stream)
	}
}

// detachBatch commits the open batch in the background and returns a
// channel closed once it, and every batch detached before it, is
// committed with all its messages. A failed commit is fatal (fail) and its
// channel never closes.
func (s *sink) detachBatch() <-chan struct{} {
	if s.open == nil {
		if s.committed == nil {
			return closedChan
		}
		return s.committed.done
	}
	b, prev := s.open, s.committed
	s.firstUnsafe = b.checked != 0 && b.checked == b.n
	d := &batchDone{done: make(chan struct{})}
	s.open, s.committed = nil, d
	// The next batch opens once this one is known stored whole. Batches
	// are not atomic with each other: when a stream leader dies with this
	// batch's tail in its queue and the client sees no disconnect (it is
	// connected to another node), a batch opened at once could be stored
	// while the tail is not, leaving a gap below a key group's last index
	// that a restore skips for good.
	s.awaitPrev = true
	floor, floorKnown := s.floor, s.floorKnown
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
		defer cancel()
		waitPrev := func() bool {
			if prev == nil {
				return true
			}
			select {
			case <-prev.done:
				return true
			case <-s.failed:
				return false
			}
		}
		ack, err := b.fp.Close(ctx)
		switch {
		case err == nil && (ack == nil || ack.BatchSize != b.n):
			// INVARIANT: with gap "fail" the server stops a batch at its
			// first failed message; a short count means outputs are missing.
			var got uint64
			if ack != nil {
				got = ack.BatchSize
			}
			err = fmt.Errorf("batch stored %d of %d messages", got, b.n)
			if b.forgotten.Load() || b.troubled {
				// A new stream leader ended the batch at a gap (messages
				// lost with the old one): the rest is not stored.
				err = fmt.Errorf("%w: stream %s: %w", ErrBatchLost, s.stream, err)
			}
		case err == nil:
			d.seq = ack.Sequence
		case batchUnknown(err) || !serverAnswer(err) || b.forgotten.Load() || b.troubled || s.reconnectedSince(b.gen):
			// The server cannot say: it forgot the batch (its batch
			// timeout, a restart), the answer was lost with the
			// connection, or none came in time (a stream leader died
			// with the commit in its queue). The stream can: no later
			// batch of this sink is sent before this one is decided
			// (awaitPrev), so what the stream holds on the batch's last
			// subject tells this batch's outcome alone.
			if !waitPrev() {
				return
			}
			if prev != nil {
				floor, floorKnown = prev.seq, true
			}
			d.seq, err = s.batchStored(ctx, b, floor, floorKnown, err)
		}
		if err != nil {
			s.fail(fmt.Errorf("engine: fast-batch publish: commit: %w", err))
			return
		}
		if !waitPrev() {
			return
		}
		close(d.done)
	}()
	return d.done
}

// batchStored decides, from what the output stream holds, whether a batch
// the server could not commit (cause) is stored whole, and returns the
// stream sequence it found.
//
// A fast batch with gap "fail" is stored as a prefix: the server stores
// its messages one by one in the order they arrive on the one connection,
// and refuses every message after the first it could not take (a gap, an
// error, a batch it no longer knows); messages lost with a connection are
// the last ones sent. So the batch is whole exactly when its last message
// is stored, or a later message of this sink on that subject (sent after
// it). An output's index is unique on its key group's subject; a marker
// repeats its key group's last index, so a marker must also lie above
// every message from before the batch (floor). A batch holds at most one
// marker per key group (markers come right before a checkpoint's fence,
// which ends the batch).
func (s *sink) batchStored(ctx context.Context, b *fastBatch, floor uint64, floorKnown bool, cause error) (uint64, error) {
	if cause == nil {
		cause = errors.New("the connection was lost under the batch")
	}
	lost := func(why string) error {
		return fmt.Errorf("%w: stream %s: %s (%w)", ErrBatchLost, s.stream, why, cause)
	}
	// A stream between leaders answers nothing for a moment: read again
	// until it does, within the commit's bound.
	var m *jetstream.RawStreamMsg
	var err error
	for {
		m, err = s.lastOnSubject(ctx, b.lastSubject)
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || ctx.Err() != nil {
			break
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, lost(fmt.Sprintf("%s holds nothing, the batch's last output %d is missing", b.lastSubject, b.lastIdx))
	}
	if err != nil {
		return 0, lost("cannot read " + b.lastSubject + ": " + err.Error())
	}
	out, perr := strconv.ParseUint(m.Header.Get(HeaderOut), 10, 64)
	if perr != nil {
		return 0, lost(fmt.Sprintf("%s seq %d has no valid %s header", b.lastSubject, m.Sequence, HeaderOut))
	}
	isMarker := m.Header.Get(HeaderMarker) != ""
	switch {
	case out > b.lastIdx:
	case out == b.lastIdx && !b.lastMarker:
	case out == b.lastIdx && isMarker && floorKnown && m.Sequence > floor:
	default:
		return 0, lost(fmt.Sprintf("the last of %s is output %d (seq %d), the batch's last is %d", b.lastSubject, out, m.Sequence, b.lastIdx))
	}
	return m.Sequence, nil
}

// lastOnSubject reads the output stream's last message on subject, one
// try bounded by a few seconds.
func (s *sink) lastOnSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		return nil, fmt.Errorf("read the stream: %w", err)
	}
	return st.GetLastMsgForSubject(ctx, subject)
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Idle commits the open batch when it got nothing since the last call:
// the server forgets a batch inactive for its batch timeout.
func (s *sink) Idle() {
	if b := s.open; b != nil {
		if !b.used {
			s.detachBatch()
			return
		}
		b.used = false
	}
}

// DeadLetter publishes a record the job could not process, with the reason.
// The dead letter always fits the server's limits (deadLetterMessage).
func (s *sink) DeadLetter(h nats.Header, data []byte, stage string, seq uint64, reason error) error {
	m := deadLetterMessage(s.dlq, h, data, stage, seq, reason, s.maxPayload)
	m.Header[HeaderMsgID] = []string{deadLetterID(s.job, stage, seq, h, data)} // within dlSlack
	_, err := s.js.PublishMsgAsync(m, jetstream.WithStallWait(publishTimeout))
	return err
}

// refused handles a publish the server refused because of the message
// itself: an output becomes a dead letter; a dead letter the server still
// refused is published once more with nothing of the record but its
// sequence and reason. Only if that fails too does the job stop.
func (s *sink) refused(m *nats.Msg, cause error) {
	var err error
	if m.Subject != s.dlq {
		seq, _ := strconv.ParseUint(m.Header.Get(HeaderSeq), 10, 64)
		reason := fmt.Errorf("engine: the server refused output %s of %s: %w", m.Header.Get(HeaderOut), m.Subject, cause)
		err = s.DeadLetter(m.Header, m.Data, "sink", seq, reason)
	} else if m.Header.Get(HeaderHeadersDropped) == "" || len(m.Data) > 0 {
		bare := nats.Header{
			HeaderHeadersDropped: {"all"},
			HeaderError:          {truncate(m.Header.Get(HeaderError)+"; the dead letter with the record was refused too: "+cause.Error(), dlErrorMax)},
			HeaderStage:          {m.Header.Get(HeaderStage)},
			HeaderSeq:            {m.Header.Get(HeaderSeq)},
			HeaderTruncated:      {strconv.Itoa(len(m.Data))},
		}
		_, err = s.js.PublishMsgAsync(&nats.Msg{Subject: s.dlq, Header: bare}, jetstream.WithStallWait(publishTimeout))
	} else {
		err = cause
	}
	if err != nil {
		s.fail(fmt.Errorf("engine: dead-letter a message the server refused (%s): %w", m.Subject, err))
	}
}

// Fence returns a channel closed once every publish issued so far is
// persisted (acknowledged; for fast batches, committed).
func (s *sink) Fence() <-chan struct{} {
	if s.delivery == Core {
		// Core publishes sit in the client's buffer until flushed: a
		// checkpoint must not commit past outputs a kill would drop, or
		// they would be neither delivered nor regenerated.
		flushed := make(chan struct{})
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
			defer cancel()
			if err := s.nc.FlushWithContext(ctx); err != nil {
				s.fail(fmt.Errorf("engine: flush core outputs: %w", err))
				return
			}
			close(flushed)
		}()
		return flushed
	}
	var async <-chan struct{}
	if s.js.PublishAsyncPending() == 0 {
		async = closedChan
	} else {
		async = s.js.PublishAsyncComplete()
	}
	if !s.batched {
		return async
	}
	batches := s.detachBatch()
	select {
	case <-async:
		return batches
	default:
	}
	both := make(chan struct{})
	go func() {
		<-async
		select {
		case <-batches:
			close(both)
		case <-s.failed:
		}
	}()
	return both
}

// Flush waits for all pending acknowledgements (and core publishes).
func (s *sink) Flush(ctx context.Context) error {
	select {
	case <-s.Fence():
	case <-s.failed:
		return errors.New("engine: flush outputs: the engine failed")
	case <-ctx.Done():
		return fmt.Errorf("engine: flush outputs: %d unacknowledged: %w", s.js.PublishAsyncPending(), ctx.Err())
	}
	if s.delivery == Core {
		return s.nc.FlushWithContext(ctx)
	}
	return nil
}

// MaxPayload is the server's max_payload.
func (s *sink) MaxPayload() int64 { return s.maxPayload }

var _ Publisher = (*sink)(nil)
