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

// TestNexmarkStateVersionPerQuery: the nexmark module declares its state
// version by the query its config names: 2 for q15 and q16 (their sets of
// 64 ids), 1 for the others, so their checkpoints of version 1 still
// restore.
func TestNexmarkStateVersionPerQuery(t *testing.T) {
	ctx := context.Background()
	rt, err := NewRuntime(ctx, RuntimeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Compile(ctx, "nexmark", mustBuiltin(t, "nexmark"))
	if err != nil {
		t.Fatal(err)
	}
	for op, want := range map[string]int{"q14": 1, "q15": 2, "q16": 2, "q16_route": 1, "q17": 1, "q18": 1} {
		inst, err := m.Instantiate(ctx, InstanceConfig{Stage: "stats", Slot: -1, Config: []byte(`{"op":"` + op + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		v, err := inst.StateVersion(ctx)
		inst.Close(ctx)
		if err != nil || v != want {
			t.Errorf("%s: state version %d (%v), want %d", op, v, err, want)
		}
	}
}
