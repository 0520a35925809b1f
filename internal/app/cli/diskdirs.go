package cli

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
	_ dashboard.DiskSource = (*demo)(nil)
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

// DiskDirs implements dashboard.DiskSource for `cairn demo`: the job's
// directory, the embedded server's and the store's.
func (d *demo) DiskDirs() []dashboard.DiskDir {
	return []dashboard.DiskDir{
		{Component: "state", Path: datadir.State(d.jobDir)},
		{Component: "checkpoints", Path: datadir.Checkpoints(d.jobDir)},
		{Component: "nats", Path: filepath.Join(d.dir, datadir.NATSDir)},
		{Component: "store", Path: filepath.Join(d.dir, "store")},
	}
}

// MemoryBudget implements dashboard.MemorySource: the job's memory budget
// and its division (none without memory:).
func (o *observer) MemoryBudget() []dashboard.MemoryShare { return o.r.budget.shares() }
