package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/state"
	"cairn/wasm"
)

// Engine runs one job. Create it with New, run it with Run.
type Engine struct {
	cfg    Config
	broker Broker
	log    *slog.Logger
	// latency is the record latency histogram (latency.go).
	latency latencyHist
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
	// tick logs a tick on tickSubject (nil when tickSubject is "").
	tick func(context.Context) error
	// The clocks of the restored state (math.MinInt64: none).
	startMaxTime, startPT int64
	// startUpWm, startUpIdx: the restored upstream watermarks and highest
	// output indexes read (UpstreamWatermarks).
	startUpWm  []int64
	startUpIdx []uint64

	// killed: the stop takes no final checkpoint (Kill).
	killed atomic.Bool
	// aborted is cancelled by Abort: the work context and the final
	// flushes end with it.
	aborted     context.Context
	abortCancel context.CancelFunc

	recordsIn    atomic.Uint64
	deadLettered atomic.Uint64
	// repeatsDropped counts repartition messages dropped as a repeat of an
	// output already read (clocks.upstreamRepeat).
	repeatsDropped atomic.Uint64
	// gapsLogged counts the repartition messages logged as jumping over
	// outputs of their upstream key group, upstreamMissing the outputs
	// jumped over (repartitionSkipped).
	gapsLogged      atomic.Uint64
	upstreamMissing atomic.Uint64
	stageCounts     stageCounters // per stage (stagestats.go)
	consumedSeq     atomic.Uint64
	watermark       atomic.Int64

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
	ID        uint64
	SourceSeq uint64
	SyncMax   time.Duration // the slowest slot's synchronous part
	Duration  time.Duration // barrier to commit
	Err       error
	Time      time.Time
}

