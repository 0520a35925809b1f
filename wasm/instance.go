package wasm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"cairn/operators/abi"
)

// InstanceConfig configures one instance of a module.
type InstanceConfig struct {
	Stage string
	Slot  int // -1 for stateless stages
	// Config is the operator's config (opaque bytes, JSON from the job file).
	Config []byte
	// Deadline bounds each call; 0 turns it off (a trusted operator: calls
	// are several times cheaper without the termination checks wazero's
	// close-on-context-done compiles in).
	Deadline time.Duration
	// MemoryPages limits guest memory, in 64 KiB pages; 0 means DefaultMemoryPages.
	MemoryPages uint32
	// Logger receives the guest's log lines; nil discards them.
	Logger *slog.Logger
	// Ports is the number of the stage's output ports (0 means 1): an
	// emit to a port at or above it is a malformed output.
	Ports int
}

// Instance is one instance of a module, for one slot. It is not safe for
// concurrent use: one goroutine (the slot's) calls it.
type Instance struct {
	m      *Module
	cfg    InstanceConfig
	logger *slog.Logger

	mod         api.Module
	mem         api.Memory
	guard       *memGuard // nil unless the runtime's memory is memMmap
	alloc       api.Function
	process     api.Function
	progressPtr uint32

	inPtr, inCap uint32 // the guest's input buffer
	enc          encoder
	scratch      abi.Output
	scanBuf      []byte
	getManyBuf   []byte
	stack        [1]uint64
	cctx         callCtx
	stderr       cappedBuffer

	// Per call: the state being read, and a failure of a host function.
	st       State
	hostErr  error
	hostTrap bool // hostErr is the guest's fault (a trap), not the host's

	unusable bool
}

// callCtx carries the instance to the host functions without allocating a
// context per call.
type callCtx struct {
	context.Context
	inst *Instance
}

type instanceKey struct{}

func (c *callCtx) Value(k any) any {
	if k == (instanceKey{}) {
		return c.inst
	}
	return c.Context.Value(k)
}

// errStateless is the trap of a state access in a stateless stage.
var errStateless = errors.New("state access in a stateless stage")

const minInputBuffer = 64 << 10

// Instantiate creates an instance with its own memory and runs the guest's
// initialization (_initialize, and so the operator's init functions).
func (m *Module) Instantiate(ctx context.Context, c InstanceConfig) (*Instance, error) {
	if c.MemoryPages == 0 {
		c.MemoryPages = DefaultMemoryPages
	}
	if c.MemoryPages > 65536 {
		return nil, fmt.Errorf("wasm: stage %q: MemoryPages %d over the 65536 (4 GiB) wasm32 limit", c.Stage, c.MemoryPages)
	}
	r := m.r
	r.mu.Lock()
	if r.mu.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	k := engineKeyOf(c)
	compiled, err := r.compiledLocked(ctx, m, k)
	rt := r.mu.engines[k]
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	i := &Instance{m: m, cfg: c, logger: c.Logger}
	i.enc.version = m.version
	if i.logger == nil {
		i.logger = slog.New(slog.DiscardHandler)
	}
	i.cctx = callCtx{Context: ctx, inst: i}
	// Nothing is granted: no args, env, filesystem, real clock or real randomness
	// (wazero's defaults are a fake clock and a deterministic random source).
	// Guest stdout and stderr are captured (bounded) to explain traps.
	mc := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions("_initialize").
		WithStdout(&i.stderr).
		WithStderr(&i.stderr)
	ictx := ctx
	if r.mem == memMmap {
		// The instance's memory is a mapping of its own (memory.go); the
		// guard keeps it mapped until instantiation returns.
		i.guard = newMemGuard()
		defer i.guard.exit()
		ictx = experimental.WithMemoryAllocator(ctx, i.guard)
	}
	mod, err := rt.rt.InstantiateModule(&callCtx{Context: ictx, inst: i}, compiled, mc)
	if err != nil {
		return nil, fmt.Errorf("wasm: stage %q slot %d: instantiate module %q: %w%s", c.Stage, c.Slot, m.name, err, i.stderr.suffix())
	}
	i.mod = mod
	i.mem = mod.Memory()
	i.alloc = mod.ExportedFunction(abi.ExportAlloc)
	i.process = mod.ExportedFunction(abi.ExportProcess)
	if i.mem == nil {
		_ = mod.Close(ctx)
		return nil, fmt.Errorf("%w: module %q has no memory", ErrNotOperator, m.name)
	}
	res, err := mod.ExportedFunction(abi.ExportProgress).Call(ctx)
	if err == nil {
		i.progressPtr = uint32(res[0])
		err = i.ensureInput(ctx, minInputBuffer)
	}
	if err != nil {
		_ = mod.Close(ctx)
		return nil, fmt.Errorf("wasm: stage %q slot %d: set up module %q: %w", c.Stage, c.Slot, m.name, err)
	}
	return i, nil
}

