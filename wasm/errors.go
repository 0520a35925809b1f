package wasm

import (
	"errors"
	"fmt"
)

var (
	// ErrModuleTooLarge is returned by Compile for a module over RuntimeConfig.MaxModuleBytes.
	ErrModuleTooLarge = errors.New("wasm: module too large")
	// ErrInvalidModule is returned by Compile for bytes that are not a valid WebAssembly module.
	ErrInvalidModule = errors.New("wasm: invalid module")
	// ErrABIVersion is returned by Compile for a module built for another
	// version of the operator ABI (it imports cairn_vN with N != 1).
	ErrABIVersion = errors.New("wasm: unsupported operator ABI version")
	// ErrNotOperator is returned by Compile for a valid module that is not a
	// cairn operator (missing exports, or imports the host does not provide).
	ErrNotOperator = errors.New("wasm: not a cairn operator module")
	// ErrBadOutput is wrapped by the TrapError of a call whose output buffer
	// does not follow the ABI.
	ErrBadOutput = errors.New("wasm: malformed operator output")
	// ErrInstanceUnusable is returned by Process after a trap or Close: the
	// caller must close the instance and instantiate a fresh one.
	ErrInstanceUnusable = errors.New("wasm: instance unusable after a trap or close")
	// ErrClosed is returned by a closed Runtime.
	ErrClosed = errors.New("wasm: runtime closed")
)

// TrapError is a failed operator call: a WebAssembly trap, a guest panic or
// returned error, a deadline, memory exhaustion or a malformed output. It
// names the stage, the slot and the input sequence of the record being
// processed (the first record's when the guest could not tell; 0 with a
// Reason naming the timer when a timer was being processed).
type TrapError struct {
	Stage  string
	Slot   int
	Seq    uint64
	Reason string // "deadline exceeded" for a deadline
	Err    error  // the underlying error, if any
	// Returned is set when the operator returned the error itself (Reason
	// is its text) rather than trapping.
	Returned bool
}

// errGuestReturned marks, inside the package, a call the guest failed by
// returning an error.
var errGuestReturned = errors.New("wasm: the operator returned an error")

// ReasonDeadline is the Reason of a TrapError for a call that ran past its deadline.
const ReasonDeadline = "deadline exceeded"

func (e *TrapError) Error() string {
	if e.Returned {
		return fmt.Sprintf("wasm: stage %q slot %d: operator returned an error at input seq %d: %s", e.Stage, e.Slot, e.Seq, e.Reason)
	}
	return fmt.Sprintf("wasm: stage %q slot %d: operator trapped at input seq %d: %s", e.Stage, e.Slot, e.Seq, e.Reason)
}

func (e *TrapError) Unwrap() error { return e.Err }
