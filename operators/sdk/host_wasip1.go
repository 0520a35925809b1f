//go:build wasip1

package sdk

import (
	"unsafe"

	"cairn/operators/abi"
)

// Host functions of module cairn_v2 (see docs/ABI.md): version 1's, with
// the input side of every record in the input buffer.

// The host reads the buffers during the call and keeps no reference to
// them: noescape lets callers pass stack-allocated sub-keys.

//go:wasmimport cairn_v2 state_get
//go:noescape
func cairnStateGet(keyPtr unsafe.Pointer, keyLen uint32, subPtr unsafe.Pointer, subLen uint32, dstPtr unsafe.Pointer, dstCap uint32) int64

//go:wasmimport cairn_v2 state_scan
//go:noescape
func cairnStateScan(keyPtr unsafe.Pointer, keyLen uint32, prefixPtr unsafe.Pointer, prefixLen uint32, dstPtr unsafe.Pointer, dstCap uint32) int64

//go:wasmimport cairn_v2 state_get_many
//go:noescape
func cairnStateGetMany(keyPtr unsafe.Pointer, keyLen uint32, reqPtr unsafe.Pointer, reqLen uint32, dstPtr unsafe.Pointer, dstCap uint32) int64

//go:wasmimport cairn_v2 log
func cairnLog(level int32, ptr unsafe.Pointer, n uint32)

//go:wasmimport cairn_v2 config
func cairnConfig(dstPtr unsafe.Pointer, dstCap uint32) uint32

func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}

func stringPtr(s string) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.StringData(s))
}

func hostStateGet(key []byte, sub string, dst []byte) int64 {
	return cairnStateGet(bytesPtr(key), uint32(len(key)), stringPtr(sub), uint32(len(sub)), bytesPtr(dst), uint32(len(dst)))
}

func hostStateGetMany(key, req, dst []byte) int64 {
	return cairnStateGetMany(bytesPtr(key), uint32(len(key)), bytesPtr(req), uint32(len(req)), bytesPtr(dst), uint32(len(dst)))
}

func hostStateScan(key []byte, prefix string, dst []byte) int64 {
	return cairnStateScan(bytesPtr(key), uint32(len(key)), stringPtr(prefix), uint32(len(prefix)), bytesPtr(dst), uint32(len(dst)))
}

func hostLog(level int32, msg string) { cairnLog(level, stringPtr(msg), uint32(len(msg))) }

func hostConfig() []byte {
	buf := make([]byte, 256)
	for {
		n := cairnConfig(bytesPtr(buf), uint32(len(buf)))
		if int(n) <= len(buf) {
			return buf[:n]
		}
		buf = make([]byte, n)
	}
}

// Exports called by the host.

var inBuf []byte

//go:wasmexport cairn_alloc
func cairnAlloc(size uint32) uint32 {
	if size == 0 {
		size = 1
	}
	inBuf = make([]byte, size)
	return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(inBuf))))
}

//go:wasmexport cairn_process
func cairnProcess(n uint32) uint64 {
	if int(n) > len(inBuf) {
		out = abi.AppendError(abi.AppendOutputHeader(out[:0]), abi.ProgressIdle, "sdk: input longer than the allocated buffer")
	} else {
		process(inBuf[:n])
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(out))))<<32 | uint64(len(out))
}

//go:wasmexport cairn_progress
func cairnProgress() uint32 {
	return uint32(uintptr(unsafe.Pointer(&progress)))
}

// InputBuffer is the buffer the host writes a call's input into: the last
// one cairn_alloc returned. Package upgrade's export reads its input there.
func InputBuffer() []byte { return inBuf }
