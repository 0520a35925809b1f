// Package abi is the byte format of the cairn operator ABI, version 1: the
// input buffer the host writes into guest memory before each call, and the
// output buffer the guest hands back. It is shared by the guest SDK
// (cairn/operators/sdk, built for wasip1) and the host (cairn/wasm), so it
// imports nothing but the standard library and builds on every platform.
//
// All integers are little endian. A byte string is a u32 length followed by
// that many bytes. docs/ABI.md is the reference for operator authors; the
// constants below must never change without bumping Version and the import
// module name.
package abi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Version is the ABI version carried in the import module name and as the
// first byte of every buffer.
const Version = 1

// ImportModule is the name of the host module every cairn v1 guest imports.
const ImportModule = "cairn_v1"

// Version2 is ABI version 2: version 1 with the input side of every record
// (a stage with two inputs tells them apart by it) and its kind (a table's
// delete). A module speaks it by importing ImportModuleV2 (the same
// functions as ImportModule); its buffers start with the byte 2, and each
// record entry with its side and kind:
//
//	u8 side, u8 kind (KindDelete: a table input's delete), u32 key index, i64 time, bytes value
//
// Everything else is as in version 1.
const Version2 = 2

// ImportModuleV2 is the name of the host module a cairn v2 guest imports.
const ImportModuleV2 = "cairn_v2"

// Record kinds (version 2).
const (
	KindUpsert = 0 // a record; on a table input, the key's new value
	KindDelete = 1 // on a table input: the key was deleted (the value is empty)
)

// Names of the guest exports the host calls.
const (
	// ExportAlloc is `cairn_alloc(size u32) -> ptr u32`: the guest returns a
	// buffer of at least size bytes that the host may write the input into.
	// The host calls it again only when an input needs more room.
	ExportAlloc = "cairn_alloc"
	// ExportProcess is `cairn_process(len u32) -> u64`: process the input of
	// len bytes at the last allocated buffer; the result is
	// (output pointer << 32) | output length.
	ExportProcess = "cairn_process"
	// ExportProgress is `cairn_progress() -> ptr u32`: the address of an i32
	// in guest memory where the guest keeps the Source it is processing
	// (ProgressIdle between calls), so the host can name the record after a
	// trap.
	ExportProgress = "cairn_progress"
)

// Names of the host functions in ImportModule.
const (
	// ImportStateGet is `state_get(key_ptr, key_len, sub_ptr, sub_len, dst_ptr, dst_cap u32) -> i64`:
	// StateAbsent, StateHostError, or the value length (the value is copied
	// only when it fits in dst_cap; otherwise call again with more room).
	ImportStateGet = "state_get"
	// ImportStateGetMany is `state_get_many(key_ptr, key_len, req_ptr, req_len, dst_ptr, dst_cap u32) -> i64`:
	// state_get of several sub-keys of one key in one call. The request is
	// a sequence of `bytes sub` to its end; the result, one entry per
	// sub-key in the request's order, an i32 (StateAbsent, or the value's
	// length) followed by that many bytes of value. Returns StateHostError
	// or the result's length, copied only when it fits in dst_cap
	// (otherwise call again with more room). A later addition to both
	// import modules: a module that does not call it does not import it.
	ImportStateGetMany = "state_get_many"
	// ImportStateScan is `state_scan(key_ptr, key_len, prefix_ptr, prefix_len, dst_ptr, dst_cap u32) -> i64`:
	// StateHostError or the length of a scan list (see AppendScanEntry),
	// copied only when it fits.
	ImportStateScan = "state_scan"
	// ImportLog is `log(level i32, ptr, len u32)`: log a line right away
	// (outside a call, or to survive a crash).
	ImportLog = "log"
	// ImportConfig is `config(dst_ptr, dst_cap u32) -> u32`: the length of the
	// operator config, copied only when it fits.
	ImportConfig = "config"
)

// Results of the state host functions below zero.
const (
	StateAbsent    = -1 // the sub-key has no value
	StateHostError = -2 // the host failed to read state; the call must fail
)

// ProgressIdle is the progress word's value when no record or timer is being processed.
const ProgressIdle = int32(-1 << 31)

// Fetch says what the host prefetched for a key of the batch: the value of
// (key, sub "").
type Fetch uint8

const (
	NotFetched Fetch = 0 // stateless stage: nothing was read
	Absent     Fetch = 1 // read, no value
	Present    Fetch = 2 // read, Value holds it
)

// Key is one distinct key of a batch, with its prefetched (key, "") state.
type Key struct {
	Key   []byte
	Fetch Fetch
	Value []byte
}

