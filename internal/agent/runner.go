package agent

import (
	"context"
	"sync"
	"time"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/state"
)

// Bounds of the backoff between retries of a failed catalog write.
const (
	minRetry = time.Second
	maxRetry = 30 * time.Second
)

// writeTimeout bounds one catalog write of a runner: a server that takes
// the connection and never answers must not keep the runner, and every
// registry change waiting to hold it, for ever. A write that times out is
// retried as a failed one is. It is real time, a bound on I/O like a
// socket deadline, not part of the check's logic (which runs on the
// agent's clock).
const writeTimeout = 10 * time.Second

// checkStatus is a check's status and output.
type checkStatus struct{ Status, Output string }

// noVerdict is the Status of a probe that could not be made at all because
// this process is out of file descriptors: the check keeps the status it
// had. Reporting it critical would say the checked service failed when the
// agent did, and invalidate the sessions bound to the check.
const noVerdict = "no verdict"

type updateReq struct {
	st    checkStatus
	reply chan error
}

// holdReq keeps a runner still (no writes, no timers handled) until the
// holder sends on release: true to stop it, false to let it carry on.
type holdReq struct{ release chan bool }

// runner is the goroutine that owns one check: its status, its timer and
// its catalog entry. Fields below "owned by run" are touched only by the
// run goroutine (and by start, before it begins).
type runner struct {
	a    *Agent
	clk  clock.Clock
	def  state.CheckDefinition // immutable
	kind checkKind

	updates chan *updateReq
	holds   chan *holdReq
	results chan checkStatus // one probe at a time; buffered so it never blocks
	stopCh  chan struct{}
	stopped sync.Once
	done    chan struct{} // closed when run has returned
	ctx     context.Context
	cancel  context.CancelFunc
	probes  sync.WaitGroup

	// held is the hold in force; touched only by the registry change that
	// holds the runner (under Agent.regMu).
	held *holdReq

	mu      sync.Mutex // guards cur and expires, which only run writes
	cur     checkStatus
	expires time.Time // TTL: deadline as last set (zero once expired), for the state file

	// owned by run:
	timer     clock.Timer // TTL: the deadline; HTTP/TCP: the next probe
	deadline  time.Time   // TTL: when the check expires; zero once it has
	synced    checkStatus // what the catalog holds (as far as we wrote it)
	unsynced  bool        // the last write failed; syncTimer retries it
	tried     checkStatus // what the last write, failed or not, carried
	lastWrite time.Time
	syncTimer clock.Timer // a retry, or a deferred output-only write
	backoff   time.Duration
}

// start makes the runner of a check that has just been written to the
// catalog as p.hc, and starts it. A TTL check's deadline is measured from
// p.at, the time of its registration.
func (a *Agent) start(p *prepared) *runner {
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{
		a: a, clk: a.cfg.Clock, def: p.def, kind: p.kind,
		updates: make(chan *updateReq), holds: make(chan *holdReq),
		results: make(chan checkStatus, 1), stopCh: make(chan struct{}), done: make(chan struct{}),
		ctx: ctx, cancel: cancel,
		cur:    checkStatus{Status: p.hc.Status, Output: p.hc.Output},
		synced: checkStatus{Status: p.hc.Status, Output: p.hc.Output},
		// lastWrite stays zero: the first output (a probe's, a note) is
		// written at once, only later output-only changes are spaced.
	}
	if p.kind == kindTTL {
		r.deadline = p.at.Add(p.def.TTL)
		r.expires = r.deadline
		r.timer = r.clk.NewTimer(r.deadline.Sub(r.clk.Now()))
	}
	go r.run()
	return r
}

func (r *runner) run() {
	defer close(r.done)
	defer r.cleanup()
	if r.kind != kindTTL {
		r.startProbe() // the first probe at once; then every Interval
	}
	for {
		var timerC, syncC <-chan time.Time
		if r.timer != nil {
			timerC = r.timer.C()
		}
		if r.syncTimer != nil {
			syncC = r.syncTimer.C()
		}
		select {
		case <-r.stopCh:
			return
		case u := <-r.updates:
			u.reply <- r.onUpdate(u.st)
		case h := <-r.holds:
			select {
			case exit := <-h.release:
				if exit {
					return
				}
			case <-r.stopCh:
				return
			}
		case <-timerC:
			if r.kind == kindTTL {
				r.expireIfDue()
			} else {
				r.startProbe()
			}
		case st := <-r.results:
			if st.Status == noVerdict {
				r.a.log.Warn("a health check could not be run: the agent is out of file descriptors (raise ulimit -n); "+
					"the check keeps its status", "check", r.def.ID, "error", st.Output)
				st = r.status()
			}
			changed := st.Status != r.status().Status
			r.set(st)
			r.maybeSync()
			if changed {
				// The state file keeps each check's last status, which a
				// restart registers again: a probed check that went
				// passing must not come back with an older critical.
				r.a.save()
			}
			if r.timer == nil {
				r.timer = r.clk.NewTimer(r.def.Interval)
			} else {
				r.timer.Reset(r.def.Interval)
			}
		case <-syncC:
			r.syncTimer = nil
			r.sync()
		}
	}
}

func (r *runner) cleanup() {
	r.cancel()
	if r.timer != nil {
		r.timer.Stop()
	}
	if r.syncTimer != nil {
		r.syncTimer.Stop()
	}
	r.probes.Wait()
}

// ---- called from other goroutines ----

// status returns the current status and output.
func (r *runner) status() checkStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// saved returns the current status and, for a TTL check, when its TTL
// runs out (zero once it has).
func (r *runner) saved() (checkStatus, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur, r.expires
}

