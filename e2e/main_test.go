package e2e

import (
	"flag"
	"os"
	"testing"
	"time"

	"cairn/internal/base/procs"
	"cairn/internal/testutil/testbin"
)

func TestMain(m *testing.M) {
	// Jobs run in this process as in the binary, whose Main raises
	// GOMAXPROCS above the CPU count (procs.Tune); the benchmarks
	// measure what the binary does.
	procs.Tune()
	// go test gives every package 10 minutes unless told otherwise; this
	// package's tests take 9 on the 2-core CI machine, so one slow test
	// (a 1-minute wait that fails) ran the rest out of time and hid which
	// test was left. Its own budget is 25 minutes when the timeout is go
	// test's default; an explicit other -timeout stands.
	flag.Parse()
	if f := flag.Lookup("test.timeout"); f != nil && f.Value.String() == (10*time.Minute).String() {
		_ = f.Value.Set((25 * time.Minute).String())
	}
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}
