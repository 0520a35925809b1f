package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"cairn/internal/base/datadir"
	"cairn/state"
	"cairn/wasm"
)

// keyedStageID is the state stage id of the job's keyed stage. Stage id 0 is
// the engine's own (output counters). A v1 job has at most one keyed stage.
const keyedStageID = KeyedStageID

// KeyedStageID is the state stage id of the keyed stage of a v1 job.
const KeyedStageID uint8 = 1

// INVARIANT: the timer domains of the ABI are those of the state's key
// layout, so a wasm.TimerDomain converts to a state domain as it is.
var _ = [1]struct{}{}[uint8(wasm.EventTime)-state.DomainEventTime+uint8(wasm.ProcessingTime)-state.DomainProcessingTime]

// rec is a record on its way to a slot.
type rec struct {
	wasm.Record
	kg int
	wm int64 // the watermark in effect when the record was routed
	pt int64 // the processing clock at the record (ingestion time, quantized)
	// arrivedNs is the input message's JetStream timestamp (latency.go).
	arrivedNs int64
}

// slotItem is what the router sends to a slot: records, the watermark after
// them, the input sequence they bring the slot up to, or a barrier.
type slotItem struct {
	recs    []rec
	wm      int64
	pt      int64 // the processing clock after the records (and any tick)
	through uint64
	barrier *barrierReq
}

type barrierReq struct {
	id        uint64
	sourceSeq uint64
	req       CheckpointRequest
	// The pipeline's event and processing clocks at the barrier: each slot
	// writes them into its snapshot, so a restore resumes both exactly.
	maxTime, pt int64
	// upWm: the upstream watermark of every key group of a repartition
	// input (UpstreamWatermarks), as of the barrier; nil otherwise.
	upWm []int64
	// upIdx: the highest output index read of every upstream key group,
	// beside upWm.
	upIdx []uint64
	// drain: the source has stopped; the pipeline injects the barrier only
	// after every message already consumed (the final checkpoint of a
	// graceful stop covers everything taken from the stream).
	drain bool
	done  chan<- slotBarrierDone
}

type slotBarrierDone struct {
	snap  state.SlotSnapshot
	fence <-chan struct{}
	err   error
}