// Stats is a point-in-time view of a running engine.
type Stats struct {
	RecordsIn        uint64
	RecordsOut       uint64
	OutputsSkipped   uint64 // regenerated outputs the output stream already held
	RepeatsDropped   uint64 // repartition messages dropped as a repeat of an output read (a second writer's copy)
	UpstreamMissing  uint64 // upstream outputs a repartition stream's messages jumped over (lost, or dead-lettered by the writer)
	DeadLetters      uint64
	ConsumedSeq      uint64 // last input sequence taken from the stream
	ProcessedSeq     uint64 // every slot has processed every record up to here
	Watermark        int64
	StateBytes       []uint64 // per slot
	Checkpoints      int
	LastChkID        uint64
	LastChkSeq       uint64
	FailedChk        int
	LastChkDurMs     int64
	LastChkSyncMaxMs int64
	// Latency is the record latency histogram since the start (latency.go).
	Latency Latency
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
	e.aborted, e.abortCancel = context.WithCancel(context.Background())
	e.stageCounts.init(len(cfg.Stages))
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

// Fail stops Run with err, as a fatal error does: no final checkpoint.
// For failures found beside the engine (an online restore's download).
func (e *Engine) Fail(err error) { e.fail(err) }

// Abort ends Run with err as soon as it can: a graceful stop that could not
// finish in its time (the broker unreachable, so the final checkpoint's
// outputs are never acknowledged) gives up its final checkpoint. Every
// wait of the work (the checkpoint in flight, its commit's store and
// JetStream calls, the final flushes) ends with the work context, which
// Abort cancels. What was committed stays as it was: the next start
// restores the last committed checkpoint, as after a kill.
func (e *Engine) Abort(err error) {
	e.killed.Store(true)
	e.fail(err)
	e.abortCancel()
}

// Kill makes the next stop (cancelling Run's context) skip the final
// checkpoint: what the job published stays, its state since the last
// checkpoint is gone, as after a kill -9. For restore-safety checks.
func (e *Engine) Kill() { e.killed.Store(true) }

// Stats returns the engine's figures.
func (e *Engine) Stats() Stats {
	st := Stats{
		RecordsIn:       e.recordsIn.Load(),
		DeadLetters:     e.deadLettered.Load(),
		RepeatsDropped:  e.repeatsDropped.Load(),
		UpstreamMissing: e.upstreamMissing.Load(),
		ConsumedSeq:     e.consumedSeq.Load(),
		Watermark:       e.watermark.Load(),
	}
	st.ProcessedSeq = e.ProcessedSeq()
	for _, s := range e.slots {
		st.RecordsOut += s.recordsOut.Load()
		st.OutputsSkipped += s.skipped.Load()
		st.StateBytes = append(st.StateBytes, s.stateBytes())
	}
	st.Latency = e.latency.snapshot()
	e.mu.Lock()
	for _, c := range e.mu.checkpoints {
		if c.Err != nil {
			st.FailedChk++
			continue
		}
		st.Checkpoints++
		st.LastChkID, st.LastChkSeq = c.ID, c.SourceSeq
		st.LastChkDurMs, st.LastChkSyncMaxMs = c.Duration.Milliseconds(), c.SyncMax.Milliseconds()
	}
	e.mu.Unlock()
	return st
}

// ConsumedSeq is the last input sequence taken from the stream: a cheap
// accessor for callers in a loop (Stats also measures every slot's DB).
func (e *Engine) ConsumedSeq() uint64 { return e.consumedSeq.Load() }

// ProcessedSeq is the sequence every slot has processed the input through:
// Stats' figure without measuring the DBs, for callers in a loop.
func (e *Engine) ProcessedSeq() uint64 {
	if len(e.slots) == 0 {
		return 0
	}
	seq := uint64(math.MaxUint64)
	for _, s := range e.slots {
		seq = min(seq, s.done.Load())
	}
	return seq
}

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
	req := PrepareRequest{Tick: tick}
	if cfg.Delivery == Dedupe {
		req.DuplicateWindow = time.Minute // a restore's expected duration, by default
		if cfg.Checkpoint != nil {
			req.DuplicateWindow += cfg.Checkpoint.Interval
		}
	}
	prep, err := e.broker.Prepare(ctx, req)
	if err != nil {
		return err
	}
	batchOK := prep.Batch
	e.tickSubject, e.tick = prep.TickSubject, prep.Tick
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
	if e.dlq, err = e.broker.NewPublisher(0, false, e.fail, e.failed); err != nil {
		return err
	}
	e.dlq = guardPublisher(e.dlq, e.cfg.PublishGuard)
	// Work context: cancelled only on a fatal error or after the drain.
	wctx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	defer context.AfterFunc(e.aborted, cancelWork)()

	defer func() {
		cctx, cancel := context.WithTimeout(e.aborted, 30*time.Second)
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
	targets := cfg.targets()
	last := make([]map[int]LastOutput, len(targets))
	portTargets := cfg.portTargets()
	for _, s := range e.slots {
		s.lanes = make([]*lane, len(targets))
		for t, tg := range targets {
			l := &lane{target: tg}
			if t > 0 {
				l.counterSub = []byte(tg.Subject)
			}
			if l.sink, err = e.broker.NewPublisher(t, batched, e.fail, e.failed); err != nil {
				return err
			}
			l.sink = guardPublisher(l.sink, e.cfg.PublishGuard)
			s.lanes[t] = l
		}
		s.sink = s.lanes[0].sink
		s.portLanes = make([][]*lane, len(portTargets))
		for p, ts := range portTargets {
			for _, t := range ts {
				s.portLanes[p] = append(s.portLanes[p], s.lanes[t])
			}
		}
	}
	if err := e.openParts(ctx, wctx, last); err != nil {
		if errors.Is(err, errStoppedStarting) {
			return nil
		}
		return err
	}
	for _, s := range e.slots {
		if cfg.Delivery == Transactional {
			s.txn, s.sealed, s.commits = true, map[uint64][]uint64{}, make(chan uint64, 64)
			s.published = make([]uint64, s.rng.Len())
		}
		for t, l := range s.lanes {
			s.setPublished(l, last[t])
		}
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
	if cfg.UpstreamWatermarks {
		e.startUpWm = make([]int64, cfg.sides()*cfg.KeyGroups)
		e.startUpIdx = make([]uint64, cfg.sides()*cfg.KeyGroups)
		for _, s := range e.slots {
			for side := range cfg.sides() {
				copy(e.startUpWm[side*cfg.KeyGroups+s.rng.First:], s.restoredUpWm[side*s.rng.Len():(side+1)*s.rng.Len()])
				copy(e.startUpIdx[side*cfg.KeyGroups+s.rng.First:], s.restoredUpIdx[side*s.rng.Len():(side+1)*s.rng.Len()])
			}
		}
	}
	// Slots resume at the restored watermark (a barrier before the first
	// record still marks the watermark the checkpoint had).
	wm := newClocks(e.startMaxTime, e.startPT, cfg, e.startUpWm, e.startUpIdx).wm
	e.watermark.Store(wm)
	for _, s := range e.slots {
		s.wm = wm
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
	// The interval trigger stops when the stop begins: an interval
	// checkpoint after the final one would still be in flight when the
	// work context ends, and fail for that.
	loopCtx, stopLoop := context.WithCancel(wctx)
	defer stopLoop()
	if cfg.Checkpoint != nil {
		go e.checkpointLoop(loopCtx)
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
	stopLoop()
	stopSourceReader()
	if runErr == nil && cfg.Checkpoint != nil && ctx.Err() != nil && !e.killed.Load() {
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
	fctx, cancel := context.WithTimeout(e.aborted, 30*time.Second)
	defer cancel()
	flushErrs := []error{e.dlq.Flush(fctx)}
	for _, s := range e.slots {
		for _, l := range s.lanes {
			flushErrs = append(flushErrs, l.sink.Flush(fctx))
		}
	}
	if ferr := errors.Join(flushErrs...); ferr != nil && runErr == nil {
		runErr = ferr
	}
	cancelWork()
	e.waitCheckpoint()
	return errors.Join(runErr, finalErr)
}

// errStoppedStarting: the run was stopped while it read the last outputs,
// before it consumed anything; it ends without an error.
var errStoppedStarting = errors.New("engine: stopped while starting")

// openParts opens what a run starts from: every slot (its DB, operator
// instance, output counters and timers: reads that an online restore serves
// from the store until its files are local), every stateless stage's
// instance, and, exactly once, each output stream's last output per key
// group (last, read from the broker with ctx). None of them needs another,
// so they open at once: a restart waits for the slowest, not for the sum,
// on its way to the first output. The slots and the stateless instances
// belong to wctx (an instance ends with the context it was made with).
func (e *Engine) openParts(ctx, wctx context.Context, last []map[int]LastOutput) error {
	cfg := &e.cfg
	var wg sync.WaitGroup
	slotErrs := make([]error, len(e.slots))
	for i, s := range e.slots {
		wg.Go(func() { slotErrs[i] = s.open(wctx) })
	}
	ops := make([]Operator, len(cfg.Stages))
	opErrs := make([]error, len(cfg.Stages))
	for i, st := range cfg.Stages {
		if st.Keyed {
			continue
		}
		wg.Go(func() {
			op, err := st.New(wctx, -1)
			if err != nil {
				opErrs[i] = fmt.Errorf("engine: stage %s (stages[%d]): %w", st.Name, i, err)
				return
			}
			ops[i] = op
		})
	}
	var lastErr error
	if cfg.Delivery == ExactlyOnce || cfg.Delivery == Transactional {
		wg.Go(func() {
			for t := range last {
				if last[t], lastErr = e.broker.LastOutputs(ctx, t); lastErr != nil {
					if ctx.Err() != nil {
						// Stopped before it consumed a record (the read
						// waits out a stream without a leader): the
						// checkpoint it restored is still its state.
						lastErr = errStoppedStarting
					}
					return
				}
			}
		})
	}
	wg.Wait()
	for _, op := range ops {
		if op != nil {
			e.stateless = append(e.stateless, op) // closed by Run, also after a failure here
		}
	}
	// The first failure in the order the parts were opened in before they
	// opened at once: a stateless stage's after the slots', the broker's last.
	for _, err := range slices.Concat(slotErrs, opErrs, []error{lastErr}) {
		if err != nil {
			return err
		}
	}
	return nil
}

// recordHeader rebuilds the envelope headers of a record for a dead letter.
func recordHeader(r *wasm.Record) nats.Header {
	return nats.Header{
		HeaderKey:  []string{string(r.Key)},
		HeaderTime: []string{strconv.FormatInt(r.Time, 10)},
	}
}
