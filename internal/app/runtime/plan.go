package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"cairn/internal/app/job"
	"cairn/state"
	"cairn/wasm"
)

// Plan is a job cut into its sub-topologies, with the process's memory
// budget divided among them: what an assignment names parts of. Start runs
// a whole plan; StartSub runs one sub-topology of it alone, as `cairn test`
// does to kill and restore each on its own slot count.
type Plan struct {
	Job  *job.Job
	Subs []job.SubTopology
	mb   memoryBudget
}

// NewPlan cuts j into sub-topologies and divides its memory budget.
func NewPlan(j *job.Job) (*Plan, error) {
	subs := j.Graph()
	mb, err := planMemory(j, subs)
	if err != nil {
		return nil, err
	}
	return &Plan{Job: j, Subs: subs, mb: mb}, nil
}

// SubJob is sub-topology k as a job of its own: its name, input, outputs,
// data directory and slot count.
func (p *Plan) SubJob(k int) *job.Job { return subJob(p.Job, p.Subs, k) }

// StartSub starts sub-topology k alone as sj (SubJob(k), its slot count
// possibly changed), on the WebAssembly runtime rt, which the caller owns
// and shares between sub-topologies. Run it with RunEngine; Close it.
func (p *Plan) StartSub(ctx context.Context, k int, sj *job.Job, ro Options, log *slog.Logger, rt *wasm.Runtime) (*Running, error) {
	return startSub(ctx, sj, ro, log, &Running{rt: rt}, subPos{k: k, n: len(p.Subs), sub: p.Subs[k], budget: p.mb})
}

// NewWasmRuntime is the WebAssembly runtime a job in dataDir compiles its
// modules on, with the compilation cache Start uses.
func NewWasmRuntime(ctx context.Context, dataDir string) (*wasm.Runtime, error) {
	return wasm.NewRuntime(ctx, wasm.RuntimeConfig{CacheDir: compileCacheDir(dataDir), MaxModuleBytes: MaxModuleBytes})
}

// A Part is one sub-topology's key-group range: the unit of work a process
// can be given.
type Part struct {
	// Sub is the sub-topology's index in Plan.Subs.
	Sub int
	// KeyGroups is the range of the sub-topology's key groups the process
	// owns.
	KeyGroups state.KeyGroupRange
}

// An Assignment is the parts a process runs. A process alone runs All; in a
// group, each member runs what the group assigned it.
type Assignment []Part

// ErrPartialAssignment is returned by Start for an assignment that holds
// part of a sub-topology's key groups: a process runs whole sub-topologies
// (a group divides a job by sub-topology, docs/SCALING.md), since a
// sub-topology's checkpoint records one input position for all its key
// groups.
var ErrPartialAssignment = errors.New("runtime: an assignment runs whole sub-topologies, not part of one's key groups")

// ErrEmptyAssignment is returned by Start for an assignment with no part:
// there is nothing to run (a group member with nothing assigned waits).
var ErrEmptyAssignment = errors.New("runtime: an empty assignment: nothing to run")

// wholeSubs returns the sub-topologies a (checked) assignment holds whole,
// in order; ErrPartialAssignment if it holds part of one.
func (p *Plan) wholeSubs(a Assignment) ([]int, error) {
	if len(a) == 0 {
		return nil, ErrEmptyAssignment
	}
	n := make([]int, len(p.Subs))
	for _, part := range a {
		n[part.Sub] += part.KeyGroups.Len()
	}
	var subs []int
	for k, c := range n {
		switch c {
		case 0:
		case p.Job.KeyGroups:
			subs = append(subs, k)
		default:
			return nil, fmt.Errorf("%w: sub-topology %d has %d of its %d key groups", ErrPartialAssignment, k, c, p.Job.KeyGroups)
		}
	}
	return subs, nil
}

// Parts is the assignment of the sub-topologies subs, each whole.
func (p *Plan) Parts(subs ...int) Assignment {
	a := make(Assignment, 0, len(subs))
	for _, k := range subs {
		a = append(a, Part{Sub: k, KeyGroups: state.KeyGroupRange{First: 0, Last: p.Job.KeyGroups - 1}})
	}
	return a
}

// SubName is the name of sub-topology k: its checkpoints' job name.
func (p *Plan) SubName(k int) string { return subName(p.Job, k) }

// AssignmentError names what is wrong with an assignment.
type AssignmentError struct {
	Part   int // the index of the part in the assignment
	Reason string
}

func (e *AssignmentError) Error() string {
	return fmt.Sprintf("runtime: assignment part %d: %s", e.Part, e.Reason)
}

// All is the whole job: every key group of every sub-topology.
func (p *Plan) All() Assignment {
	a := make(Assignment, len(p.Subs))
	for k := range p.Subs {
		a[k] = Part{Sub: k, KeyGroups: state.KeyGroupRange{First: 0, Last: p.Job.KeyGroups - 1}}
	}
	return a
}

// Check reports the first part of a that names no sub-topology of the plan,
// holds key groups outside the job's, or overlaps an earlier part.
func (p *Plan) Check(a Assignment) error {
	for i, part := range a {
		if part.Sub < 0 || part.Sub >= len(p.Subs) {
			return &AssignmentError{Part: i, Reason: fmt.Sprintf("sub-topology %d: the job has %d", part.Sub, len(p.Subs))}
		}
		r := part.KeyGroups
		if r.First < 0 || r.Last >= p.Job.KeyGroups || r.First > r.Last {
			return &AssignmentError{Part: i, Reason: fmt.Sprintf("key groups [%d, %d] are not a range of the job's %d", r.First, r.Last, p.Job.KeyGroups)}
		}
		for h, q := range a[:i] {
			if q.Sub == part.Sub && q.KeyGroups.First <= r.Last && r.First <= q.KeyGroups.Last {
				return &AssignmentError{Part: i, Reason: fmt.Sprintf("key groups [%d, %d] of sub-topology %d overlap part %d", r.First, r.Last, part.Sub, h)}
			}
		}
	}
	return nil
}

// Whole reports whether a covers every key group of every sub-topology (a
// checked assignment: its parts do not overlap).
func (p *Plan) Whole(a Assignment) bool {
	n := make([]int, len(p.Subs))
	for _, part := range a {
		n[part.Sub] += part.KeyGroups.Len()
	}
	for _, c := range n {
		if c != p.Job.KeyGroups {
			return false
		}
	}
	return true
}
