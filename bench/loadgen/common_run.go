// Code shared verbatim by bench/loadgen and bench/peers; see common_hist.go.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Workload names, the same for every target.
const (
	wSessionChurn = "session-churn"
	wLockOwn      = "lock-own"
	wLockContend  = "lock-contend"
	wPut          = "put"
	wGet          = "get-consistent"
	wWatchWake    = "watch-wake"
	wKeepalive    = "sessions-keepalive"
	wPing         = "ping" // readiness probe: one successful write+read, retried until -duration
)

var allWorkloads = []string{wSessionChurn, wLockOwn, wLockContend, wPut, wGet, wWatchWake, wKeepalive, wPing}

// defaultClients is the client count each workload's yardstick was taken with.
func defaultClients(workload string) int {
	switch workload {
	case wPut, wGet, wKeepalive:
		return 32
	case wPing:
		return 1
	default:
		return 8
	}
}

// config holds the flags every target understands.
type config struct {
	target       string
	workload     string
	addr         string
	clients      int
	watchers     int
	duration     time.Duration
	jsonOut      bool
	sessions     int
	sessionTTL   time.Duration
	pid          int
	keys         int
	valueSize    int
	maxOps       int64
	timeout      time.Duration
	setupTimeout time.Duration
	prefix       string
	quiet        bool
	noCleanup    bool
}

func (c *config) register(fs *flag.FlagSet, defaultSessions int) {
	fs.StringVar(&c.workload, "workload", "", "one of: "+strings.Join(allWorkloads, ", "))
	fs.IntVar(&c.clients, "clients", 0, "concurrent clients (0 = the workload's default: 8, or 32 for put, get-consistent and sessions-keepalive)")
	fs.IntVar(&c.watchers, "watchers", 0, "watch-wake: number of watchers (0 = -clients)")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "length of the measured phase")
	fs.BoolVar(&c.jsonOut, "json", false, "also print the result as one JSON object on the next line")
	fs.IntVar(&c.sessions, "sessions", defaultSessions, "sessions-keepalive: sessions (leases, connections) to create and keep alive")
	fs.DurationVar(&c.sessionTTL, "session-ttl", 60*time.Second, "sessions-keepalive: TTL of each session; each is renewed every TTL/2")
	fs.IntVar(&c.pid, "pid", 0, "server process id: sample its RSS and CPU time from /proc around the measured phase")
	fs.IntVar(&c.keys, "keys", 1000, "put, get-consistent: number of distinct keys")
	fs.IntVar(&c.valueSize, "value-size", 16, "bytes per value written")
	fs.Int64Var(&c.maxOps, "max-ops", 50_000_000, "stop early after this many operations in total")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "per-request timeout (blocking reads get their wait on top)")
	fs.DurationVar(&c.setupTimeout, "setup-timeout", 10*time.Minute, "bound on set-up and clean-up phases (e.g. creating 100k sessions)")
	fs.StringVar(&c.prefix, "prefix", "bench", "key prefix; each run adds its own unique component below it")
	fs.BoolVar(&c.quiet, "quiet", false, "do not log the first errors to stderr")
	fs.BoolVar(&c.noCleanup, "no-cleanup", false, "sessions-keepalive: leave the sessions to expire instead of destroying them (for a server about to be restarted)")
}

func (c *config) check() error {
	ok := false
	for _, w := range allWorkloads {
		ok = ok || w == c.workload
	}
	if !ok {
		return fmt.Errorf("-workload must be one of: %s", strings.Join(allWorkloads, ", "))
	}
	if c.clients <= 0 {
		c.clients = defaultClients(c.workload)
	}
	if c.watchers <= 0 {
		c.watchers = c.clients
	}
	if c.duration <= 0 || c.timeout <= 0 || c.setupTimeout <= 0 {
		return errors.New("-duration, -timeout and -setup-timeout must be positive")
	}
	if c.keys <= 0 || c.valueSize < 0 || c.sessions <= 0 || c.maxOps <= 0 {
		return errors.New("-keys, -sessions and -max-ops must be positive, -value-size not negative")
	}
	if c.sessionTTL < 2*time.Second {
		return errors.New("-session-ttl must be at least 2s")
	}
	return nil
}

