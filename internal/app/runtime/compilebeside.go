package runtime

// The modules compile beside the start's round trips: compiling is CPU
// (0.2-0.6 s for the demo's two builtins on a loaded 2-core machine),
// connecting to NATS, reading the checkpoint store's manifests and
// restoring are waits on the network, and nothing in between needs the
// compiled modules but the check of the stages' state versions. The
// refusals that need no compile (a missing file, a pinned hash, an
// unknown builtin) still come before anything connects; an invalid module
// is refused once its compile ends, before any input is read, with its own
// error even when the restore beside it failed too.

import (
	"context"
	"fmt"

	"cairn/checkpoint"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/wasm"
)

// compiling is the stages' compile running beside the rest of the start.
type compiling struct {
	done     chan struct{}
	stages   []engine.Stage
	versions map[string]int // the keyed stages' declared state versions
	err      error
}

// compileBeside starts compiling srcs in rt and asking the modules for
// their state versions (hashes: stage → module hash).
func compileBeside(ctx context.Context, rt *wasm.Runtime, j *job.Job, srcs []stageSource, hashes map[string]string) *compiling {
	c := &compiling{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		if c.stages, c.err = compileStages(ctx, rt, srcs); c.err == nil {
			c.versions, c.err = declaredStateVersions(ctx, rt, j, hashes)
		}
	}()
	return c
}

// wait returns when the compile has ended, with its error.
func (c *compiling) wait() error {
	<-c.done
	return c.err
}

// ready reports whether the compile has ended.
func (c *compiling) ready() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// compiled waits for the compile and takes the state versions it found.
func (r *Running) compiled() error {
	if err := r.compiling.wait(); err != nil {
		return err
	}
	r.StateVersions = r.compiling.versions
	return nil
}

// checkStateVersions is checkStateVersions once the modules have compiled.
func (r *Running) checkStateVersions(j *job.Job, spec string, m *checkpoint.Manifest) error {
	if err := r.compiled(); err != nil {
		return err
	}
	if err := checkStateVersions(j, spec, m, r.StateVersions); err != nil {
		return fmt.Errorf("restore %s: %w", spec, err)
	}
	return nil
}
