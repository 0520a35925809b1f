package drill

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/state"
)

// Input of the drill's job. The record key travels in the Cairn-Key header,
// so the stream has one subject (JetStream keeps per-subject state: a
// subject per key would cost memory per key).
const (
	inputStream  = "DRILL_IN"
	inputSubject = "drill.in"
	outSubject   = "drill.out"
	jobName      = "drill"
	keyHeader    = "Cairn-Key"
)

// keyOf is the i-th key: keyBytes hex characters derived from i by
// splitmix64, so that keys spread over the key groups. Hex is deliberate:
// Pebble's Snappy blocks barely compress it (no entropy coding) while the
// full checkpoint's zstd halves it — the ratio docs/DESIGN.md records for
// uncompressed data (1.7–2.5), so the drill's full checkpoints are smaller
// than its native files as they are on real data. (A 64-letter alphabet
// would not compress in either format.) The first 16 characters are one
// splitmix64 output, a bijection of i, so keys are distinct.
func keyOf(i int, keyBytes int) []byte {
	const hexdig = "0123456789abcdef"
	b := make([]byte, 0, keyBytes)
	x := uint64(i)
	for len(b) < keyBytes {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		for s := 60; s >= 0 && len(b) < keyBytes; s -= 4 {
			b = append(b, hexdig[(z>>uint(s))&0xf])
		}
	}
	return b
}

// model is what the job's state must be: the count of every key, exactly as
// the builtin count operator keeps it (decimal ASCII).
type model struct {
	keyBytes int
	counts   []uint32
}

// digest is an order-independent digest of a set of (user key, value)
// pairs: two states with the same digest hold the same pairs (up to a
// 2^-64 collision).
//
// In JSON the 64-bit sums are decimal strings: a JavaScript reader (the
// dashboard showing drill.json) would round them as numbers.
type digest struct {
	Entries int64  `json:"entries"`
	Sum     uint64 `json:"sum,string"`
	Xor     uint64 `json:"xor,string"`
}

func (d *digest) add(key, value []byte) {
	var h xxhash.Digest
	h.Reset()
	var n [binary.MaxVarintLen64]byte
	_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(key)))])
	_, _ = h.Write(key)
	_, _ = h.Write(value)
	s := h.Sum64()
	d.Entries++
	d.Sum += s
	d.Xor ^= s
}

func (d digest) String() string {
	return fmt.Sprintf("%d entries, %016x%016x", d.Entries, d.Sum, d.Xor)
}

// digest of the model's state.
func (m *model) digest() digest {
	var d digest
	var v []byte
	for i, c := range m.counts {
		if c == 0 {
			continue
		}
		v = strconv.AppendUint(v[:0], uint64(c), 10)
		d.add(keyOf(i, m.keyBytes), v)
	}
	return d
}

// pairsDigest is the state of the drill's job graph's second sub-topology
// (graphJobYAML): rekey and split turn the n-th count of key k into the key
// k followed by n in decimal, counted once: for every key, one entry per
// count it reached, value "1".
func (m *model) pairsDigest() digest {
	var d digest
	one := []byte("1")
	var k []byte
	for i, c := range m.counts {
		base := keyOf(i, m.keyBytes)
		for n := uint32(1); n <= c; n++ {
			k = strconv.AppendUint(append(k[:0], base...), uint64(n), 10)
			d.add(k, one)
		}
	}
	return d
}

// digestDBs digests the user value state of slot DBs: dirs[i] holds slot i
// of len(dirs) slots. Engine entries (output counters) are not user state
// and are left out.
func digestDBs(dirs []string, keyGroups int) (digest, error) {
	var d digest
	for i, dir := range dirs {
		rng := state.SlotRange(i, len(dirs), keyGroups)
		db, err := state.Open(dir, state.Options{KeyGroups: keyGroups, Range: rng, ReadOnly: true, CacheSize: 8 << 20})
		if err != nil {
			return d, err
		}
		err = db.ScanRaw(rng, func(key, value []byte) error {
			k, err := state.DecodeKey(key)
			if err != nil {
				return err
			}
			if k.Kind != state.KindValue {
				return nil
			}
			// The value header (state/value.go): 0 = no expiry. The drill's
			// job has no TTL, so any other flag is a difference.
			if len(value) == 0 || value[0] != 0 {
				return fmt.Errorf("drill: key %q: unexpected value header %x", k.UserKey, value)
			}
			d.add(k.UserKey, value[1:])
			return nil
		})
		if cerr := db.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return d, fmt.Errorf("drill: digest slot %d (%s): %w", i, dir, err)
		}
	}
	return d, nil
}

// publisher writes the drill's input and keeps the model.
type publisher struct {
	js  jetstream.JetStream
	m   *model
	rnd *rand.Rand
	// lastSeq is the stream sequence of the last acknowledged message.
	lastSeq uint64
	// sent is the number of messages published.
	sent int64
}

// publish sends one message per key index in keys (incrementing each
// key's count in the model) and waits for every acknowledgement.
func (p *publisher) publish(ctx context.Context, keys func(yield func(int) bool), prog *phaseProgress) error {
	var futures []jetstream.PubAckFuture
	flush := func() error {
		select {
		case <-p.js.PublishAsyncComplete():
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Minute):
			return errors.New("drill: input publishes not acknowledged after 2 minutes")
		}
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				p.lastSeq = max(p.lastSeq, ack.Sequence)
			case err := <-f.Err():
				return fmt.Errorf("drill: publish input: %w", err)
			}
		}
		futures = futures[:0]
		return nil
	}
	var err error
	for i := range keys {
		if err = ctx.Err(); err != nil {
			break
		}
		msg := &nats.Msg{Subject: inputSubject, Header: nats.Header{keyHeader: []string{string(keyOf(i, p.m.keyBytes))}}, Data: []byte{'1'}}
		var f jetstream.PubAckFuture
		if f, err = p.js.PublishMsgAsync(msg, jetstream.WithStallWait(time.Minute)); err != nil {
			err = fmt.Errorf("drill: publish input: %w", err)
			break
		}
		futures = append(futures, f)
		p.m.counts[i]++
		p.sent++
		prog.add(1)
		if len(futures) >= 8192 {
			if err = flush(); err != nil {
				break
			}
		}
	}
	if ferr := flush(); err == nil {
		err = ferr
	}
	return err
}

// allKeys yields every key index once.
func allKeys(n int) func(yield func(int) bool) {
	return func(yield func(int) bool) {
		for i := range n {
			if !yield(i) {
				return
			}
		}
	}
}

// someKeys yields k distinct random key indexes of n.
func (p *publisher) someKeys(n, k int) func(yield func(int) bool) {
	idx := p.rnd.Perm(n)[:k]
	return func(yield func(int) bool) {
		for _, i := range idx {
			if !yield(i) {
				return
			}
		}
	}
}
