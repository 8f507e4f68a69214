//go:build unix

package cli

import "syscall"

// openFileLimit is the number of files (sockets included) this process may
// have open: RLIMIT_NOFILE's soft limit, which Go raises to the hard one
// at start on Linux. 0 if unknown.
func openFileLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur)
}