// Timer is a fired timer of the batch.
type Timer struct {
	KeyIdx     uint32 // index in Input.Keys
	Time       int64
	Processing bool // processing-time domain (else event time)
}

// Record is an input record of the batch.
type Record struct {
	KeyIdx uint32 // index in Input.Keys
	Time   int64
	Value  []byte
	// Side is the input the record came from, in the order of the stage's
	// inputs (0 for a stage with one). Carried by version 2 only.
	Side uint8
	// Delete marks a table input's delete (KindDelete). Version 2 only.
	Delete bool
}

// Sizes of the input's fixed parts, for decoders that read it in place.
const (
	InputHeaderSize    = 1 + 8 + 8 // version, watermark, proctime
	MinKeyEntrySize    = 1 + 4     // fetch, key length (then the key, and the value if present)
	TimerEntrySize     = 1 + 4 + 8 // flags, key index, time
	MinRecordEntrySize = 4 + 8 + 4 // key index, time, value length (then the value)
)

// Input is the decoded input buffer:
//
//	u8 version
//	i64 watermark, i64 proctime
//	u32 n, n × { u8 fetch, bytes key, [bytes value if fetch == Present] }
//	u32 n, n × { u8 flags (1 = processing time), u32 key index, i64 time }
//	u32 n, n × { u32 key index, i64 time, bytes value }
type Input struct {
	// Version is the buffer's format: Version (0 means it too) or Version2.
	Version   uint8
	Watermark int64
	ProcTime  int64
	Keys      []Key
	Timers    []Timer
	Records   []Record
}

// Source names what the guest was processing: a record index (>= 0), or the
// timer index t encoded as -t-1.
func TimerSource(t int) int32 { return int32(-t - 1) }

// Tags of the output buffer's entries.
const (
	TagEmit  = 1 // i32 source, i64 time, bytes key, bytes value
	TagState = 2 // u8 flags (1 = delete), u32 key index, bytes sub, bytes value
	TagTimer = 3 // u8 flags (1 = delete, 2 = processing time), u32 key index, i64 time
	TagLog   = 4 // i32 level, bytes message
	TagError = 5 // i32 source, bytes message: the call failed
	// TagEmitPort (version 2) is an emit to one of the stage's named
	// output ports: u8 port, then TagEmit's fields. Port 0 is the port a
	// TagEmit goes to.
	TagEmitPort = 6
)

// Emit is an output record.
type Emit struct {
	// Port is the stage's output port (0: the first, or only, one).
	Port   uint8
	Source int32
	Time   int64
	Key    []byte
	Value  []byte
}

// StateOp is a put or delete of (Keys[KeyIdx], Sub).
type StateOp struct {
	KeyIdx uint32
	Sub    []byte
	Value  []byte
	Delete bool
}

// TimerOp registers or deletes a timer of Keys[KeyIdx].
type TimerOp struct {
	KeyIdx     uint32
	Time       int64
	Processing bool
	Delete     bool
}

// Log is a logged line.
type Log struct {
	Level int32
	Msg   []byte
}

// Output is the decoded output buffer: u8 version, then tagged entries to
// the end of the buffer, in the order the guest produced them.
type Output struct {
	Emits  []Emit
	State  []StateOp
	Timers []TimerOp
	Logs   []Log
	// Failed is set when the buffer holds an error entry; ErrSource and
	// ErrMsg describe it.
	Failed    bool
	ErrSource int32
	ErrMsg    []byte
}

// ErrMalformed is returned (wrapped) for any buffer that does not follow the format.
var ErrMalformed = errors.New("abi: malformed buffer")

// --- encoding -------------------------------------------------------------

func appendU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func appendI64(b []byte, v int64) []byte  { return binary.LittleEndian.AppendUint64(b, uint64(v)) }

// AppendBytes appends a length-prefixed byte string.
func AppendBytes(b, s []byte) []byte { return append(appendU32(b, uint32(len(s))), s...) }

func appendString(b []byte, s string) []byte { return append(appendU32(b, uint32(len(s))), s...) }

// AppendInputHeader appends the version, watermark and proctime of a
// version 1 input.
func AppendInputHeader(b []byte, watermark, proctime int64) []byte {
	return AppendInputHeaderV(b, Version, watermark, proctime)
}

// AppendInputHeaderV appends the header of an input of the given version.
func AppendInputHeaderV(b []byte, version uint8, watermark, proctime int64) []byte {
	b = append(b, version)
	return appendI64(appendI64(b, watermark), proctime)
}

// AppendCount appends a section's element count.
func AppendCount(b []byte, n int) []byte { return appendU32(b, uint32(n)) }

