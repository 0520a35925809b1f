package wasm

// This file is the host-side face of the operator ABI: the types the engine
// hands to an operator instance and gets back. The engine's native Go
// operators use the same types, so a WASM stage and a native stage are
// interchangeable on the engine path.

// TimerDomain says which clock a timer follows.
type TimerDomain uint8

const (
	// EventTime timers fire when the watermark passes their time.
	EventTime TimerDomain = 0
	// ProcessingTime timers fire when the wall clock passes their time.
	ProcessingTime TimerDomain = 1
)

// Record is one input record of a batch.
type Record struct {
	Seq   uint64 // input stream sequence the record derives from
	Key   []byte
	Value []byte
	Time  int64 // event time, Unix milliseconds
	// Side is the input the record came from in a stage with two (0 or 1;
	// 0 otherwise). Only a module that speaks ABI v2 sees it.
	Side uint8
	// Delete marks a table input's delete: the key no longer has a value
	// (Value is empty). Only a module that speaks ABI v2 sees it.
	Delete bool
	// Port is the output port of the stage that emitted the record (0 for
	// an input record): where the record goes when no stage follows.
	Port int
}

// Timer is a fired timer handed to a keyed operator.
type Timer struct {
	Key    []byte
	Time   int64
	Domain TimerDomain
}

// Batch is the input of one operator call. Timers are processed before
// Records; both belong to the same key-group range (the slot's).
type Batch struct {
	Records   []Record
	Timers    []Timer
	Watermark int64 // current event-time watermark, Unix ms (math.MinInt64 when none yet)
	ProcTime  int64 // processing time at the call, Unix ms (only meaningful when the stage is granted the clock)
}

// Emit is one output record of a call.
type Emit struct {
	Key   []byte
	Value []byte
	Time  int64
	// Port is the stage's output port the emit goes to (0: the first, or
	// only, one; InstanceConfig.Ports bounds it).
	Port int
	// Input is the index in Batch.Records of the record being processed when
	// the guest emitted, or -1 when it was emitted while handling a timer.
	Input int
	// Timer is the index in Batch.Timers when Input is -1.
	Timer int
}

// StateOp is a write to the state of a key: a put, or a delete when Delete is set.
type StateOp struct {
	Key    []byte
	Sub    []byte
	Value  []byte
	Delete bool
}

// TimerOp registers or deletes a timer of a key.
type TimerOp struct {
	Key    []byte
	Time   int64
	Domain TimerDomain
	Delete bool
}

// LogLine is a line the guest logged during the call.
type LogLine struct {
	Level int // slog level numbers: -4 debug, 0 info, 4 warn, 8 error
	Msg   string
}

// Output is everything one call produced, in the order the guest produced it
// (per slice). Nothing of it has been applied yet: the engine applies the state
// and timer ops in one batch with the outputs' bookkeeping, so a failed call
// has no effect at all.
type Output struct {
	Emits  []Emit
	State  []StateOp
	Timers []TimerOp
	Logs   []LogLine
}

// State is the read side of a keyed stage's state, as the engine provides it.
// Reads see everything committed before the call. Writes travel back in
// Output.State; the SDK overlays them for reads within the same call.
type State interface {
	// Get returns the value of (key, sub); ok is false when absent or expired.
	Get(key, sub []byte) (value []byte, ok bool, err error)
	// Scan calls fn for every sub-key of key that starts with prefix, in sub-key order.
	Scan(key, prefix []byte, fn func(sub, value []byte) error) error
}
