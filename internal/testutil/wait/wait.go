// Package wait polls a condition in tests until it holds or its deadline
// passes; a missed deadline fails the test, naming what was awaited and the
// last state seen. It replaces hand-written polling loops (some had no
// deadline, some ran out silently).
package wait

import (
	"fmt"
	"testing"
	"time"
)

// Poll is how often a condition is checked.
const Poll = 5 * time.Millisecond

// For waits until cond returns true, for at most timeout; then the test
// fails with what.
func For(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	Until(tb, timeout, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

var errNotYet = fmt.Errorf("not yet")

// Until waits until check returns nil, for at most timeout; then the test
// fails with what and check's last error (the state it saw).
func Until(tb testing.TB, timeout time.Duration, what string, check func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("waited %v for %s: %v", timeout, what, err)
		}
		time.Sleep(Poll)
	}
}
