package runtime

import (
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"

	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
	"cairn/wasm"
)

// The memory budget (`memory:` / --memory): one number divided among what
// holds memory in a job process. The shares are fractions of the budget,
// chosen from what the parts need on the 2-core, small-state edge machines
// the budget is for (docs/RATIONALE.md, "The memory budget"):
//
//   - Pebble's block caches, all slots of all sub-topologies together;
//   - Pebble's memtables (a slot may hold two while one flushes);
//   - the operator instances' memory limit (guest memory is an mmap per
//     instance, outside the Go heap: wasm/memory_mmap.go);
//   - the embedded NATS server's JetStream memory (only with nats:
//     embedded; else it goes to the block caches);
//   - the rest: the engine's batches, NATS client buffers, the Go runtime.
//
// Everything but the guest memory lives on the Go heap (Pebble's cache too,
// without cgo), so the Go runtime's soft limit (debug.SetMemoryLimit) is the
// budget minus the operators' share: the GC works harder as the heap nears
// it instead of letting the heap double.
const (
	shareCache     = 0.25
	shareMemTables = 0.10
	shareOperators = 0.30
	shareNATS      = 0.15

	// Floors: below them the parts misbehave (Pebble flushes every few
	// writes; a Go-built guest does not start in less than ~16 MiB).
	minSlotCache     = 1 << 20
	minSlotMemTable  = 1 << 20
	minInstanceBytes = 32 << 20
)

// memoryBudget is a job's budget divided (zero Total: no budget; every part
// keeps its default).
type memoryBudget struct {
	Total int64
	// Totals of the shares.
	Cache, MemTables, Operators, NATS, GoLimit int64
	// What each part is given.
	SlotCache, SlotMemTable int64
	InstanceBytes           int64 // each operator instance's memory limit
	Slots, Instances        int
}

// planMemory divides j's budget over its sub-topologies' slots and operator
// instances.
func planMemory(j *job.Job, subs []job.SubTopology) (memoryBudget, error) {
	if j.Memory == "" {
		return memoryBudget{}, nil
	}
	total, err := job.ParseBytes(j.Memory)
	if err != nil {
		return memoryBudget{}, &job.Error{Field: "memory", Reason: err.Error()}
	}
	b := memoryBudget{Total: total}
	for k := range subs {
		sj := subJob(j, subs, k)
		b.Slots += sj.Slots
		for _, st := range sj.Stages {
			if st.Keyed {
				b.Instances += sj.Slots
			} else {
				b.Instances++
			}
		}
	}
	b.Cache = int64(float64(total) * shareCache)
	b.MemTables = int64(float64(total) * shareMemTables)
	b.Operators = int64(float64(total) * shareOperators)
	if j.NATS == "embedded" {
		b.NATS = int64(float64(total) * shareNATS)
	} else {
		b.Cache += int64(float64(total) * shareNATS)
	}
	b.SlotCache = max(b.Cache/int64(max(b.Slots, 1)), minSlotCache)
	b.SlotMemTable = max(b.MemTables/int64(2*max(b.Slots, 1)), minSlotMemTable)
	if b.Instances > 0 {
		b.InstanceBytes = max(b.Operators/int64(b.Instances), minInstanceBytes)
	}
	b.GoLimit = total
	if runtime.GOOS == "linux" {
		b.GoLimit -= b.Operators // guest memory is mmap'd there, not Go heap
	}
	return b, nil
}

// apply sets the Go runtime's soft memory limit; the other parts read
// their share where they are made (slot DBs, instances, the server).
func (b memoryBudget) apply(log *slog.Logger) {
	if b.Total == 0 {
		return
	}
	debug.SetMemoryLimit(b.GoLimit)
	log.Info("memory budget", "total", FormatBytes(uint64(b.Total)),
		"pebble_cache", fmt.Sprintf("%s (%s × %d slots)", FormatBytes(uint64(b.SlotCache*int64(b.Slots))), FormatBytes(uint64(b.SlotCache)), b.Slots),
		"pebble_memtables", fmt.Sprintf("%s (2 × %s × %d slots)", FormatBytes(uint64(2*b.SlotMemTable*int64(b.Slots))), FormatBytes(uint64(b.SlotMemTable)), b.Slots),
		"operators", fmt.Sprintf("%s (at most %s × %d instances)", FormatBytes(uint64(b.Operators)), FormatBytes(uint64(b.InstanceBytes)), b.Instances),
		"nats", FormatBytes(uint64(b.NATS)),
		"go_limit", FormatBytes(uint64(b.GoLimit)))
}

// instancePages is an operator instance's memory limit in pages: the
// stage's own (memory:, default wasm.DefaultMemoryPages) or the budget's
// share, whichever is smaller.
func (b memoryBudget) instancePages(stagePages uint32) uint32 {
	if stagePages == 0 {
		stagePages = wasm.DefaultMemoryPages
	}
	if b.InstanceBytes == 0 {
		return stagePages
	}
	return min(stagePages, uint32(b.InstanceBytes>>16))
}

// shares is the budget as /metrics reports it.
func (b memoryBudget) shares() []dashboard.MemoryShare {
	if b.Total == 0 {
		return nil
	}
	return []dashboard.MemoryShare{
		{Component: "total", Bytes: b.Total},
		{Component: "pebble_cache", Bytes: b.SlotCache * int64(b.Slots)},
		{Component: "pebble_memtables", Bytes: 2 * b.SlotMemTable * int64(b.Slots)},
		{Component: "operators", Bytes: b.InstanceBytes * int64(b.Instances)},
		{Component: "nats", Bytes: b.NATS},
		{Component: "go_limit", Bytes: b.GoLimit},
	}
}

// stateOptions are the slot DBs' sizes under the budget (zero: defaults).
func (b memoryBudget) stateOptions() (cache, memTable int64) {
	if b.Total == 0 {
		return 0, 0
	}
	return b.SlotCache, b.SlotMemTable
}
