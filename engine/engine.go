package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/internal/datadir"
	"cairn/state"
	"cairn/wasm"
)

// Engine runs one job. Create it with New, run it with Run.
type Engine struct {
	cfg    Config
	broker Broker
	log    *slog.Logger
	// slots exist from New on (Stats may be called before Run); each is
	// opened by Run.
	slots []*slot

	stateless []Operator
	dlq       Publisher // the pipeline's dead letters

	failOnce sync.Once
	failErr  error
	failed   chan struct{}

	barriers chan barrierReq // checkpoint triggers to the pipeline
	nextID   atomic.Uint64

	// tickSubject logs processing-time ticks into the input stream ("":
	// none, the keyed stage has the wall clock or the stream refused it).
	tickSubject string
	// The clocks of the restored state (math.MinInt64: none).
	startMaxTime, startPT int64

	recordsIn    atomic.Uint64
	deadLettered atomic.Uint64
	consumedSeq  atomic.Uint64
	watermark    atomic.Int64

	mu struct {
		sync.Mutex
		inFlight    bool              // a checkpoint's async part is running
		checkpoints []CheckpointEvent // completed and failed checkpoints, oldest first
		// changed is closed (and replaced) whenever inFlight or
		// checkpoints change: waiters are signalled, not polling.
		changed chan struct{}
	}
}

// CheckpointEvent reports a finished checkpoint attempt.
type CheckpointEvent struct {
	ID           uint64
	SourceSeq    uint64
	SyncDuration time.Duration // the slowest slot's synchronous part
	Duration     time.Duration // barrier to commit
	Err          error
	Time         time.Time
}

// Stats is a point-in-time view of a running engine.
type Stats struct {
	RecordsIn      uint64
	RecordsOut     uint64
	OutputsSkipped uint64 // regenerated outputs the output stream already held
	DeadLetters    uint64
	ConsumedSeq    uint64 // last input sequence taken from the stream
	ProcessedSeq   uint64 // every slot has processed every record up to here
	Watermark      int64
	StateBytes     []uint64 // per slot
	Checkpoints    int
	LastChkID      uint64
	LastChkSeq     uint64
	FailedChk      int
	LastChkDurMs   int64
	LastChkSyncMs  int64
}

// New validates the configuration of a job on a NATS server. Nothing is
// opened until Run.
func New(cfg Config, nc *nats.Conn) (*Engine, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b, err := newNATSBroker(nc, &cfg)
	if err != nil {
		return nil, err
	}
	return newEngine(cfg, b), nil
}

// NewWithBroker validates the configuration of a job on any Broker.
func NewWithBroker(cfg Config, b Broker) (*Engine, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return newEngine(cfg, b), nil
}

func newEngine(cfg Config, b Broker) *Engine {
	e := &Engine{cfg: cfg, broker: b, log: cfg.Logger, failed: make(chan struct{}), barriers: make(chan barrierReq)}
	e.watermark.Store(math.MinInt64)
	e.mu.changed = make(chan struct{})
	if cfg.Checkpoint != nil {
		e.nextID.Store(1)
	}
	for i := range cfg.Slots {
		e.slots = append(e.slots, &slot{e: e, idx: i, rng: state.SlotRange(i, cfg.Slots, cfg.KeyGroups), in: make(chan slotItem, cfg.QueueDepth)})
	}
	return e
}

// changedLocked wakes everyone waiting for a checkpoint.
func (e *Engine) changedLocked() {
	close(e.mu.changed)
	e.mu.changed = make(chan struct{})
}

// SetNextCheckpointID sets the id of the next checkpoint (the caller knows
// the store's newest). Call before Run.
func (e *Engine) SetNextCheckpointID(id uint64) { e.nextID.Store(id) }

// SetPublishMode sets how JetStream deliveries publish outputs (see
// PublishMode). Call before Run.
func (e *Engine) SetPublishMode(m PublishMode) { e.cfg.Publish = m }

func (e *Engine) fail(err error) {
	e.failOnce.Do(func() {
		e.failErr = err
		close(e.failed)
	})
}

func (e *Engine) localCheckpointDir(id uint64) string {
	return datadir.Checkpoint(datadir.Checkpoints(e.cfg.DataDir), id)
}