// runID makes keys of different runs against one server disjoint.
func runID() string {
	return fmt.Sprintf("%x-%04x", time.Now().UnixNano(), rand.Intn(1<<16))
}

// startWatchdog ends the process if it is still running after limit, so that
// no run can outlive its budget whatever the server does.
func startWatchdog(name string, limit time.Duration) {
	time.AfterFunc(limit, func() {
		fmt.Fprintf(os.Stderr, "%s: watchdog: still running after %s, exiting\n", name, limit)
		os.Exit(3)
	})
}

// watchdogLimit is the longest a run with this config may take.
func (c *config) watchdogLimit() time.Duration {
	return 2*c.setupTimeout + c.duration + 2*c.timeout + time.Minute
}

// errLog counts errors and prints the first few.
type errLog struct {
	w       io.Writer
	n       atomic.Int64
	printed atomic.Int64
}

func (e *errLog) add(what string, err error) {
	e.n.Add(1)
	if e.w != nil && e.printed.Add(1) <= 5 {
		fmt.Fprintf(e.w, "error: %s: %v\n", what, err)
	}
}

func (e *errLog) count() int64 { return e.n.Load() }

// errBackoff keeps a failing client from spinning.
const errBackoff = 5 * time.Millisecond

// loop runs op in n goroutines until dur has passed, ctx ends, or maxOps ops
// have been started in total. An op in flight at the deadline is allowed to
// finish (each request has its own timeout) so that it leaves nothing half
// done, but only ops that completed by the deadline are counted. Failures
// go to el. op gets the client number.
func loop(ctx context.Context, n int, dur time.Duration, maxOps int64, el *errLog, what string,
	op func(ctx context.Context, client int) error) (ops int64, lat *Hist, elapsed time.Duration) {
	var started atomic.Int64
	var done atomic.Int64
	hists := make([]Hist, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	end := t0.Add(dur)
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			h := &hists[c]
			for ctx.Err() == nil && time.Now().Before(end) && started.Add(1) <= maxOps {
				s := time.Now()
				err := op(ctx, c)
				f := time.Now()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					el.add(what, err)
					sleepCtx(ctx, errBackoff)
					continue
				}
				if f.After(end) {
					return
				}
				h.Record(f.Sub(s))
				done.Add(1)
			}
		}(c)
	}
	wg.Wait()
	elapsed = time.Since(t0)
	if elapsed > dur {
		elapsed = dur
	}
	lat = &Hist{}
	for i := range hists {
		lat.Merge(&hists[i])
	}
	return done.Load(), lat, elapsed
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// handoffs follows a contended lock from the clients' side. Holds are
// numbered in the order their acquisitions were seen; since a hold can only
// start after the previous one ended, that order is the lock's true order.
// The gap of a hand-off is the time from the releasing client seeing its
// release succeed to the next (different) client seeing its acquire
// succeed, both read from this process's clock. The two can be seen in
// either order, so whichever comes second computes the gap; when the
// acquire was seen first the gap counts as zero and early is incremented.
type handoffs struct {
	mu         sync.Mutex
	gen        int64
	acquires   int64
	handoffs   int64
	reacquires int64
	early      int64
	lastHolder int
	rel        holdEvent // last release not yet paired
	acq        holdEvent // last acquire not yet paired
	gap        Hist
	measure    bool
}

type holdEvent struct {
	gen    int64
	client int
	at     time.Time
	ok     bool
}

// acquired records that client now holds the lock and returns the hold's number.
func (h *handoffs) acquired(client int, at time.Time) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gen++
	g := h.gen
	if h.measure {
		h.acquires++
		if g > 1 && h.lastHolder == client {
			h.reacquires++
		}
	}
	h.lastHolder = client
	if h.rel.ok && h.rel.gen == g-1 {
		h.pair(h.rel.client, h.rel.at, client, at)
		h.rel.ok = false
	} else {
		h.acq = holdEvent{g, client, at, true}
	}
	return g
}