// slot owns one key-group range: one Pebble DB, one keyed operator instance.
type slot struct {
	e     *Engine
	idx   int
	rng   state.KeyGroupRange
	db    *state.DB
	op    Operator // keyed operator; nil when the job has no keyed stage
	stage string
	// lanes are the output targets (Config.targets), lanes[0] the
	// primary; sink is lanes[0]'s publisher, which also takes the slot's
	// dead letters.
	lanes []*lane
	sink  Publisher
	// portLanes maps each output port of the last stage to its lanes.
	portLanes [][]*lane
	in        chan slotItem

	outCount []uint64 // lanes[0].count: the primary output's count per key group (the outbox's)
	nextET   int64    // earliest event-time timer (math.MaxInt64: none)
	nextPT   int64    // earliest processing-time timer
	// timerFloor, per timer domain: no timer of the domain is earlier
	// (math.MinInt64: not known). The scans for timers start there, past
	// the deletions of fired timers (timers.go).
	timerFloor [2]int64
	// timerSet is, per domain, the earliest timer registered since the
	// current firing began.
	timerSet [2]int64
	wm       int64
	// pt is the slot's processing clock (ingestion time, from the
	// records), the clock of ProcTime, processing-time timers and TTL; the
	// keyed stage's wall clock instead when it is granted one (wall).
	pt   int64
	wall bool
	// ptDue mirrors nextPT for the pipeline, which logs a tick when the
	// input is idle and a timer is due by the wall clock.
	ptDue atomic.Int64
	// restored clocks, read from the state at open (math.MinInt64: none).
	restoredMaxTime, restoredPT int64
	// restoredUpWm: the upstream watermarks of this slot's key groups
	// (UpstreamWatermarks), indexed by key group - rng.First.
	restoredUpWm []int64
	wroteUpWm    []int64
	// restoredUpIdx, wroteUpIdx: the same for the highest upstream output
	// indexes read.
	restoredUpIdx []uint64
	wroteUpIdx    []uint64
	// the clocks last written into the state: an idle job's checkpoints
	// write nothing (no new file to upload).
	wroteMaxTime, wrotePT int64

	// Transactional delivery: outputs wait in the outbox (state of the
	// system stage) until the checkpoint after them commits.
	txn bool
	// sealed: checkpoint id -> outCount per key group at its barrier (emit
	// latest: the epoch the barrier closed, one element; see seal).
	sealed map[uint64][]uint64
	// latest: Config.Emit is EmitLatest (outbox.go, "Emit latest"); epoch
	// is then the outbox epoch the outputs go to until the next barrier.
	latest bool
	epoch  uint64
	// latestSeen and latestBuf are commit's scratch (emit latest).
	latestSeen map[string]struct{}
	latestBuf  []byte
	// async tracks the checkpoint parts running beside processing
	// (snapshot); close waits for them. syncCheckpoint makes the next
	// checkpoint whole in the pause after one was raced by a flush.
	async          sync.WaitGroup
	syncCheckpoint atomic.Bool
	published      []uint64    // per key group: outbox entries published so far
	commits        chan uint64 // committed checkpoint ids, from the engine
	// outboxThrough is the newest committed checkpoint whose outbox this
	// slot has published (for waiters outside the slot goroutine).
	outboxThrough atomic.Uint64
	// sweepLimit is the next sweep call's delete limit (sweepExpired).
	sweepLimit int

	// Reused per operator call; nothing keeps them past the call.
	recBuf []wasm.Record
	outBuf []pending
	keyBuf [][]byte // the call's keys, for a prefetch
	// itemPrefetched: the item being handled had its keys' state fetched
	// together (handle), so its calls fetch none of their own.
	itemPrefetched bool

	// statsMu guards db against Stats while open and close change it.
	statsMu sync.RWMutex

	done       atomic.Uint64 // input sequence processed through
	recordsOut atomic.Uint64
	skipped    atomic.Uint64 // outputs not published because the stream had them

	// timerLow is, per domain and key group (- rng.First), the timers'
	// lower bound the DB holds (timerlow.go); timerLowBuf the updates of
	// the batch being built. timersSeeded counts the domains opened from
	// the bounds without a walk; timerLowWrites is the DB's Writes after
	// the bounds were last written.
	timerLow       [2][]int64
	timerLowBuf    []timerLowUpdate
	timersSeeded   int
	timerLowWrites uint64
}

type stateView struct {
	db  *state.DB
	kgs int
}

func (v stateView) Get(key, sub []byte) ([]byte, bool, error) {
	return v.db.Get(keyedStageID, state.KeyGroup(key, v.kgs), key, sub)
}

func (v stateView) Scan(key, prefix []byte, fn func(sub, value []byte) error) error {
	return v.db.Scan(keyedStageID, state.KeyGroup(key, v.kgs), key, prefix, fn)
}

