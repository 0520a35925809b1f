package runtime

import (
	"path/filepath"

	"cairn/internal/app/dashboard"
	"cairn/internal/base/datadir"
)

// The directories /metrics measures as cairn_disk_allocated_bytes, so that a
// user sees which part of the data directory fills the disk: the live state per slot, the local checkpoint copies, the embedded
// NATS server's store and, for the demo, its file:// checkpoint store.

var (
	_ dashboard.DiskSource = (*observer)(nil)
)

// DiskDirs implements dashboard.DiskSource for `cairn run`.
func (o *observer) DiskDirs() []dashboard.DiskDir {
	dir := o.r.Job.DataDir
	return []dashboard.DiskDir{
		{Component: "state", Path: datadir.State(dir)},
		{Component: "checkpoints", Path: datadir.Checkpoints(dir)},
		{Component: "nats", Path: filepath.Join(dir, datadir.NATSDir)},
	}
}

// MemoryBudget implements dashboard.MemorySource: the job's memory budget
// and its division (none without memory:).
func (o *observer) MemoryBudget() []dashboard.MemoryShare { return o.r.budget.shares() }
