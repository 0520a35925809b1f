package statetool

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"cairn/state"
)

// ErrInto is a copy of state into another sub-topology that cannot be
// made as asked.
var ErrInto = errors.New("statetool: copy into another stage")

// keyedStage is the state id of a sub-topology's keyed stage (the
// engine's KeyedStageID): the one stage whose state a sub-topology holds
// besides the engine's own.
const keyedStage uint8 = 1

// Into is the other sub-topology a migration writes (MigrateOptions.Into):
// a keyed stage is split in two, or moves behind another keyed stage, and
// the new stage starts from the old one's state (or what a migration makes
// of it). Its savepoint holds that state only: no engine state (output
// counters, outbox), which belongs to the sub-topology that wrote it, and
// an input position at the start of the stream it reads.
type Into struct {
	// Job is the sub-topology's name in the store (<job>.s<k>, or the
	// job's own name for the first).
	Job string
	// Stage is its keyed stage: the state's name in the new manifest.
	Stage string
	// SourceStream is the stream it reads (for a sub-topology after the
	// first, its repartition stream): the savepoint resumes at its start.
	SourceStream string
	// KeyGroups is the job's key_groups (0: unchecked). The state keeps
	// its key groups, so the savepoint read must have as many.
	KeyGroups int
	// MoveOutputs: the sub-topology written takes over the output the one
	// read wrote (the job's output, when the split-off stage is the last):
	// its savepoint carries the read one's output counts per key group,
	// so its outputs go on with the stream's next Cairn-Out index instead
	// of being skipped as already published. The read sub-topology's own
	// new savepoint then drops them (MigrateOptions.ResetOutputs).
	MoveOutputs bool
}

// intoPlan checks an Into migration and returns the manifest metadata of
// the savepoint it writes: the stage's state version (v, from the
// migration, or else the one the read chain's keyed stage had) and the
// steps for its origin.
func intoPlan(o MigrateOptions, v int, migrated bool) (map[string]int, []string, error) {
	in, m := o.Into, o.From
	switch {
	case in.Job == "" || in.Stage == "":
		return nil, nil, fmt.Errorf("%w: name the sub-topology and its stage", ErrInto)
	case len(o.Rename) > 0 || len(o.Drop) > 0:
		return nil, nil, fmt.Errorf("%w: a rename or a drop applies to the savepoint of the sub-topology read (%s), not to the one written (%s): run them separately", ErrInto, m.Job, in.Job)
	case in.Job == m.Job:
		return nil, nil, fmt.Errorf("%w: stage %s is in sub-topology %s, the one read: migrate or rename its state in place (--stage/--rename)", ErrInto, in.Stage, m.Job)
	case in.KeyGroups > 0 && in.KeyGroups != m.KeyGroups:
		return nil, nil, fmt.Errorf("%w: the state read has %d key groups, the job %d: move it between jobs with cairn state export and import", ErrInto, m.KeyGroups, in.KeyGroups)
	}
	steps := []string{fmt.Sprintf("copy the state of the keyed stage of %s into stage %s of %s", m.Job, in.Stage, in.Job)}
	if in.MoveOutputs {
		steps = append(steps, "move the output counts of "+m.Job+" along")
	}
	if !migrated {
		// The same state in another stage: its shape, so its version, is
		// the read stage's (the one keyed stage of the sub-topology read).
		v = 0
		if len(m.StateVersions) == 1 {
			v = m.StateVersions[slices.Collect(maps.Keys(m.StateVersions))[0]]
		}
	}
	if v > 0 {
		return map[string]int{in.Stage: v}, steps, nil
	}
	return nil, steps, nil
}

// isOutputCount reports whether stored key k is a key group's count of
// outputs to a sub-topology's first target (state.CounterOutputs).
func isOutputCount(k []byte) bool {
	key, err := state.DecodeKey(k)
	return err == nil && key.Kind == state.KindCounter && key.Counter == state.CounterOutputs
}
