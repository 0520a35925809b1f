package e2e

import (
	"os"
	"testing"

	"cairn/internal/procs"
	"cairn/internal/testutil/testbin"
)

func TestMain(m *testing.M) {
	// Jobs run in this process as in the binary, whose Main raises
	// GOMAXPROCS above the CPU count (procs.Tune); the benchmarks
	// measure what the binary does.
	procs.Tune()
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}
