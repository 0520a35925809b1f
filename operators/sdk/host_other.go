//go:build !wasip1

package sdk

import (
	"encoding/binary"

	"cairn/operators/abi"
)

// Outside wasip1 there is no host: state reads find nothing and the config
// is empty. The package builds so that it can be documented and vetted.

func hostStateGet(key []byte, sub string, dst []byte) int64 { return abi.StateAbsent }

// hostStateGetMany answers every sub-key of req as absent.
func hostStateGetMany(key, req, dst []byte) int64 {
	n := int64(0)
	for len(req) >= 4 {
		l := int(binary.LittleEndian.Uint32(req))
		req = req[4+l:]
		if int(n)+4 <= len(dst) {
			binary.LittleEndian.PutUint32(dst[n:], uint32(abi.StateAbsent&0xffffffff))
		}
		n += 4
	}
	return n
}

func hostStateScan(key []byte, prefix string, dst []byte) int64 { return 0 }
func hostLog(level int32, msg string)                           {}
func hostConfig() []byte                                        { return nil }

var _ = process // the entry point of a call on wasip1

// InputBuffer is the buffer the host writes a call's input into (none
// outside wasip1).
func InputBuffer() []byte { return nil }