// ensureInput makes the guest's input buffer at least n bytes long.
func (i *Instance) ensureInput(ctx context.Context, n int) error {
	if uint64(n) <= uint64(i.inCap) {
		return nil
	}
	want := max(uint64(n)+uint64(n)/4, minInputBuffer)
	if want > 1<<31 {
		return fmt.Errorf("input batch of %d bytes is too large", n)
	}
	i.stack[0] = want
	if err := i.alloc.CallWithStack(ctx, i.stack[:]); err != nil {
		return err
	}
	i.inPtr, i.inCap = uint32(i.stack[0]), uint32(want)
	return nil
}

// Close releases the instance; its memory goes back to the OS at once (see
// memory.go).
func (i *Instance) Close(ctx context.Context) error {
	i.unusable = true
	return i.mod.Close(ctx)
}

// Process runs the operator over one batch: timers first, then records. st
// is the state of the slot for a keyed stage, nil for a stateless one. A
// failed call returns a *TrapError (or another error when the host or the
// context failed) and leaves the instance unusable; nothing of the call
// takes effect.
//
// The guest's log lines are logged to InstanceConfig.Logger and also
// returned in Output.Logs. The byte slices of the Output are owned by the
// caller (StateOp.Key and TimerOp.Key alias the batch's keys).
func (i *Instance) Process(ctx context.Context, b *Batch, st State) (*Output, error) {
	if i.unusable {
		return nil, fmt.Errorf("stage %q slot %d: %w", i.cfg.Stage, i.cfg.Slot, ErrInstanceUnusable)
	}
	if len(b.Records) == 0 && len(b.Timers) == 0 {
		return &Output{}, nil
	}
	if !i.guard.enter() {
		// The module was closed (Runtime.Close) and its memory released.
		i.unusable = true
		return nil, fmt.Errorf("stage %q slot %d: module closed: %w", i.cfg.Stage, i.cfg.Slot, ErrInstanceUnusable)
	}
	defer i.guard.exit()
	if err := i.enc.encode(b, st); err != nil {
		return nil, fmt.Errorf("wasm: stage %q slot %d: %w", i.cfg.Stage, i.cfg.Slot, err)
	}
	if err := i.ensureInput(ctx, len(i.enc.buf)); err != nil {
		i.unusable = true
		return nil, i.trap(b, abi.ProgressIdle, "allocate input: "+firstLine(err.Error()), err)
	}
	if !i.mem.Write(i.inPtr, i.enc.buf) {
		i.unusable = true
		return nil, i.trap(b, abi.ProgressIdle, "input buffer out of guest memory", nil)
	}
	if i.cfg.Deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, i.cfg.Deadline)
		defer cancel()
	}
	i.st, i.hostErr, i.hostTrap = st, nil, false
	i.stderr.reset()
	cctx := &i.cctx
	if i.cfg.Deadline > 0 {
		// wazero watches this context from a goroutine that may outlive the
		// call: give it its own.
		cctx = &callCtx{Context: ctx, inst: i}
	} else {
		cctx.Context = ctx
	}
	i.stack[0] = uint64(len(i.enc.buf))
	err := i.process.CallWithStack(cctx, i.stack[:])
	i.st = nil
	if err != nil {
		i.unusable = true
		return nil, i.callError(ctx, b, err)
	}
	if i.hostErr != nil && !i.hostTrap {
		i.unusable = true
		return nil, fmt.Errorf("wasm: stage %q slot %d: %w", i.cfg.Stage, i.cfg.Slot, i.hostErr)
	}
	ptr, n := uint32(i.stack[0]>>32), uint32(i.stack[0])
	view, ok := i.mem.Read(ptr, n)
	if !ok {
		i.unusable = true
		err := fmt.Errorf("%w: output buffer [%d, +%d) outside guest memory", ErrBadOutput, ptr, n)
		return nil, i.trap(b, abi.ProgressIdle, err.Error(), err)
	}
	// One copy: the output's byte slices then belong to the caller.
	buf := bytes.Clone(view)
	out, gf, err := decodeOutput(buf, &i.scratch, len(b.Records), len(b.Timers), i.enc.keys, st != nil, max(i.cfg.Ports, 1))
	if err != nil {
		i.unusable = true
		return nil, i.trap(b, abi.ProgressIdle, err.Error(), err)
	}
	for _, l := range out.Logs {
		i.logger.Log(ctx, slog.Level(l.Level), l.Msg, "stage", i.cfg.Stage, "slot", i.cfg.Slot)
	}
	if gf != nil {
		i.unusable = true
		if i.hostErr != nil {
			return nil, i.trap(b, gf.source, i.hostErr.Error(), i.hostErr)
		}
		if strings.HasPrefix(gf.msg, "panic:") {
			// The SDK recovered a panic and reports it as the call's failure.
			return nil, i.trap(b, gf.source, gf.msg, nil)
		}
		return nil, i.trap(b, gf.source, gf.msg, errGuestReturned)
	}
	return out, nil
}

