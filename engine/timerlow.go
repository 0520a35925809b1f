package engine

// The timers' lower bounds a checkpoint carries: per key group and timer
// domain, a counter (state.CounterTimerLowEventTime/ProcTime) no timer of
// the keyed stage in that key group is earlier than. A slot that opens its
// state reads them and, when every key group of its range has one, starts
// from their minimum instead of walking every key group's timers: after an
// online restore that walk is remote round trips through files that span
// every key group, even when the job never set a timer.
//
// INVARIANT: in every state the DB can hold, a key group's counter is at
// most each of its timers. Two writes keep it so: a batch that sets a
// timer earlier than the key group's counter lowers the counter in the
// same batch (apply), and a checkpoint's pause sets it to the slot's next
// timer of the domain, itself a lower bound of all the slot's timers, and
// stamps it with the checkpoint's id. A slot trusts only the bounds
// stamped with the checkpoint it was restored from (Config.
// RestoredCheckpoint): a binary that does not know the bounds sets timers
// without lowering them, but its checkpoints leave the stamp behind. A
// missing or untrusted bound (state written before the counters existed,
// by an older binary, by a tool, or by a checkpoint that wrote nothing, see
// below) is unknown, and the slot walks as before.
//
// A pause writes the bounds and the stamp only when the slot wrote
// something since the last checkpoint (state.DB.Writes): that checkpoint
// flushes and uploads a new file anyway, and the counters ride in it. A
// checkpoint of a slot that wrote nothing writes nothing either, so an idle
// job's checkpoints stay empty; its stamp is then an older checkpoint's,
// and a restore of it walks (only slower). When written, all of a key
// group's bounds are written with its stamp, changed or not: a restored
// slot reads them beside the stamp and the clocks, from the newest file,
// not one by one from older files that an online restore holds remote.

import (
	"fmt"
	"math"

	"cairn/state"
	"cairn/wasm"
)

// readTimerLows reads the counters of the slot's key groups into
// s.timerLow and returns, per domain, their minimum (math.MinInt64: some
// key group has none, or not one the restored checkpoint wrote, so the
// timers are not known without a walk).
func (s *slot) readTimerLows() (low [2]int64, err error) {
	n := s.rng.Len()
	unknown := func() ([2]int64, error) {
		// An untrusted bound counts as unknown in every key group: the
		// next pause that writes rewrites them all, and no batch lowers
		// one until then (nothing trusts the live state's).
		for d := range s.timerLow {
			for i := range s.timerLow[d] {
				s.timerLow[d][i] = math.MinInt64
			}
		}
		return [2]int64{math.MinInt64, math.MinInt64}, nil
	}
	for d := range low {
		low[d] = math.MaxInt64
		s.timerLow[d] = make([]int64, n)
	}
	id := s.e.cfg.RestoredCheckpoint
	if id == 0 {
		return unknown()
	}
	for kg := s.rng.First; kg <= s.rng.Last; kg++ {
		stamp, err := s.db.Counter(kg, state.CounterTimerLowStamp)
		if err != nil {
			return low, fmt.Errorf("engine: slot %d: timer bounds of key group %d: %w", s.idx, kg, err)
		}
		if stamp != id {
			// One key group not known is a walk anyway: the others'
			// bounds need not be read.
			return unknown()
		}
		for d := range low {
			v, err := s.db.Counter(kg, state.TimerLowCounter(uint8(d)))
			if err != nil {
				return low, fmt.Errorf("engine: slot %d: timer bound of key group %d: %w", s.idx, kg, err)
			}
			t := decodeClock(v) // absent: math.MinInt64, unknown
			s.timerLow[d][kg-s.rng.First] = t
			low[d] = min(low[d], t)
		}
	}
	return low, nil
}

// timerLowUpdate is a counter a batch lowered, applied to s.timerLow once
// the batch committed.
type timerLowUpdate struct {
	domain uint8
	i      int // key group - range's first
	t      int64
}

// lowerTimerLows writes into b, for each key group and domain where out
// sets a timer earlier than the key group's counter, the counter lowered
// to the earliest such timer, and returns the updates to apply when b has
// committed (applyTimerLows); until then s.timerLow keeps what the DB
// holds, so a batch discarded leaves nothing behind.
func (s *slot) lowerTimerLows(b *state.Batch, timers []wasm.TimerOp) []timerLowUpdate {
	ups := s.timerLowBuf[:0]
	kgs := s.e.cfg.KeyGroups
	for _, t := range timers {
		if t.Delete {
			continue
		}
		d := uint8(t.Domain) & 1
		i := state.KeyGroup(t.Key, kgs) - s.rng.First
		if t.Time >= s.timerLow[d][i] {
			continue
		}
		j := 0
		for j < len(ups) && (ups[j].domain != d || ups[j].i != i) {
			j++
		}
		if j == len(ups) {
			ups = append(ups, timerLowUpdate{domain: d, i: i, t: t.Time})
		} else {
			ups[j].t = min(ups[j].t, t.Time)
		}
	}
	for _, u := range ups {
		b.SetCounter(s.rng.First+u.i, state.TimerLowCounter(u.domain), encodeClock(u.t))
	}
	s.timerLowBuf = ups
	return ups
}

func (s *slot) applyTimerLows(ups []timerLowUpdate) {
	for _, u := range ups {
		s.timerLow[u.domain][u.i] = u.t
	}
}

// writeTimerLows, in a checkpoint's pause, sets every key group's bounds
// to the slot's next timer of each domain and stamps them with checkpoint
// id, if the slot wrote anything since the last pause that did (see the top
// of this file); otherwise it writes nothing. The checkpoint then carries
// how early the restored slot's timers can be.
func (s *slot) writeTimerLows(id uint64) error {
	if s.op == nil || s.db.Writes() == s.timerLowWrites {
		return nil
	}
	next := [2]int64{s.nextET, s.nextPT}
	b := s.db.NewBatch()
	defer b.Close()
	for kg := s.rng.First; kg <= s.rng.Last; kg++ {
		b.SetCounter(kg, state.CounterTimerLowStamp, id)
		for d := range next {
			b.SetCounter(kg, state.TimerLowCounter(uint8(d)), encodeClock(next[d]))
		}
	}
	if err := b.Commit(); err != nil {
		return err
	}
	for d := range next {
		for i := range s.timerLow[d] {
			s.timerLow[d][i] = next[d]
		}
	}
	s.timerLowWrites = s.db.Writes()
	return nil
}
