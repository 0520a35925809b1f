package demo

import (
	"path/filepath"

	"cairn/internal/app/dashboard"
	"cairn/internal/base/datadir"
)

var _ dashboard.DiskSource = (*demo)(nil)

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