func (s *slot) open(ctx context.Context) error {
	cfg := &s.e.cfg
	ttl := map[uint8]time.Duration{}
	if k := cfg.keyedStage(); k >= 0 && cfg.Stages[k].TTL > 0 {
		ttl[keyedStageID] = cfg.Stages[k].TTL
	}
	s.pt = math.MinInt64
	if k := cfg.keyedStage(); k >= 0 {
		s.wall = cfg.Stages[k].WallClock
	}
	blockCache, valueCache := cfg.slotCaches()
	db, err := state.Open(cfg.SlotDir(s.idx), state.Options{KeyGroups: cfg.KeyGroups, Range: s.rng, TTL: ttl, Now: s.now, CacheSize: blockCache, ValueCacheBytes: valueCache, MemTableSize: cfg.SlotMemTableBytes, NoWAL: true})
	if err != nil {
		return fmt.Errorf("engine: slot %d: %w", s.idx, err)
	}
	s.statsMu.Lock()
	s.db = db
	s.statsMu.Unlock()
	for _, l := range s.lanes {
		l.count = make([]uint64, s.rng.Len())
		if s.e.cfg.InputTable != "" {
			l.lastSrc = make([]uint64, s.rng.Len())
		}
		for kg := s.rng.First; kg <= s.rng.Last; kg++ {
			n, err := l.readCount(db, kg)
			if err != nil {
				return fmt.Errorf("engine: slot %d: output counter of key group %d (%s): %w", s.idx, kg, l.target.Subject, err)
			}
			l.count[kg-s.rng.First] = n
		}
	}
	s.outCount = s.lanes[0].count
	s.latest, s.epoch = cfg.Emit == EmitLatest, 1
	if s.restoredMaxTime, s.restoredPT, err = s.readClocks(); err != nil {
		return err
	}
	s.pt = s.restoredPT
	s.wroteMaxTime, s.wrotePT = s.restoredMaxTime, s.restoredPT
	if s.e.cfg.UpstreamWatermarks {
		if s.restoredUpWm, s.restoredUpIdx, err = s.readUpstream(); err != nil {
			return err
		}
		s.wroteUpWm = slices.Clone(s.restoredUpWm)
		s.wroteUpIdx = slices.Clone(s.restoredUpIdx)
	}
	if k := cfg.keyedStage(); k >= 0 {
		s.stage = cfg.Stages[k].Name
		if s.op, err = cfg.Stages[k].New(ctx, s.idx); err != nil {
			return fmt.Errorf("engine: slot %d: stage %s: %w", s.idx, s.stage, err)
		}
	}
	s.timerFloor = [2]int64{math.MinInt64, math.MinInt64}
	if err := s.loadTimers(); err != nil {
		return err
	}
	s.wm = math.MinInt64
	return nil
}

func (s *slot) close(ctx context.Context) error {
	s.async.Wait() // a checkpoint's part beside processing still uses the DB
	var errs []error
	if s.op != nil {
		errs = append(errs, s.op.Close(ctx))
	}
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if s.db != nil {
		errs = append(errs, s.db.Close())
		s.db = nil
	}
	return errors.Join(errs...)
}

// stateBytes is the approximate size of the slot's state (0 before open
// and after close). Safe from any goroutine.
func (s *slot) stateBytes() uint64 {
	s.statsMu.RLock()
	defer s.statsMu.RUnlock()
	if s.db == nil {
		return 0
	}
	n, _ := s.db.ApproxSize()
	return n
}

// run processes items until the input channel closes.
func (s *slot) run(ctx context.Context) error {
	cfg := &s.e.cfg
	tick := time.NewTicker(cfg.ProcessingTimerInterval)
	defer tick.Stop()
	sweep := time.NewTicker(cfg.TTLSweepInterval)
	defer sweep.Stop()
	for {
		select {
		case it, ok := <-s.in:
			if !ok {
				for {
					select {
					case id := <-s.commits:
						if err := s.publishCommitted(id); err != nil {
							return err
						}
					default:
						return nil
					}
				}
			}
			if err := s.handle(ctx, it); err != nil {
				return err
			}
		case id := <-s.commits:
			if err := s.publishCommitted(id); err != nil {
				return err
			}
		case <-tick.C:
			for _, l := range s.lanes {
				l.sink.Idle()
			}
			// On the ingestion clock, processing-time timers fire from the
			// records and logged ticks (handle); only a stage granted the
			// wall clock fires them from the machine's clock.
			if now := cfg.Now().UnixMilli(); s.wall && now >= s.nextPT {
				if err := s.fireTimers(ctx, wasm.ProcessingTime, now, s.wm); err != nil {
					return err
				}
			}
		case <-sweep.C:
			if s.op != nil && s.db.NeedsSweep() {
				if err := s.sweepExpired(); err != nil {
					return err
				}
			}
		}
	}
}

