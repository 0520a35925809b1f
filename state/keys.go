package state

import (
	"encoding/binary"
	"fmt"
)

// Pebble key layout. Every key in a slot's Pebble DB is
//
//	key group (2 bytes, big-endian) | stage id (1 byte) | kind (1 byte) | rest
//
// and rest depends on kind:
//
//	KindValue   (1): uvarint(len(userKey)) | userKey | subKey
//	KindTimer   (2): domain (1 byte) | timestamp (8 bytes) | uvarint(len(userKey)) | userKey
//	KindCounter (3): counter id (1 byte)                      (stage 0 only)
//
// The timer timestamp is the int64 as big-endian with the sign bit flipped, so
// byte order is numeric order and timers sort by time within (kg, stage,
// domain). A timer's value is empty; registering the same (key, time, domain)
// twice writes the same Pebble key, so it is idempotent. A counter's value is
// a uint64, big-endian. A value-state entry's value carries a header, see
// value.go.
//
// Because the key group leads, the keys of a key-group range form one
// contiguous span (KeyGroupSpan), which is what rescaled restores clip by.
// Stage id 0 is reserved for the engine ("system" stage); user stages are
// 1..255.
//
// INVARIANT: this layout, the kind and domain numbers, and the value header are
// an on-disk format shared with checkpoints. They must never change without
// bumping FormatVersion.

// FormatVersion is the version of the key and value layout described above.
// Checkpoint manifests record it; a change to the layout must bump it.
const FormatVersion = 1

// Kind is the kind byte of a Pebble key: what the entry is.
type Kind uint8

// Kinds. INVARIANT: the numbers are part of the on-disk format.
const (
	// KindValue is an operator's value state for (user key, sub-key).
	KindValue Kind = 1
	// KindTimer is a registered timer; the value is empty.
	KindTimer Kind = 2
	// KindCounter is an engine counter of a key group (stage 0 only); the
	// value is a big-endian uint64.
	KindCounter Kind = 3
)

