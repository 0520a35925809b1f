package runtime

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"cairn/checkpoint"
	"cairn/internal/app/job"
	"cairn/wasm"
)

// State versions: a module declares the version of the shape of its state
// (cairn_state_version, sdk/upgrade.StateVersion; 0 when it declares none),
// every manifest records the versions of its stages (those other than 0),
// and a restore onto a module that declares another version than the state
// it would read is refused before anything is restored: the state must be
// migrated first (`cairn state migrate`). Manifests written before state
// versions existed record none: their stages are at version 0, which is
// what every module that declares nothing reads, so they restore as before.

// ErrStateVersion is a restore refused because a keyed stage's module
// declares another state version than the state it would read.
var ErrStateVersion = errors.New("state version mismatch")

// StateVersionError is a restore refused for a stage whose module declares
// another state version than the checkpoint holds.
type StateVersionError struct {
	Stage string
	// Module is the version the stage's module declares, State the one the
	// checkpoint's state has.
	Module, State int
	// From is the checkpoint or savepoint ("savepoint:NAME" or an id).
	From string
}

func (e *StateVersionError) Error() string {
	what, name := "checkpoint "+e.From, e.From
	if sp, ok := strings.CutPrefix(e.From, "savepoint:"); ok {
		what, name = "savepoint "+sp, sp
	}
	to := name + "-v" + strconv.Itoa(e.Module)
	return fmt.Sprintf("%v: stage %s: its module declares state version %d, but %s holds state version %d: migrate the state first: "+
		"cairn state migrate --from %s --to %s --stage %s --with MIGRATION.wasm, then start with --restore savepoint:%s (docs/UPGRADES.md)",
		ErrStateVersion, e.Stage, e.Module, what, e.State, e.From, to, e.Stage, to)
}

func (e *StateVersionError) Unwrap() error { return ErrStateVersion }

// declaredStateVersions asks the module of every keyed stage of j, compiled
// in rt (hashes: stage → module hash), for its state version; stages that
// declare none (0) are left out. Builtins and native operators declare none.
func declaredStateVersions(ctx context.Context, rt *wasm.Runtime, j *job.Job, hashes map[string]string) (map[string]int, error) {
	out := map[string]int{}
	for _, s := range j.Stages {
		if !s.Keyed || strings.HasPrefix(s.Module, "native:") {
			continue
		}
		mod, ok := rt.Module(hashes[s.Name])
		if !ok || !mod.DeclaresStateVersion() {
			continue // declares 0: no instance needed to ask
		}
		inst, err := mod.Instantiate(ctx, wasm.InstanceConfig{Stage: s.Name, Slot: -1, Config: s.ConfigJSON()})
		if err != nil {
			return nil, fmt.Errorf("stage %s: state version: %w", s.Name, err)
		}
		v, err := inst.StateVersion(ctx)
		inst.Close(ctx)
		if err != nil {
			return nil, fmt.Errorf("stage %s: state version: %w", s.Name, err)
		}
		if v < 0 {
			return nil, fmt.Errorf("stage %s: module %s declares state version %d; versions are 0 or more", s.Name, s.Module, v)
		}
		if v > 0 {
			out[s.Name] = v
		}
	}
	return out, nil
}

// checkStateVersions refuses to restore m (named by spec) for j when a
// keyed stage's module declares (declared) another state version than m
// records for it.
func checkStateVersions(j *job.Job, spec string, m *checkpoint.Manifest, declared map[string]int) error {
	if spec == "" || spec == "latest" {
		spec = strconv.FormatUint(m.ID, 10)
	}
	for _, s := range j.Stages {
		if !s.Keyed {
			continue
		}
		if have, want := m.StateVersions[s.Name], declared[s.Name]; have != want {
			return &StateVersionError{Stage: s.Name, Module: want, State: have, From: spec}
		}
	}
	return nil
}
