//go:build wasip1

package upgrade

import (
	"unsafe"

	"cairn/operators/abi"
	"cairn/operators/sdk"
)

//go:wasmexport cairn_state_version
func cairnStateVersion() int32 { return stateVersion() }

// cairn_migrate reads its input where the host wrote it: the buffer the
// last cairn_alloc returned (sdk's).
//
//go:wasmexport cairn_migrate
func cairnMigrate(n uint32) uint64 {
	in := sdk.InputBuffer()
	var o []byte
	if int(n) > len(in) {
		out = abi.AppendMigrateError(append(out[:0], abi.MigrateVersion), -1, "sdk: input longer than the allocated buffer")
		o = out
	} else {
		o = migrate(in[:n])
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(o))))<<32 | uint64(len(o))
}
