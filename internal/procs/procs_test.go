package procs

import "testing"

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
