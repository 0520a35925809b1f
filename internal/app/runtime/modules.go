package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/base/sysfile"
	"cairn/operators/builtin"
	"cairn/wasm"
)

// defaultDeadline is the per-call deadline of a stage that does not set one.
const defaultDeadline = 5 * time.Second

// MaxModuleBytes bounds a module read from a file, and the runtime's
// compile limit.
const MaxModuleBytes = wasm.DefaultMaxModuleBytes

// buildStages compiles every stage's module once and returns the engine
// stages with factories that instantiate per slot, plus each stage's module
// hash (recorded in checkpoint manifests).
func buildStages(ctx context.Context, rt *wasm.Runtime, j *job.Job, mb memoryBudget, log *slog.Logger) ([]engine.Stage, map[string]string, error) {
	srcs, hashes, err := readStages(j, mb, log)
	if err != nil {
		return nil, nil, err
	}
	stages, err := compileStages(ctx, rt, srcs)
	if err != nil {
		return nil, nil, err
	}
	return stages, hashes, nil
}

// stageSource is a stage as read and checked before anything compiles:
// its engine stage (New set for a native operator), and for a module its
// bytes and the configuration its instances get.
type stageSource struct {
	field string
	st    engine.Stage
	code  []byte // nil: a native operator
	ic    wasm.InstanceConfig
	ports int
	from  int
}

// readStages reads every stage's module and checks what needs no compile
// (known names, the file, the pinned hash), and returns each stage's module
// hash: the SHA-256 of the bytes a compile would take (wasm.Module.Hash),
// so a restore can compare it with a checkpoint's while the modules
// compile.
func readStages(j *job.Job, mb memoryBudget, log *slog.Logger) ([]stageSource, map[string]string, error) {
	var srcs []stageSource
	hashes := map[string]string{}
	for i, s := range j.Stages {
		field := fmt.Sprintf("stages[%d].module", i)
		src := stageSource{field: field, st: engine.Stage{Name: s.Name, Keyed: s.Keyed, TTL: s.TTL, WallClock: s.Clock == job.ClockWall}, ports: len(s.Ports), from: len(s.From)}
		switch {
		case strings.HasPrefix(s.Module, "native:"):
			switch strings.TrimPrefix(s.Module, "native:") {
			case "count":
				if len(s.From) > 1 || len(s.Ports) > 1 {
					return nil, nil, &job.Error{Field: field, Reason: fmt.Sprintf("stage %q reads two inputs; native:count does not tell them apart", s.Name)}
				}
				src.st.New = engine.NewNativeCount
				hashes[s.Name] = s.Module
			default:
				return nil, nil, &job.Error{Field: field, Reason: fmt.Sprintf("unknown native operator %q (have: native:count)", s.Module)}
			}
		default:
			var code []byte
			if name, ok := strings.CutPrefix(s.Module, "builtin:"); ok {
				b, ok := builtin.Lookup(name)
				if !ok {
					return nil, nil, &job.Error{Field: field, Reason: fmt.Sprintf("unknown builtin %q (have: %s)", name, strings.Join(builtin.Names(), ", "))}
				}
				code = b
			} else {
				p := s.Module
				if !filepath.IsAbs(p) && j.Dir != "" {
					p = filepath.Join(j.Dir, p)
				}
				b, err := ReadModule(p, MaxModuleBytes)
				if err != nil {
					return nil, nil, &job.Error{Field: field, Reason: err.Error()}
				}
				code = b
			}
			if err := checkPin(s, code); err != nil {
				return nil, nil, &job.Error{Field: fmt.Sprintf("stages[%d].sha256", i), Reason: err.Error()}
			}
			// Builtin operators are cairn's own code: trusted, no deadline
			// (it costs 2-3x per record, see docs/bench/operators.md). A module from a
			// file gets the default deadline unless the job says otherwise.
			deadline := defaultDeadline
			if strings.HasPrefix(s.Module, "builtin:") {
				deadline = 0
			}
			if s.Deadline != nil {
				deadline = s.Deadline.Duration
			}
			var pages uint32
			if s.Memory != "" {
				n, _ := job.ParseBytes(s.Memory)
				pages = uint32((n + 65535) / 65536)
			}
			src.code = code
			src.ic = wasm.InstanceConfig{Stage: s.Name, Config: s.ConfigJSON(), Deadline: deadline, MemoryPages: mb.instancePages(pages), Logger: log, Ports: len(s.Ports)}
			sum := sha256.Sum256(code)
			hashes[s.Name] = hex.EncodeToString(sum[:])
		}
		srcs = append(srcs, src)
	}
	return srcs, hashes, nil
}

