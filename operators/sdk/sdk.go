// Package sdk is the guest side of the cairn operator ABI (v1): operators are
// ordinary Go programs built for WebAssembly that register callbacks here.
//
// An operator is a package main that registers itself in init and has an
// empty main:
//
//	//go:build wasip1
//
//	package main
//
//	import "cairn/operators/sdk"
//
//	func main() {}
//
//	func init() {
//		sdk.Register(sdk.Operator{
//			OnRecord: func(c *sdk.Context, r sdk.Record) error {
//				n := 0
//				if v, ok := c.Get(""); ok {
//					n, _ = strconv.Atoi(string(v))
//				}
//				n++
//				c.Put("", []byte(strconv.Itoa(n)))
//				c.Emit(r.Key, []byte(strconv.Itoa(n)), r.Time)
//				return nil
//			},
//		})
//	}
//
// Build it as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o op.wasm .
//
// State is owned by the host: the guest keeps nothing it needs across calls,
// and reads and writes the current key's state through the Context. The host
// hands the operator records in batches, one call per batch; within a call
// the operator reads its own writes. Byte slices the SDK hands out (record
// keys and values, state values) are valid only until the callback returns:
// copy them to keep them.
//
// An error returned from a callback, or a panic, fails the whole call: the
// host dead-letters the record being processed with the error text as the
// reason and discards everything else the call produced.
//
// The guest has no filesystem, network, environment, clock or real
// randomness (unless the job grants them): results must depend only on the
// input, the state and the config, so a replay reproduces them.
//
// On platforms other than wasip1 the package compiles (for documentation and
// vet) but Register has no effect.
package sdk

import (
	"encoding/binary"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"cairn/operators/abi"
)

// Record is an input record.
type Record struct {
	Key   []byte
	Value []byte
	Time  int64 // event time, Unix milliseconds
	// Side is the input the record came from, in the order of the stage's
	// `from:` list: 0 or 1 in a two-input stage (a join, a union), 0 in
	// any other.
	Side int
	// Delete is set on a record of a table input (a NATS KV bucket) whose
	// key was deleted; Value is then empty. Other records never have it.
	Delete bool
}

// Timer is a fired timer of the current key.
type Timer struct {
	Key        []byte
	Time       int64
	Processing bool // a processing-time timer (else event time)
}

// Operator is the set of callbacks of an operator. OnRecord is required;
// OnTimer only for keyed operators that register timers.
type Operator struct {
	OnRecord func(c *Context, r Record) error
	OnTimer  func(c *Context, t Timer) error
}

// Level is a log level, with slog's numbering.
type Level int32

// Log levels.
const (
	LevelDebug Level = -4
	LevelInfo  Level = 0
	LevelWarn  Level = 4
	LevelError Level = 8
)

// Context is the operator's view of the call while it handles one record or
// timer: the current key's state, emits, timers, logs.
type Context struct {
	keyIdx uint32
	src    int32
}

// Register installs the operator. Call it once, from init.
//
// It reads the config from the host once, so that every module built with
// the SDK imports the host module of the ABI version the SDK speaks
// (cairn_v2), even one that never calls the host otherwise: the host
// tells a module's version from that import (docs/ABI.md).
func Register(op Operator) {
	registered = op
	Config()
}

// The SDK is written for the Go wasm code generator: every taken branch and
// every loop iteration costs a jump through the function's dispatch loop
// (and, under a deadline, an exit to the host to check for termination).
// So the per-record path decodes the input lazily, straight from the input
// buffer, relies on Go's bounds checks to reject a malformed input (the
// failure path is never taken for a well-formed one), keeps no per-record
// allocations, and writes each output entry with one capacity check.

var (
	registered Operator
	ctx        Context

	// The input of the current call; keys, timers and records alias the
	// input buffer.
	inWatermark, inProcTime int64
	// inVersion is the input's ABI version; the output answers in it.
	inVersion byte
	// keys is the input's key table with the overlay of (key, "") per key
	// index.
	keys     []keyState
	timers   []byte // the timers section, abi.TimerEntrySize bytes each
	nTimers  int
	records  []byte // the records section to the end of the input
	nRecords int

	out []byte // the output buffer, reused across calls

	// subs is the overlay of every other sub-key read or written in the call,
	// in first-use order; subTab indexes it (see subIndex).
	subs []subState
	// subTab is an open-addressing hash table over subs: slot h holds
	// index+1 of a sub-key whose hash probes to h, valid only while its
	// generation is the call's (subGen), so a call starts with an empty
	// table without clearing it.
	subTab []subSlot
	subGen uint32 = 1
	// arena holds copies of the values Put (and fetched) in this call.
	arena []byte

	progress = abi.ProgressIdle

	configCache []byte
	configDone  bool

	getBuf = make([]byte, 4096)
)

