package engine

// The transactional outbox: with delivery transactional, a slot's outputs
// wait in its state (stage state.SystemStage, key outboxKey) until the
// checkpoint after them commits; then they are published in output order,
// skipping what the stream already holds, and removed.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"cairn/state"
)

// outboxKey is the user key, in the system stage, of a key group's outbox;
// the sub-key is the output index (8 bytes big-endian, so the outbox scans
// in output order).
var outboxKey = []byte("outbox")

func outboxSub(idx uint64) []byte { return binary.BigEndian.AppendUint64(nil, idx) }

// encodeOutboxEntry: uvarint len(key) | key | varint time | value.
//
// INVARIANT: this is outbox format 1, part of the state format
// (state.FormatVersion): entries live in checkpoints and savepoints and are
// published after a restore. It has no version byte and must never change;
// a new format is stored under a new user key beside outboxKey, and
// decodeOutboxEntry keeps reading this one (docs/RATIONALE.md, "The outbox
// entry format is versioned by its key"; fixtures in
// testdata/format-1/outbox).
// INVARIANT: transactional delivery has one output (lanes[0]), so an entry
// needs no target.
func encodeOutboxEntry(o *pending) []byte {
	b := make([]byte, 0, len(o.key)+len(o.value)+20)
	b = binary.AppendUvarint(b, uint64(len(o.key)))
	b = append(b, o.key...)
	b = binary.AppendVarint(b, o.time)
	return append(b, o.value...)
}

func decodeOutboxEntry(b []byte) (key, value []byte, t int64, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, 0, errors.New("engine: corrupt outbox entry")
	}
	key, b = b[k:k+int(n)], b[k+int(n):]
	t, k = binary.Varint(b)
	if k <= 0 {
		return nil, nil, 0, errors.New("engine: corrupt outbox entry")
	}
	return key, b[k:], t, nil
}

// publishCommitted publishes the outbox entries sealed by checkpoint id (and
// any earlier one) and removes them from the outbox.
func (s *slot) publishCommitted(id uint64) error {
	counts, ok := s.sealed[id]
	if ok {
		for k := range s.sealed {
			if k <= id {
				delete(s.sealed, k)
			}
		}
		if err := s.publishOutbox(counts); err != nil {
			return err
		}
	}
	s.outboxThrough.Store(id)
	return nil
}

// publishOutbox publishes, per key group, the outbox entries up to
// counts[kg] in output order, then deletes them.
func (s *slot) publishOutbox(counts []uint64) error {
	b := s.db.NewBatch()
	defer b.Close()
	for kg := s.rng.First; kg <= s.rng.Last; kg++ {
		i := kg - s.rng.First
		if counts[i] <= s.published[i] {
			continue
		}
		upTo := counts[i]
		err := s.db.Scan(state.SystemStage, kg, outboxKey, nil, func(sub, v []byte) error {
			if len(sub) != 8 {
				return fmt.Errorf("engine: slot %d: corrupt outbox sub-key of key group %d", s.idx, kg)
			}
			idx := binary.BigEndian.Uint64(sub)
			if idx > upTo {
				return errStopScan
			}
			key, value, t, err := decodeOutboxEntry(v)
			if err != nil {
				return err
			}
			// The outbox keeps no watermark: a repartition edge is
			// never transactional (see Config.Repartition), so it
			// carries no table delete either.
			if err := s.publishOutput(s.lanes[0], kg, idx, key, value, t, math.MinInt64, OutputMeta{}); err != nil {
				return err
			}
			b.Delete(state.SystemStage, kg, outboxKey, append([]byte(nil), sub...))
			return nil
		})
		if err != nil && !errors.Is(err, errStopScan) {
			return err
		}
		s.published[i] = upTo
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("engine: slot %d: outbox: %w", s.idx, err)
	}
	return nil
}

var errStopScan = errors.New("stop scan")
