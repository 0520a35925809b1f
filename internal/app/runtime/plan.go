package runtime

import (
	"context"
	"log/slog"

	"cairn/internal/app/job"
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
	return startSub(ctx, sj, ro, log, &Running{rt: rt}, subPos{n: len(p.Subs), sub: p.Subs[k], budget: p.mb})
}

// NewWasmRuntime is the WebAssembly runtime a job in dataDir compiles its
// modules on, with the compilation cache Start uses.
func NewWasmRuntime(ctx context.Context, dataDir string) (*wasm.Runtime, error) {
	return wasm.NewRuntime(ctx, wasm.RuntimeConfig{CacheDir: compileCacheDir(dataDir), MaxModuleBytes: MaxModuleBytes})
}
