//go:build !(linux || darwin)

package wasm

import "github.com/tetratelabs/wazero/experimental"

// mmapSupported is false: guest memory is wazero's Go-heap []byte (memHeap).
const mmapSupported = false

func newLinearMemory(g *memGuard, maxBytes uint64) experimental.LinearMemory {
	return &heapMemory{g: g, max: maxBytes}
}