// sweepLocal removes the local checkpoint copies whose id drop selects.
//
// At start it drops the ids from the next one on: they are left by a
// process killed between the snapshot and the commit (ids are never reused,
// so such a copy was never committed), and a Pebble checkpoint refuses an
// existing directory: without the sweep, every checkpoint after a restart
// with the same next id would abort. After a commit it drops every older
// id, including the copy a restore kept, so local recovery keeps exactly
// the newest committed checkpoint however many restarts came before.
func (e *Engine) sweepLocal(drop func(id uint64) bool) error {
	root := datadir.Checkpoints(e.cfg.DataDir)
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("engine: local checkpoints: %w", err)
	}
	for _, ent := range entries {
		id, ok := datadir.ParseCheckpointName(ent.Name())
		if !ok || !ent.IsDir() || !drop(id) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, ent.Name())); err != nil {
			return fmt.Errorf("engine: remove local checkpoint copy %s: %w", ent.Name(), err)
		}
	}
	return nil
}

// Stats returns the engine's figures.
func (e *Engine) Stats() Stats {
	st := Stats{
		RecordsIn:   e.recordsIn.Load(),
		DeadLetters: e.deadLettered.Load(),
		ConsumedSeq: e.consumedSeq.Load(),
		Watermark:   e.watermark.Load(),
	}
	st.ProcessedSeq = math.MaxUint64
	for _, s := range e.slots {
		st.RecordsOut += s.recordsOut.Load()
		st.OutputsSkipped += s.skipped.Load()
		st.ProcessedSeq = min(st.ProcessedSeq, s.done.Load())
		st.StateBytes = append(st.StateBytes, s.stateBytes())
	}
	if len(e.slots) == 0 {
		st.ProcessedSeq = 0
	}
	e.mu.Lock()
	for _, c := range e.mu.checkpoints {
		if c.Err != nil {
			st.FailedChk++
			continue
		}
		st.Checkpoints++
		st.LastChkID, st.LastChkSeq = c.ID, c.SourceSeq
		st.LastChkDurMs, st.LastChkSyncMs = c.Duration.Milliseconds(), c.SyncDuration.Milliseconds()
	}
	e.mu.Unlock()
	return st
}

// ConsumedSeq is the last input sequence taken from the stream: a cheap
// accessor for callers in a loop (Stats also measures every slot's DB).
func (e *Engine) ConsumedSeq() uint64 { return e.consumedSeq.Load() }

// Checkpoints returns the history of checkpoint attempts.
func (e *Engine) Checkpoints() []CheckpointEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]CheckpointEvent(nil), e.mu.checkpoints...)
}

