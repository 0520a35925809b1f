//go:build !wasip1

package sdk

import "cairn/operators/abi"

// Outside wasip1 there is no host: state reads find nothing and the config
// is empty. The package builds so that it can be documented and vetted.

func hostStateGet(key []byte, sub string, dst []byte) int64     { return abi.StateAbsent }
func hostStateScan(key []byte, prefix string, dst []byte) int64 { return 0 }
func hostLog(level int32, msg string)                           {}
func hostConfig() []byte                                        { return nil }

var _ = process // the entry point of a call on wasip1

// InputBuffer is the buffer the host writes a call's input into (none
// outside wasip1).
func InputBuffer() []byte { return nil }
