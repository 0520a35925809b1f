package engine

// A slot's clocks and timers: the processing clock the keyed stage sees
// (ingestion time, or the wall clock when granted), the clocks a snapshot
// carries, and the firing of due event-time and processing-time timers.

import (
	"context"
	"fmt"
	"math"
	"time"

	"cairn/state"
	"cairn/wasm"
)

// now is the clock of the slot's state TTL: the processing clock.
func (s *slot) now() time.Time { return time.UnixMilli(max(s.procTime(), 0)) }

// procTime is what the keyed stage sees as processing time.
func (s *slot) procTime() int64 {
	if s.wall {
		return s.e.cfg.Now().UnixMilli()
	}
	return s.pt
}

// The clocks a snapshot carries, per key group so that any rescaled slot
// finds them: encoded with the sign bit flipped, so math.MinInt64 (none)
// is the counter's zero.
func encodeClock(t int64) uint64 { return uint64(t) ^ 1<<63 }

func decodeClock(n uint64) int64 { return int64(n ^ 1<<63) }

func (s *slot) readClocks() (maxTime, pt int64, err error) {
	maxTime, pt = math.MinInt64, math.MinInt64
	for kg := s.rng.First; kg <= s.rng.Last; kg++ {
		for _, c := range []struct {
			id  uint8
			dst *int64
		}{{state.CounterMaxEventTime, &maxTime}, {state.CounterProcClock, &pt}} {
			n, err := s.db.Counter(kg, c.id)
			if err != nil {
				return 0, 0, fmt.Errorf("engine: slot %d: clocks of key group %d: %w", s.idx, kg, err)
			}
			*c.dst = max(*c.dst, decodeClock(n))
		}
	}
	return maxTime, pt, nil
}