// sweepExpired removes a slice of the expired state. A call examines at
// most 16 × its limit entries, a few ms on the slot's goroutine, so the
// sweep does not stall records (it did: 10,000 per second scanned up to
// 640k entries, 7 ms per 200k on a quiet VM, BenchmarkSweepWithoutTTL); the limit doubles while calls find that many
// expired entries (up to 16,000) and halves back when they do not, so the
// deletes keep up with the state that expires.
func (s *slot) sweepExpired() error {
	if s.sweepLimit == 0 {
		s.sweepLimit = sweepMinLimit
	}
	n, err := s.db.SweepExpired(s.sweepLimit)
	if err != nil {
		return fmt.Errorf("engine: slot %d: sweep expired state: %w", s.idx, err)
	}
	switch {
	case n >= s.sweepLimit:
		s.sweepLimit = min(2*s.sweepLimit, sweepMaxLimit)
	case n < s.sweepLimit/4:
		s.sweepLimit = max(s.sweepLimit/2, sweepMinLimit)
	}
	return nil
}

// The bounds of one sweep call's deletes (sweepExpired).
const (
	sweepMinLimit = 1000
	sweepMaxLimit = 16000
)

func (s *slot) handle(ctx context.Context, it slotItem) error {
	if it.barrier != nil {
		s.snapshot(it.barrier)
		return nil
	}
	// INVARIANT: a call's records share one processing clock value, and
	// timers fire before the first record whose clock reached them. Both
	// clocks are functions of the input order alone, so every key group's
	// outputs are the same sequence whatever the batch boundaries, the
	// slot count or the restores were.
	//
	// A late record (at or before its watermark, admitted within
	// AllowedLateness) runs in a call of its own: its call's watermark is
	// exactly the one it was routed at, so an operator may compare its time
	// with it (a window that already fired, or was dropped) whatever the
	// batch boundaries, and a timer it sets at or before the watermark
	// fires right after it. Without allowed lateness no record is late.
	//
	// While an online restore's files are still remote, the item's keys'
	// state is fetched together before its first call. A call is only the
	// records of one processing-clock step (10 ms of input), so a replay
	// of a slow input is calls of a few records each, and each call's
	// misses would cost a round trip of their own, one call after another.
	s.itemPrefetched = s.op != nil && len(it.recs) > 1 && s.db.PrefetchPays()
	if s.itemPrefetched {
		s.prefetch(it.recs)
	}
	defer func() { s.itemPrefetched = false }()
	start := 0
	for i := range it.recs {
		r := &it.recs[i]
		etDue := r.wm >= s.nextET
		ptDue := !s.wall && r.pt >= s.nextPT
		afterLate := s.op != nil && i > start && it.recs[i-1].Time <= it.recs[i-1].wm
		late := s.op != nil && r.Time <= r.wm
		if etDue || ptDue || (!s.wall && r.pt != it.recs[start].pt) || late || afterLate {
			if err := s.runRecords(ctx, it.recs[start:i]); err != nil {
				return err
			}
			start = i
			// The late record's call may have set a timer it has passed.
			etDue = etDue || (afterLate && r.wm >= s.nextET)
			if etDue {
				if err := s.fireTimers(ctx, wasm.EventTime, r.wm, s.wm); err != nil {
					return err
				}
			}
			if ptDue {
				s.pt = r.pt
				if err := s.fireTimers(ctx, wasm.ProcessingTime, r.pt, s.wm); err != nil {
					return err
				}
			}
		}
		s.wm = r.wm
	}
	if err := s.runRecords(ctx, it.recs[start:]); err != nil {
		return err
	}
	before := s.wm
	s.wm = it.wm
	if s.wm >= s.nextET {
		if err := s.fireTimers(ctx, wasm.EventTime, s.wm, before); err != nil {
			return err
		}
	}
	if !s.wall {
		s.pt = max(s.pt, it.pt)
		if s.pt >= s.nextPT {
			if err := s.fireTimers(ctx, wasm.ProcessingTime, s.pt, s.wm); err != nil {
				return err
			}
		}
	}
	s.done.Store(it.through)
	return nil
}