// update hands a TTL update to the runner and waits until it is applied
// (and a status change written, or queued for retry).
func (r *runner) update(ctx context.Context, status, output string) error {
	req := &updateReq{st: checkStatus{Status: status, Output: output}, reply: make(chan error, 1)}
	select {
	case r.updates <- req:
	case <-r.done:
		return notFoundf("Unknown check ID %q: the check was deregistered", r.def.ID)
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-req.reply
}

// hold keeps the runner still until release; false if it has already
// stopped. Once hold returns true the runner has no write in progress.
func (r *runner) hold(ctx context.Context) (bool, error) {
	h := &holdReq{release: make(chan bool, 1)}
	select {
	case r.holds <- h:
		r.held = h
		return true, nil
	case <-r.done:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// release ends a hold: exit stops the runner (and waits for it).
func (r *runner) release(exit bool) {
	r.held.release <- exit
	r.held = nil
	if exit {
		<-r.done
	}
}

// shutdown stops the runner and waits for it; a write or probe in
// progress is cancelled.
func (r *runner) shutdown() {
	r.cancel()
	r.stopped.Do(func() { close(r.stopCh) })
	<-r.done
}

// ---- owned by run ----

func (r *runner) set(st checkStatus) {
	r.mu.Lock()
	r.cur = st
	r.mu.Unlock()
}

// onUpdate applies a TTL update. A TTL that ran out before the update
// arrived still takes effect first: the check goes critical (and its
// sessions are invalidated) even if the update was only just late.
func (r *runner) onUpdate(st checkStatus) error {
	r.expireIfDue()
	r.deadline = r.clk.Now().Add(r.def.TTL)
	r.timer.Reset(r.def.TTL)
	r.mu.Lock()
	r.expires = r.deadline
	r.mu.Unlock()
	r.set(st)
	r.maybeSync()
	return nil
}

// expireIfDue turns a TTL check critical once its deadline has passed.
func (r *runner) expireIfDue() {
	if r.deadline.IsZero() || r.clk.Now().Before(r.deadline) {
		return
	}
	r.deadline = time.Time{}
	r.mu.Lock()
	r.expires = time.Time{}
	r.mu.Unlock()
	r.set(checkStatus{Status: state.HealthCritical, Output: ttlExpiredOutput(r.status().Output)})
	r.maybeSync()
}

// maybeSync writes the current status to the catalog if it changed, and
// the current output if it changed and the last write is at least
// OutputUpdateInterval old (otherwise it arms a write for then).
func (r *runner) maybeSync() {
	cur := r.status()
	switch {
	case cur == r.synced && !r.unsynced:
		return
	case r.unsynced && r.syncTimer != nil && cur.Status == r.tried.Status:
		// A failed write is waiting for its retry, and the status is
		// still the one it carried: the retry writes what is current
		// then. (A probed check reports at every interval; without this
		// each report would write, and log, at once, whatever the
		// backoff.) A new status is written at once.
		return
	case cur.Status != r.synced.Status || r.unsynced:
		r.sync()
	case r.a.cfg.OutputUpdateInterval < 0 || !r.clk.Now().Before(r.lastWrite.Add(r.a.cfg.OutputUpdateInterval)):
		r.sync()
	case r.syncTimer == nil:
		r.syncTimer = r.clk.NewTimer(r.lastWrite.Add(r.a.cfg.OutputUpdateInterval).Sub(r.clk.Now()))
	}
}

// sync writes the current status and output to the catalog. A failed
// write is retried on the clock with a doubling backoff (1s to 30s).
func (r *runner) sync() {
	cur := r.status()
	r.tried = cur
	hc := r.a.catalogCheck(&r.def, r.kind, cur.Status, cur.Output)
	wctx, cancel := context.WithTimeout(r.ctx, writeTimeout)
	err := r.a.cfg.Catalog.Register(wctx, &state.RegisterRequest{Node: r.a.cfg.Node, SkipNodeUpdate: true, Check: hc})
	cancel()
	if r.syncTimer != nil {
		r.syncTimer.Stop()
		r.syncTimer = nil
	}
	if err != nil {
		if r.ctx.Err() != nil {
			return // stopping
		}
		r.unsynced = true
		switch {
		case r.backoff == 0:
			r.backoff = minRetry
		case r.backoff < maxRetry:
			r.backoff = min(2*r.backoff, maxRetry)
		}
		r.a.log.Warn("writing a check's status to the catalog failed; will retry",
			"check", r.def.ID, "status", cur.Status, "retry_in", r.backoff, "error", err)
		r.syncTimer = r.clk.NewTimer(r.backoff)
		return
	}
	r.synced, r.unsynced, r.backoff, r.lastWrite = cur, false, 0, r.clk.Now()
}

// startProbe runs one probe in its own goroutine; its result comes back
// on r.results.
func (r *runner) startProbe() {
	r.probes.Add(1)
	go func() {
		defer r.probes.Done()
		r.results <- r.a.probe(r.ctx, &r.def, r.kind)
	}()
}

// ttlExpiredOutput is the output of a TTL check whose TTL ran out after
// last. The last output is cut to fit first, so that the reason at the
// front survives (truncate keeps a text's end).
func ttlExpiredOutput(last string) string {
	out := "TTL expired"
	if last == "" {
		return out
	}
	const prefix = " (last output before timeout follows): "
	if room := MaxOutput - len(out) - len(prefix); len(last) > room {
		last = last[len(last)-room:]
	}
	return out + prefix + last
}