type keyState struct {
	key            []byte
	val            []byte
	known, present bool // known: val/present reflect state; present: a value exists
	dirty          bool // written in this call
}

type subState struct {
	keyIdx  uint32
	sub     string // a copy in the arena
	hash    uint32
	val     []byte
	present bool
	dirty   bool
}

type subSlot struct {
	gen uint32
	idx int32 // index into subs
}

// hostFailure is panicked when a host function reports that the host failed;
// the call then fails and the host reports its own error.
type hostFailure struct{ what string }

// malformedInput is panicked when the input buffer does not follow the ABI.
type malformedInput struct{ what string }

// Key returns the current key.
func (c *Context) Key() []byte { return keys[c.keyIdx].key }

// Watermark returns the stage's event-time watermark at the call (Unix ms,
// math.MinInt64 before the first one).
func (c *Context) Watermark() int64 { return inWatermark }

// ProcTime returns the stage's processing clock at the call (Unix ms):
// ingestion time, the JetStream timestamp of the call's records in 10 ms
// steps, so a replay after a restore sees the same value at the same
// records. A stage granted the wall clock (job file `clock: wall`, refused
// with exactly_once and dedupe delivery) sees the machine's clock instead.
func (c *Context) ProcTime() int64 { return inProcTime }

// Config returns the operator's config (the bytes of the job file's config
// for the stage, usually JSON).
func (c *Context) Config() []byte { return Config() }

// Config returns the operator's config; it may also be called from init.
func Config() []byte {
	if !configDone {
		configCache = hostConfig()
		configDone = true
	}
	return configCache
}

// Get returns the value of sub-key sub of the current key's state.
func (c *Context) Get(sub string) ([]byte, bool) {
	if sub == "" {
		if ks := &keys[c.keyIdx]; ks.known {
			return ks.val, ks.present
		}
	}
	return c.get(sub)
}

func (c *Context) get(sub string) ([]byte, bool) {
	if sub == "" {
		ks := &keys[c.keyIdx]
		ks.val, ks.present = fetch(ks.key, "")
		ks.known = true
		return ks.val, ks.present
	}
	h := subHash(c.keyIdx, sub)
	slot := subFind(c.keyIdx, sub, h)
	if e := subTab[slot]; e.gen == subGen {
		s := &subs[e.idx]
		return s.val, s.present
	}
	v, ok := fetch(keys[c.keyIdx].key, sub)
	subAdd(slot, subState{keyIdx: c.keyIdx, sub: keepString(sub), hash: h, val: v, present: ok})
	return v, ok
}

// The sub-key overlay is looked up on every Get and Put of a sub-key, so
// it avoids Go's map: in this guest a map insert allocates its string key
// and hashes through the runtime's portable fallback, and the sub-key
// strings the callers pass escape into it, so that every string(b) they
// convert a sub-key from allocates too. Here the sub-key is copied into
// the call's arena once, when first used, and the caller's string does not
// escape.

// subHash is FNV-1a over the key index and the sub-key.
func subHash(keyIdx uint32, sub string) uint32 {
	h := uint32(2166136261)
	h = (h ^ (keyIdx & 0xff)) * 16777619
	h = (h ^ (keyIdx >> 8 & 0xff)) * 16777619
	h = (h ^ (keyIdx >> 16)) * 16777619
	for i := 0; i < len(sub); i++ {
		h = (h ^ uint32(sub[i])) * 16777619
	}
	return h
}

// subFind returns the slot of subTab that holds (keyIdx, sub), or the
// empty slot where it goes.
func subFind(keyIdx uint32, sub string, h uint32) int {
	if len(subTab) == 0 {
		subTab = make([]subSlot, 64)
	}
	mask := len(subTab) - 1
	i := int(h) & mask
	for {
		e := subTab[i]
		if e.gen != subGen {
			return i
		}
		if s := &subs[e.idx]; s.hash == h && s.keyIdx == keyIdx && s.sub == sub {
			return i
		}
		i = (i + 1) & mask
	}
}

