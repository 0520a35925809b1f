package state

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Batch collects writes to a DB that commit atomically. Write methods do not
// return errors: the first error (a key group outside the DB's range, a
// malformed raw key) is kept and returned by Commit, which then writes
// nothing. A Batch is not safe for concurrent use.
type Batch struct {
	d   *DB
	b   *pebble.Batch
	err error
	// buf is scratch space for encoding keys.
	buf []byte
	// pend is the value-state writes for the DB's value cache, applied
	// when the batch commits (cache.go).
	pend []cacheOp
}

// NewBatch returns an empty batch for d.
func (d *DB) NewBatch() *Batch {
	return &Batch{d: d, b: d.db.NewBatch()}
}

func (b *Batch) fail(op string, kg int) bool {
	if b.err != nil {
		return true
	}
	if err := b.d.checkRange(op, kg); err != nil {
		b.err = err
		return true
	}
	return false
}

func (b *Batch) setErr(err error) {
	if err != nil && b.err == nil {
		b.err = err
	}
}

// Put sets the value state of (userKey, sub) of a stage. When the stage has a
// TTL, the entry expires TTL after now.
func (b *Batch) Put(stage uint8, kg int, userKey, sub, value []byte) {
	if b.fail("put", kg) {
		return
	}
	ttl := b.d.ttlMs[stage]
	keyLen := headerLen + uvarintLen(uint64(len(userKey))) + len(userKey) + len(sub)
	hl := valueHeaderLen(ttl > 0)
	op := b.b.SetDeferred(keyLen, hl+len(value))
	k := appendValuePrefix(op.Key[:0], kg, stage, userKey)
	_ = append(k, sub...) // fills op.Key in place: exactly keyLen bytes
	var expiry int64
	if ttl > 0 {
		expiry = b.d.nowMs() + ttl
	}
	putValueHeader(op.Value, ttl > 0, expiry)
	copy(op.Value[hl:], value)
	if b.d.cache != nil {
		b.pend = append(b.pend, cacheOp{key: string(op.Key), raw: append([]byte(nil), op.Value...)})
	}
	b.setErr(op.Finish())
}

// Delete removes the value state of (userKey, sub) of a stage.
func (b *Batch) Delete(stage uint8, kg int, userKey, sub []byte) {
	if b.fail("delete", kg) {
		return
	}
	b.buf = append(appendValuePrefix(b.buf[:0], kg, stage, userKey), sub...)
	if b.d.cache != nil {
		b.pend = append(b.pend, cacheOp{key: string(b.buf)})
	}
	b.setErr(b.b.Delete(b.buf, nil))
}

func (b *Batch) timerKey(kg int, stage, domain uint8, ts int64, userKey []byte) []byte {
	b.buf = appendTimer(b.buf[:0], kg, stage, domain, ts, userKey)
	return b.buf
}

func appendTimer(dst []byte, kg int, stage, domain uint8, ts int64, userKey []byte) []byte {
	dst = appendTimerPrefix(dst, kg, stage, domain)
	dst = appendTime(dst, ts)
	dst = binary.AppendUvarint(dst, uint64(len(userKey)))
	return append(dst, userKey...)
}

// SetTimer registers a timer for userKey at ts in a domain. Registering the
// same (userKey, ts, domain) again is a no-op.
func (b *Batch) SetTimer(stage uint8, kg int, domain uint8, ts int64, userKey []byte) {
	if b.fail("set timer", kg) {
		return
	}
	if domain > DomainProcessingTime {
		b.err = fmt.Errorf("state: set timer: unknown domain %d", domain)
		return
	}
	b.d.timers.lower(stage, domain, kg-b.d.opts.Range.First, ts)
	b.setErr(b.b.Set(b.timerKey(kg, stage, domain, ts, userKey), nil, nil))
}

// DeleteTimer removes a timer; removing an absent one is a no-op.
func (b *Batch) DeleteTimer(stage uint8, kg int, domain uint8, ts int64, userKey []byte) {
	if b.fail("delete timer", kg) {
		return
	}
	b.setErr(b.b.Delete(b.timerKey(kg, stage, domain, ts, userKey), nil))
}

// SetCounter sets engine counter id of key group kg to n.
func (b *Batch) SetCounter(kg int, id uint8, n uint64) {
	if b.fail("set counter", kg) {
		return
	}
	b.buf = append(appendHeader(b.buf[:0], kg, SystemStage, KindCounter), id)
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], n)
	b.setErr(b.b.Set(b.buf, v[:], nil))
}

// PutRaw writes a key and value in their stored encoding, as produced by
// ScanRaw; it is how a restore writes entries back unchanged. The key must
// decode and lie in the DB's range, and a value-state value must carry a valid
// header.
func (b *Batch) PutRaw(key, value []byte) {
	if b.err != nil {
		return
	}
	if err := checkRaw(key, value); err != nil {
		b.err = fmt.Errorf("state: put raw: %w", err)
		return
	}
	if b.fail("put raw", int(binary.BigEndian.Uint16(key))) {
		return
	}
	if b.d.cache != nil && Kind(key[3]) == KindValue {
		b.pend = append(b.pend, cacheOp{key: string(key), raw: append([]byte(nil), value...)})
	}
	if Kind(key[3]) == KindTimer {
		k, _ := DecodeKey(key) // checkRaw decoded it
		b.d.timers.lower(k.Stage, k.Domain, k.KeyGroup-b.d.opts.Range.First, k.Time)
	}
	b.setErr(b.b.Set(key, value, nil))
}

// checkRaw validates a stored key/value pair.
func checkRaw(key, value []byte) error {
	k, err := DecodeKey(key)
	if err != nil {
		return err
	}
	switch k.Kind {
	case KindValue:
		if _, _, _, err := decodeValue(value); err != nil {
			return fmt.Errorf("key %x: %w", key, err)
		}
	case KindCounter:
		if len(value) != 8 {
			return fmt.Errorf("key %x: counter of %d bytes: %w", key, len(value), ErrCorruptValue)
		}
	case KindTimer:
		if len(value) != 0 {
			return fmt.Errorf("key %x: timer with a value: %w", key, ErrCorruptValue)
		}
	}
	return nil
}

// Len is the number of writes in the batch.
func (b *Batch) Len() int { return int(b.b.Count()) }

// Reset empties the batch, and clears its error, for reuse.
func (b *Batch) Reset() {
	b.b.Reset()
	b.err = nil
	b.pend = b.pend[:0]
}

// Close releases the batch without committing what it holds.
func (b *Batch) Close() error {
	if err := b.b.Close(); err != nil {
		return fmt.Errorf("state: close batch: %w", err)
	}
	return nil
}

// Commit writes the batch atomically. It is written to the WAL without an
// fsync (pebble.NoSync): durability comes from checkpoints, and the WAL
// protects against a process crash. Between a checkpoint's barrier and the
// moment it captured its files the batch is held on top of the DB instead
// (hold.go): reads see it, the DB gets it at a later Commit. After Commit,
// Reset the batch to reuse it.
func (b *Batch) Commit() error {
	pend := b.pend
	b.pend = b.pend[:0] // a failed commit wrote nothing: the cache stays
	if b.err != nil {
		return fmt.Errorf("state: commit %s: %w", b.d.dir, b.err)
	}
	if err := b.d.commit(b.b); err != nil {
		return fmt.Errorf("state: commit %s: %w", b.d.dir, err)
	}
	if c := b.d.cache; c != nil {
		for _, op := range pend {
			c.put(op.key, op.raw)
		}
	}
	return nil
}
