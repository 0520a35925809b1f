// Package wasm runs cairn operators compiled to WebAssembly, through wazero.
// It is the only package that imports wazero: it owns the host side of the
// operator ABI (module cairn_v1, see docs/ABI.md and cairn/operators/abi),
// module compilation and caching, and the limits an instance runs under
// (memory pages, a per-call deadline, module size, no filesystem, network,
// clock or environment).
//
// Use: one Runtime per process; Compile each module once (by content hash);
// Instantiate it per slot; call Process once per batch. After a trap the
// instance is unusable: close it and instantiate a fresh one.
package wasm

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"cairn/operators/abi"
)

// DefaultMaxModuleBytes is the module size limit when RuntimeConfig.MaxModuleBytes is 0.
const DefaultMaxModuleBytes = 32 << 20

// DefaultMemoryPages is the memory limit (in 64 KiB pages, 256 MiB) when
// InstanceConfig.MemoryPages is 0.
const DefaultMemoryPages = 4096

// RuntimeConfig configures a Runtime.
type RuntimeConfig struct {
	// CacheDir is wazero's on-disk compilation cache; "" keeps compiled code
	// in memory only.
	CacheDir string
	// MaxModuleBytes refuses larger modules before compiling; 0 means
	// DefaultMaxModuleBytes.
	MaxModuleBytes int
}

// Runtime compiles and instantiates operator modules. It is safe for
// concurrent use.
type Runtime struct {
	cfg   RuntimeConfig
	cache wazero.CompilationCache
	// mem is how guest memory is allocated (memory.go); tests change it
	// before the first Compile.
	mem memoryMode

	mu struct {
		sync.Mutex
		closed bool
		// engines holds one wazero runtime per limit combination: the memory
		// limit and close-on-context-done are runtime-wide settings in wazero.
		engines map[engineKey]*engine
		// modules caches compiled modules by hash.
		modules map[string]*Module
	}
}

type engineKey struct {
	deadline bool   // WithCloseOnContextDone(true)
	pages    uint32 // WithMemoryLimitPages
}

// engineKeyOf is the engine the instances c describes run on.
func engineKeyOf(c InstanceConfig) engineKey {
	return engineKey{deadline: c.Deadline > 0, pages: cmp.Or(c.MemoryPages, DefaultMemoryPages)}
}

type engine struct {
	rt       wazero.Runtime
	compiled map[string]wazero.CompiledModule // by module hash
}

// NewRuntime returns a Runtime.
func NewRuntime(ctx context.Context, c RuntimeConfig) (*Runtime, error) {
	if c.MaxModuleBytes <= 0 {
		c.MaxModuleBytes = DefaultMaxModuleBytes
	}
	r := &Runtime{cfg: c, mem: defaultMemoryMode()}
	if c.CacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(c.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("wasm: compilation cache %s: %w", c.CacheDir, err)
		}
		r.cache = cache
	} else {
		r.cache = wazero.NewCompilationCache()
	}
	r.mu.engines = map[engineKey]*engine{}
	r.mu.modules = map[string]*Module{}
	return r, nil
}

// Close closes every instance, module and wazero runtime of r. It may be
// called while instances run: a call in progress fails (at once with a
// Deadline, else when the guest returns) and its instance's memory is
// released after it.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return nil
	}
	r.mu.closed = true
	var errs []error
	for _, e := range r.mu.engines {
		errs = append(errs, e.rt.Close(ctx))
	}
	errs = append(errs, r.cache.Close(ctx))
	return errors.Join(errs...)
}

