package loadkit

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"
)

// Workload names, the same for every target.
const (
	WorkloadSessionChurn      = "session-churn"
	WorkloadLockOwn           = "lock-own"
	WorkloadLockContend       = "lock-contend"
	WorkloadPut               = "put"
	WorkloadGetConsistent     = "get-consistent"
	WorkloadWatchWake         = "watch-wake"
	WorkloadSessionsKeepalive = "sessions-keepalive"
	WorkloadPing              = "ping" // readiness probe: one successful write+read, retried until -duration
)

// Workloads lists every workload name, in the order -h shows them.
var Workloads = []string{
	WorkloadSessionChurn, WorkloadLockOwn, WorkloadLockContend, WorkloadPut,
	WorkloadGetConsistent, WorkloadWatchWake, WorkloadSessionsKeepalive, WorkloadPing,
}

// defaultClients is the client count each workload's yardstick was taken
// with; lock-contend's is the 32 clients for one key that the project sets.
func defaultClients(workload string) int {
	switch workload {
	case WorkloadPut, WorkloadGetConsistent, WorkloadLockContend, WorkloadSessionsKeepalive:
		return 32
	case WorkloadPing:
		return 1
	default:
		return 8
	}
}

// Config holds the flags every target understands. Target and Addr are
// left to each command, which registers them with its own names and
// defaults.
type Config struct {
	Target       string
	Workload     string
	Addr         string
	Clients      int
	Watchers     int
	Duration     time.Duration
	JSON         bool
	Sessions     int
	SessionTTL   time.Duration
	PID          int
	Keys         int
	ValueSize    int
	MaxOps       int64
	Timeout      time.Duration
	SetupTimeout time.Duration
	Prefix       string
	Quiet        bool
	NoCleanup    bool
	Rate         float64 // put, get-consistent: ops offered per second in all; 0 = a closed loop
	GenHeapMiB   int     // the load generator's own heap limit before it collects; 0 = Go's default collector
}

// Register defines the common flags on fs. defaultSessions is the
// command's default for -sessions.
func (c *Config) Register(fs *flag.FlagSet, defaultSessions int) {
	fs.StringVar(&c.Workload, "workload", "", "one of: "+strings.Join(Workloads, ", "))
	fs.IntVar(&c.Clients, "clients", 0, "concurrent clients (0 = the workload's default: 8, or 32 for lock-contend, put, get-consistent and sessions-keepalive, 1 for ping)")
	fs.IntVar(&c.Watchers, "watchers", 0, "watch-wake: number of watchers (0 = -clients)")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "length of the measured phase")
	fs.BoolVar(&c.JSON, "json", false, "also print the result as one JSON object on the next line")
	fs.IntVar(&c.Sessions, "sessions", defaultSessions, "sessions-keepalive: sessions (leases, connections) to create and keep alive")
	fs.DurationVar(&c.SessionTTL, "session-ttl", 60*time.Second, "sessions-keepalive: TTL of each session; each is renewed every TTL/2")
	fs.IntVar(&c.PID, "pid", 0, "server process id: sample its RSS and CPU time from /proc around the measured phase")
	fs.IntVar(&c.Keys, "keys", 1000, "put, get-consistent: number of distinct keys")
	fs.IntVar(&c.ValueSize, "value-size", 16, "bytes per value written")
	fs.Int64Var(&c.MaxOps, "max-ops", 50_000_000, "stop early after this many operations in total")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Second, "per-request timeout (blocking reads get their wait on top)")
	fs.DurationVar(&c.SetupTimeout, "setup-timeout", 10*time.Minute, "bound on set-up and clean-up phases (e.g. creating 100k sessions)")
	fs.StringVar(&c.Prefix, "prefix", "bench", "key prefix; each run adds its own unique component below it")
	fs.BoolVar(&c.Quiet, "quiet", false, "do not log the first errors to stderr")
	fs.Float64Var(&c.Rate, "rate", 0, "put, get-consistent: offer this many ops per second in all, spread evenly over the clients, and time each op from when it was due (0: each client sends its next op as soon as the last is answered)")
	fs.IntVar(&c.GenHeapMiB, "gen-heap", 256, "MiB the load generator's own heap may reach before it collects garbage (GOGC off, a memory limit), so that its collections do not count in the latencies it measures; 0: Go's default collector. GOGC or GOMEMLIMIT in the environment overrides it")
	fs.BoolVar(&c.NoCleanup, "no-cleanup", false, "sessions-keepalive: leave the sessions to expire instead of destroying them (for a server about to be restarted)")
}