func (s *slot) writeClocks(maxTime, pt int64, upWm []int64, upIdx []uint64) error {
	clocks := maxTime != s.wroteMaxTime || pt != s.wrotePT
	// upWm and upIdx are side-major over the whole job's key groups;
	// wroteUpWm and wroteUpIdx over the slot's.
	kgs, n := s.e.cfg.KeyGroups, s.rng.Len()
	var up []int // side*n + kg-First of the upstream entries that moved
	for side := 0; upWm != nil && side < s.e.cfg.sides(); side++ {
		for kg := s.rng.First; kg <= s.rng.Last; kg++ {
			i := side*n + kg - s.rng.First
			if upWm[side*kgs+kg] != s.wroteUpWm[i] || upIdx[side*kgs+kg] != s.wroteUpIdx[i] {
				up = append(up, i)
			}
		}
	}
	if !clocks && len(up) == 0 {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	for kg := s.rng.First; clocks && kg <= s.rng.Last; kg++ {
		b.SetCounter(kg, state.CounterMaxEventTime, encodeClock(maxTime))
		b.SetCounter(kg, state.CounterProcClock, encodeClock(pt))
	}
	for _, i := range up {
		side, kg := i/n, s.rng.First+i%n
		b.SetCounter(kg, state.UpstreamWatermarkCounter(side), encodeClock(upWm[side*kgs+kg]))
		b.SetCounter(kg, state.UpstreamIndexCounter(side), upIdx[side*kgs+kg])
	}
	if err := b.Commit(); err != nil {
		return err
	}
	s.wroteMaxTime, s.wrotePT = maxTime, pt
	for _, i := range up {
		side, kg := i/n, s.rng.First+i%n
		s.wroteUpWm[i], s.wroteUpIdx[i] = upWm[side*kgs+kg], upIdx[side*kgs+kg]
	}
	return nil
}

// readUpstream reads the upstream watermark (math.MinInt64: none yet) and
// the highest upstream output index read (0: none) of each side of each
// of the slot's key groups, side-major.
func (s *slot) readUpstream() ([]int64, []uint64, error) {
	n := s.rng.Len()
	wms := make([]int64, s.e.cfg.sides()*n)
	idx := make([]uint64, s.e.cfg.sides()*n)
	for side := range s.e.cfg.sides() {
		for kg := s.rng.First; kg <= s.rng.Last; kg++ {
			v, err := s.db.Counter(kg, state.UpstreamWatermarkCounter(side))
			if err != nil {
				return nil, nil, fmt.Errorf("engine: slot %d: upstream watermark of key group %d (side %d): %w", s.idx, kg, side, err)
			}
			wms[side*n+kg-s.rng.First] = decodeClock(v)
			if idx[side*n+kg-s.rng.First], err = s.db.Counter(kg, state.UpstreamIndexCounter(side)); err != nil {
				return nil, nil, fmt.Errorf("engine: slot %d: upstream output index of key group %d (side %d): %w", s.idx, kg, side, err)
			}
		}
	}
	return wms, idx, nil
}

// markers publishes a watermark marker on each of the slot's key groups of
// a repartition stream.
//
// INVARIANT: every key group gets a marker at every checkpoint, carrying
// the index of the stream's last output of that group — max(the slot's
// count, what the stream held at start), so a restored upstream still
// regenerating outputs repeats the stream's index, never a lower one. Each
// key group's last message is therefore at most one checkpoint old, which
// is what lets the downstream purge the stream (see the cli's graph).
func (s *slot) markers() error {
	for _, l := range s.lanes {
		if !l.target.Repartition {
			continue
		}
		for kg := s.rng.First; kg <= s.rng.Last; kg++ {
			k := kg - s.rng.First
			idx := l.count[k]
			if l.skipTo != nil {
				idx = max(idx, l.skipTo[k])
			}
			var fence uint64
			if l.fenceSeq != nil {
				fence, l.fenceSeq[k] = l.fenceSeq[k], 0
			}
			wm := s.wm
			if s.e.cfg.InputTable != "" {
				wm = math.MaxInt64 // see publishOutput
			} else if l.heldWm != nil && l.count[k] < l.skipTo[k] {
				// Still regenerating what the stream holds: the replay
				// reaches the watermark the stream already carries, so
				// the marker says no less.
				wm = max(wm, l.heldWm[k])
			}
			var src uint64
			if l.lastSrc != nil {
				src = l.lastSrc[k]
			}
			if err := l.sink.Publish(Output{KeyGroup: kg, Index: idx, Wm: wm, Fence: fence, Meta: OutputMeta{Source: src}, Marker: true}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *slot) loadTimers() error {
	s.nextET, s.nextPT = math.MaxInt64, math.MaxInt64
	defer func() { s.ptDue.Store(s.nextPT) }()
	if s.op == nil {
		return nil
	}
	low, err := s.readTimerLows()
	if err != nil {
		return err
	}
	for _, d := range []struct {
		domain wasm.TimerDomain
		dst    *int64
	}{{wasm.EventTime, &s.nextET}, {wasm.ProcessingTime, &s.nextPT}} {
		if l := low[d.domain&1]; l != math.MinInt64 {
			// The checkpoint bounds every key group's timers (timerlow.go):
			// start from the bound, the first firing walks from there.
			s.timerFloor[d.domain&1], *d.dst = l, l
			s.timersSeeded++
			continue
		}
		ts, ok, err := s.db.NextTimerFrom(keyedStageID, uint8(d.domain), s.timerFloor[d.domain&1])
		if err != nil {
			return fmt.Errorf("engine: slot %d: load timers: %w", s.idx, err)
		}
		if ok {
			*d.dst = ts
		}
	}
	return nil
}

// fireTimers hands every timer of the domain due at upTo to the operator.
// outWm is the watermark before the advance that fired them: their outputs
// carry it on a repartition stream (they are not late downstream).
func (s *slot) fireTimers(ctx context.Context, domain wasm.TimerDomain, upTo, outWm int64) error {
	if s.op == nil {
		return nil
	}
	var timers []wasm.Timer
	var kgs []int
	d := domain & 1
	s.timerSet[d] = math.MaxInt64
	next, hasNext, err := s.db.DueTimersFrom(keyedStageID, uint8(domain), s.timerFloor[d], upTo, func(kg int, ts int64, key []byte) error {
		timers = append(timers, wasm.Timer{Key: append([]byte(nil), key...), Time: ts, Domain: domain})
		kgs = append(kgs, kg)
		return nil
	})
	if err != nil {
		return fmt.Errorf("engine: slot %d: due timers: %w", s.idx, err)
	}
	bs := s.e.cfg.BatchSize
	for start := 0; start < len(timers); start += bs {
		end := min(start+bs, len(timers))
		batch := &wasm.Batch{Timers: timers[start:end], Watermark: s.wm, ProcTime: s.procTime()}
		part := kgs[start:end]
		out, err := s.call(ctx, batch)
		if err == nil {
			err = s.apply(batch, out, func(e *wasm.Emit) (int, int64) { return part[e.Timer], outWm }, part)
		}
		if err != nil {
			if !isOperatorFault(err) {
				return err
			}
			// A failed timer handler would fire again forever: its timers are
			// dead-lettered (key, time, reason) and deleted.
			s.e.cfg.Logger.Error("timer handler failed; timers dead-lettered", "stage", s.stage, "slot", s.idx, "timers", end-start, "err", err)
			if err := s.replaceOp(ctx); err != nil {
				return err
			}
			for _, t := range batch.Timers {
				s.e.deadLettered.Add(1)
				h := recordHeader(&wasm.Record{Key: t.Key, Time: t.Time})
				if derr := s.sink.DeadLetter(h, nil, s.stage+"/timer", 0, err); derr != nil {
					return fmt.Errorf("engine: slot %d: dead-letter timer: %w", s.idx, derr)
				}
			}
			b := s.db.NewBatch()
			for i, t := range batch.Timers {
				b.DeleteTimer(keyedStageID, part[i], uint8(t.Domain), t.Time, t.Key)
			}
			err := b.Commit()
			b.Close()
			if err != nil {
				return fmt.Errorf("engine: slot %d: drop failed timers: %w", s.idx, err)
			}
		}
	}
	// Every timer up to upTo was fired and deleted, but for those the
	// handlers registered meanwhile (which lowered the floor as they came).
	if upTo < math.MaxInt64 {
		s.timerFloor[d] = min(max(s.timerFloor[d], upTo+1), s.timerSet[d])
	}
	// The domain's next timer: the walk's first after upTo, or one the
	// handlers registered (the other domain's is unchanged). One a handler
	// deleted may leave it early: that costs a walk that finds nothing.
	if !hasNext {
		next = math.MaxInt64
	}
	next = min(next, s.timerSet[d])
	if domain == wasm.EventTime {
		s.nextET = next
	} else {
		s.nextPT = next
		s.ptDue.Store(next)
	}
	return nil
}