// subAdd appends s to subs and puts it into slot (from subFind), growing
// the table when it is half full.
func subAdd(slot int, s subState) {
	subTab[slot] = subSlot{gen: subGen, idx: int32(len(subs))}
	subs = append(subs, s)
	if 2*len(subs) <= len(subTab) {
		return
	}
	subTab = make([]subSlot, 2*len(subTab))
	mask := len(subTab) - 1
	for j := range subs {
		i := int(subs[j].hash) & mask
		for subTab[i].gen == subGen {
			i = (i + 1) & mask
		}
		subTab[i] = subSlot{gen: subGen, idx: int32(j)}
	}
}

// subReset empties the overlay for a new call.
func subReset() {
	subs = subs[:0]
	if subGen++; subGen == 0 {
		// The generations wrapped: slots of old calls would look current.
		clear(subTab)
		subGen = 1
	}
}

// GetMany is Get of each sub-key of names: vals[i], found[i] are Get(names[i]).
// The sub-keys this call has not read or written yet are read with one host
// call, where a Get each would make one each. vals and found must be at
// least as long as names.
func (c *Context) GetMany(names []string, vals [][]byte, found []bool) {
	if len(names) == 0 {
		return
	}
	_, _ = vals[len(names)-1], found[len(names)-1] // one bounds check for all
	ki := c.keyIdx
	req := reqBuf[:0]
	miss := missBuf[:0]
	for i, sub := range names {
		if sub == "" {
			vals[i], found[i] = c.Get("")
			continue
		}
		h := subHash(ki, sub)
		if e := subTab[subFind(ki, sub, h)]; e.gen == subGen {
			s := &subs[e.idx]
			vals[i], found[i] = s.val, s.present
			continue
		}
		req = binary.LittleEndian.AppendUint32(req, uint32(len(sub)))
		req = append(req, sub...)
		miss = append(miss, missing{i: int32(i), hash: h})
	}
	reqBuf, missBuf = req, miss
	if len(miss) == 0 {
		return
	}
	var res []byte
	for {
		m := hostStateGetMany(keys[ki].key, req, getBuf)
		if m < 0 {
			panic(hostFailure{"state_get_many"})
		}
		if int(m) <= len(getBuf) {
			res = getBuf[:m]
			break
		}
		getBuf = make([]byte, m)
	}
	le := binary.LittleEndian
	off := 0
	for _, ms := range miss {
		sub := names[ms.i]
		vl := int32(le.Uint32(res[off:]))
		off += 4
		var v []byte
		ok := vl >= 0
		if ok {
			v = keep(res[off : off+int(vl)])
			off += int(vl)
		}
		slot := subFind(ki, sub, ms.hash)
		if e := subTab[slot]; e.gen == subGen { // named twice
			s := &subs[e.idx]
			v, ok = s.val, s.present
		} else {
			subAdd(slot, subState{keyIdx: ki, sub: keepString(sub), hash: ms.hash, val: v, present: ok})
		}
		vals[ms.i], found[ms.i] = v, ok
	}
	if off != len(res) {
		panic(hostFailure{"state_get_many: result longer than asked"})
	}
}

// missing is a sub-key GetMany asks the host for: its index in names and
// its hash.
type missing struct {
	i    int32
	hash uint32
}

// reqBuf and missBuf hold GetMany's request and the sub-keys it asks,
// reused across calls.
var (
	reqBuf  []byte
	missBuf []missing
)

func fetch(key []byte, sub string) ([]byte, bool) {
	for {
		n := hostStateGet(key, sub, getBuf)
		switch {
		case n == abi.StateAbsent:
			return nil, false
		case n < 0:
			panic(hostFailure{"state_get"})
		case int(n) <= len(getBuf):
			return keep(getBuf[:n]), true
		}
		getBuf = make([]byte, n)
	}
}

// keep copies v into the call's arena.
func keep(v []byte) []byte {
	start := len(arena)
	arena = append(arena, v...)
	return arena[start:len(arena):len(arena)]
}

// keepString copies s into the call's arena.
func keepString(s string) string {
	if s == "" {
		return ""
	}
	start := len(arena)
	arena = append(arena, s...)
	return unsafe.String(&arena[start], len(s))
}