// released records that client's release of hold gen was acknowledged.
func (h *handoffs) released(client int, gen int64, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.acq.ok && h.acq.gen == gen+1 {
		h.pair(client, at, h.acq.client, h.acq.at)
		h.acq.ok = false
	} else {
		h.rel = holdEvent{gen, client, at, true}
	}
}

func (h *handoffs) pair(from int, relAt time.Time, to int, acqAt time.Time) {
	if from == to || !h.measure {
		return
	}
	h.handoffs++
	d := acqAt.Sub(relAt)
	if d < 0 {
		h.early++
		d = 0
	}
	h.gap.Record(d)
}

// keeper runs the sessions-keepalive workload for any target: workers
// create their share of the sessions, renewing each one every interval
// (first renewal at a random point within the first interval, so renewals
// are spread evenly over time), then all keep renewing for the measured
// phase, then destroy them.
type keeper struct {
	cfg      *config
	el       *errLog
	workers  int
	interval time.Duration
	create   func(ctx context.Context, worker int) (string, error)
	renew    func(ctx context.Context, worker int, id string) (alive bool, err error) // nil: the client library keeps sessions alive itself
	destroy  func(ctx context.Context, worker int, id string) error
	// onMeasure runs when every session exists, just before the measured phase.
	onMeasure func()
}

type kaItem struct {
	due time.Time
	id  string
}

type kaHeap []kaItem

func (h kaHeap) less(i, j int) bool { return h[i].due.Before(h[j].due) }

