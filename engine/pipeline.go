package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"cairn/state"
	"cairn/wasm"
)

// pipeline is the single goroutine between the source and the slots: it
// decodes the envelope, runs the stateless stages, computes the watermark,
// routes records to slots by key group and injects barriers. Running on one
// goroutine is what makes the per-key-group order, the watermark and the
// barrier position deterministic functions of the input.
func (e *Engine) pipeline(ctx context.Context, msgs <-chan Message, stop <-chan struct{}) error {
	cfg := &e.cfg
	bound := cfg.MaxOutOfOrder.Milliseconds()
	clk := newClocks(e.startMaxTime, e.startPT, cfg, e.startUpWm, e.startUpIdx)
	perSlot := make([][]rec, len(e.slots))
	round := e.roundSize()
	batch := make([]Message, 0, round)
	recs := make([]wasm.Record, 0, round)
	ing := make([]ingested, 0, round)
	var lastSeq uint64 = cfg.StartSeq - 1
	e.watermark.Store(clk.wm)

	// Idle ticks (processing time on an idle input): see maybeTick.
	var tickC <-chan time.Time
	if e.tickSubject != "" {
		t := time.NewTicker(cfg.ProcessingTimerInterval)
		defer t.Stop()
		tickC = t.C
	}
	lastMsg := time.Now()
	var tickSent time.Time

	var pending *barrierReq // a draining barrier waiting for msgs to empty
	for {
		batch = batch[:0]
		barriers := e.barriers
		if pending != nil {
			if len(msgs) == 0 {
				if err := e.injectBarrier(ctx, *pending, lastSeq, clk); err != nil {
					return err
				}
				pending = nil
				continue
			}
			barriers = nil
		}
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		case req := <-barriers:
			if req.drain {
				pending = &req
				continue
			}
			if err := e.injectBarrier(ctx, req, lastSeq, clk); err != nil {
				return err
			}
			continue
		case <-tickC:
			if len(msgs) == 0 && time.Since(lastMsg) >= cfg.ProcessingTimerInterval && time.Since(tickSent) >= tickRetry {
				if e.maybeTick(ctx, clk.pt) {
					tickSent = time.Now()
				}
			}
			continue
		case m := <-msgs:
			batch = append(batch, m)
		}
		lastMsg = time.Now()
	fill:
		for len(batch) < round {
			select {
			case m := <-msgs:
				batch = append(batch, m)
			default:
				break fill
			}
		}

		// Decode the envelope; malformed messages are dead-lettered. The
		// processing clock follows the messages' JetStream timestamps, ticks
		// included.
		recs, ing = recs[:0], ing[:0]
		ticks := 0
		for _, m := range batch {
			seq := m.Seq
			lastSeq = seq
			if e.foreignTick(m.Subject) {
				// Another job's tick, delivered because the source dropped
				// its filter (natsBroker.Consume): no effect at all, as if
				// the filter had kept it out.
				ticks++
				continue
			}
			if IsFenceSubject(m.Subject) && m.Header.Get(HeaderFence) != "" {
				// A writer's claim of the stream it writes (fence.go): no
				// record, no effect, wherever the stream is read.
				ticks++
				continue
			}
			tsMs := clk.ingest(m.TsNanos)
			if e.tickSubject != "" && m.Subject == e.tickSubject {
				ticks++
				continue
			}
			in := ingested{seq: seq, ts: tsMs, pt: clk.pt, upKG: -1, arrivedNs: m.TsNanos}
			if cfg.UpstreamWatermarks {
				up, side, wm, idx, marker, err := upstreamMeta(&m, cfg.KeyGroups, cfg.sides())
				if err != nil {
					if err := e.deadLetterMsg(m, "source", seq, err); err != nil {
						return err
					}
					continue
				}
				repeat, skipped := clk.upstreamRepeat(up, idx, marker)
				if skipped > 0 {
					e.repartitionSkipped(m.Subject, seq, idx, skipped)
				}
				if repeat {
					// Read before, from this key group's other writer: not
					// a record, and its watermark was carried by the copy
					// read first.
					e.repeatsDropped.Add(1)
					continue
				}
				in.upKG, in.upWm, in.side = up, wm, uint8(side)
				if marker {
					ing = append(ing, in)
					continue
				}
			}
			ing = append(ing, in)
			var key []byte
			var t int64
			var del bool
			var err error
			if cfg.InputTable != "" {
				key, t, del, err = decodeTableEntry(cfg.InputTable, m.Subject, m.Header, m.Data, time.Unix(0, m.TsNanos), cfg.MaxMessageBytes)
			} else {
				key, t, err = decodeEnvelope(m.Subject, m.Header, m.Data, time.Unix(0, m.TsNanos), cfg.MaxMessageBytes)
				del = cfg.UpstreamWatermarks && m.Header.Get(HeaderDelete) != ""
			}
			if err != nil {
				if err := e.deadLetterMsg(m, "source", seq, err); err != nil {
					return err
				}
				continue
			}
			recs = append(recs, wasm.Record{Seq: seq, Key: key, Value: m.Data, Time: t, Side: in.side, Delete: del})
		}
		e.recordsIn.Add(uint64(len(batch) - ticks))
		e.consumedSeq.Store(lastSeq)

		// Stateless stages, in order.
		for i, op := range e.stateless {
			out, err := e.runStateless(ctx, i, op, recs)
			if err != nil {
				return err
			}
			e.stageCounts.batch(i, len(recs), len(out))
			recs = out
		}

		// Route. On a repartition input the upstream watermarks the
		// messages carried apply in sequence order, each before the records
		// from its own message, so every record meets the watermark of its
		// place in the stream whatever the batch boundaries.
		next := 0
		applyUp := func(through uint64) {
			for ; next < len(ing) && ing[next].seq <= through; next++ {
				if ing[next].upKG >= 0 {
					clk.upstream(ing[next].upKG, ing[next].upWm)
				}
			}
		}
		// Each slot's records of the round in one allocation, usually: a
		// quarter above an even share.
		share := len(recs)/len(e.slots) + len(recs)/(4*len(e.slots)) + 1
		for i := range perSlot {
			perSlot[i] = make([]rec, 0, share)
		}
		at := 0 // ing[at] is the message of the record, when records come in order
		for _, r := range recs {
			applyUp(r.Seq)
			for at < len(ing) && ing[at].seq < r.Seq {
				at++
			}
			var in ingested
			if at < len(ing) && ing[at].seq == r.Seq {
				in = ing[at]
			} else {
				in = ingestedAt(ing, r.Seq)
			}
			if err := clk.admit(&r, in, cfg); err != nil {
				if err := e.dlq.DeadLetter(recordHeader(&r), r.Value, "router", r.Seq, err); err != nil {
					return fmt.Errorf("engine: dead-letter seq %d: %w", r.Seq, err)
				}
				e.deadLettered.Add(1)
				e.stageCounts.deadLetter(-1)
				continue
			}
			kg := state.KeyGroup(r.Key, cfg.KeyGroups)
			si := state.SlotOf(kg, len(e.slots), cfg.KeyGroups)
			perSlot[si] = append(perSlot[si], rec{Record: r, kg: kg, wm: clk.wm, pt: in.pt, arrivedNs: in.arrivedNs})
			clk.observe(r.Time, bound)
		}
		applyUp(lastSeq)
		e.watermark.Store(clk.wm)
		e.routed(perSlot)
		for i, s := range e.slots {
			rs := perSlot[i]
			perSlot[i] = nil
			if !e.sendRecords(ctx, s, rs, clk.wm, clk.pt, lastSeq) {
				return nil
			}
		}
	}
}