// compileStages compiles the modules of srcs and returns the engine stages.
func compileStages(ctx context.Context, rt *wasm.Runtime, srcs []stageSource) ([]engine.Stage, error) {
	var stages []engine.Stage
	for _, src := range srcs {
		st, field, ic := src.st, src.field, src.ic
		if src.code != nil {
			// Compiled for its instances' memory limit and deadline: one
			// compile, not a second one when the first slot instantiates it.
			mod, err := rt.CompileFor(ctx, st.Name, src.code, ic)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", field, err)
			}
			if src.ports > 1 && mod.ABIVersion() < 2 {
				return nil, &job.Error{Field: field, Reason: fmt.Sprintf("stage %q has %d output ports, but its module speaks operator ABI v%d, which emits to one: rebuild it with the current SDK (ABI v2, docs/ABI.md)", st.Name, src.ports, mod.ABIVersion())}
			}
			if src.from > 1 && mod.ABIVersion() < 2 {
				return nil, &job.Error{Field: field, Reason: fmt.Sprintf("stage %q reads two inputs, but its module speaks operator ABI v%d, which does not tell a record's side: rebuild it with the current SDK (ABI v2, docs/ABI.md)", st.Name, mod.ABIVersion())}
			}
			st.New = func(ctx context.Context, slot int) (engine.Operator, error) {
				c := ic
				c.Slot = slot
				inst, err := mod.Instantiate(ctx, c)
				if err != nil {
					return nil, err // not a typed nil inside the interface
				}
				return inst, nil
			}
		}
		stages = append(stages, st)
	}
	return stages, nil
}

// checkPin refuses a module whose bytes are not the ones the stage's
// sha256 pins: a file replaced on a device must not run silently. The
// hash is taken of the very bytes that are compiled.
func checkPin(s job.Stage, code []byte) error {
	if s.SHA256 == "" {
		return nil
	}
	sum := sha256.Sum256(code)
	if got := hex.EncodeToString(sum[:]); got != s.SHA256 {
		return fmt.Errorf("stage %q: module %s has sha256 %s, but the job pins sha256 %s: refusing to start; "+
			"if the new module is intended, put its hash in the job file", s.Name, s.Module, got, s.SHA256)
	}
	return nil
}

// ReadModule reads a module file of at most limit bytes. Anything but a
// regular file is refused before it is read: a FIFO would block the start
// forever and a device like /dev/zero never ends. The read itself is bounded
// too, for a file that grows after the check.
func ReadModule(path string, limit int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: point module at a .wasm file (a relative path is relative to the job file)", err)
	}
	if err := regularModule(path, fi, limit); err != nil {
		return nil, err
	}
	// O_NONBLOCK: should path have become a FIFO since the Stat, opening it
	// returns at once instead of waiting for a writer; the Stat below refuses it.
	f, err := os.OpenFile(path, os.O_RDONLY|sysfile.NonBlock, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := regularModule(path, fi, limit); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("module %s is larger than the limit of %d bytes: is it the right file?", path, limit)
	}
	return b, nil
}

func regularModule(path string, fi fs.FileInfo, limit int64) error {
	if !fi.Mode().IsRegular() {
		what := "not a regular file (mode " + fi.Mode().String() + ")"
		switch t := fi.Mode().Type(); {
		case t&fs.ModeDir != 0:
			what = "a directory"
		case t&fs.ModeNamedPipe != 0:
			what = "a named pipe (FIFO)"
		case t&fs.ModeCharDevice != 0:
			what = "a character device"
		case t&fs.ModeDevice != 0:
			what = "a device"
		case t&fs.ModeSocket != 0:
			what = "a socket"
		}
		return fmt.Errorf("module %s is %s, not a regular file: point module at a .wasm file", path, what)
	}
	if fi.Size() > limit {
		return fmt.Errorf("module %s is %d bytes, larger than the limit of %d: is it the right file?", path, fi.Size(), limit)
	}
	return nil
}
