package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cairn/engine"
	"cairn/internal/job"
	"cairn/operators/builtin"
	"cairn/wasm"
)

// defaultDeadline is the per-call deadline of a stage that does not set one.
const defaultDeadline = 5 * time.Second

// buildStages compiles every stage's module once and returns the engine
// stages with factories that instantiate per slot, plus each stage's module
// hash (recorded in checkpoint manifests).
func buildStages(ctx context.Context, rt *wasm.Runtime, j *job.Job, log *slog.Logger) ([]engine.Stage, map[string]string, error) {
	var stages []engine.Stage
	hashes := map[string]string{}
	for i, s := range j.Stages {
		field := fmt.Sprintf("stages[%d].module", i)
		st := engine.Stage{Name: s.Name, Keyed: s.Keyed, TTL: s.TTL}
		switch {
		case strings.HasPrefix(s.Module, "native:"):
			switch strings.TrimPrefix(s.Module, "native:") {
			case "count":
				st.New = engine.NewNativeCount
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
				b, err := os.ReadFile(p)
				if err != nil {
					return nil, nil, &job.Error{Field: field, Reason: err.Error()}
				}
				code = b
			}
			mod, err := rt.Compile(ctx, s.Name, code)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", field, err)
			}
			hashes[s.Name] = mod.Hash()
			// Builtin operators are cairn's own code: trusted, no deadline
			// (it costs 2-3x per record, see BENCHMARKS.md). A module from a
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
			ic := wasm.InstanceConfig{Stage: s.Name, Config: s.ConfigJSON(), Deadline: deadline, MemoryPages: pages, Logger: log}
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
	return stages, hashes, nil
}
