//go:build !linux

package e2e

import "syscall"

// procAttr: outside Linux there is no parent-death signal; t.Cleanup still
// kills every agent when its test ends.
func procAttr() *syscall.SysProcAttr { return nil }