// engineLocked returns (creating it on first use) the wazero runtime for k.
func (r *Runtime) engineLocked(ctx context.Context, k engineKey) (*engine, error) {
	if e, ok := r.mu.engines[k]; ok {
		return e, nil
	}
	rc := wazero.NewRuntimeConfigCompiler().
		WithCompilationCache(r.cache).
		WithMemoryLimitPages(k.pages).
		WithCloseOnContextDone(k.deadline)
	if r.mem == memCapFromMax {
		rc = rc.WithMemoryCapacityFromMax(true)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("wasm: instantiate WASI: %w", err)
	}
	if err := instantiateHost(ctx, rt); err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("wasm: instantiate host module %s: %w", abi.ImportModule, err)
	}
	e := &engine{rt: rt, compiled: map[string]wazero.CompiledModule{}}
	r.mu.engines[k] = e
	return e, nil
}

// Module is a compiled operator module.
type Module struct {
	r    *Runtime
	name string
	hash string
	wasm []byte
	// version is the ABI version the module speaks (abi.Version or
	// abi.Version2), from the host module it imports.
	version uint8
	// stateVersion: the module exports abi.ExportStateVersion (without it
	// its state version is 0, and nothing need run to ask).
	stateVersion bool
}

// ABIVersion is the operator ABI version the module speaks: 1, or 2 (it
// sees each record's input side).
func (m *Module) ABIVersion() int { return int(m.version) }

// DeclaresStateVersion reports whether the module exports its state
// version; a module that does not declares 0 (Instance.StateVersion).
func (m *Module) DeclaresStateVersion() bool { return m.stateVersion }

// Hash returns the hex SHA-256 of the module's bytes.
func (m *Module) Hash() string { return m.hash }

// Name returns the name the module was first compiled under.
func (m *Module) Name() string { return m.name }

// Compile validates and compiles a module, once per process per content
// hash (and from the on-disk cache when configured). Errors wrap
// ErrModuleTooLarge, ErrInvalidModule, ErrABIVersion or ErrNotOperator.
func (r *Runtime) Compile(ctx context.Context, name string, wasm []byte) (*Module, error) {
	return r.CompileFor(ctx, name, wasm, InstanceConfig{})
}

// CompileFor is Compile for the instances c describes: their memory limit
// and deadline choose the wazero runtime a module is compiled for, and one
// compiled for another is compiled again by the first Instantiate (tens of
// milliseconds for a Go module even from the on-disk cache, which still
// decodes and validates it). Compiling for the instances' runtime at once
// spares a job's start that second compile.
func (r *Runtime) CompileFor(ctx context.Context, name string, wasm []byte, c InstanceConfig) (*Module, error) {
	if len(wasm) > r.cfg.MaxModuleBytes {
		return nil, fmt.Errorf("%w: module %q is %d bytes, the limit is %d (RuntimeConfig.MaxModuleBytes)",
			ErrModuleTooLarge, name, len(wasm), r.cfg.MaxModuleBytes)
	}
	sum := sha256.Sum256(wasm)
	hash := hex.EncodeToString(sum[:])
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return nil, ErrClosed
	}
	if m, ok := r.mu.modules[hash]; ok {
		return m, nil
	}
	m := &Module{r: r, name: name, hash: hash, wasm: append([]byte(nil), wasm...)}
	if _, err := r.compiledLocked(ctx, m, engineKeyOf(c)); err != nil {
		return nil, err
	}
	r.mu.modules[hash] = m
	return m, nil
}

// compiledLocked returns m compiled for engine k.
func (r *Runtime) compiledLocked(ctx context.Context, m *Module, k engineKey) (wazero.CompiledModule, error) {
	e, err := r.engineLocked(ctx, k)
	if err != nil {
		return nil, err
	}
	if c, ok := e.compiled[m.hash]; ok {
		return c, nil
	}
	c, err := e.rt.CompileModule(ctx, m.wasm)
	if err != nil {
		return nil, fmt.Errorf("%w: module %q: %w", ErrInvalidModule, m.name, err)
	}
	v, err := checkOperator(m.name, c)
	if err != nil {
		_ = c.Close(ctx)
		return nil, err
	}
	m.version = v
	_, m.stateVersion = c.ExportedFunctions()[abi.ExportStateVersion]
	e.compiled[m.hash] = c
	return c, nil
}

