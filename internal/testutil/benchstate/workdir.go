package benchstate

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// WorkDir returns a benchmark's work directory: tb's temp dir when dir is
// "" (a -*.dir flag left unset), else dir/name, emptied now and removed
// when tb ends (so a state of GiBs can be put on a chosen disk).
func WorkDir(tb testing.TB, dir, name string) string {
	if dir == "" {
		return tb.TempDir()
	}
	root := filepath.Join(dir, name)
	os.RemoveAll(root)
	if err := os.MkdirAll(root, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(root) })
	return root
}

// Pct is the p-quantile of ds by nearest rank (ds is not changed).
func Pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}
