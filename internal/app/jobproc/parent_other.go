//go:build !linux

package jobproc

import "os/exec"

// withParent does nothing here: the job watches its parent itself
// (`cairn run --exit-with-parent`).
func withParent(*exec.Cmd) {}