// Run opens the slots, consumes the input and processes it until ctx is
// cancelled (a graceful stop: stop consuming, drain, flush, close) or a fatal
// error occurs.
func (e *Engine) Run(ctx context.Context) (err error) {
	defer func() {
		// A stop requested while starting is a graceful stop, not a failure.
		if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
			err = nil
		}
	}()
	cfg := &e.cfg
	if cfg.Checkpoint != nil {
		next := e.nextID.Load()
		if err := e.sweepLocal(func(id uint64) bool { return id >= next }); err != nil {
			return err
		}
	}
	var tick string
	if cfg.needsTicks() {
		tick = TickSubject(cfg.Job)
	}
	batchOK, tick, err := e.broker.Prepare(ctx, tick)
	if err != nil {
		return err
	}
	e.tickSubject = tick
	// Dedupe stays on async publishes: with orbit.go jetstreamext v0.3.2, a
	// batch whose first message is a duplicate (a replay after a restore)
	// gets a PubAck instead of a flow ack, the client waits for the flow ack
	// until its timeout and the batch fails; the replay after the restart
	// would hit it again.
	batched := false
	if cfg.Delivery == Dedupe && cfg.Publish == PublishBatch {
		e.log.Warn("dedupe delivery publishes asynchronously: fast batches fail when their first message is a duplicate", "stream", cfg.OutputStream)
	}
	if (cfg.Delivery == ExactlyOnce || cfg.Delivery == Transactional) && cfg.Publish != PublishAsync {
		if batched = batchOK; !batched {
			e.log.Warn("output stream does not allow batch publishing (allow_batched); publishing outputs asynchronously, one acknowledgement each",
				"stream", cfg.OutputStream)
		}
	}
	if e.dlq, err = e.broker.NewPublisher(false, e.fail, e.failed); err != nil {
		return err
	}
	// Work context: cancelled only on a fatal error or after the drain.
	wctx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()

	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var errs []error
		for _, op := range e.stateless {
			errs = append(errs, op.Close(cctx))
		}
		for _, s := range e.slots {
			errs = append(errs, s.close(cctx))
		}
		if cerr := errors.Join(errs...); cerr != nil && err == nil {
			err = cerr
		}
	}()
	// Exactly-once: the output stream is the truth of what was published.
	// Regenerated outputs up to each key group's last Cairn-Out are skipped,
	// and the first publish per key group is fenced on the subject's last
	// sequence, so a stale writer that appended meanwhile is detected.
	var last map[int]LastOutput
	switch cfg.Delivery {
	case ExactlyOnce, Transactional:
		if last, err = e.broker.LastOutputs(ctx); err != nil {
			return err
		}
	case Dedupe:
		need := time.Minute // a restore's expected duration, by default
		if cfg.Checkpoint != nil {
			need += cfg.Checkpoint.Interval
		}
		e.broker.CheckDuplicateWindow(ctx, need)
	}
	for _, s := range e.slots {
		if s.sink, err = e.broker.NewPublisher(batched, e.fail, e.failed); err != nil {
			return err
		}
		if err := s.open(wctx); err != nil {
			return err
		}
		if cfg.Delivery == Transactional {
			s.txn, s.sealed, s.commits = true, map[uint64][]uint64{}, make(chan uint64, 64)
			s.published = make([]uint64, s.rng.Len())
		}
		s.setPublished(last)
		if s.txn {
			// The outbox of restored state belongs to a committed
			// checkpoint: publish it now (skipping what already landed).
			if err := s.publishOutbox(s.outCount); err != nil {
				return err
			}
		}
		s.done.Store(cfg.StartSeq - 1)
	}
	// Every slot of a checkpoint holds the same clocks; a slot with no
	// state yet holds none.
	e.startMaxTime, e.startPT = math.MinInt64, math.MinInt64
	for _, s := range e.slots {
		e.startMaxTime = max(e.startMaxTime, s.restoredMaxTime)
		e.startPT = max(e.startPT, s.restoredPT)
	}
	for _, s := range e.slots {
		s.pt = max(s.pt, e.startPT)
	}
	for i, st := range cfg.Stages {
		if st.Keyed {
			continue
		}
		op, err := st.New(wctx, -1)
		if err != nil {
			return fmt.Errorf("engine: stage %s (stages[%d]): %w", st.Name, i, err)
		}
		e.stateless = append(e.stateless, op)
	}
	e.consumedSeq.Store(cfg.StartSeq - 1)

	// Source: the input from StartSeq on.
	msgs, stopSourceReader, readerDone, err := e.broker.Consume(wctx, cfg.StartSeq, e.sourceFilters())
	if err != nil {
		return err
	}

	var wg sync.WaitGroup
	slotErrs := make([]error, len(e.slots))
	for i, s := range e.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.run(wctx); err != nil {
				slotErrs[i] = err
				e.fail(err)
			}
		}()
	}
	pipeDone := make(chan error, 1)
	stopSource := make(chan struct{})
	go func() { pipeDone <- e.pipeline(wctx, msgs, stopSource) }()
	if cfg.Checkpoint != nil {
		go e.checkpointLoop(wctx)
	}

	var runErr, finalErr error
	select {
	case <-ctx.Done():
		e.log.Info("stopping: draining", "job", cfg.Job)
	case <-e.failed:
		runErr = e.failErr
	case runErr = <-pipeDone:
		pipeDone <- runErr
	}
	stopSourceReader()
	if runErr == nil && cfg.Checkpoint != nil && ctx.Err() != nil {
		// A graceful stop ends with a checkpoint at the last consumed
		// record, so a restart replays nothing (and, for transactional
		// delivery, publishes everything): once the reader has exited,
		// msgs holds all that will ever be consumed, and the final
		// barrier waits for the pipeline to take it all.
		select {
		case <-readerDone:
			finalErr = e.finalCheckpoint(wctx)
		case <-e.failed:
		}
	}
	close(stopSource)
	if perr := <-pipeDone; perr != nil && runErr == nil {
		runErr = perr
	}
	for _, s := range e.slots {
		close(s.in)
	}
	wg.Wait()
	if runErr == nil {
		runErr = errors.Join(slotErrs...)
	}
	if runErr == nil {
		select {
		case <-e.failed:
			runErr = e.failErr
		default:
		}
	}
	// Flush what was published before closing.
	fctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	flushErrs := []error{e.dlq.Flush(fctx)}
	for _, s := range e.slots {
		flushErrs = append(flushErrs, s.sink.Flush(fctx))
	}
	if ferr := errors.Join(flushErrs...); ferr != nil && runErr == nil {
		runErr = ferr
	}
	cancelWork()
	e.waitCheckpoint()
	return errors.Join(runErr, finalErr)
}