func (k Kind) String() string {
	switch k {
	case KindValue:
		return "value"
	case KindTimer:
		return "timer"
	case KindCounter:
		return "counter"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Timer domains. INVARIANT: the numbers are part of the on-disk format.
const (
	// DomainEventTime is the domain of timers that fire on the watermark.
	DomainEventTime uint8 = 0
	// DomainProcessingTime is the domain of timers that fire on the wall clock.
	DomainProcessingTime uint8 = 1
)

// SystemStage is the stage id reserved for the engine.
const SystemStage uint8 = 0

// Counter ids of the engine's per-key-group counters (stage SystemStage).
// INVARIANT: part of the state format; an id is never reused.
const (
	// CounterOutputs is the number of outputs of the key group so far (the
	// last output's Cairn-Out index).
	CounterOutputs uint8 = 1
	// CounterMaxEventTime is the largest event time the job routed, as of
	// the last checkpoint (the watermark follows from it).
	CounterMaxEventTime uint8 = 2
	// CounterProcClock is the processing clock (ingestion time) as of the
	// last checkpoint.
	CounterProcClock uint8 = 3
	// CounterUpstreamWatermark: on a sub-topology fed by a repartition
	// stream, the last watermark key group kg of the upstream carried, as
	// of the last checkpoint (kept in the downstream's key group kg).
	CounterUpstreamWatermark uint8 = 4
	// CounterUpstreamWatermarkSide1 is CounterUpstreamWatermark for the
	// second writer (side 1) of a repartition stream a two-input stage
	// reads; CounterUpstreamWatermark holds side 0's.
	CounterUpstreamWatermarkSide1 uint8 = 5
	// CounterTimerLowEventTime is a lower bound on the key group's
	// event-time timers of the keyed stage (encoded as the clocks are:
	// math.MaxInt64 none, absent or math.MinInt64 unknown). INVARIANT:
	// every batch that sets an earlier timer in the key group lowers it in
	// the same batch, so any state that holds the timer holds the bound.
	CounterTimerLowEventTime uint8 = 6
	// CounterTimerLowProcTime is CounterTimerLowEventTime for the
	// processing-time timers.
	CounterTimerLowProcTime uint8 = 7
	// CounterTimerLowStamp is the id of the checkpoint whose pause wrote
	// the key group's timer bounds last (a pause writes them only when the
	// slot wrote something since the last checkpoint). The bounds are
	// trusted only in the state of that checkpoint: a binary that does not
	// know them leaves them behind stale while it sets timers, but also
	// leaves this stamp behind its own checkpoints' ids.
	CounterTimerLowStamp uint8 = 8
	// CounterUpstreamIndex: on a sub-topology fed by a repartition stream,
	// the highest Cairn-Out index of upstream key group kg it has read, as
	// of the last checkpoint (kept in the downstream's key group kg): a
	// message repeating an index at or below it is a second writer's copy
	// and is dropped.
	CounterUpstreamIndex uint8 = 9
	// CounterUpstreamIndexSide1 is CounterUpstreamIndex for side 1.
	CounterUpstreamIndexSide1 uint8 = 10
)

// TimerLowCounter is the counter id of the lower bound on domain's timers.
func TimerLowCounter(domain uint8) uint8 {
	if domain&1 == DomainEventTime {
		return CounterTimerLowEventTime
	}
	return CounterTimerLowProcTime
}

// UpstreamIndexCounter is the counter id of side's highest upstream
// output index read.
func UpstreamIndexCounter(side int) uint8 {
	if side == 0 {
		return CounterUpstreamIndex
	}
	return CounterUpstreamIndexSide1
}

// UpstreamWatermarkCounter is the counter id of side's upstream watermark.
func UpstreamWatermarkCounter(side int) uint8 {
	if side == 0 {
		return CounterUpstreamWatermark
	}
	return CounterUpstreamWatermarkSide1
}

const (
	headerLen    = 4 // key group (2) + stage (1) + kind (1)
	timerFixed   = 1 + 8
	counterRest  = 1
	signBit      = uint64(1) << 63
	maxKeyGroup  = MaxKeyGroups - 1
	maxUvarintSz = binary.MaxVarintLen64
)

// Key is a decoded Pebble key. Its slices alias the decoded bytes.
type Key struct {
	KeyGroup int
	Stage    uint8
	Kind     Kind
	// UserKey is the record key (KindValue and KindTimer).
	UserKey []byte
	// Sub is the operator's sub-key (KindValue).
	Sub []byte
	// Domain is the timer domain (KindTimer).
	Domain uint8
	// Time is the timer timestamp (KindTimer).
	Time int64
	// Counter is the counter id (KindCounter).
	Counter uint8
}

func checkKG(kg int) {
	if kg < 0 || kg > maxKeyGroup {
		panic(fmt.Sprintf("state: key group %d out of range [0, %d]", kg, maxKeyGroup))
	}
}

func appendHeader(b []byte, kg int, stage uint8, kind Kind) []byte {
	checkKG(kg)
	return append(b, byte(kg>>8), byte(kg), stage, byte(kind))
}

func appendTime(b []byte, ts int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(ts)^signBit)
}

// valuePrefix is the key prefix of every sub-key of userKey.
func appendValuePrefix(b []byte, kg int, stage uint8, userKey []byte) []byte {
	b = appendHeader(b, kg, stage, KindValue)
	b = binary.AppendUvarint(b, uint64(len(userKey)))
	return append(b, userKey...)
}

// ValueKey encodes the key of the value state of (userKey, sub) of a stage in
// key group kg. kg must be in [0, MaxKeyGroups); it panics otherwise.
func ValueKey(kg int, stage uint8, userKey, sub []byte) []byte {
	b := make([]byte, 0, headerLen+maxUvarintSz+len(userKey)+len(sub))
	b = appendValuePrefix(b, kg, stage, userKey)
	return append(b, sub...)
}

// appendTimerPrefix is the key prefix of all timers of (kg, stage, domain).
func appendTimerPrefix(b []byte, kg int, stage, domain uint8) []byte {
	b = appendHeader(b, kg, stage, KindTimer)
	return append(b, domain)
}

// TimerKey encodes the key of a timer. kg must be in [0, MaxKeyGroups); it
// panics otherwise.
func TimerKey(kg int, stage uint8, domain uint8, ts int64, userKey []byte) []byte {
	return appendTimer(make([]byte, 0, headerLen+timerFixed+maxUvarintSz+len(userKey)), kg, stage, domain, ts, userKey)
}

// CounterKey encodes the key of engine counter id of key group kg (stage 0).
// kg must be in [0, MaxKeyGroups); it panics otherwise.
func CounterKey(kg int, id uint8) []byte {
	b := make([]byte, 0, headerLen+counterRest)
	b = appendHeader(b, kg, SystemStage, KindCounter)
	return append(b, id)
}

// kgKey is the 2-byte key-group prefix; kg may be MaxKeyGroups (the end of
// the key space).
func kgKey(kg int) []byte { return []byte{byte(kg >> 8), byte(kg)} }

// KeyGroupSpan is the Pebble span [start, end) that holds exactly the keys of
// the key groups of r. An empty range yields start == end.
func KeyGroupSpan(r KeyGroupRange) (start, end []byte) {
	if r.Len() == 0 {
		return kgKey(r.First), kgKey(r.First)
	}
	return kgKey(r.First), kgKey(r.Last + 1)
}

// prefixSuccessor is the smallest key greater than every key with prefix p,
// or nil if there is none (p is all 0xff).
func prefixSuccessor(p []byte) []byte {
	s := append([]byte(nil), p...)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] != 0xff {
			s[i]++
			return s[:i+1]
		}
	}
	return nil
}

