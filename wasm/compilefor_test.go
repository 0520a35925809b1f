package wasm

import (
	"context"
	"testing"
	"time"

	"cairn/operators/builtin"
)

// compiledFor reports for which engines of r module hash is compiled.
func compiledFor(r *Runtime, hash string) []engineKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ks []engineKey
	for k, e := range r.mu.engines {
		if _, ok := e.compiled[hash]; ok {
			ks = append(ks, k)
		}
	}
	return ks
}

// TestCompileForCompilesOnce: a module compiled for its instances' memory
// limit and deadline is compiled for their engine only, and instantiating
// it compiles nothing more; Compile compiles for the default instances.
func TestCompileForCompilesOnce(t *testing.T) {
	ctx := context.Background()
	r, err := NewRuntime(ctx, RuntimeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	code, ok := builtin.Lookup("count")
	if !ok {
		t.Fatal("no builtin count")
	}
	c := InstanceConfig{Stage: "count", Slot: 0, MemoryPages: 256, Deadline: time.Second}
	m, err := r.CompileFor(ctx, "count", code, c)
	if err != nil {
		t.Fatal(err)
	}
	want := engineKey{deadline: true, pages: 256}
	if ks := compiledFor(r, m.Hash()); len(ks) != 1 || ks[0] != want {
		t.Fatalf("compiled for %v, want only %v", ks, want)
	}
	i, err := m.Instantiate(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	i.Close(ctx)
	if ks := compiledFor(r, m.Hash()); len(ks) != 1 {
		t.Fatalf("after instantiating: compiled for %v, want only %v", ks, want)
	}
	// Another limit is another engine: compiled when first instantiated.
	i, err = m.Instantiate(ctx, InstanceConfig{Stage: "count", Slot: 1})
	if err != nil {
		t.Fatal(err)
	}
	i.Close(ctx)
	if ks := compiledFor(r, m.Hash()); len(ks) != 2 {
		t.Fatalf("after an instance with the default limit: compiled for %v, want two engines", ks)
	}
	split, ok := builtin.Lookup("split")
	if !ok {
		t.Fatal("no builtin split")
	}
	m2, err := r.Compile(ctx, "split", split)
	if err != nil {
		t.Fatal(err)
	}
	if ks := compiledFor(r, m2.Hash()); len(ks) != 1 || ks[0] != (engineKey{pages: DefaultMemoryPages}) {
		t.Fatalf("Compile compiled for %v, want the default instances' engine", ks)
	}
}
