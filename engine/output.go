package engine

// Outputs: each emit takes the key group's next output index in the same
// state batch as the state writes that made it; after the commit it is
// published unless the output stream already holds it (a replay after a
// restore), the first publish per key group fenced on the stream's last
// sequence. An output that cannot fit the server's limits is a dead letter
// before it takes an index.

import (
	"fmt"
	"math"

	"cairn/state"
	"cairn/wasm"
)

// setPublished records what lane l's stream already holds of this slot's
// key groups.
func (s *slot) setPublished(l *lane, last map[int]LastOutput) {
	l.skipTo = make([]uint64, s.rng.Len())
	l.fenceSeq = make([]uint64, s.rng.Len())
	l.heldWm = make([]int64, s.rng.Len())
	for i := range l.heldWm {
		l.heldWm[i] = math.MinInt64
	}
	for kg := s.rng.First; kg <= s.rng.Last; kg++ {
		lo, ok := last[kg]
		if !ok {
			continue
		}
		i := kg - s.rng.First
		l.skipTo[i], l.fenceSeq[i] = lo.Index, lo.SubjectSeq
		l.heldWm[i] = lo.Wm
		if l.lastSrc != nil {
			// A table forwarder skips by the KV entry, not by index: the
			// bucket keeps only the newest revisions, so a replay from
			// the checkpoint may regenerate fewer entries than it
			// published. New outputs follow the stream's last index.
			l.lastSrc[i] = lo.Source
			l.count[i] = max(l.count[i], lo.Index)
			l.skipTo[i] = 0
			continue
		}
		// With transactional delivery the state counts outputs of its
		// outbox too, published only now: fewer in the stream is normal.
		if lo.Index < l.count[i] && !s.txn {
			s.e.log.Error("output stream is missing outputs its checkpointed state counts; they cannot be regenerated",
				"stream", l.target.Stream, "key_group", kg, "stream_last_index", lo.Index, "state_count", l.count[i])
		}
	}
}

// anyRepartition reports whether a lane writes a repartition stream.
func (s *slot) anyRepartition() bool {
	for _, l := range s.lanes {
		if l.target.Repartition {
			return true
		}
	}
	return false
}

// stageName names the stage whose outputs the slot publishes.
func (s *slot) stageName() string {
	if s.stage == "" {
		return "sink"
	}
	return s.stage
}

// fits reports whether an output can be published; one that cannot (a key
// over max_key_bytes, over the server's max_payload) is dead-lettered here,
// before it takes an output index, so a replay makes the same decision.
func (s *slot) fits(key, value []byte, t int64, seq uint64) (bool, error) {
	err := checkOutput(key, value, s.e.cfg.MaxKeyBytes, s.sink.MaxPayload(), s.e.cfg.Job)
	if err == nil {
		return true, nil
	}
	s.e.deadLettered.Add(1)
	if derr := s.sink.DeadLetter(recordHeader(&wasm.Record{Key: key, Time: t}), value, s.stageName(), seq, err); derr != nil {
		return false, fmt.Errorf("engine: slot %d: dead-letter seq %d: %w", s.idx, seq, derr)
	}
	return false, nil
}

type pending struct {
	lane  *lane
	meta  OutputMeta // a table entry's (forwarded into a repartition stream)
	kg    int
	idx   uint64
	key   []byte
	value []byte
	time  int64
	wm    int64 // the watermark before the record or timer that made it
}

func (s *slot) nextOutput(_ *state.Batch, l *lane, kg int, key, value []byte, t, wm int64) pending {
	i := kg - s.rng.First
	l.count[i]++
	l.touch(i) // written into b once per batch, by commitAndPublish
	return pending{lane: l, kg: kg, idx: l.count[i], key: key, value: value, time: t, wm: wm}
}

func (s *slot) commitAndPublish(b *state.Batch, outs []pending) error {
	defer func() {
		clear(outs) // drop references to operator output
		s.outBuf = outs[:0]
	}()
	for _, l := range s.lanes {
		l.writeDirtyCounts(b, s.rng.First)
	}
	if s.txn {
		for i := range outs {
			o := &outs[i]
			b.Put(state.SystemStage, o.kg, outboxKey, outboxSub(o.idx), encodeOutboxEntry(o))
		}
		if err := b.Commit(); err != nil {
			return fmt.Errorf("engine: slot %d: %w", s.idx, err)
		}
		s.recordsOut.Add(uint64(len(outs)))
		return nil
	}
	if err := b.Commit(); err != nil {
		// INVARIANT: a failed commit (an fsync error, a full disk) is never
		// retried: the job stops and restarts from its last checkpoint.
		return fmt.Errorf("engine: slot %d: %w", s.idx, err)
	}
	for i := range outs {
		o := &outs[i]
		if err := s.publishOutput(o.lane, o.kg, o.idx, o.key, o.value, o.time, o.wm, o.meta); err != nil {
			return err
		}
	}
	s.recordsOut.Add(uint64(len(outs)))
	return nil
}

// publishOutput publishes output idx of key group kg to lane l, unless its
// stream already holds it (regenerated after a restore: skipped); the
// first publish per key group carries the fence of the stream's last
// sequence.
func (s *slot) publishOutput(l *lane, kg int, idx uint64, key, value []byte, t, wm int64, meta OutputMeta) error {
	k := kg - s.rng.First
	if l.skipTo != nil && idx <= l.skipTo[k] {
		s.skipped.Add(1)
		if f := s.e.cfg.OnReplay; f != nil && l == s.lanes[0] {
			f(kg, idx, key, value, t)
		}
		return nil
	}
	var fence uint64
	if l.fenceSeq != nil {
		fence, l.fenceSeq[k] = l.fenceSeq[k], 0
	}
	if !l.target.Repartition {
		wm = math.MinInt64 // only a repartition stream carries the watermark
	} else if s.e.cfg.InputTable != "" {
		wm = math.MaxInt64 // a table does not hold back what it is joined with
	}
	if err := l.sink.Publish(Output{KeyGroup: kg, Index: idx, Key: key, Value: value, Time: t, Wm: wm, Fence: fence, Meta: meta}); err != nil {
		if messageFault(err) {
			if l.fenceSeq != nil {
				l.fenceSeq[k] = fence // nothing was appended: the next publish carries the fence
			}
			// This one output cannot be published: it is a dead letter.
			s.e.deadLettered.Add(1)
			reason := fmt.Errorf("engine: output %d of key group %d to %s refused: %w", idx, kg, l.target.Stream, err)
			if derr := s.sink.DeadLetter(recordHeader(&wasm.Record{Key: key, Time: t}), value, s.stageName(), 0, reason); derr != nil {
				return fmt.Errorf("engine: slot %d: dead-letter output %d of key group %d: %w", s.idx, idx, kg, derr)
			}
			return nil
		}
		return fmt.Errorf("engine: slot %d: publish output %d of key group %d to %s: %w", s.idx, idx, kg, l.target.Stream, err)
	}
	return nil
}
