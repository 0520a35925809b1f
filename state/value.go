package state

import (
	"encoding/binary"
	"fmt"
)

// Value-state header. Every KindValue entry is stored as
//
//	flag (1 byte) | [expiry (8 bytes, big-endian Unix milliseconds) if flag = 1] | value
//
//	flag 0: no expiry (the stage had no TTL when the value was written)
//	flag 1: the value expires at expiry; reads at or after it see nothing
//
// The header makes the stored format self-describing whatever the current TTL
// configuration: turning a stage's TTL on or off does not make old entries
// unreadable, and an entry written with an expiry keeps it (reads and
// SweepExpired honour the stored expiry, not the current config). It costs one
// byte per entry without TTL and nine with. Timer and counter entries carry no
// header.
//
// INVARIANT: part of the on-disk format (FormatVersion); flags other than 0
// and 1 are reserved and rejected as ErrCorruptValue.
const (
	valueNoExpiry  byte = 0
	valueHasExpiry byte = 1
	expiryLen           = 8
)

// valueHeaderLen is the header length for a value with or without expiry.
func valueHeaderLen(ttl bool) int {
	if ttl {
		return 1 + expiryLen
	}
	return 1
}

// putValueHeader writes the header into dst (which must be valueHeaderLen
// long) and returns the number of bytes written.
func putValueHeader(dst []byte, ttl bool, expiryMs int64) int {
	if !ttl {
		dst[0] = valueNoExpiry
		return 1
	}
	dst[0] = valueHasExpiry
	binary.BigEndian.PutUint64(dst[1:], uint64(expiryMs))
	return 1 + expiryLen
}

// decodeValue splits a stored value into its payload and expiry. hasExpiry is
// false for entries without one. The payload aliases raw.
func decodeValue(raw []byte) (payload []byte, expiryMs int64, hasExpiry bool, err error) {
	if len(raw) == 0 {
		return nil, 0, false, fmt.Errorf("decode value: empty: %w", ErrCorruptValue)
	}
	switch raw[0] {
	case valueNoExpiry:
		return raw[1:], 0, false, nil
	case valueHasExpiry:
		if len(raw) < 1+expiryLen {
			return nil, 0, false, fmt.Errorf("decode value: short expiry: %w", ErrCorruptValue)
		}
		return raw[1+expiryLen:], int64(binary.BigEndian.Uint64(raw[1:])), true, nil
	}
	return nil, 0, false, fmt.Errorf("decode value: unknown header flag %d: %w", raw[0], ErrCorruptValue)
}

// expired reports whether an entry with the given expiry is invisible at nowMs.
func expired(expiryMs int64, hasExpiry bool, nowMs int64) bool {
	return hasExpiry && nowMs >= expiryMs
}

// DecodeValue splits a stored value-state entry, as ScanRaw yields it, into
// its payload and expiry (hasExpiry false: none). The payload aliases raw.
func DecodeValue(raw []byte) (payload []byte, expiryMs int64, hasExpiry bool, err error) {
	return decodeValue(raw)
}

// EncodeValue is the stored form of a value-state entry with payload and,
// when hasExpiry, the expiry in Unix milliseconds: the inverse of
// DecodeValue, for tools that build state outside a running job.
func EncodeValue(payload []byte, expiryMs int64, hasExpiry bool) []byte {
	b := make([]byte, valueHeaderLen(hasExpiry)+len(payload))
	n := putValueHeader(b, hasExpiry, expiryMs)
	copy(b[n:], payload)
	return b
}

// AppendValue is EncodeValue appending to dst.
func AppendValue(dst, payload []byte, expiryMs int64, hasExpiry bool) []byte {
	var h [1 + expiryLen]byte
	n := putValueHeader(h[:], hasExpiry, expiryMs)
	return append(append(dst, h[:n]...), payload...)
}