// callError classifies an error returned by the guest call.
func (i *Instance) callError(ctx context.Context, b *Batch, err error) error {
	src := abi.ProgressIdle
	if v, ok := i.mem.ReadUint32Le(i.progressPtr); ok {
		src = int32(v)
	}
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		switch exit.ExitCode() {
		case sys.ExitCodeDeadlineExceeded:
			return i.trap(b, src, ReasonDeadline, err)
		case sys.ExitCodeContextCanceled:
			return fmt.Errorf("wasm: stage %q slot %d: call canceled: %w", i.cfg.Stage, i.cfg.Slot, context.Cause(ctx))
		}
	}
	reason := i.stderr.reason()
	if reason == "" {
		reason = firstLine(err.Error())
	}
	if i.hostErr != nil && i.hostTrap {
		reason = i.hostErr.Error()
	}
	return i.trap(b, src, reason, err)
}

// trap builds the TrapError of a failed call; src is the guest's progress
// (abi.ProgressIdle when unknown).
func (i *Instance) trap(b *Batch, src int32, reason string, err error) *TrapError {
	e := &TrapError{Stage: i.cfg.Stage, Slot: i.cfg.Slot, Reason: reason, Err: err}
	if err == errGuestReturned {
		// The operator's own error, not a fault: the record is dead-lettered
		// with it, and the log says it as an error of the operator.
		e.Returned, e.Err = true, nil
	}
	switch {
	case src >= 0 && int(src) < len(b.Records):
		e.Seq = b.Records[src].Seq
	case src < 0 && src != abi.ProgressIdle && int(-int64(src)-1) < len(b.Timers):
		t := b.Timers[-int64(src)-1]
		e.Reason = fmt.Sprintf("timer (key %q, time %d): %s", t.Key, t.Time, reason)
	case len(b.Records) > 0:
		e.Seq = b.Records[0].Seq
	}
	if e.Returned {
		i.logger.Error("operator returned an error", "stage", e.Stage, "slot", e.Slot, "seq", e.Seq, "error", e.Reason)
	} else {
		i.logger.Warn("operator trapped", "stage", e.Stage, "slot", e.Slot, "seq", e.Seq, "reason", e.Reason)
	}
	return e
}

