package e2e

import (
	"os"
	"testing"

	"cairn/internal/app/cli"
	"cairn/internal/testutil/testbin"
)

func TestMain(m *testing.M) {
	// Jobs run in this process as in the binary, whose Main raises
	// GOMAXPROCS above the CPU count (cli.TuneGOMAXPROCS); the benchmarks
	// measure what the binary does.
	cli.TuneGOMAXPROCS()
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}