// TriggerCheckpoint asks for a checkpoint now (mode "" = the configured
// one, "full", "incremental", or "savepoint:NAME"). It returns the
// checkpoint's id, or ok=false when one is already in flight.
func (e *Engine) TriggerCheckpoint(ctx context.Context, mode string) (id uint64, ok bool) {
	return e.trigger(ctx, barrierReq{mode: mode})
}

func (e *Engine) trigger(ctx context.Context, req barrierReq) (id uint64, ok bool) {
	e.mu.Lock()
	if e.mu.inFlight {
		e.mu.Unlock()
		return 0, false
	}
	e.mu.inFlight = true
	e.mu.Unlock()
	req.id = e.nextID.Load()
	select {
	case e.barriers <- req:
		return req.id, true
	case <-ctx.Done():
	case <-e.failed:
	}
	e.mu.Lock()
	e.mu.inFlight = false
	e.changedLocked()
	e.mu.Unlock()
	return 0, false
}

// WaitCheckpoint waits until checkpoint id has finished and returns its event.
func (e *Engine) WaitCheckpoint(ctx context.Context, id uint64) (CheckpointEvent, error) {
	for {
		e.mu.Lock()
		for _, c := range e.mu.checkpoints {
			if c.ID == id {
				e.mu.Unlock()
				return c, nil
			}
		}
		changed := e.mu.changed
		e.mu.Unlock()
		select {
		case <-ctx.Done():
			return CheckpointEvent{}, ctx.Err()
		case <-changed:
		}
	}
}

// waitCheckpoint waits until no checkpoint is in flight.
func (e *Engine) waitCheckpoint() {
	for {
		e.mu.Lock()
		busy, changed := e.mu.inFlight, e.mu.changed
		e.mu.Unlock()
		if !busy {
			return
		}
		<-changed
	}
}

func (e *Engine) checkpointLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.Checkpoint.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.TriggerCheckpoint(ctx, "")
		}
	}
}

