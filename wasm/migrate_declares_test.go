package wasm

import (
	"context"
	"testing"

	"cairn/operators/builtin"
)

// TestDeclaresStateVersion: a module without the state-version export
// declares none, known from its compilation without an instance.
func TestDeclaresStateVersion(t *testing.T) {
	ctx := context.Background()
	rt, err := NewRuntime(ctx, RuntimeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	code, ok := builtin.Lookup("count")
	if !ok {
		t.Fatal("no builtin count")
	}
	m, err := rt.Compile(ctx, "count", code)
	if err != nil {
		t.Fatal(err)
	}
	if m.DeclaresStateVersion() {
		t.Fatal("builtin count declares a state version; it exports none")
	}
}