// hostImports are the functions of abi.ImportModule the host provides.
var hostImports = map[string]bool{
	abi.ImportStateGet: true, abi.ImportStateGetMany: true, abi.ImportStateScan: true, abi.ImportLog: true, abi.ImportConfig: true,
}

// checkOperator refuses a module that does not speak ABI v1 or v2, and
// returns the version it speaks: the one of the host module it imports (a
// module importing neither speaks v1).
func checkOperator(name string, c wazero.CompiledModule) (uint8, error) {
	version := uint8(0)
	for _, f := range c.ImportedFunctions() {
		mod, fn, _ := f.Import()
		switch {
		case mod == abi.ImportModule || mod == abi.ImportModuleV2:
			if !hostImports[fn] {
				return 0, fmt.Errorf("%w: module %q imports %s.%s, which this host does not provide", ErrNotOperator, name, mod, fn)
			}
			v := uint8(abi.Version)
			if mod == abi.ImportModuleV2 {
				v = abi.Version2
			}
			if version != 0 && version != v {
				return 0, fmt.Errorf("%w: module %q imports both %s and %s; an operator speaks one ABI version", ErrNotOperator, name, abi.ImportModule, abi.ImportModuleV2)
			}
			version = v
		case mod == wasi_snapshot_preview1.ModuleName:
		case strings.HasPrefix(mod, "cairn_"):
			return 0, fmt.Errorf("%w: module %q was built for ABI %q (it imports %s.%s); this host speaks %q and %q: rebuild the operator with the current cairn SDK",
				ErrABIVersion, name, mod, mod, fn, abi.ImportModule, abi.ImportModuleV2)
		default:
			return 0, fmt.Errorf("%w: module %q imports %s.%s; operators may import only %s (or %s) and %s",
				ErrNotOperator, name, mod, fn, abi.ImportModule, abi.ImportModuleV2, wasi_snapshot_preview1.ModuleName)
		}
	}
	if version == 0 {
		version = abi.Version
	}
	exports := c.ExportedFunctions()
	for _, want := range []struct {
		name            string
		params, results []api.ValueType
	}{
		{abi.ExportAlloc, []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}},
		{abi.ExportProcess, []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}},
		{abi.ExportProgress, nil, []api.ValueType{api.ValueTypeI32}},
	} {
		def, ok := exports[want.name]
		if !ok {
			return 0, fmt.Errorf("%w: module %q does not export %s (build it with the cairn SDK, -buildmode=c-shared)", ErrNotOperator, name, want.name)
		}
		if !sameTypes(def.ParamTypes(), want.params) || !sameTypes(def.ResultTypes(), want.results) {
			return 0, fmt.Errorf("%w: module %q exports %s with the wrong signature", ErrNotOperator, name, want.name)
		}
	}
	return version, nil
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Interface describes a compiled module for people: its imports and
// exported functions ("module.name"), and its memory's initial and maximum
// size in 64 KiB pages (max 0: none declared).
type Interface struct {
	Imports, Exports []string
	MemoryMin        uint32
	MemoryMax        uint32
}

// Interface returns what m imports and exports (Compile already checked
// them against the ABI).
func (m *Module) Interface(ctx context.Context) (Interface, error) {
	r := m.r
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.compiledLocked(ctx, m, engineKey{pages: DefaultMemoryPages})
	if err != nil {
		return Interface{}, err
	}
	var in Interface
	for _, f := range c.ImportedFunctions() {
		mod, fn, _ := f.Import()
		in.Imports = append(in.Imports, mod+"."+fn)
	}
	for name := range c.ExportedFunctions() {
		in.Exports = append(in.Exports, name)
	}
	sort.Strings(in.Imports)
	sort.Strings(in.Exports)
	for _, mem := range c.ExportedMemories() {
		in.MemoryMin = mem.Min()
		if mx, ok := mem.Max(); ok {
			in.MemoryMax = mx
		}
	}
	return in, nil
}