func (h *kaHeap) push(it kaItem) {
	*h = append(*h, it)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

// fixTop restores heap order after s[0].due grew.
func (h kaHeap) fixTop() {
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h.less(l, m) {
			m = l
		}
		if r < len(h) && h.less(r, m) {
			m = r
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func (h *kaHeap) popTop() {
	s := *h
	n := len(s) - 1
	s[0] = s[n]
	*h = s[:n]
	(*h).fixTop()
}

type keeperStats struct {
	created, createErrs, renewals, expired int64
	createDur, measured                    time.Duration
	maxLag                                 time.Duration
	lat                                    Hist
}

func (k *keeper) run(ctx context.Context) (*keeperStats, error) {
	total := k.cfg.sessions
	setupCtx, cancelSetup := context.WithTimeout(ctx, k.cfg.setupTimeout)
	defer cancelSetup()

	var createdWG sync.WaitGroup
	measureStart := make(chan struct{})
	var measureEnd time.Time // written before measureStart is closed
	stats := make([]keeperStats, k.workers)
	heaps := make([]kaHeap, k.workers)
	var wg sync.WaitGroup
	var failed atomic.Bool
	t0 := time.Now()
	for w := 0; w < k.workers; w++ {
		share := total / k.workers
		if w < total%k.workers {
			share++
		}
		createdWG.Add(1)
		wg.Add(1)
		go func(w, share int) {
			defer wg.Done()
			st := &stats[w]
			h := &heaps[w]
			rnd := rand.New(rand.NewSource(time.Now().UnixNano() + int64(w)))
			measuring := false
			creating := true
			consecutive := 0
			renewOne := func() {
				it := &(*h)[0]
				now := time.Now()
				if lag := now.Sub(it.due); measuring && lag > st.maxLag {
					st.maxLag = lag
				}
				rctx, cancel := context.WithTimeout(ctx, k.cfg.timeout)
				alive, err := k.renew(rctx, w, it.id)
				cancel()
				switch {
				case err != nil:
					k.el.add("renew", err)
					it.due = time.Now().Add(time.Second)
					h.fixTop()
				case !alive:
					st.expired++
					h.popTop()
				default:
					if measuring {
						st.renewals++
						st.lat.Record(time.Since(now))
					}
					it.due = it.due.Add(k.interval)
					if d := time.Now(); it.due.Before(d) {
						it.due = d.Add(k.interval) // fell a whole interval behind
					}
					h.fixTop()
				}
			}
			for {
				if creating && (int(st.created) >= share || setupCtx.Err() != nil || failed.Load()) {
					creating = false
					createdWG.Done()
				}
				if !measuring && !creating {
					select {
					case <-measureStart:
						measuring = true
					default:
					}
				}
				now := time.Now()
				if measuring && !now.Before(measureEnd) || ctx.Err() != nil {
					return
				}
				if k.renew != nil && len(*h) > 0 && !(*h)[0].due.After(now) {
					renewOne()
					continue
				}
				if creating {
					cctx, cancel := context.WithTimeout(setupCtx, k.cfg.timeout)
					id, err := k.create(cctx, w)
					cancel()
					if err != nil {
						st.createErrs++
						consecutive++
						k.el.add("create session", err)
						if consecutive >= 100 {
							failed.Store(true)
						}
						sleepCtx(setupCtx, errBackoff)
						continue
					}
					consecutive = 0
					st.created++
					h.push(kaItem{due: time.Now().Add(time.Duration(rnd.Int63n(int64(k.interval))) + 1), id: id})
					continue
				}
				// Nothing due: sleep until the next renewal, the end, or the start of measuring.
				wait := time.Second
				if k.renew != nil && len(*h) > 0 {
					wait = time.Until((*h)[0].due)
				}
				if measuring {
					if u := time.Until(measureEnd); u < wait {
						wait = u
					}
					sleepCtx(ctx, wait)
				} else {
					t := time.NewTimer(wait)
					select {
					case <-t.C:
					case <-measureStart:
					case <-ctx.Done():
					}
					t.Stop()
				}
			}
		}(w, share)
	}
	createdWG.Wait()
	createDur := time.Since(t0)
	var created int64
	for i := range stats {
		created += stats[i].created
	}
	var runErr error
	if failed.Load() || created < int64(total) {
		runErr = fmt.Errorf("created only %d of %d sessions within %s", created, total, k.cfg.setupTimeout)
	}
	if k.onMeasure != nil && runErr == nil {
		k.onMeasure()
	}
	mStart := time.Now()
	measureEnd = mStart.Add(k.cfg.duration)
	if runErr != nil {
		measureEnd = mStart // stop at once
	}
	close(measureStart)
	wg.Wait()
	out := &keeperStats{createDur: createDur, measured: time.Since(mStart)}
	for i := range stats {
		s := &stats[i]
		out.created += s.created
		out.createErrs += s.createErrs
		out.renewals += s.renewals
		out.expired += s.expired
		if s.maxLag > out.maxLag {
			out.maxLag = s.maxLag
		}
		out.lat.Merge(&s.lat)
	}
	if out.measured > k.cfg.duration {
		out.measured = k.cfg.duration
	}

	if k.cfg.noCleanup {
		return out, runErr
	}
	// Clean up with the same workers, bounded in time.
	dctx, cancelD := context.WithTimeout(context.Background(), k.cfg.setupTimeout)
	defer cancelD()
	for w := range heaps {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for _, it := range heaps[w] {
				if dctx.Err() != nil {
					return
				}
				c, cancel := context.WithTimeout(dctx, k.cfg.timeout)
				if err := k.destroy(c, w, it.id); err != nil && dctx.Err() == nil {
					k.el.add("destroy session", err)
				}
				cancel()
			}
		}(w)
	}
	wg.Wait()
	return out, runErr
}

// keepaliveResult turns keeper statistics into a result.
func keepaliveResult(cfg *config, st *keeperStats) *Result {
	r := &Result{Clients: cfg.clients, Ops: st.renewals, Lat: &st.lat, Elapsed: st.measured, Unit: "renewals", LatName: "renew"}
	r.Int("sessions", int64(cfg.sessions))
	r.Int("created", st.created)
	r.Float("create_s", st.createDur.Seconds(), 2)
	r.Float("create_per_s", float64(st.created)/st.createDur.Seconds(), 1)
	r.Int("create_errors", st.createErrs)
	r.Int("expired", st.expired)
	r.Ms("renew_lag_max_ms", st.maxLag)
	r.Float("session_ttl_s", cfg.sessionTTL.Seconds(), 0)
	return r
}
