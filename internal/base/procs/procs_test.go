package procs

import (
	"runtime"
	"testing"
)

func TestTuneProcs(t *testing.T) {
	for _, tc := range []struct {
		name          string
		envSet        bool
		current, cpus int
		want          int
	}{
		{"two cores", false, 2, 2, 4},
		{"one core", false, 1, 1, 3},
		{"sixteen cores", false, 16, 16, 18},
		{"GOMAXPROCS set by the operator", true, 2, 2, 2},
		{"a container's CPU quota", false, 2, 16, 2},
		{"already above", false, 8, 2, 8},
	} {
		got, called := 0, false
		n := tuneProcs(tc.envSet, tc.current, tc.cpus, func(n int) int { got, called = n, true; return tc.current })
		if n != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, n, tc.want)
		}
		if called != (tc.want != tc.current) || (called && got != tc.want) {
			t.Errorf("%s: set called %v with %d", tc.name, called, got)
		}
	}
}

// TestCPUsIgnoresTheSpareProcs: after Tune raised GOMAXPROCS, CPU-bound
// work still counts the Ps Go would have had.
func TestCPUsIgnoresTheSpareProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "") // not set: Tune may raise it
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	defer cpuBound.Store(0)
	n := Tune()
	if n > before && CPUs() != before {
		t.Fatalf("Tune raised GOMAXPROCS %d -> %d; CPUs() = %d, want %d", before, n, CPUs(), before)
	}
	if n == before && CPUs() != before {
		t.Fatalf("GOMAXPROCS unchanged at %d; CPUs() = %d", n, CPUs())
	}
}