// AppendKey appends one entry of the keys section.
func AppendKey(b []byte, key []byte, f Fetch, value []byte) []byte {
	b = AppendBytes(append(b, byte(f)), key)
	if f == Present {
		b = AppendBytes(b, value)
	}
	return b
}

// AppendTimer appends one entry of the timers section.
func AppendTimer(b []byte, keyIdx uint32, t int64, processing bool) []byte {
	var fl byte
	if processing {
		fl = 1
	}
	return appendI64(appendU32(append(b, fl), keyIdx), t)
}

// AppendRecord appends one entry of the records section.
func AppendRecord(b []byte, keyIdx uint32, t int64, value []byte) []byte {
	return AppendBytes(appendI64(appendU32(b, keyIdx), t), value)
}

// AppendRecordV2 appends one entry of a version 2 records section.
func AppendRecordV2(b []byte, side uint8, del bool, keyIdx uint32, t int64, value []byte) []byte {
	kind := byte(KindUpsert)
	if del {
		kind = KindDelete
	}
	return AppendRecord(append(b, side, kind), keyIdx, t, value)
}

// AppendInput appends a whole input buffer.
func AppendInput(b []byte, in *Input) []byte {
	v := in.Version
	if v == 0 {
		v = Version
	}
	b = AppendInputHeaderV(b, v, in.Watermark, in.ProcTime)
	b = AppendCount(b, len(in.Keys))
	for _, k := range in.Keys {
		b = AppendKey(b, k.Key, k.Fetch, k.Value)
	}
	b = AppendCount(b, len(in.Timers))
	for _, t := range in.Timers {
		b = AppendTimer(b, t.KeyIdx, t.Time, t.Processing)
	}
	b = AppendCount(b, len(in.Records))
	for _, r := range in.Records {
		if v == Version2 {
			b = AppendRecordV2(b, r.Side, r.Delete, r.KeyIdx, r.Time, r.Value)
			continue
		}
		b = AppendRecord(b, r.KeyIdx, r.Time, r.Value)
	}
	return b
}

// AppendOutputHeader starts a version 1 output buffer.
func AppendOutputHeader(b []byte) []byte { return append(b, Version) }

// AppendOutputHeaderV starts an output buffer of the given version (its
// entries are the same in both).
func AppendOutputHeaderV(b []byte, version uint8) []byte { return append(b, version) }

// grow extends b by n bytes (geometrically when it must reallocate) and
// returns the extended slice.
func grow(b []byte, n int) []byte {
	l := len(b)
	return slices.Grow(b, n)[:l+n]
}

// AppendEmit appends an emit entry. (Entry writers size the entry once and
// store its fields in place: they run in the guest for every output.)
func AppendEmit(b []byte, source int32, t int64, key, value []byte) []byte {
	n := len(b)
	b = grow(b, 1+4+8+4+4+len(key)+len(value))
	e := b[n:]
	e[0] = TagEmit
	binary.LittleEndian.PutUint32(e[1:], uint32(source))
	binary.LittleEndian.PutUint64(e[5:], uint64(t))
	binary.LittleEndian.PutUint32(e[13:], uint32(len(key)))
	p := 17 + copy(e[17:], key)
	binary.LittleEndian.PutUint32(e[p:], uint32(len(value)))
	copy(e[p+4:], value)
	return b
}

// AppendEmitPort appends an emit to output port port (TagEmitPort; port 0
// is written as a plain TagEmit).
func AppendEmitPort(b []byte, port uint8, source int32, t int64, key, value []byte) []byte {
	if port == 0 {
		return AppendEmit(b, source, t, key, value)
	}
	n := len(b)
	b = AppendEmit(append(b, TagEmitPort, port), source, t, key, value)
	// AppendEmit wrote its own tag after the port: drop it.
	copy(b[n+2:], b[n+3:])
	return b[:len(b)-1]
}

// AppendStateOp appends a state entry; value is ignored for a delete.
func AppendStateOp(b []byte, keyIdx uint32, sub string, value []byte, del bool) []byte {
	var fl byte
	if del {
		fl, value = 1, nil
	}
	n := len(b)
	b = grow(b, 1+1+4+4+4+len(sub)+len(value))
	e := b[n:]
	e[0], e[1] = TagState, fl
	binary.LittleEndian.PutUint32(e[2:], keyIdx)
	binary.LittleEndian.PutUint32(e[6:], uint32(len(sub)))
	p := 10 + copy(e[10:], sub)
	binary.LittleEndian.PutUint32(e[p:], uint32(len(value)))
	copy(e[p+4:], value)
	return b
}

