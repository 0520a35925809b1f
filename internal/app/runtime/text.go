package runtime

import (
	"context"
	"fmt"

	"cairn/checkpoint"
)

// SavepointExists reports whether job has a committed savepoint name. A
// store error says no: the savepoint itself then finds out and fails.
func SavepointExists(ctx context.Context, s checkpoint.Store, job, name string) bool {
	_, err := s.Stat(ctx, checkpoint.SavepointManifestPath(job, name))
	return err == nil
}

// SavepointExistsMsg is the answer (HTTP 409) to a savepoint name in use.
func SavepointExistsMsg(name string) string {
	return fmt.Sprintf("savepoint %s already exists: savepoints are never overwritten; choose another name, or remove the old one first with: cairn savepoint rm %s --job-file JOB.yaml", name, name)
}

// FormatBytes prints a byte count in binary units, one decimal.
func FormatBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
