//go:build !unix

package cli

import (
	"os"
	"os/exec"
)

// Without process groups the child alone is signalled, and there is no
// SIGTERM: both steps kill it.

func ownProcessGroup(cmd *exec.Cmd) {}

func terminateChild(pid int, group bool) error { return killPid(pid) }

func killChild(pid int, group bool) error { return killPid(pid) }

func killPid(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}
