//go:build unix

package cli

import (
	"os/exec"
	"syscall"
)

// ownProcessGroup starts the child as the leader of a process group of its
// own, so that signals sent to the group reach everything it started.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// terminateGroup sends SIGTERM to the process group led by pid.
func terminateGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGTERM) }

// killGroup sends SIGKILL to the process group led by pid.
func killGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGKILL) }
