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
	sealed, ok := s.sealed[id]
	if ok {
		for k := range s.sealed {
			if k <= id {
				delete(s.sealed, k)
			}
		}
		if s.latest {
			if err := s.publishLatest(sealed[0], false); err != nil {
				return err
			}
		} else if err := s.publishIndexed(sealed); err != nil {
			return err
		}
	}
	s.outboxThrough.Store(id)
	return nil
}

// seal records, at checkpoint id's barrier, what of the outbox that
// checkpoint covers: the output count per key group, or (emit latest) the
// epoch it closes, one element, after which a new epoch opens.
func (s *slot) seal(id uint64) {
	if s.latest {
		s.sealed[id] = []uint64{s.epoch}
		s.epoch++
		return
	}
	s.sealed[id] = append([]uint64(nil), s.outCount...)
}

// publishOutbox publishes the whole outbox of restored state, which
// belongs to the committed checkpoint it was restored from: the
// index-keyed entries up to counts[kg], then the coalesced ones of every
// epoch. Both kinds are drained whatever the job's emit now is, so a job
// whose emit changed across the restart publishes what its checkpoint
// sealed, and the outbox is empty before the first record.
func (s *slot) publishOutbox(counts []uint64) error {
	if err := s.publishIndexed(counts); err != nil {
		return err
	}
	return s.publishLatest(math.MaxUint64, true)
}

// publishIndexed publishes, per key group, the outbox entries up to
// counts[kg] in output order, then deletes them.
func (s *slot) publishIndexed(counts []uint64) error {
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

// Emit latest (Config.Emit): the outbox keeps, per key group and epoch,
// the latest output of each key, and gives outputs their index only when
// they are published.
//
// An epoch is the stretch of a slot's outputs between two barriers: the
// barrier of checkpoint id seals the open epoch (seal) and opens the next,
// so writes after a barrier never touch what the checkpoint before it
// holds. When checkpoint id commits, its epochs are published in (epoch,
// key) order, the key group's output indexes taken in that order, and
// their entries deleted in the batch that writes the new output count.
// A restore (publishOutbox) finds in the state exactly the epochs not yet
// deleted at its barrier and the count of indexes taken before them, and
// takes the same indexes for the same outputs again: a crash between the
// commit and the publish, or in the middle of it, republishes the same
// messages and the stream's skip-by-index (Cairn-Out) drops the ones that
// landed. A checkpoint that fails leaves its epoch apart: it is published
// with the next commit, not merged with the next epoch.
//
// INVARIANT: epochs are never coalesced with each other, and the drain at
// open empties the outbox before the first record, so the epoch counter
// needs no place in the state.

// outboxLatestKey is the user key, in the system stage, of a key group's
// coalesced outbox; the sub-key is the epoch (8 bytes big-endian) and then
// the output key, so the outbox scans in (epoch, key) order.
var outboxLatestKey = []byte("outbox-latest")

// appendLatestSub appends the sub-key of key's entry in epoch to b.
func appendLatestSub(b []byte, epoch uint64, key []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, epoch)
	return append(b, key...)
}

// appendLatestEntry appends an entry to b: varint time | value (the key
// is in the sub-key).
//
// INVARIANT: this is the coalesced outbox's format 1, beside outbox format
// 1 (encodeOutboxEntry) and versioned the same way, by its user key
// outboxLatestKey: it has no version byte and must never change; fixtures
// in testdata/format-1/outbox-latest. It lives in checkpoints and
// savepoints and is published after a restore.
func appendLatestEntry(b []byte, t int64, value []byte) []byte {
	b = binary.AppendVarint(b, t)
	return append(b, value...)
}

func decodeLatestEntry(b []byte) (value []byte, t int64, err error) {
	t, k := binary.Varint(b)
	if k <= 0 {
		return nil, 0, errors.New("engine: corrupt coalesced outbox entry")
	}
	return b[k:], t, nil
}