// roundSize is the most input messages the pipeline takes per round. With
// no stateless stage every record of a round goes to a keyed call, so a
// round holds a full call for every slot (BatchSize records each) rather
// than BatchSize records split over the slots: fewer, fuller calls share
// the per-call costs (the state batch and its commit, one state read per
// distinct key of the call, one output count per key group). A stateless
// stage takes a whole round in one call, which BatchSize bounds.
func (e *Engine) roundSize() int {
	if len(e.stateless) == 0 {
		return e.cfg.BatchSize * len(e.slots)
	}
	return e.cfg.BatchSize
}

// sendRecords sends slot s its records of a round (wm, pt: the clocks
// after the round; through: its last sequence) in items of at most
// BatchSize records. An item before the last ends as if the round had
// ended after its last record: the clocks are that record's, every later
// record carries its own, so the slot sees one more batch boundary, which
// its outputs do not depend on (slot.handle). It returns false when ctx
// ended.
func (e *Engine) sendRecords(ctx context.Context, s *slot, recs []rec, wm, pt int64, through uint64) bool {
	n := e.cfg.BatchSize
	for {
		it := slotItem{recs: recs, wm: wm, pt: pt, through: through}
		if len(recs) > n {
			last := &recs[n-1]
			it = slotItem{recs: recs[:n:n], wm: last.wm, pt: last.pt, through: last.Seq}
		}
		select {
		case s.in <- it:
		case <-ctx.Done():
			return false
		case <-e.failed:
			// A slot that failed reads no more: waiting for it would
			// keep Run from ever ending.
			return false
		}
		if len(recs) <= n {
			return true
		}
		recs = recs[n:]
	}
}