// Check validates the flags and fills in the defaults that depend on the
// workload (Clients, Watchers).
func (c *Config) Check() error {
	ok := false
	for _, w := range Workloads {
		ok = ok || w == c.Workload
	}
	if !ok {
		return fmt.Errorf("-workload must be one of: %s", strings.Join(Workloads, ", "))
	}
	if c.Clients <= 0 {
		c.Clients = defaultClients(c.Workload)
	}
	if c.Watchers <= 0 {
		c.Watchers = c.Clients
	}
	if c.Duration <= 0 || c.Timeout <= 0 || c.SetupTimeout <= 0 {
		return errors.New("-duration, -timeout and -setup-timeout must be positive")
	}
	if c.GenHeapMiB < 0 {
		return errors.New("-gen-heap must not be negative")
	}
	if c.Keys <= 0 || c.ValueSize < 0 || c.Sessions <= 0 || c.MaxOps <= 0 {
		return errors.New("-keys, -sessions and -max-ops must be positive, -value-size not negative")
	}
	if c.Rate < 0 || (c.Rate > 0 && c.Workload != WorkloadPut && c.Workload != WorkloadGetConsistent) {
		return errors.New("-rate must not be negative, and applies to put and get-consistent only")
	}
	if c.SessionTTL < 2*time.Second {
		return errors.New("-session-ttl must be at least 2s")
	}
	return nil
}

// RunID makes keys of different runs against one server disjoint.
func RunID() string {
	return fmt.Sprintf("%x-%04x", time.Now().UnixNano(), rand.Intn(1<<16))
}

// startWatchdog ends the process if it is still running after limit, so that
// no run can outlive its budget whatever the server does. Stop the timer
// to disarm it.
func startWatchdog(name string, limit time.Duration) *time.Timer {
	return time.AfterFunc(limit, func() {
		fmt.Fprintf(os.Stderr, "%s: watchdog: still running after %s, exiting\n", name, limit)
		os.Exit(3)
	})
}

// watchdogLimit is the longest a run with this config may take.
func (c *Config) watchdogLimit() time.Duration {
	return 2*c.SetupTimeout + c.Duration + 2*c.Timeout + time.Minute
}

// Run does one run for a command named name whose flags have been parsed
// into cfg and checked: it arms the watchdog, cancels ctx on SIGINT or
// SIGTERM, calls workload with an error log (printing the first errors to
// stderr unless -quiet) and a ProcWatch for -pid, completes the result with
// target, workload, error count and the -pid figures, prints it to stdout
// (and its JSON form with -json) and returns the exit status: 1 if
// workload failed or no operation succeeded, else 0.
func Run(name string, cfg *Config, stdout, stderr io.Writer,
	workload func(ctx context.Context, el *ErrLog, pw *ProcWatch) (*Result, error)) int {
	defer startWatchdog(name, cfg.watchdogLimit()).Stop()
	setGenHeap(cfg.GenHeapMiB, os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	el := &ErrLog{w: stderr}
	if cfg.Quiet {
		el.w = nil
	}
	pw := NewProcWatch(cfg.PID, el)
	r, err := workload(ctx, el, pw)
	if r != nil {
		r.Target = cfg.Target
		r.Workload = cfg.Workload
		r.Errors = el.Count()
		pw.Finish(r)
		if cfg.Rate > 0 {
			r.Float("offered_rate", cfg.Rate, 1)
		}
		fmt.Fprintln(stdout, r.Line())
		if cfg.JSON {
			fmt.Fprintln(stdout, r.JSON())
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	if r == nil || r.Ops == 0 {
		fmt.Fprintf(stderr, "%s: no operation succeeded\n", name)
		return 1
	}
	return 0
}

// setGenHeap turns the load generator's collector into one that runs only
// when the heap reaches mib MiB (GOGC off, a soft memory limit), unless mib
// is 0 or the environment sets GOGC or GOMEMLIMIT. It reports whether it
// did.
//
// Why: at tens of thousands of requests per second the generator's heap,
// about 1 MiB live, would be collected a hundred times a second, with one of
// two Ps given to each collection's marking; the clients stalled behind it
// count the stall as the server's latency, and the faster the target the
// more often that happens. Its live heap stays far below the limit (about
// 10 MiB with 100,000 sessions held), so the limit is reached by garbage.
func setGenHeap(mib int, getenv func(string) string) bool {
	if mib <= 0 || getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return false
	}
	debug.SetMemoryLimit(int64(mib) << 20)
	debug.SetGCPercent(-1)
	return true
}