// AppendTimerOp appends a timer entry.
func AppendTimerOp(b []byte, keyIdx uint32, t int64, processing, del bool) []byte {
	var fl byte
	if del {
		fl |= 1
	}
	if processing {
		fl |= 2
	}
	n := len(b)
	b = grow(b, 1+1+4+8)
	e := b[n:]
	e[0], e[1] = TagTimer, fl
	binary.LittleEndian.PutUint32(e[2:], keyIdx)
	binary.LittleEndian.PutUint64(e[6:], uint64(t))
	return b
}

// AppendLog appends a log entry.
func AppendLog(b []byte, level int32, msg string) []byte {
	return appendString(appendU32(append(b, TagLog), uint32(level)), msg)
}

// AppendError appends the error entry that fails the call.
func AppendError(b []byte, source int32, msg string) []byte {
	return appendString(appendU32(append(b, TagError), uint32(source)), msg)
}

// AppendOutput appends a whole output buffer: emits, state, timers, logs,
// then the error if Failed. (A guest interleaves entries freely.)
func AppendOutput(b []byte, o *Output) []byte {
	b = AppendOutputHeader(b)
	for _, e := range o.Emits {
		b = AppendEmitPort(b, e.Port, e.Source, e.Time, e.Key, e.Value)
	}
	for _, s := range o.State {
		b = AppendStateOp(b, s.KeyIdx, string(s.Sub), s.Value, s.Delete)
	}
	for _, t := range o.Timers {
		b = AppendTimerOp(b, t.KeyIdx, t.Time, t.Processing, t.Delete)
	}
	for _, l := range o.Logs {
		b = AppendLog(b, l.Level, string(l.Msg))
	}
	if o.Failed {
		b = AppendError(b, o.ErrSource, string(o.ErrMsg))
	}
	return b
}

// AppendGetManyEntry appends one sub-key's entry of a state_get_many
// result: its value, or StateAbsent when found is false.
func AppendGetManyEntry(b, value []byte, found bool) []byte {
	if !found {
		return binary.LittleEndian.AppendUint32(b, uint32(0xffffffff)) // StateAbsent as an i32
	}
	return AppendBytes(b, value)
}

// DecodeGetManyRequest calls fn with each sub-key of a state_get_many
// request, in order; a malformed request is ErrMalformed.
func DecodeGetManyRequest(req []byte, fn func(sub []byte) error) error {
	r := reader{b: req}
	for r.err == nil && r.left() > 0 {
		sub := r.bytes()
		if r.err != nil {
			break
		}
		if err := fn(sub); err != nil {
			return err
		}
	}
	return r.err
}

// AppendScanEntry appends one (sub, value) pair of a state_scan result; the
// result is a sequence of them to the end of the buffer, in sub-key order.
func AppendScanEntry(b, sub, value []byte) []byte { return AppendBytes(AppendBytes(b, sub), value) }

// --- decoding -------------------------------------------------------------