// output makes the pending output of an emit: with emit latest it takes no
// index (publishLatest gives it one), else the key group's next.
func (s *slot) output(b *state.Batch, l *lane, kg int, key, value []byte, t, wm int64) pending {
	if s.latest {
		return pending{lane: l, kg: kg, key: key, value: value, time: t, wm: wm}
	}
	return s.nextOutput(b, l, kg, key, value, t, wm)
}

// commit commits a call's batch with its outputs: with emit latest each
// key's last output of the call overwrites the key's entry in the open
// epoch of the outbox (the earlier ones are never written), else
// commitAndPublish.
func (s *slot) commit(b *state.Batch, outs []pending) error {
	if !s.latest {
		return s.commitAndPublish(b, outs)
	}
	defer func() {
		clear(outs) // drop references to operator output
		s.outBuf = outs[:0]
	}()
	if s.latestSeen == nil {
		s.latestSeen = map[string]struct{}{}
	}
	clear(s.latestSeen)
	for i := len(outs) - 1; i >= 0; i-- { // the last output of a key wins
		o := &outs[i]
		if _, dup := s.latestSeen[string(o.key)]; dup {
			continue
		}
		s.latestSeen[string(o.key)] = struct{}{}
		// Put copies both: one buffer holds the sub-key, then the entry.
		buf := appendLatestSub(s.latestBuf[:0], s.epoch, o.key)
		sub := len(buf)
		buf = appendLatestEntry(buf, o.time, o.value)
		s.latestBuf = buf
		b.Put(state.SystemStage, o.kg, outboxLatestKey, buf[:sub], buf[sub:])
	}
	if err := b.Commit(); err != nil {
		// INVARIANT: never retried (see commitAndPublish).
		return fmt.Errorf("engine: slot %d: %w", s.idx, err)
	}
	s.recordsOut.Add(uint64(len(outs)))
	return nil
}

// publishLatest publishes, per key group, the coalesced outbox entries of
// the epochs up to through, in (epoch, key) order, each with the key
// group's next output index, and deletes them in the batch that writes the
// new count.
//
// After the restored outbox is drained (restored; emit latest), a stream
// that holds more outputs of a key group than the state has indexes for
// means the state is older than what was published (a restore of an
// older checkpoint or a savepoint): its replay coalesces at other barriers,
// so its outputs cannot match the stream's by index. They then take
// indexes after the stream's last one instead of being skipped: a consumer
// may see a key's older value again, and then its latest.
func (s *slot) publishLatest(through uint64, restored bool) error {
	l := s.lanes[0]
	b := s.db.NewBatch()
	defer b.Close()
	for kg := s.rng.First; kg <= s.rng.Last; kg++ {
		i := kg - s.rng.First
		n := l.count[i]
		err := s.db.Scan(state.SystemStage, kg, outboxLatestKey, nil, func(sub, v []byte) error {
			if len(sub) < 8 {
				return fmt.Errorf("engine: slot %d: corrupt coalesced outbox sub-key of key group %d", s.idx, kg)
			}
			if binary.BigEndian.Uint64(sub) > through {
				return errStopScan
			}
			value, t, err := decodeLatestEntry(v)
			if err != nil {
				return err
			}
			n++
			// No watermark and no table delete: emit latest is
			// transactional only, never a repartition edge.
			if err := s.publishOutput(l, kg, n, sub[8:], value, t, math.MinInt64, OutputMeta{}); err != nil {
				return err
			}
			b.Delete(state.SystemStage, kg, outboxLatestKey, append([]byte(nil), sub...))
			return nil
		})
		if err != nil && !errors.Is(err, errStopScan) {
			return err
		}
		if restored && s.latest && l.skipTo != nil && l.skipTo[i] > n {
			s.e.log.Warn("output stream holds outputs past the restored state's; emit latest cannot match a replay's outputs to them by index, so they follow the stream's last output",
				"stream", l.target.Stream, "key_group", kg, "stream_last_index", l.skipTo[i], "state_count", n)
			n = l.skipTo[i]
		}
		if n != l.count[i] {
			l.count[i] = n
			l.writeCount(b, kg, n)
		}
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("engine: slot %d: coalesced outbox: %w", s.idx, err)
	}
	return nil
}