// Put sets sub-key sub of the current key's state to a copy of v.
func (c *Context) Put(sub string, v []byte) {
	// The copy goes into a variable of its own: were it assigned to v,
	// escape analysis (which does not follow the order of assignments)
	// would see v stored in the overlay and move every caller's buffer,
	// a stack array included, to the heap, an allocation per Put.
	kept := keep(v)
	if sub == "" {
		ks := &keys[c.keyIdx]
		ks.val, ks.known, ks.present, ks.dirty = kept, true, true, true
		return
	}
	c.setSub(sub, kept, true)
}

// Delete removes sub-key sub of the current key's state.
func (c *Context) Delete(sub string) {
	if sub == "" {
		ks := &keys[c.keyIdx]
		ks.val, ks.known, ks.present, ks.dirty = nil, true, false, true
		return
	}
	c.setSub(sub, nil, false)
}

func (c *Context) setSub(sub string, v []byte, present bool) {
	h := subHash(c.keyIdx, sub)
	slot := subFind(c.keyIdx, sub, h)
	if e := subTab[slot]; e.gen == subGen {
		s := &subs[e.idx]
		s.val, s.present, s.dirty = v, present, true
		return
	}
	subAdd(slot, subState{keyIdx: c.keyIdx, sub: keepString(sub), hash: h, val: v, present: present, dirty: true})
}

// Scan calls fn for every sub-key of the current key that starts with
// prefix, in sub-key order, including this call's writes, until fn returns
// false.
func (c *Context) Scan(prefix string, fn func(sub string, value []byte) bool) {
	type kv struct {
		sub string
		val []byte
	}
	var buf []byte = make([]byte, 4096)
	for {
		n := hostStateScan(keys[c.keyIdx].key, prefix, buf)
		if n < 0 {
			panic(hostFailure{"state_scan"})
		}
		if int(n) <= len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, n)
	}
	m := map[string][]byte{}
	if err := abi.DecodeScan(buf, func(sub, value []byte) { m[string(sub)] = value }); err != nil {
		panic(hostFailure{"state_scan: " + err.Error()})
	}
	if ks := keys[c.keyIdx]; prefix == "" && ks.dirty {
		if ks.present {
			m[""] = ks.val
		} else {
			delete(m, "")
		}
	}
	for _, s := range subs {
		if s.keyIdx != c.keyIdx || !s.dirty || !strings.HasPrefix(s.sub, prefix) {
			continue
		}
		if s.present {
			m[s.sub] = s.val
		} else {
			delete(m, s.sub)
		}
	}
	list := make([]kv, 0, len(m))
	for k, v := range m {
		list = append(list, kv{k, v})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].sub < list[j].sub })
	for _, e := range list {
		if !fn(e.sub, e.val) {
			return
		}
	}
}

// Emit outputs a record. The key decides the output's partition (and, for
// a following keyed stage, its slot).
func (c *Context) Emit(key, value []byte, time int64) {
	out = abi.AppendEmit(out, c.src, time, key, value)
}

// EmitStart begins an emit whose value the operator appends in place, in
// the output buffer itself, where Emit copies a finished value there: it
// returns an empty slice to append the value to, and EmitEnd, given the
// result, ends the emit. Between the two the operator may read and write
// state but produce no other output (no Emit, timer or Log): EmitEnd
// fails the call if it did. The value may outgrow the slice's capacity
// (append then moves it, and EmitEnd copies it back once).
//
//	b := c.EmitStart(r.Key, r.Time)
//	b = append(b, `{"n":`...)
//	b = strconv.AppendInt(b, n, 10)
//	c.EmitEnd(append(b, '}'))
func (c *Context) EmitStart(key []byte, time int64) []byte {
	if emitAt >= 0 {
		panic("sdk: EmitStart before the previous EmitStart's EmitEnd")
	}
	out = abi.AppendEmit(out, c.src, time, key, nil)
	emitAt = len(out)
	out = slices.Grow(out, emitRoom)
	return out[emitAt:emitAt:cap(out)]
}