// injectBarrier sends a barrier to every slot after everything routed so far
// and starts the checkpoint's asynchronous part.
func (e *Engine) injectBarrier(ctx context.Context, req barrierReq, lastSeq uint64, clk *clocks) error {
	t0 := time.Now()
	req.sourceSeq = lastSeq
	req.maxTime, req.pt = clk.maxTime, clk.pt
	if clk.up != nil {
		req.upWm = clk.up.snapshot()
		req.upIdx = slices.Clone(clk.upIdx)
	}
	done := make(chan slotBarrierDone, len(e.slots))
	req.done = done
	for _, s := range e.slots {
		r := req
		select {
		case s.in <- slotItem{barrier: &r, through: lastSeq}:
		case <-ctx.Done():
			e.abandonBarrier()
			return nil
		case <-e.failed:
			e.abandonBarrier()
			return nil
		}
	}
	fences := []<-chan struct{}{e.dlq.Fence()}
	go e.completeCheckpoint(ctx, req, t0, done, fences)
	return nil
}

func (e *Engine) deadLetterMsg(m Message, stage string, seq uint64, reason error) error {
	e.deadLettered.Add(1)
	e.stageCounts.deadLetter(-1)
	if err := e.dlq.DeadLetter(m.Header, m.Data, stage, seq, reason); err != nil {
		return fmt.Errorf("engine: dead-letter seq %d: %w", seq, err)
	}
	return nil
}

// runStateless runs stateless stage i over recs. When the batch fails, the
// instance is replaced and the records run one by one; the failing ones are
// dead-lettered.
func (e *Engine) runStateless(ctx context.Context, i int, op Operator, recs []wasm.Record) ([]wasm.Record, error) {
	if len(recs) == 0 {
		return recs, nil
	}
	name := e.cfg.Stages[i].Name
	out, err := op.Process(ctx, &wasm.Batch{Records: recs, Watermark: e.watermark.Load()}, nil)
	if err == nil {
		if res, ok := statelessEmits(recs, out); ok {
			return res, nil
		}
		err = fmt.Errorf("engine: stage %s: emit refers to a record outside the batch", name)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	e.log.Debug("stateless batch failed; running its records one by one", "stage", name, "records", len(recs), "err", err)
	var res []wasm.Record
	if op, err = e.replaceStateless(ctx, i); err != nil {
		return nil, err
	}
	for j := range recs {
		out, err := op.Process(ctx, &wasm.Batch{Records: recs[j : j+1], Watermark: e.watermark.Load()}, nil)
		if err == nil {
			r, ok := statelessEmits(recs[j:j+1], out)
			if ok {
				res = append(res, r...)
				continue
			}
			err = fmt.Errorf("engine: stage %s: emit refers to a record outside the batch", name)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		e.deadLettered.Add(1)
		e.stageCounts.deadLetter(i)
		if derr := e.dlq.DeadLetter(recordHeader(&recs[j]), recs[j].Value, name, recs[j].Seq, err); derr != nil {
			return nil, fmt.Errorf("engine: dead-letter seq %d: %w", recs[j].Seq, derr)
		}
		if op, err = e.replaceStateless(ctx, i); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func (e *Engine) replaceStateless(ctx context.Context, i int) (Operator, error) {
	_ = e.stateless[i].Close(ctx)
	op, err := e.cfg.Stages[i].New(ctx, -1)
	if err != nil {
		return nil, fmt.Errorf("engine: re-instantiate stage %s: %w", e.cfg.Stages[i].Name, err)
	}
	e.stateless[i] = op
	return op, nil
}

func statelessEmits(in []wasm.Record, out *wasm.Output) ([]wasm.Record, bool) {
	res := make([]wasm.Record, 0, len(out.Emits))
	for _, em := range out.Emits {
		if em.Input < 0 || em.Input >= len(in) {
			return nil, false
		}
		res = append(res, wasm.Record{Seq: in[em.Input].Seq, Key: em.Key, Value: em.Value, Time: em.Time, Port: em.Port})
	}
	return res, true
}

// abandonBarrier ends a checkpoint that never reached every slot (the
// engine failed, or its work ended), so that nothing waits for it.
func (e *Engine) abandonBarrier() {
	e.mu.Lock()
	e.mu.inFlight = false
	e.changedLocked()
	e.mu.Unlock()
}

// maxGapsLogged bounds the warnings of repartitionSkipped per engine.
const maxGapsLogged = 20

// repartitionSkipped warns of a repartition message whose Cairn-Out jumps
// over skipped outputs of its upstream key group (clocks.upstreamRepeat):
// the stream does not hold them, so this sub-topology never processes
// them. Logged, not refused: an output the server refused took its index
// and went to the dead-letter stream.
func (e *Engine) repartitionSkipped(subject string, seq, idx, skipped uint64) {
	e.upstreamMissing.Add(skipped)
	if n := e.gapsLogged.Add(1); n <= maxGapsLogged {
		e.log.Warn("repartition input: a message jumps over outputs of its upstream key group that the stream does not hold (lost, or dead-lettered by the writer)",
			"job", e.cfg.Job, "stream", e.cfg.InputStream, "subject", subject, "seq", seq, "out", idx, "skipped", skipped, "warning", fmt.Sprintf("%d of at most %d", n, maxGapsLogged))
	}
}
