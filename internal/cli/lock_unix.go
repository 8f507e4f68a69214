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

// terminateChild sends SIGTERM to the child pid: to its process group when
// it leads one (group), else to it alone.
func terminateChild(pid int, group bool) error { return signalChild(pid, group, syscall.SIGTERM) }

// killChild sends SIGKILL as terminateChild sends SIGTERM.
func killChild(pid int, group bool) error { return signalChild(pid, group, syscall.SIGKILL) }

func signalChild(pid int, group bool, sig syscall.Signal) error {
	if group {
		return syscall.Kill(-pid, sig)
	}
	return syscall.Kill(pid, sig)
}
