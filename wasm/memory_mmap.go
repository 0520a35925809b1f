//go:build linux || darwin

package wasm

import (
	"math"
	"os"
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

const mmapSupported = true

var pageSize = uint64(os.Getpagesize())

// mmapMemory is a linear memory in its own mapping: the maximum reserved
// PROT_NONE (address space only: not resident, not charged to the commit
// limit), [0, committed) read-write.
type mmapMemory struct {
	g         *memGuard
	mapping   []byte // as returned by mmap: the whole reservation
	committed uint64
	max       uint64
}

// newLinearMemory reserves maxBytes; it falls back to a Go-heap memory
// when the address space cannot be reserved (a 32-bit host, a ulimit -v).
func newLinearMemory(g *memGuard, maxBytes uint64) experimental.LinearMemory {
	reserve := max(roundUp(maxBytes, pageSize), pageSize)
	if reserve > math.MaxInt {
		return &heapMemory{g: g, max: maxBytes}
	}
	b, err := syscall.Mmap(-1, 0, int(reserve), syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return &heapMemory{g: g, max: maxBytes}
	}
	return &mmapMemory{g: g, mapping: b, max: maxBytes}
}

// Reallocate implements experimental.LinearMemory: the same memory, size
// bytes long; new pages are zero (fresh anonymous memory). nil (memory.grow
// fails: the guest runs out of memory) over max or when the OS refuses.
func (m *mmapMemory) Reallocate(size uint64) []byte {
	if m.mapping == nil || size > m.max {
		return nil
	}
	if need := roundUp(size, pageSize); need > m.committed {
		if err := syscall.Mprotect(m.mapping[m.committed:need], syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
			return nil
		}
		m.committed = need
	}
	return m.mapping[:size:size]
}

// Free implements experimental.LinearMemory: unmaps the memory, at once or
// when the instance's call in progress returns.
func (m *mmapMemory) Free() {
	m.g.release(func() {
		if m.mapping != nil {
			_ = syscall.Munmap(m.mapping)
			m.mapping = nil
		}
	})
}

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }
