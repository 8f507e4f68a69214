package cli

import (
	"os"
	"runtime"
)

// minServerProcs is the fewest Ps (GOMAXPROCS) a server agent runs with.
//
// Why: every raft write ends in an fsync of the log, a system call that
// keeps its P for as long as it runs unless the runtime's monitor takes the
// P back, which it does only after one of its ticks, and those stretch to
// 10 ms while it finds little to do. With one P (a one-CPU host or
// container, or an agent started under taskset with one CPU) nothing else
// runs during each sync: no request is read, no answer written, no session
// renewed. Measured on this project's 2-core machine with the agent held to
// one CPU and 32 PUT clients on the other (bench/README.md, "One CPU"):
// 6,093 PUTs/s with one P against 40,809/s with two, p50 5.2 against
// 0.73 ms. A second P lets the other goroutines run on another thread
// while the sync sleeps in the kernel.
const minServerProcs = 2

// procsFloor returns the GOMAXPROCS a server should run with: cur, or min
// if cur is smaller, unless the operator chose the value (envSet).
func procsFloor(cur, min int, envSet bool) int {
	if envSet || cur >= min {
		return cur
	}
	return min
}

// raiseServerProcs applies procsFloor to the process, leaving a GOMAXPROCS
// set in the environment alone. It returns the old and new values. The
// setting is process-wide and is not put back: an agent is the process.
func raiseServerProcs() (from, to int) {
	_, envSet := os.LookupEnv("GOMAXPROCS")
	from = runtime.GOMAXPROCS(0)
	to = procsFloor(from, minServerProcs, envSet)
	if to != from {
		runtime.GOMAXPROCS(to)
	}
	return from, to
}