func corruptKey(b []byte, why string) error {
	return fmt.Errorf("decode key %x: %s: %w", b, why, ErrCorruptKey)
}

// DecodeKey decodes a Pebble key. It fails with ErrCorruptKey when b is not a
// well-formed key of the layout above. The slices of the result alias b.
func DecodeKey(b []byte) (Key, error) {
	if len(b) < headerLen {
		return Key{}, corruptKey(b, "short header")
	}
	k := Key{
		KeyGroup: int(binary.BigEndian.Uint16(b)),
		Stage:    b[2],
		Kind:     Kind(b[3]),
	}
	if k.KeyGroup > maxKeyGroup {
		return Key{}, corruptKey(b, "key group out of range")
	}
	rest := b[headerLen:]
	switch k.Kind {
	case KindValue:
		n, w := binary.Uvarint(rest)
		if w <= 0 || w != uvarintLen(n) {
			return Key{}, corruptKey(b, "bad user key length")
		}
		rest = rest[w:]
		if n > uint64(len(rest)) {
			return Key{}, corruptKey(b, "user key past end")
		}
		k.UserKey, k.Sub = rest[:n:n], rest[n:]
	case KindTimer:
		if len(rest) < timerFixed {
			return Key{}, corruptKey(b, "short timer")
		}
		k.Domain = rest[0]
		if k.Domain > DomainProcessingTime {
			return Key{}, corruptKey(b, "unknown timer domain")
		}
		k.Time = int64(binary.BigEndian.Uint64(rest[1:]) ^ signBit)
		rest = rest[timerFixed:]
		n, w := binary.Uvarint(rest)
		if w <= 0 || w != uvarintLen(n) {
			return Key{}, corruptKey(b, "bad user key length")
		}
		rest = rest[w:]
		if n != uint64(len(rest)) {
			return Key{}, corruptKey(b, "user key length mismatch")
		}
		k.UserKey = rest
	case KindCounter:
		if k.Stage != SystemStage {
			return Key{}, corruptKey(b, "counter outside the system stage")
		}
		if len(rest) != counterRest {
			return Key{}, corruptKey(b, "bad counter length")
		}
		k.Counter = rest[0]
	default:
		return Key{}, corruptKey(b, "unknown kind")
	}
	return k, nil
}

// uvarintLen is the length of the canonical (shortest) uvarint encoding of n;
// DecodeKey rejects longer encodings so that every key has one spelling.
func uvarintLen(n uint64) int {
	w := 1
	for n >= 0x80 {
		n >>= 7
		w++
	}
	return w
}

// AppendValueKey is ValueKey appending to dst.
func AppendValueKey(dst []byte, kg int, stage uint8, userKey, sub []byte) []byte {
	return append(appendValuePrefix(dst, kg, stage, userKey), sub...)
}

// AppendTimerKey is TimerKey appending to dst.
func AppendTimerKey(dst []byte, kg int, stage uint8, domain uint8, ts int64, userKey []byte) []byte {
	return appendTimer(dst, kg, stage, domain, ts, userKey)
}