// completeCheckpoint is the asynchronous part: wait for every slot's local
// snapshot and for the outputs published before the barrier to be
// acknowledged, then hand the snapshots to the committer.
func (e *Engine) completeCheckpoint(ctx context.Context, req barrierReq, t0 time.Time, done <-chan slotBarrierDone, fences []<-chan struct{}) {
	ev := CheckpointEvent{ID: req.id, SourceSeq: req.sourceSeq, Time: time.Now()}
	b := Barrier{ID: req.id, SourceSeq: req.sourceSeq, Mode: req.mode}
	var errs []error
	for range e.slots {
		d := <-done
		if d.err != nil {
			errs = append(errs, d.err)
			continue
		}
		b.Slots = append(b.Slots, d.snap)
		fences = append(fences, d.fence)
		ev.SyncDuration = max(ev.SyncDuration, d.snap.SyncDuration)
	}
	err := errors.Join(errs...)
	cctx, cancel := context.WithTimeout(ctx, e.cfg.Checkpoint.Timeout)
	defer cancel()
	for _, f := range fences {
		if err != nil {
			break
		}
		select {
		case <-f:
		case <-cctx.Done():
			err = fmt.Errorf("engine: checkpoint %d: outputs not acknowledged: %w", req.id, cctx.Err())
		}
	}
	if err == nil {
		sortSnapshots(b.Slots)
		err = e.cfg.Checkpoint.Committer.Commit(cctx, b)
	}
	ev.Duration = time.Since(t0)
	ev.Err = err
	if err == nil {
		// INVARIANT: sent before inFlight is cleared, so a stop that waits
		// for the checkpoint also sees its outputs published.
		for _, s := range e.slots {
			if s.txn {
				select {
				case s.commits <- req.id:
				default: // a later commit publishes these too
				}
			}
		}
	}
	// Local copies are settled before inFlight is cleared, so whoever waits
	// for the checkpoint finds the data dir as it stays.
	if err != nil {
		_ = os.RemoveAll(e.localCheckpointDir(req.id))
	} else if serr := e.sweepLocal(func(id uint64) bool { return id < req.id }); serr != nil {
		// Keep only the newest committed checkpoint's local copy (local recovery).
		e.log.Warn("older local checkpoint copies stay on disk", "job", e.cfg.Job, "err", serr)
	}
	e.mu.Lock()
	// INVARIANT: ids are never reused, not even after a failed attempt: its
	// uploads may still be in the store until the orphan sweep.
	e.nextID.Store(req.id + 1)
	e.mu.checkpoints = append(e.mu.checkpoints, ev)
	if n := len(e.mu.checkpoints); n > 1000 {
		e.mu.checkpoints = e.mu.checkpoints[n-1000:]
	}
	e.mu.inFlight = false
	e.changedLocked()
	e.mu.Unlock()
	if err != nil {
		e.log.Error("checkpoint aborted", "job", e.cfg.Job, "id", req.id, "err", err)
		return
	}
	e.log.Info("checkpoint complete", "job", e.cfg.Job, "id", req.id, "source_seq", req.sourceSeq,
		"sync_ms", ev.SyncDuration.Milliseconds(), "duration_ms", ev.Duration.Milliseconds())
}

func sortSnapshots(s []SlotSnapshot) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].Slot < s[j-1].Slot; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// recordHeader rebuilds the envelope headers of a record for a dead letter.
func recordHeader(r *wasm.Record) nats.Header {
	return nats.Header{
		HeaderKey:  []string{string(r.Key)},
		HeaderTime: []string{strconv.FormatInt(r.Time, 10)},
	}
}

// ErrFinalCheckpoint is returned by Run when a graceful stop could not take
// its final checkpoint: nothing is lost, but a restart replays the input
// from the last committed checkpoint (and, with transactional delivery, the
// outputs since then are published only after that restart).
var ErrFinalCheckpoint = errors.New("engine: the final checkpoint on stop failed")

// finalAttempts is how many times a graceful stop tries its checkpoint.
const finalAttempts = 2

// finalCheckpoint takes a checkpoint and waits for it to finish; a failed
// one (a store that failed beyond its retries) is tried once more, with a
// new id.
func (e *Engine) finalCheckpoint(ctx context.Context) error {
	var last error
	for attempt := 1; attempt <= finalAttempts; attempt++ {
		e.waitCheckpoint()
		var id uint64
		for {
			e.mu.Lock()
			changed := e.mu.changed
			e.mu.Unlock()
			var ok bool
			if id, ok = e.trigger(ctx, barrierReq{mode: e.cfg.Checkpoint.StopMode, drain: true}); ok {
				break
			}
			select {
			case <-e.failed:
				return nil // Run reports the failure
			case <-changed:
			}
		}
		e.waitCheckpoint()
		for _, c := range e.Checkpoints() {
			if c.ID != id {
				continue
			}
			if c.Err == nil {
				e.log.Info("final checkpoint on stop", "job", e.cfg.Job, "id", c.ID, "source_seq", c.SourceSeq)
				return nil
			}
			last = c.Err
			e.log.Warn("final checkpoint on stop failed", "job", e.cfg.Job, "id", c.ID, "attempt", attempt, "of", finalAttempts, "err", c.Err)
		}
		select {
		case <-e.failed:
			return nil
		default:
		}
	}
	if last == nil {
		last = errors.New("no checkpoint event recorded")
	}
	return fmt.Errorf("%w (a restart replays from the last committed checkpoint): %w", ErrFinalCheckpoint, last)
}
