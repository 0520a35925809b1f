package wasm

import (
	"context"
	"errors"
	"fmt"

	"cairn/operators/abi"
)

// ErrNoMigration is returned by Instance.Migrate for a module that does
// not export cairn_migrate.
var ErrNoMigration = errors.New("wasm: module exports no cairn_migrate (register one with sdk.RegisterMigration)")

// MigrateError is a migration call that failed: the guest's error (or
// trap) and the input entry it was at (-1 when unknown).
type MigrateError struct {
	Module string
	Entry  int
	Reason string
	Err    error
}

func (e *MigrateError) Error() string {
	if e.Entry >= 0 {
		return fmt.Sprintf("wasm: migration %q failed at entry %d of the call: %s", e.Module, e.Entry, e.Reason)
	}
	return fmt.Sprintf("wasm: migration %q failed: %s", e.Module, e.Reason)
}

func (e *MigrateError) Unwrap() error { return e.Err }

// StateVersion is the state version the module declares: what its
// cairn_state_version export returns, 0 when it has none.
func (i *Instance) StateVersion(ctx context.Context) (int, error) {
	f := i.mod.ExportedFunction(abi.ExportStateVersion)
	if f == nil {
		return 0, nil
	}
	if !i.guard.enter() {
		return 0, ErrInstanceUnusable
	}
	defer i.guard.exit()
	res, err := f.Call(ctx)
	if err != nil {
		i.unusable = true
		return 0, fmt.Errorf("wasm: module %q: %s: %w", i.m.name, abi.ExportStateVersion, err)
	}
	return int(int32(uint32(res[0]))), nil
}

// CanMigrate reports whether the module exports cairn_migrate.
func (i *Instance) CanMigrate() bool { return i.mod.ExportedFunction(abi.ExportMigrate) != nil }

// Migrate runs one cairn_migrate call over in, a migrate input of n entries
// (abi.AppendMigrateInput, abi.AppendEntry), and calls fn with every entry
// of the new state the guest wrote and the index of the input entry it
// came from. The entry's slices are valid until fn returns. On a failure
// (a *MigrateError, or fn's error) the instance is unusable when the guest
// trapped.
func (i *Instance) Migrate(ctx context.Context, in []byte, n int, fn func(source int32, e *abi.Entry) error) error {
	if i.unusable {
		return ErrInstanceUnusable
	}
	f := i.mod.ExportedFunction(abi.ExportMigrate)
	if f == nil {
		return ErrNoMigration
	}
	if !i.guard.enter() {
		i.unusable = true
		return ErrInstanceUnusable
	}
	defer i.guard.exit()
	fail := func(src int32, reason string, err error) error {
		i.unusable = true
		return &MigrateError{Module: i.m.name, Entry: int(src), Reason: reason, Err: err}
	}
	if err := i.ensureInput(ctx, len(in)); err != nil {
		return fail(-1, "allocate input: "+firstLine(err.Error()), err)
	}
	if !i.mem.Write(i.inPtr, in) {
		return fail(-1, "input buffer out of guest memory", nil)
	}
	i.stderr.reset()
	i.stack[0] = uint64(len(in))
	cctx := &i.cctx
	cctx.Context = ctx
	if err := f.CallWithStack(cctx, i.stack[:]); err != nil {
		src := int32(-1)
		if v, ok := i.mem.ReadUint32Le(i.progressPtr); ok && int32(v) >= 0 {
			src = int32(v)
		}
		reason := i.stderr.reason()
		if reason == "" {
			reason = firstLine(err.Error())
		}
		return fail(src, reason, err)
	}
	ptr, size := uint32(i.stack[0]>>32), uint32(i.stack[0])
	view, ok := i.mem.Read(ptr, size)
	if !ok {
		return fail(-1, fmt.Sprintf("output buffer [%d, +%d) outside guest memory", ptr, size), ErrBadOutput)
	}
	var fnErr error
	gf, err := abi.DecodeMigrateOutput(view, n, func(src int32, e *abi.Entry) error {
		if fnErr == nil {
			fnErr = fn(src, e)
		}
		return nil
	})
	if err != nil {
		return fail(-1, err.Error(), fmt.Errorf("%w: %w", ErrBadOutput, err))
	}
	if gf != nil {
		src := gf.Source
		if src < 0 {
			src = -1
		}
		i.unusable = false // the guest failed cleanly; the instance is fine
		return &MigrateError{Module: i.m.name, Entry: int(src), Reason: gf.Message}
	}
	return fnErr
}

// Module returns the module compiled under hash (Module.Hash), if this
// runtime compiled it.
func (r *Runtime) Module(hash string) (*Module, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.mu.modules[hash]
	return m, ok
}
