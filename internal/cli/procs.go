package cli

import (
	"os"
	"runtime"
)

// minServerProcs is the fewest Ps (GOMAXPROCS) a server agent runs with.
//
// Why: every raft write ends in an fsync of the log, a system call that
// keeps its P while it sleeps in the kernel until the runtime's monitor
// takes the P back. With one P (a one-CPU host or container, or an agent
// started under taskset with one CPU) the other goroutines wait for that.
// Measured on this project's 2-core machine with the agent held to one CPU
// and 32 PUT clients on the other (bench/README.md, "One CPU"): a freshly
// started agent did about 6,000 PUTs/s (p50 5 ms) in its first seconds
// with one P against 40,000/s (p50 0.7 ms) with two, and once warm
// 31,932 against 37,934/s. The price, also measured there: on one CPU the
// two threads share its time slices, and the p99 of reads that saturate
// the CPU doubles.
const minServerProcs = 2

// procsFloor returns the GOMAXPROCS a server should run with: cur, or
// least if cur is smaller, unless the operator chose the value (envSet).
func procsFloor(cur, least int, envSet bool) int {
	if envSet || cur >= least {
		return cur
	}
	return least
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
