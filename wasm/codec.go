package wasm

import (
	"bytes"
	"fmt"
	"hash/maphash"

	"cairn/operators/abi"
)

// encoder builds input buffers; its slices are reused across calls, so
// encoding allocates nothing once they have grown.
type encoder struct {
	version uint8 // the module's ABI version (0: 1)
	buf     []byte
	keys    [][]byte // key table of the last encoded batch
	recIdx  []uint32 // key index per record
	tmrIdx  []uint32 // key index per timer

	// slots is an open-addressing table of the distinct keys (keyed
	// stages): index+1 into keys, 0 for an empty slot. It is sized to a
	// power of two at least twice the batch's keys.
	slots []uint32
	seed  maphash.Seed
}

// add returns the key index of k, adding it to the key table when new.
func (e *encoder) add(k []byte) uint32 {
	mask := uint64(len(e.slots) - 1)
	for h := maphash.Bytes(e.seed, k) & mask; ; h = (h + 1) & mask {
		i := e.slots[h]
		if i == 0 {
			e.keys = append(e.keys, k)
			e.slots[h] = uint32(len(e.keys))
			return uint32(len(e.keys) - 1)
		}
		if bytes.Equal(e.keys[i-1], k) {
			return i - 1
		}
	}
}

// encode writes b into e.buf. With st non-nil, keys are deduplicated and
// each distinct key's (key, "") state is prefetched.
func (e *encoder) encode(b *Batch, st State) error {
	e.keys, e.recIdx, e.tmrIdx = e.keys[:0], e.recIdx[:0], e.tmrIdx[:0]
	if st == nil {
		for _, t := range b.Timers {
			e.tmrIdx = append(e.tmrIdx, uint32(len(e.keys)))
			e.keys = append(e.keys, t.Key)
		}
		for _, r := range b.Records {
			e.recIdx = append(e.recIdx, uint32(len(e.keys)))
			e.keys = append(e.keys, r.Key)
		}
	} else {
		n := 16
		for n < 2*(len(b.Timers)+len(b.Records)) {
			n *= 2
		}
		if cap(e.slots) < n {
			e.slots = make([]uint32, n)
			e.seed = maphash.MakeSeed()
		} else {
			e.slots = e.slots[:n]
			clear(e.slots)
		}
		for _, t := range b.Timers {
			e.tmrIdx = append(e.tmrIdx, e.add(t.Key))
		}
		for _, r := range b.Records {
			e.recIdx = append(e.recIdx, e.add(r.Key))
		}
	}
	size := abi.InputHeaderSize + 12 + len(b.Timers)*abi.TimerEntrySize + len(e.keys)*(abi.MinKeyEntrySize+4)
	for _, k := range e.keys {
		size += len(k)
	}
	for _, r := range b.Records {
		size += abi.MinRecordEntrySize + 2 + len(r.Value)
	}
	if cap(e.buf) < size {
		e.buf = make([]byte, 0, size+size/4)
	}
	v := e.version
	if v == 0 {
		v = abi.Version
	}
	buf := abi.AppendInputHeaderV(e.buf[:0], v, b.Watermark, b.ProcTime)
	buf = abi.AppendCount(buf, len(e.keys))
	for _, k := range e.keys {
		if st == nil {
			buf = abi.AppendKey(buf, k, abi.NotFetched, nil)
			continue
		}
		v, ok, err := st.Get(k, nil)
		if err != nil {
			return fmt.Errorf("prefetch state of key %q: %w", k, err)
		}
		f := abi.Absent
		if ok {
			f = abi.Present
		}
		buf = abi.AppendKey(buf, k, f, v)
	}
	buf = abi.AppendCount(buf, len(b.Timers))
	for i, t := range b.Timers {
		buf = abi.AppendTimer(buf, e.tmrIdx[i], t.Time, t.Domain == ProcessingTime)
	}
	buf = abi.AppendCount(buf, len(b.Records))
	for i, r := range b.Records {
		if v == abi.Version2 {
			buf = abi.AppendRecordV2(buf, r.Side, r.Delete, e.recIdx[i], r.Time, r.Value)
			continue
		}
		buf = abi.AppendRecord(buf, e.recIdx[i], r.Time, r.Value)
	}
	e.buf = buf
	return nil
}

// guestFailure is a failure the guest reported in its output (an error
// returned by the operator, or a recovered panic).
type guestFailure struct {
	source int32
	msg    string
}

// decodeOutput decodes an output buffer owned by the host (the result
// aliases buf) for a batch of nRecords records and nTimers timers whose key
// table is keys. It never panics; any violation of the format, or an index
// out of range, is an error wrapping ErrBadOutput.
func decodeOutput(buf []byte, scratch *abi.Output, nRecords, nTimers int, keys [][]byte, stateful bool, ports int) (*Output, *guestFailure, error) {
	if err := abi.DecodeOutput(buf, scratch); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrBadOutput, err)
	}
	out := &Output{}
	for _, l := range scratch.Logs {
		out.Logs = append(out.Logs, LogLine{Level: int(l.Level), Msg: string(l.Msg)})
	}
	if scratch.Failed {
		return out, &guestFailure{source: scratch.ErrSource, msg: string(scratch.ErrMsg)}, nil
	}
	if !stateful && (len(scratch.State) > 0 || len(scratch.Timers) > 0) {
		return nil, nil, fmt.Errorf("%w: state or timer write in a stateless stage", ErrBadOutput)
	}
	if n := len(scratch.Emits); n > 0 {
		out.Emits = make([]Emit, n)
		for i, e := range scratch.Emits {
			em := Emit{Key: e.Key, Value: e.Value, Time: e.Time, Input: int(e.Source), Timer: -1, Port: int(e.Port)}
			if int(e.Port) >= ports {
				return nil, nil, fmt.Errorf("%w: emit %d to port %d; the stage has %d output port(s) (ports: in the job file)", ErrBadOutput, i, e.Port, ports)
			}
			switch {
			case e.Source >= 0 && int(e.Source) < nRecords:
			case e.Source < 0 && int(-int64(e.Source)-1) < nTimers:
				em.Input, em.Timer = -1, int(-int64(e.Source)-1)
			default:
				return nil, nil, fmt.Errorf("%w: emit %d: source %d out of range (%d records, %d timers)", ErrBadOutput, i, e.Source, nRecords, nTimers)
			}
			out.Emits[i] = em
		}
	}
	if n := len(scratch.State); n > 0 {
		out.State = make([]StateOp, n)
		for i, s := range scratch.State {
			if s.KeyIdx >= uint32(len(keys)) {
				return nil, nil, fmt.Errorf("%w: state op %d: key index %d out of range", ErrBadOutput, i, s.KeyIdx)
			}
			out.State[i] = StateOp{Key: keys[s.KeyIdx], Sub: s.Sub, Value: s.Value, Delete: s.Delete}
		}
	}
	if n := len(scratch.Timers); n > 0 {
		out.Timers = make([]TimerOp, n)
		for i, t := range scratch.Timers {
			if t.KeyIdx >= uint32(len(keys)) {
				return nil, nil, fmt.Errorf("%w: timer op %d: key index %d out of range", ErrBadOutput, i, t.KeyIdx)
			}
			d := EventTime
			if t.Processing {
				d = ProcessingTime
			}
			out.Timers[i] = TimerOp{Key: keys[t.KeyIdx], Time: t.Time, Domain: d, Delete: t.Delete}
		}
	}
	return out, nil, nil
}
