package ttl

import (
	"sync"
	"time"

	"github.com/holdfast/holdfast/clock"
)

// Timers calls a function when an id's deadline passes. It keeps every
// deadline in one Heap and a single clock timer armed for the earliest of
// them, so a hundred thousand ids cost one timer, and Reset is O(log n).
//
// Ownership: the Timers value owns the heap and the clock timer, guarded by
// an internal mutex that Reset, Remove, Clear and Len hold only briefly, so
// they may be called from any goroutine, including from onExpire. One
// goroutine, started by New and stopped by Close, owns expiry: it alone
// takes expired ids out of the heap and calls onExpire, so calls to
// onExpire are never concurrent with each other.
//
// A Reset or Remove of an id, or a Clear, that returns before the goroutine
// calls onExpire for that id prevents the call, even if the deadline has
// already passed. A call already under way cannot be recalled, so the
// consumer of onExpire must order it against its renewals itself (the
// server does so under a lock of its own, with Pending: see
// Server.onSessionExpired).
type Timers struct {
	clk      clock.Clock
	onExpire func(id string)
	afterRun func() // test hook: called by the goroutine after each wake-up; nil in production

	mu       sync.Mutex
	h        Heap
	inflight map[string]struct{} // taken from h, onExpire not yet called
	tm       clock.Timer         // armed for h's earliest deadline when isArmed
	armedAt  time.Time
	isArmed  bool
	closed   bool

	closeOnce sync.Once
	quit      chan struct{}
	done      chan struct{}
}

// New starts a Timers on clk. onExpire is called with each id whose deadline
// passes, once per deadline, from the Timers goroutine; ids that expire at
// the same wake-up are passed in deadline order (ties by id). onExpire must
// not block for long, since no other id expires while it runs: it should
// hand the id to a channel or proposer and return. It may call Reset,
// Remove, Clear and Len, but not Close. onExpire must not be nil.
//
// The caller must call Close to stop the goroutine.
func New(clk clock.Clock, onExpire func(id string), opts ...Option) *Timers {
	return newTimers(clk, onExpire, nil, opts...)
}

// Option configures a Timers.
type Option func(*Timers)

// WithIntern has Timers keep intern(id), which must equal id, as the key of
// each id it starts tracking, instead of the caller's string. The server
// passes the session ID already held by its state, so the heap shares it
// rather than keeping a second copy of every live session's ID. intern is
// called with the Timers' lock held, only when an absent id is Reset.
func WithIntern(intern func(id string) string) Option {
	return func(t *Timers) { t.h.intern = intern }
}

func newTimers(clk clock.Clock, onExpire func(id string), afterRun func(), opts ...Option) *Timers {
	if onExpire == nil {
		panic("ttl: New with a nil onExpire")
	}
	t := &Timers{
		clk:      clk,
		onExpire: onExpire,
		afterRun: afterRun,
		inflight: make(map[string]struct{}),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for _, o := range opts {
		o(t)
	}
	// clock.Clock cannot make a stopped timer; make one and stop it. Its
	// channel stays the same through every Reset, so the goroutine reads
	// it once.
	t.tm = clk.NewTimer(time.Hour)
	t.tm.Stop()
	go t.run(t.tm.C())
	return t
}

// Reset sets id to expire d from now, by the Timers' clock, whether or not
// it was already present. A d <= 0 expires id at once. Reset also cancels
// an expiry of id that has been taken from the heap but not yet passed to
// onExpire. After Close, Reset does nothing.
func (t *Timers) Reset(id string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	now := t.clk.Now()
	delete(t.inflight, id)
	t.h.Set(id, now.Add(d))
	t.rearmLocked(now, false)
}

// Remove cancels id's expiry and reports whether there was one to cancel.
func (t *Timers) Remove(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, pending := t.inflight[id]
	delete(t.inflight, id)
	if t.h.Remove(id) {
		pending = true
		t.rearmLocked(t.clk.Now(), false)
	}
	return pending
}

// Clear cancels every expiry, including those taken from the heap but not
// yet passed to onExpire. The server calls it when it loses leadership.
func (t *Timers) Clear() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.h.Clear()
	clear(t.inflight)
	if t.isArmed {
		t.tm.Stop()
		t.isArmed = false
	}
}

// Pending reports whether id has a deadline waiting in the heap: set by a
// Reset and neither passed, removed nor cleared since. Called from
// onExpire, it tells whether id was Reset again after the deadline that
// fired.
func (t *Timers) Pending(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.h.Deadline(id)
	return ok
}

// Len returns the number of ids waiting to expire.
func (t *Timers) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.h.Len()
}

// Close cancels every expiry, stops the goroutine and waits for it to exit;
// after Close returns, onExpire is not called again. Close must not be
// called from onExpire. Calling Close more than once is harmless.
func (t *Timers) Close() {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		t.Clear()
		close(t.quit)
	})
	<-t.done
}

// run is the Timers goroutine.
func (t *Timers) run(fired <-chan time.Time) {
	defer close(t.done)
	for {
		select {
		case <-t.quit:
			return
		case <-fired:
		}
		t.expire()
		if t.afterRun != nil {
			t.afterRun()
		}
	}
}

// expire takes every id whose deadline has passed out of the heap, re-arms
// the clock timer for the next deadline and calls onExpire for each id that
// was not reset or removed in the meantime.
func (t *Timers) expire() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	now := t.clk.Now()
	ids := t.h.PopExpired(now)
	for _, id := range ids {
		t.inflight[id] = struct{}{}
	}
	// The timer has fired, or a Reset since the firing re-armed it;
	// either way, arm it afresh for the earliest remaining deadline.
	t.rearmLocked(now, true)
	t.mu.Unlock()

	for _, id := range ids {
		t.mu.Lock()
		_, live := t.inflight[id]
		delete(t.inflight, id)
		live = live && !t.closed
		t.mu.Unlock()
		if live {
			t.onExpire(id)
		}
	}
}

// rearmLocked points the clock timer at the heap's earliest deadline, or
// stops it if the heap is empty. Unless force is set it leaves a timer that
// is already armed for that deadline alone, so a Reset of any id but the
// earliest costs no timer operation.
func (t *Timers) rearmLocked(now time.Time, force bool) {
	_, next, ok := t.h.Next()
	if !ok {
		if t.isArmed || force {
			t.tm.Stop()
			t.isArmed = false
		}
		return
	}
	if !force && t.isArmed && next.Equal(t.armedAt) {
		return
	}
	t.tm.Reset(next.Sub(now))
	t.armedAt = next
	t.isArmed = true
}