// snapshot takes the slot's part of a checkpoint and sends it to b.done.
// Every batch is already committed, so the state at the barrier is what
// the DB holds now. The slot pauses only to write the clocks and to start
// the checkpoint (state.DB.CheckpointBegin): the memtable's flush runs in
// the background while the slot's writes from now on are held on top of
// the DB, and the hard links and the metadata copy run beside processing
// too (docs/RATIONALE.md, "The barrier holds writes instead of
// flushing"); neither grows the pause with the writes or the state size.
// If anything raced them the checkpoint fails (nothing is committed; the
// next one is taken whole in the pause).
func (s *slot) snapshot(b *barrierReq) {
	fail := func(err error) {
		b.done <- slotBarrierDone{err: fmt.Errorf("engine: slot %d: checkpoint %d: %w", s.idx, b.id, err)}
	}
	t0 := time.Now()
	if err := s.writeClocks(b.maxTime, b.pt, b.upWm, b.upIdx); err != nil {
		fail(fmt.Errorf("clocks: %w", err))
		return
	}
	if err := s.writeTimerLows(b.id); err != nil {
		fail(fmt.Errorf("timer bounds: %w", err))
		return
	}
	if s.anyRepartition() {
		if err := s.markers(); err != nil {
			fail(fmt.Errorf("watermark markers: %w", err))
			return
		}
	}
	dir := datadir.SlotIn(s.e.localCheckpointDir(b.id), s.idx)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		fail(err)
		return
	}
	finish, err := s.db.CheckpointBegin()
	if err != nil {
		fail(err)
		return
	}
	if s.txn {
		s.seal(b.id)
	}
	fences := make([]<-chan struct{}, len(s.lanes))
	for i, l := range s.lanes {
		fences[i] = l.sink.Fence()
	}
	fence := mergeFences(fences)
	done := func(pause func() time.Duration) {
		if err := finish(dir); err != nil {
			if errors.Is(err, state.ErrCheckpointRaced) {
				s.syncCheckpoint.Store(true)
			}
			fail(err)
			return
		}
		b.done <- slotBarrierDone{snap: state.SlotSnapshot{Slot: s.idx, Range: s.rng, Dir: dir, SyncDuration: pause()}, fence: fence}
	}
	if s.syncCheckpoint.Swap(false) {
		// After a race, the whole checkpoint is the pause, once.
		done(func() time.Duration { return time.Since(t0) })
		return
	}
	pause := time.Since(t0)
	s.async.Add(1)
	go func() {
		defer s.async.Done()
		done(func() time.Duration { return pause })
	}()
}

// prefetch fetches the state of recs' keys together (state.DB.Prefetch).
func (s *slot) prefetch(recs []rec) {
	keys := s.keyBuf[:0]
	for i := range recs {
		keys = append(keys, recs[i].Key)
	}
	s.db.Prefetch(keyedStageID, keys)
	clear(keys)
	s.keyBuf = keys[:0]
}

