package wasm

import (
	"sync"

	"github.com/tetratelabs/wazero/experimental"
)

// Guest memory.
//
// wazero's default linear memory is a Go []byte that memory.grow extends
// with append: every grow past the capacity allocates a buffer about 1.25×
// larger, zeroes it and copies the old one into it (so even pages the guest
// never wrote become resident), and the old buffer stays resident as garbage
// until a GC — which GOGC=100 lets wait until the heap is twice the live
// heap, and the live heap includes every instance's memory. An instance
// grown to a 256 MiB limit cost the host about 1.1 GB of RSS, two about
// 1.8 GB, and nothing came back at Close before the next GC
// (BenchmarkGuestMemoryGrow; TestGuestMemoryRSS fails with memHeap).
//
// wazero's WithMemoryCapacityFromMax (memCapFromMax) removes the copies but
// keeps the memory in the Go heap: the GC's goal still doubles with it (the
// host's own garbage can then grow by the limit × instances before a GC),
// closed instances' memory stays until a GC, and a module that declares a
// maximum over the instance's limit is refused instead of limited.
//
// So on Linux and macOS each instance's memory is its own mapping, outside
// the Go heap (memMmap): the maximum (the instance's limit, or the module's
// declared maximum when smaller) is reserved up front as inaccessible
// address space, memory.grow makes the next pages read-write in place (no
// copy, the slice's address never changes), only the pages the guest
// touches become resident, and closing the instance unmaps it at once.

// memoryMode is how a Runtime backs guest memory.
type memoryMode int

const (
	// memMmap: one mapping per instance reserved at the maximum, committed
	// as the guest grows, unmapped on close (linux, darwin).
	memMmap memoryMode = iota
	// memHeap: wazero's default, a Go []byte copied on growth.
	memHeap
	// memCapFromMax: wazero's WithMemoryCapacityFromMax, a Go []byte
	// allocated at the maximum capacity up front.
	memCapFromMax
)

func (m memoryMode) String() string {
	switch m {
	case memMmap:
		return "mmap"
	case memHeap:
		return "heap"
	case memCapFromMax:
		return "capfrommax"
	}
	return "?"
}

// defaultMemoryMode is memMmap where the platform supports it.
func defaultMemoryMode() memoryMode {
	if mmapSupported {
		return memMmap
	}
	return memHeap
}

// memGuard is the memory allocator of one instance (memMmap), and keeps its
// memory mapped while the host or the guest may touch it: a Runtime.Close
// from another goroutine closes the instance's module (and so frees its
// memory) even during a call, and an access to an unmapped page is a fatal
// fault, not a Go panic. Free during a call (or during instantiation)
// therefore only marks the memory freed; the call's exit unmaps it.
type memGuard struct {
	mu      sync.Mutex
	busy    int  // calls (or the instantiation) in progress
	freed   bool // a memory was freed: no more calls
	pending []func()
}

// newMemGuard returns a guard for an instance being instantiated: it counts
// as one call until exit.
func newMemGuard() *memGuard { return &memGuard{busy: 1} }

// Allocate implements experimental.MemoryAllocator.
func (g *memGuard) Allocate(_, max uint64) experimental.LinearMemory {
	return newLinearMemory(g, max)
}

// enter starts a call; false when the memory is gone (the instance's module
// was closed). A nil guard (another memoryMode) always allows the call.
func (g *memGuard) enter() bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.freed {
		return false
	}
	g.busy++
	return true
}

// exit ends a call, and releases memory freed during it when it was the last.
func (g *memGuard) exit() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.busy--
	var run []func()
	if g.busy == 0 {
		run, g.pending = g.pending, nil
	}
	g.mu.Unlock()
	for _, f := range run {
		f()
	}
}

// release runs unmap now, or when the calls in progress end.
func (g *memGuard) release(unmap func()) {
	g.mu.Lock()
	g.freed = true
	if g.busy > 0 {
		g.pending = append(g.pending, unmap)
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	unmap()
}

// heapMemory is a LinearMemory in the Go heap, grown like wazero's own (the
// fallback when a mapping cannot be made).
type heapMemory struct {
	g   *memGuard
	buf []byte
	max uint64
}

func (m *heapMemory) Reallocate(size uint64) []byte {
	if size > m.max {
		return nil
	}
	if n := uint64(len(m.buf)); size > n {
		m.buf = append(m.buf, make([]byte, size-n)...)
	}
	return m.buf[:size]
}

func (m *heapMemory) Free() { m.g.release(func() { m.buf = nil }) }
