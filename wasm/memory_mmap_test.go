//go:build linux || darwin

package wasm

import (
	"testing"
	"unsafe"
)

// TestLinearMemory checks the mmap LinearMemory against wazero's contract:
// Reallocate keeps the contents (and here the address), refuses to go past
// the maximum; Free unmaps, deferred while a call is in progress.
func TestLinearMemory(t *testing.T) {
	g := newMemGuard()
	a := g.Allocate(0, 3<<16)
	lm, ok := a.(*mmapMemory)
	if !ok {
		t.Fatalf("allocated a %T", a)
	}
	b := lm.Reallocate(1 << 16)
	if len(b) != 1<<16 {
		t.Fatalf("len %d", len(b))
	}
	b[0], b[len(b)-1] = 7, 8
	b2 := lm.Reallocate(3 << 16)
	if len(b2) != 3<<16 || b2[0] != 7 || b2[1<<16-1] != 8 || b2[3<<16-1] != 0 {
		t.Fatal("contents not kept or new memory not zero")
	}
	if unsafe.SliceData(b2) != unsafe.SliceData(b) {
		t.Fatal("mmap memory moved")
	}
	if lm.Reallocate(3<<16+1) != nil {
		t.Fatal("grew past the maximum")
	}
	lm.Free() // during "instantiation": deferred
	if lm.mapping == nil {
		t.Fatal("unmapped during a call")
	}
	if g.enter() {
		t.Fatal("a call may start after Free")
	}
	g.exit()
	if lm.mapping != nil {
		t.Fatal("not unmapped when the call ended")
	}
	if lm.Reallocate(1<<16) != nil {
		t.Fatal("Reallocate after Free")
	}
}