// reader decodes a buffer with every length checked against what remains.
// After the first error, reads return zero values and r.err stays set;
// methods are small enough to inline (this runs in the guest too, where
// calls are expensive).
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s at offset %d of %d", ErrMalformed, what, r.off, len(r.b))
	}
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) u8() byte {
	if r.off >= len(r.b) {
		r.fail("truncated")
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *reader) u32() uint32 {
	if len(r.b)-r.off < 4 {
		r.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) i64() int64 {
	if len(r.b)-r.off < 8 {
		r.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return int64(v)
}

// bytes returns a length-prefixed string aliasing the buffer (capacity
// clipped so an append by the user cannot overwrite what follows).
func (r *reader) bytes() []byte {
	if len(r.b)-r.off < 4 {
		r.fail("truncated")
		return nil
	}
	n := uint64(binary.LittleEndian.Uint32(r.b[r.off:]))
	if n > uint64(len(r.b)-r.off-4) {
		r.fail("byte string longer than the buffer")
		return nil
	}
	r.off += 4
	end := r.off + int(n)
	v := r.b[r.off:end:end]
	r.off = end
	return v
}

// count reads a section count and refuses one that cannot fit in what
// remains at minSize bytes per element, so no allocation is ever larger
// than the buffer.
func (r *reader) count(minSize int) int {
	n := r.u32()
	if r.err != nil {
		return 0
	}
	if uint64(n)*uint64(minSize) > uint64(r.left()) {
		r.fail("count larger than the buffer")
		return 0
	}
	return int(n)
}

func (r *reader) version() uint8 {
	v := r.u8()
	if r.err == nil && v != Version && v != Version2 {
		r.fail(fmt.Sprintf("version %d, want %d or %d", v, Version, Version2))
	}
	return v
}

// DecodeInput decodes an input buffer into in, reusing its slices. The
// decoded byte strings alias buf.
func DecodeInput(buf []byte, in *Input) error {
	r := reader{b: buf}
	in.Version = r.version()
	in.Watermark = r.i64()
	in.ProcTime = r.i64()
	n := r.count(5)
	in.Keys = resize(in.Keys[:0], n)
	for i := range in.Keys {
		k := &in.Keys[i]
		k.Fetch = Fetch(r.u8())
		k.Key = r.bytes()
		k.Value = nil
		switch k.Fetch {
		case Present:
			k.Value = r.bytes()
		case NotFetched, Absent:
		default:
			r.fail("key fetch flag")
		}
	}
	n = r.count(13)
	in.Timers = resize(in.Timers[:0], n)
	for i := range in.Timers {
		t := &in.Timers[i]
		fl := r.u8()
		t.Processing = fl&1 != 0
		t.KeyIdx = r.u32()
		t.Time = r.i64()
		if fl&^1 != 0 {
			r.fail("timer flags")
		}
		if r.err == nil && t.KeyIdx >= uint32(len(in.Keys)) {
			r.fail("timer key index")
		}
	}
	minRec := MinRecordEntrySize
	if in.Version == Version2 {
		minRec += 2
	}
	n = r.count(minRec)
	in.Records = resize(in.Records[:0], n)
	for i := range in.Records {
		rec := &in.Records[i]
		rec.Side, rec.Delete = 0, false
		if in.Version == Version2 {
			rec.Side = r.u8()
			switch r.u8() {
			case KindUpsert:
			case KindDelete:
				rec.Delete = true
			default:
				r.fail("record kind")
			}
		}
		rec.KeyIdx = r.u32()
		rec.Time = r.i64()
		rec.Value = r.bytes()
		if r.err == nil && rec.KeyIdx >= uint32(len(in.Keys)) {
			r.fail("record key index")
		}
	}
	if r.err == nil && r.left() != 0 {
		r.fail("trailing bytes")
	}
	return r.err
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// DecodeOutput decodes an output buffer into out, reusing its slices. The
// decoded byte strings alias buf. It never panics on any input; indices
// are not checked against the batch here (the host does that).
func DecodeOutput(buf []byte, out *Output) error {
	out.Emits, out.State, out.Timers, out.Logs = out.Emits[:0], out.State[:0], out.Timers[:0], out.Logs[:0]
	out.Failed, out.ErrSource, out.ErrMsg = false, 0, nil
	r := reader{b: buf}
	r.version()
	for r.err == nil && r.left() > 0 {
		switch tag := r.u8(); tag {
		case TagEmit, TagEmitPort:
			var e Emit
			if tag == TagEmitPort {
				e.Port = r.u8()
			}
			e.Source = int32(r.u32())
			e.Time = r.i64()
			e.Key = r.bytes()
			e.Value = r.bytes()
			out.Emits = append(out.Emits, e)
		case TagState:
			var s StateOp
			fl := r.u8()
			s.Delete = fl&1 != 0
			s.KeyIdx = r.u32()
			s.Sub = r.bytes()
			s.Value = r.bytes()
			if fl&^1 != 0 || (s.Delete && len(s.Value) != 0) {
				r.fail("state flags")
			}
			out.State = append(out.State, s)
		case TagTimer:
			var t TimerOp
			fl := r.u8()
			t.Delete = fl&1 != 0
			t.Processing = fl&2 != 0
			t.KeyIdx = r.u32()
			t.Time = r.i64()
			if fl&^3 != 0 {
				r.fail("timer flags")
			}
			out.Timers = append(out.Timers, t)
		case TagLog:
			var l Log
			l.Level = int32(r.u32())
			l.Msg = r.bytes()
			out.Logs = append(out.Logs, l)
		case TagError:
			src := int32(r.u32())
			msg := r.bytes()
			if out.Failed {
				r.fail("second error entry")
			}
			out.Failed, out.ErrSource, out.ErrMsg = true, src, msg
		default:
			if r.err == nil {
				r.off--
				r.fail(fmt.Sprintf("unknown tag %d", tag))
			}
		}
	}
	return r.err
}

// DecodeScan calls fn for each (sub, value) pair of a state_scan result.
func DecodeScan(buf []byte, fn func(sub, value []byte)) error {
	r := reader{b: buf}
	for r.err == nil && r.left() > 0 {
		sub := r.bytes()
		val := r.bytes()
		if r.err == nil {
			fn(sub, val)
		}
	}
	return r.err
}
