package state

import (
	"errors"

	"github.com/cockroachdb/pebble/v2"
)

// ErrOutOfRange is returned when a read or write names a key group the DB
// does not own, or a key outside the range being built. It is a programming
// error of the caller.
var ErrOutOfRange = errors.New("state: key group out of range")

// ErrCorruptKey is returned when bytes are not a well-formed Pebble key of the
// state layout.
var ErrCorruptKey = errors.New("state: corrupt key")

// ErrCorruptValue is returned when a stored value does not carry a valid
// header (value.go) or a counter is not 8 bytes.
var ErrCorruptValue = errors.New("state: corrupt value")

// ErrUnsorted is returned by IngestSorted when keys are not strictly
// increasing.
var ErrUnsorted = errors.New("state: keys not in strictly increasing order")

// ErrNotEmpty is returned by IngestSorted when the destination already holds
// a DB or other files.
var ErrNotEmpty = errors.New("state: destination not empty")

// IsCorruption reports whether err means stored or supplied bytes are not in
// the state format.
func IsCorruption(err error) bool {
	return errors.Is(err, ErrCorruptKey) || errors.Is(err, ErrCorruptValue)
}

// IsStoredCorruption reports whether err means bytes the DB read are
// damaged: not in the state format, or a block Pebble found corrupt (a
// checksum mismatch of a table, local or read remotely).
func IsStoredCorruption(err error) bool {
	return IsCorruption(err) || pebble.IsCorruptionError(err)
}