func firstLine(s string) string {
	if j := strings.IndexByte(s, '\n'); j >= 0 {
		return s[:j]
	}
	return s
}

// cappedBuffer keeps the first bytes the guest writes to stdout/stderr in a
// call: a Go guest prints its panic or fatal error there before exiting.
type cappedBuffer struct{ b []byte }

const stderrCap = 4096

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if n := stderrCap - len(c.b); n > 0 {
		c.b = append(c.b, p[:min(n, len(p))]...)
	}
	return len(p), nil
}

func (c *cappedBuffer) reset() { c.b = c.b[:0] }

// reason returns the line explaining a crash: a Go "panic:" or "fatal
// error:" line, else the first non-empty line.
func (c *cappedBuffer) reason() string {
	var first string
	for _, l := range strings.Split(string(c.b), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") {
			return l
		}
		if first == "" && l != "" {
			first = l
		}
	}
	return first
}

func (c *cappedBuffer) suffix() string {
	if r := c.reason(); r != "" {
		return " (guest: " + r + ")"
	}
	return ""
}

// --- host functions of modules cairn_v1 and cairn_v2 ------------------------------------

const maxLogLine = 64 << 10

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// instantiateHost provides the host functions under both import module
// names: version 2 changes only the input buffer.
func instantiateHost(ctx context.Context, rt wazero.Runtime) error {
	for _, name := range []string{abi.ImportModule, abi.ImportModuleV2} {
		_, err := rt.NewHostModuleBuilder(name).
			NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(hostStateGet), []api.ValueType{i32, i32, i32, i32, i32, i32}, []api.ValueType{i64}).Export(abi.ImportStateGet).
			NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(hostStateGetMany), []api.ValueType{i32, i32, i32, i32, i32, i32}, []api.ValueType{i64}).Export(abi.ImportStateGetMany).
			NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(hostStateScan), []api.ValueType{i32, i32, i32, i32, i32, i32}, []api.ValueType{i64}).Export(abi.ImportStateScan).
			NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(hostLog), []api.ValueType{i32, i32, i32}, nil).Export(abi.ImportLog).
			NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(hostConfig), []api.ValueType{i32, i32}, []api.ValueType{i32}).Export(abi.ImportConfig).
			Instantiate(ctx)
		if err != nil {
			return err
		}
	}
	return nil
}

// result encodes a negative i64 result.
func result(v int64) uint64 { return uint64(v) }

func instanceOf(ctx context.Context) *Instance {
	i, _ := ctx.Value(instanceKey{}).(*Instance)
	return i
}

// fail records a host-function failure; the call then fails.
func (i *Instance) fail(err error, guestFault bool) {
	if i.hostErr == nil {
		i.hostErr, i.hostTrap = err, guestFault
	}
}

// read copies guest memory [ptr, ptr+n): the State must be free to keep it.
func read(mod api.Module, ptr, n uint32) ([]byte, bool) {
	v, ok := mod.Memory().Read(ptr, n)
	if !ok {
		return nil, false
	}
	return bytes.Clone(v), true
}

// stateCallArgs decodes the (key, sub-key or prefix) arguments shared by
// state_get and state_scan and presets the host-error result. ok is false
// when the call has already failed.
func stateCallArgs(ctx context.Context, mod api.Module, stack []uint64, name string) (i *Instance, key, second []byte, ok bool) {
	keyPtr, keyLen, ptr, n := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3])
	stack[0] = result(abi.StateHostError)
	if i = instanceOf(ctx); i == nil {
		return nil, nil, nil, false
	}
	if i.st == nil {
		i.fail(errStateless, true)
		return nil, nil, nil, false
	}
	key, ok1 := read(mod, keyPtr, keyLen)
	second, ok2 := read(mod, ptr, n)
	if !ok1 || !ok2 {
		i.fail(fmt.Errorf("%s: arguments outside guest memory", name), true)
		return nil, nil, nil, false
	}
	return i, key, second, true
}

