//go:build linux

package e2e

import "syscall"

// procAttr makes the kernel kill an agent if the test process dies first
// (a panic, a -timeout), so no agent outlives its test run.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
