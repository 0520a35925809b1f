package nexmarkq_test

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel SIGKILL cmd when the test process dies, so a
// failed or killed test leaves no cairn running.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