func hostStateGet(ctx context.Context, mod api.Module, stack []uint64) {
	dst, dcap := uint32(stack[4]), uint32(stack[5])
	i, key, sub, ok := stateCallArgs(ctx, mod, stack, "state_get")
	if !ok {
		return
	}
	v, found, err := i.st.Get(key, sub)
	switch {
	case err != nil:
		i.fail(fmt.Errorf("state get (key %q, sub %q): %w", key, sub, err), false)
	case !found:
		stack[0] = result(abi.StateAbsent)
	default:
		if uint64(len(v)) <= uint64(dcap) && !mod.Memory().Write(dst, v) {
			i.fail(errors.New("state_get: destination outside guest memory"), true)
			return
		}
		stack[0] = uint64(len(v))
	}
}

// hostStateGetMany is state_get of each sub-key of the request, answered
// in one result: one host call for what would be one each.
func hostStateGetMany(ctx context.Context, mod api.Module, stack []uint64) {
	dst, dcap := uint32(stack[4]), uint32(stack[5])
	i, key, req, ok := stateCallArgs(ctx, mod, stack, "state_get_many")
	if !ok {
		return
	}
	buf := i.getManyBuf[:0]
	var hostErr error // the host's failure, not the guest's request
	err := abi.DecodeGetManyRequest(req, func(sub []byte) error {
		v, found, err := i.st.Get(key, sub)
		if err != nil {
			hostErr = fmt.Errorf("state get (key %q, sub %q): %w", key, sub, err)
			return hostErr
		}
		buf = abi.AppendGetManyEntry(buf, v, found)
		if len(buf) > 1<<30 {
			return errors.New("state_get_many: result over 1 GiB")
		}
		return nil
	})
	i.getManyBuf = buf
	switch {
	case hostErr != nil:
		i.fail(hostErr, false)
		return
	case err != nil: // a malformed request, or a result over 1 GiB: the guest's
		i.fail(fmt.Errorf("state_get_many: %w", err), true)
		return
	}
	if uint64(len(buf)) <= uint64(dcap) && !mod.Memory().Write(dst, buf) {
		i.fail(errors.New("state_get_many: destination outside guest memory"), true)
		return
	}
	stack[0] = uint64(len(buf))
}

func hostStateScan(ctx context.Context, mod api.Module, stack []uint64) {
	dst, dcap := uint32(stack[4]), uint32(stack[5])
	i, key, prefix, ok := stateCallArgs(ctx, mod, stack, "state_scan")
	if !ok {
		return
	}
	buf := i.scanBuf[:0]
	err := i.st.Scan(key, prefix, func(sub, value []byte) error {
		buf = abi.AppendScanEntry(buf, sub, value)
		if len(buf) > 1<<30 {
			return errors.New("scan result over 1 GiB")
		}
		return nil
	})
	i.scanBuf = buf
	if err != nil {
		i.fail(fmt.Errorf("state scan (key %q, prefix %q): %w", key, prefix, err), false)
		return
	}
	if uint64(len(buf)) <= uint64(dcap) && !mod.Memory().Write(dst, buf) {
		i.fail(errors.New("state_scan: destination outside guest memory"), true)
		return
	}
	stack[0] = uint64(len(buf))
}

func hostLog(ctx context.Context, mod api.Module, stack []uint64) {
	i := instanceOf(ctx)
	level, ptr, n := int32(stack[0]), uint32(stack[1]), uint32(stack[2])
	if i == nil {
		return
	}
	msg, ok := mod.Memory().Read(ptr, min(n, maxLogLine))
	if !ok {
		return
	}
	i.logger.Log(ctx, slog.Level(level), string(msg), "stage", i.cfg.Stage, "slot", i.cfg.Slot)
}

func hostConfig(ctx context.Context, mod api.Module, stack []uint64) {
	i := instanceOf(ctx)
	dst, dcap := uint32(stack[0]), uint32(stack[1])
	stack[0] = 0
	if i == nil {
		return
	}
	c := i.cfg.Config
	if uint64(len(c)) <= uint64(dcap) && !mod.Memory().Write(dst, c) {
		return
	}
	stack[0] = uint64(len(c))
}