// EmitEnd ends the emit EmitStart began, with value the slice it returned
// after the operator's appends.
func (c *Context) EmitEnd(value []byte) {
	at := emitAt
	if at < 0 {
		panic("sdk: EmitEnd without EmitStart")
	}
	if len(out) != at {
		out = out[:at] // what came between is not an entry the host could read
		panic("sdk: output (an Emit, a timer or a Log) between EmitStart and EmitEnd")
	}
	emitAt = -1
	binary.LittleEndian.PutUint32(out[at-4:], uint32(len(value)))
	if len(value) == 0 {
		return
	}
	if unsafe.SliceData(value) == &out[:cap(out)][at] {
		out = out[:at+len(value)] // written in place: nothing to copy
		return
	}
	out = append(out, value...)
	// Leave room for a value this large from now on, so that it is
	// copied once, not at every emit.
	emitRoom = max(emitRoom, 2*len(value))
}

// emitRoom is the room EmitStart leaves after the key for the value: a
// value that fits is written in place.
var emitRoom = 1024

// emitAt is the offset in out where the value of the emit EmitStart began
// starts (its u32 length just before), or -1 when none is open.
var emitAt = -1

// EmitTo emits to one of the stage's named output ports: port i is the
// i-th name of the stage's `ports:` list in the job file (Emit is
// EmitTo(0, ...)). A port the stage does not have fails the call.
func (c *Context) EmitTo(port int, key, value []byte, time int64) {
	if port < 0 || port > 255 {
		panic("sdk: EmitTo: port " + strconv.Itoa(port) + " out of range")
	}
	out = abi.AppendEmitPort(out, uint8(port), c.src, time, key, value)
}

// RegisterEventTimer asks for OnTimer with this key once the watermark
// passes t. Registering the same time twice fires once.
func (c *Context) RegisterEventTimer(t int64) {
	out = abi.AppendTimerOp(out, c.keyIdx, t, false, false)
}

// DeleteEventTimer cancels an event-time timer of the current key.
func (c *Context) DeleteEventTimer(t int64) {
	out = abi.AppendTimerOp(out, c.keyIdx, t, false, true)
}

// RegisterProcessingTimer asks for OnTimer with this key once processing
// time passes t.
func (c *Context) RegisterProcessingTimer(t int64) {
	out = abi.AppendTimerOp(out, c.keyIdx, t, true, false)
}

// DeleteProcessingTimer cancels a processing-time timer of the current key.
func (c *Context) DeleteProcessingTimer(t int64) {
	out = abi.AppendTimerOp(out, c.keyIdx, t, true, true)
}

// Log logs a line through the host's logger when the call succeeds.
func (c *Context) Log(level Level, msg string) {
	out = abi.AppendLog(out, int32(level), msg)
}

// Log logs a line right away (from init, or before something that may crash).
func Log(level Level, msg string) { hostLog(int32(level), msg) }

// process runs one call: decode input, run the callbacks, encode output.
func process(buf []byte) []byte {
	// The Go runtime reclaims memory and runs other goroutines only when a
	// call yields; one yield per batch keeps guest memory flat.
	runtime.Gosched()
	v := byte(abi.Version)
	if len(buf) > 0 && buf[0] == abi.Version2 {
		v = abi.Version2 // the output answers in the input's version
	}
	out = abi.AppendOutputHeaderV(out[:0], v)
	arena = arena[:0]
	subReset()
	emitAt = -1
	if failed := run(buf); failed {
		return out
	}
	if emitAt >= 0 {
		emitAt = -1
		out = abi.AppendError(out, abi.ProgressIdle, "sdk: EmitStart without EmitEnd")
		return out
	}
	for i := range keys {
		if ks := &keys[i]; ks.dirty {
			out = abi.AppendStateOp(out, uint32(i), "", ks.val, !ks.present)
		}
	}
	for _, s := range subs {
		if s.dirty {
			out = abi.AppendStateOp(out, s.keyIdx, s.sub, s.val, !s.present)
		}
	}
	return out
}