// runRecords runs the keyed stage (if any) over records and publishes the outputs.
func (s *slot) runRecords(ctx context.Context, recs []rec) (err error) {
	if len(recs) == 0 {
		return nil
	}
	defer func() {
		if err == nil {
			s.e.latency.observeSince(time.Now().UnixNano(), func(yield func(int64)) {
				for i := range recs {
					yield(recs[i].arrivedNs)
				}
			})
		}
	}()
	if s.op == nil { // no keyed stage: records are the outputs
		b := s.db.NewBatch()
		defer b.Close()
		outs := s.outBuf[:0]
		for i := range recs {
			r := &recs[i]
			if l := s.lanes[0]; l.lastSrc != nil {
				// A table's forwarder: one lane.
				k := r.kg - s.rng.First
				if r.Seq <= l.lastSrc[k] {
					s.skipped.Add(1) // forwarded before the restart
					continue
				}
				l.lastSrc[k] = r.Seq
			}
			if ok, err := s.fits(r.Key, r.Value, r.Time, r.Seq); !ok {
				if err != nil {
					return err
				}
				continue
			}
			if r.Port >= len(s.portLanes) {
				return fmt.Errorf("engine: slot %d: a record of output port %d; the job has %d", s.idx, r.Port, len(s.portLanes))
			}
			for _, l := range s.portLanes[r.Port] {
				outs = append(outs, s.output(b, l, r.kg, r.Key, r.Value, r.Time, r.wm))
				if l.lastSrc != nil {
					outs[len(outs)-1].meta = OutputMeta{Delete: r.Delete, Source: r.Seq}
				}
			}
		}
		return s.commit(b, outs)
	}
	if !s.wall {
		s.pt = recs[0].pt // handle splits calls where the clock moves
	}
	s.recBuf = s.recBuf[:0]
	for i := range recs {
		s.recBuf = append(s.recBuf, recs[i].Record)
	}
	if !s.itemPrefetched && s.db.PrefetchPays() {
		// An online restore's files are still remote, and a miss costs a
		// wait: fetch the call's keys' state together, not one miss after
		// another inside the call.
		s.prefetch(recs)
	}
	batch := &wasm.Batch{Records: s.recBuf, Watermark: recs[0].wm, ProcTime: s.procTime()}
	out, err := s.call(ctx, batch)
	if err == nil {
		err = s.apply(batch, out, func(e *wasm.Emit) (int, int64) { return recs[e.Input].kg, recs[e.Input].wm }, nil)
	}
	if err == nil {
		return nil
	}
	if !isOperatorFault(err) {
		return err
	}
	// The batch failed as a whole and had no effect. Replace the instance and
	// run the records one by one to find and dead-letter the bad ones.
	if err := s.replaceOp(ctx); err != nil {
		return err
	}
	for i := range recs {
		one := &wasm.Batch{Records: batch.Records[i : i+1], Watermark: recs[i].wm, ProcTime: batch.ProcTime}
		out, err := s.call(ctx, one)
		if err == nil {
			kg := recs[i].kg
			wm := recs[i].wm
			err = s.apply(one, out, func(*wasm.Emit) (int, int64) { return kg, wm }, nil)
		}
		if err == nil {
			continue
		}
		if !isOperatorFault(err) {
			return err
		}
		s.e.deadLettered.Add(1)
		if derr := s.sink.DeadLetter(recordHeader(&recs[i].Record), recs[i].Value, s.stage, recs[i].Seq, err); derr != nil {
			return fmt.Errorf("engine: slot %d: dead-letter seq %d: %w", s.idx, recs[i].Seq, derr)
		}
		if err := s.replaceOp(ctx); err != nil {
			return err
		}
	}
	return nil
}

// operatorFault marks an error caused by the operator (a trap, a deadline, a
// bad output): the input is dead-lettered, the engine carries on.
type operatorFault struct{ err error }

func (f *operatorFault) Error() string { return f.err.Error() }
func (f *operatorFault) Unwrap() error { return f.err }

func isOperatorFault(err error) bool {
	var f *operatorFault
	return errors.As(err, &f)
}

func (s *slot) call(ctx context.Context, b *wasm.Batch) (*wasm.Output, error) {
	out, err := s.op.Process(ctx, b, stateView{db: s.db, kgs: s.e.cfg.KeyGroups})
	// The call's reads are done: the iterator they shared must not pin the
	// DB's memtables and files until the next commit (state/point.go).
	s.db.EndReads()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &operatorFault{err}
	}
	return out, nil
}

func (s *slot) replaceOp(ctx context.Context) error {
	_ = s.op.Close(ctx)
	k := s.e.cfg.keyedStage()
	op, err := s.e.cfg.Stages[k].New(ctx, s.idx)
	if err != nil {
		return fmt.Errorf("engine: slot %d: re-instantiate stage %s: %w", s.idx, s.stage, err)
	}
	s.op = op
	return nil
}

