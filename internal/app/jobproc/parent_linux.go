package jobproc

import (
	"os/exec"
	"syscall"
)

// withParent has the kernel SIGKILL the job when this process dies, however
// it dies: a supervisor killed with SIGKILL leaves no orphan holding the
// job's data directory.
func withParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