// decodeHead decodes the input's header, its key table and the bounds of
// its timers and records sections. A malformed input panics (a bounds
// check, or malformedInput).
func decodeHead(b []byte) {
	le := binary.LittleEndian
	if b[0] != abi.Version && b[0] != abi.Version2 {
		panic(malformedInput{"version " + strconv.Itoa(int(b[0]))})
	}
	inVersion = b[0]
	inWatermark = int64(le.Uint64(b[1:]))
	inProcTime = int64(le.Uint64(b[9:]))
	off := abi.InputHeaderSize
	n := int(le.Uint32(b[off:]))
	off += 4
	if n > (len(b)-off)/abi.MinKeyEntrySize {
		panic(malformedInput{"key count larger than the input"})
	}
	keys = slices.Grow(keys[:0], n)[:n]
	for i := range keys {
		f := abi.Fetch(b[off])
		ks := off + 5
		ke := ks + int(le.Uint32(b[off+1:]))
		k := &keys[i]
		k.key = b[ks:ke:ke]
		k.val, k.known, k.present, k.dirty = nil, f != abi.NotFetched, f == abi.Present, false
		off = ke
		if f == abi.Present {
			vs := off + 4
			ve := vs + int(le.Uint32(b[off:]))
			k.val = b[vs:ve:ve]
			off = ve
		} else if f > abi.Present {
			panic(malformedInput{"key fetch flag"})
		}
	}
	nTimers = int(le.Uint32(b[off:]))
	off += 4
	if nTimers > (len(b)-off)/abi.TimerEntrySize {
		panic(malformedInput{"timer count larger than the input"})
	}
	end := off + nTimers*abi.TimerEntrySize
	timers = b[off:end]
	off = end
	nRecords = int(le.Uint32(b[off:]))
	off += 4
	if nRecords > (len(b)-off)/(abi.MinRecordEntrySize+2*int(inVersion-abi.Version)) {
		panic(malformedInput{"record count larger than the input"})
	}
	records = b[off:]
}

// run decodes the input and calls the callbacks for the batch's timers,
// then its records.
func run(buf []byte) (failed bool) {
	progress = abi.ProgressIdle
	defer func() {
		if v := recover(); v != nil {
			var msg string
			switch x := v.(type) {
			case hostFailure:
				msg = "host failure in " + x.what
			case malformedInput:
				msg = "sdk: malformed input: " + x.what
			default:
				msg = "panic: " + panicText(v)
				if progress == abi.ProgressIdle {
					msg = "sdk: malformed input: " + panicText(v)
				}
			}
			out = abi.AppendError(out, progress, msg)
			failed = true
		}
		progress = abi.ProgressIdle
	}()
	decodeHead(buf)
	op := registered
	if op.OnRecord == nil {
		out = abi.AppendError(out, abi.ProgressIdle, "sdk: no operator registered (call sdk.Register in init)")
		return true
	}
	le := binary.LittleEndian
	for i := 0; i < nTimers; i++ {
		e := timers[i*abi.TimerEntrySize : (i+1)*abi.TimerEntrySize]
		fl, ki, t := e[0], le.Uint32(e[1:]), int64(le.Uint64(e[5:]))
		k := &keys[ki]
		if fl&^1 != 0 {
			panic(malformedInput{"timer flags"})
		}
		if op.OnTimer == nil {
			continue
		}
		progress = abi.TimerSource(i)
		ctx = Context{keyIdx: ki, src: progress}
		if err := op.OnTimer(&ctx, Timer{Key: k.key, Time: t, Processing: fl&1 != 0}); err != nil {
			out = abi.AppendError(out, progress, err.Error())
			return true
		}
		progress = abi.ProgressIdle
	}
	onRecord := op.OnRecord
	rb := records
	off := 0
	sided := inVersion == abi.Version2
	side, del := 0, false
	for i := 0; i < nRecords; i++ {
		if sided {
			side, del = int(rb[off]), rb[off+1] == abi.KindDelete
			if rb[off+1] > abi.KindDelete {
				panic(malformedInput{"record kind"})
			}
			off += 2
		}
		e := rb[off : off+abi.MinRecordEntrySize : off+abi.MinRecordEntrySize]
		ki := le.Uint32(e)
		t := int64(le.Uint64(e[4:]))
		vs := off + abi.MinRecordEntrySize
		ve := vs + int(le.Uint32(e[12:]))
		v := rb[vs:ve:ve]
		off = ve
		k := &keys[ki]
		progress = int32(i)
		ctx.keyIdx, ctx.src = ki, int32(i)
		if err := onRecord(&ctx, Record{Key: k.key, Value: v, Time: t, Side: side, Delete: del}); err != nil {
			out = abi.AppendError(out, int32(i), err.Error())
			return true
		}
		progress = abi.ProgressIdle
	}
	if off != len(rb) {
		panic(malformedInput{"trailing bytes"})
	}
	return false
}

func panicText(v any) string {
	switch x := v.(type) {
	case error:
		return x.Error()
	case string:
		return x
	case interface{ String() string }:
		return x.String()
	case int:
		return strconv.Itoa(x)
	}
	return "(non-string panic value)"
}