// apply writes a call's state and timer ops and output counters in one
// batch, then publishes the outputs. firedKGs, when set, are the key groups of
// the batch's timers, deleted in the same batch.
func (s *slot) apply(in *wasm.Batch, out *wasm.Output, emitAt func(*wasm.Emit) (kg int, wm int64), firedKGs []int) error {
	kgs := s.e.cfg.KeyGroups
	for i := range out.Emits {
		e := &out.Emits[i]
		if (e.Input < 0 || e.Input >= len(in.Records)) && (e.Input != -1 || e.Timer < 0 || e.Timer >= len(in.Timers)) {
			return &operatorFault{fmt.Errorf("engine: stage %s: emit refers to input %d / timer %d of a batch of %d records and %d timers", s.stage, e.Input, e.Timer, len(in.Records), len(in.Timers))}
		}
		if e.Input == -1 && firedKGs == nil {
			return &operatorFault{fmt.Errorf("engine: stage %s: emit refers to a timer in a record batch", s.stage)}
		}
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, op := range out.State {
		kg := state.KeyGroup(op.Key, kgs)
		if !s.rng.Contains(kg) {
			return &operatorFault{fmt.Errorf("engine: stage %s: state write for key %q of key group %d outside slot %d range %v", s.stage, op.Key, kg, s.idx, s.rng)}
		}
		if op.Delete {
			b.Delete(keyedStageID, kg, op.Key, op.Sub)
		} else {
			b.Put(keyedStageID, kg, op.Key, op.Sub, op.Value)
		}
	}
	for i, t := range in.Timers {
		b.DeleteTimer(keyedStageID, firedKGs[i], uint8(t.Domain), t.Time, t.Key)
	}
	for _, t := range out.Timers {
		kg := state.KeyGroup(t.Key, kgs)
		if !s.rng.Contains(kg) {
			return &operatorFault{fmt.Errorf("engine: stage %s: timer for key %q outside slot %d range %v", s.stage, t.Key, s.idx, s.rng)}
		}
		if t.Delete {
			b.DeleteTimer(keyedStageID, kg, uint8(t.Domain), t.Time, t.Key)
			continue
		}
		b.SetTimer(keyedStageID, kg, uint8(t.Domain), t.Time, t.Key)
		if d := t.Domain & 1; t.Time < s.timerFloor[d] {
			s.timerFloor[d] = t.Time
		}
		if d := t.Domain & 1; t.Time < s.timerSet[d] {
			s.timerSet[d] = t.Time
		}
		if t.Domain == wasm.EventTime && t.Time < s.nextET {
			s.nextET = t.Time
		} else if t.Domain == wasm.ProcessingTime && t.Time < s.nextPT {
			s.nextPT = t.Time
			s.ptDue.Store(t.Time)
		}
	}
	// INVARIANT: every check that can fail the call runs before the first
	// output takes an index (s.output): a call that fails after that would
	// leave the key groups' counts advanced past outputs never published,
	// and the record-by-record retry would publish with a gap in Cairn-Out
	// that no replay reproduces.
	for i := range out.Emits {
		if p := out.Emits[i].Port; p >= len(s.portLanes) {
			return &operatorFault{fmt.Errorf("engine: stage %s: emit to output port %d; the stage has %d", s.stage, p, len(s.portLanes))}
		}
	}
	outs := s.outBuf[:0]
	for i := range out.Emits {
		e := &out.Emits[i]
		var seq uint64
		if e.Input >= 0 {
			seq = in.Records[e.Input].Seq
		}
		if ok, err := s.fits(e.Key, e.Value, e.Time, seq); !ok {
			if err != nil {
				return err
			}
			continue
		}
		kg, wm := emitAt(e)
		for _, l := range s.portLanes[e.Port] {
			outs = append(outs, s.output(b, l, kg, e.Key, e.Value, e.Time, wm))
		}
	}
	ups := s.lowerTimerLows(b, out.Timers)
	if err := s.commit(b, outs); err != nil {
		return err
	}
	s.applyTimerLows(ups)
	return nil
}
