package clocktest

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/holdfast/holdfast/clock"
)

// Fake is a clock.Clock whose time moves only when a test calls Advance or
// Set. Make one with NewFake.
//
// All methods of Fake and of the timers it makes are safe for concurrent
// use. Fake never holds its lock while running an AfterFunc callback, and
// it never blocks while sending on a timer's channel, so callbacks and
// timer receivers may call back into the Fake freely.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	created uint64        // timers made so far; orders deadline ties
	pending fakeHeap      // armed timers, earliest deadline first
	changed chan struct{} // closed when len(pending) changes; nil if nobody waits
}

var _ clock.Clock = (*Fake)(nil)

// NewFake returns a Fake that reads start until it is moved.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start}
}

// Now returns the fake's current time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake's time reaches
// Now()+d. A timer with d <= 0 fires at once. When it fires, C receives the
// timer's deadline (not the time the fake was moved to).
func (f *Fake) NewTimer(d time.Duration) clock.Timer {
	t := &fakeTimer{f: f, index: -1, c: make(chan time.Time, 1)}
	f.mu.Lock()
	f.created++
	t.order = f.created
	fn := f.armLocked(t, d)
	f.mu.Unlock()
	startDetached(fn)
	return t
}

// AfterFunc returns a timer that calls fn in its own goroutine when the
// fake's time reaches Now()+d. With d <= 0 the goroutine starts at once and
// nobody waits for it; otherwise the Advance or Set that reaches the
// deadline waits for fn to return (see Advance). The returned timer's C is
// nil.
func (f *Fake) AfterFunc(d time.Duration, fn func()) clock.Timer {
	t := &fakeTimer{f: f, index: -1, fn: fn}
	f.mu.Lock()
	f.created++
	t.order = f.created
	due := f.armLocked(t, d)
	f.mu.Unlock()
	startDetached(due)
	return t
}

// Advance moves the fake's time forward by d and fires every pending timer
// whose deadline is at or before the new time: a timer due exactly at the
// new time fires, one due a nanosecond later does not.
//
// The move is a single jump: the new time is visible to Now before any
// timer fires, so a goroutine woken by a timer, or a callback, reads the
// new time, and a timer it re-arms is measured from the new time (it does
// not fire again within the same Advance, even if its new deadline would
// fall before the target).
//
// Timers fire in deadline order, ties in the order the timers were made
// (by NewTimer or AfterFunc; Reset does not change a timer's place).
// Channel timers receive their value without blocking. AfterFunc callbacks
// run one at a time, each in its own goroutine, and Advance waits for each
// to return before firing the next and before returning: when Advance
// returns, every callback it launched has finished. A callback must
// therefore not wait for the caller of Advance; if a test needs that, it
// should call Advance from another goroutine.
//
// Advance panics if d is negative. Concurrent calls are allowed; each fires
// the timers that are due when it takes the lock.
func (f *Fake) Advance(d time.Duration) {
	if d < 0 {
		panic("clocktest: Advance with a negative duration")
	}
	f.mu.Lock()
	f.now = f.now.Add(d)
	fns := f.fireDueLocked()
	f.mu.Unlock()
	runInOrder(fns)
}

// Set moves the fake's time to t and fires due timers exactly as Advance
// does, waiting for AfterFunc callbacks in the same way. Set panics if t is
// before the current time: timers measure durations, and a fake that could
// run backwards would give them no meaning.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	if t.Before(f.now) {
		f.mu.Unlock()
		panic("clocktest: Set would move time backwards")
	}
	f.now = t
	fns := f.fireDueLocked()
	f.mu.Unlock()
	runInOrder(fns)
}

// Waiters returns the number of pending timers: made or Reset with a
// deadline still in the future, and neither fired nor stopped since.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// BlockUntilWaiters blocks until at least n timers are pending, or ctx is
// done, in which case it returns ctx.Err(). Tests use it to learn that a
// goroutine has armed the timer it is about to wait on, so that an Advance
// made afterwards is certain to wake it.
func (f *Fake) BlockUntilWaiters(ctx context.Context, n int) error {
	return f.BlockUntil(ctx, func(_ time.Time, due []time.Time) bool { return len(due) >= n })
}

// BlockUntil blocks until cond returns true, or ctx is done, in which case
// it returns ctx.Err(). cond is called with the fake's current time and the
// deadlines of the pending timers, earliest first, at once and again each
// time a timer is armed, re-armed, stopped or fired; it must not call back
// into the Fake. A count of waiters cannot tell a goroutine that has
// re-armed its timer from one still busy under another timer (a probe's
// timeout, say); the deadlines can.
func (f *Fake) BlockUntil(ctx context.Context, cond func(now time.Time, due []time.Time) bool) error {
	for {
		f.mu.Lock()
		due := make([]time.Time, len(f.pending))
		for i, t := range f.pending {
			due[i] = t.deadline
		}
		slices.SortFunc(due, time.Time.Compare)
		if cond(f.now, due) {
			f.mu.Unlock()
			return nil
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// notifyLocked wakes BlockUntilWaiters callers after the pending set
// changed.
func (f *Fake) notifyLocked() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// armLocked sets t to fire d after the current time. If that is not in the
// future the timer fires now: a channel timer gets its value, and for a
// func timer the callback is returned for the caller to start once the lock
// is released.
func (f *Fake) armLocked(t *fakeTimer, d time.Duration) func() {
	t.deadline = f.now.Add(d)
	if d <= 0 {
		return t.fireLocked()
	}
	heap.Push(&f.pending, t)
	f.notifyLocked()
	return nil
}

// fireDueLocked fires every pending timer due at or before f.now and
// returns, in firing order, the callbacks of func timers among them.
func (f *Fake) fireDueLocked() []func() {
	var fns []func()
	n := len(f.pending)
	for len(f.pending) > 0 && !f.pending[0].deadline.After(f.now) {
		t := heap.Pop(&f.pending).(*fakeTimer)
		if fn := t.fireLocked(); fn != nil {
			fns = append(fns, fn)
		}
	}
	if len(f.pending) != n {
		f.notifyLocked()
	}
	return fns
}

// runInOrder runs each callback in a goroutine of its own and waits for it
// to return before starting the next.
func runInOrder(fns []func()) {
	for _, fn := range fns {
		done := make(chan struct{})
		go func() {
			defer close(done)
			fn()
		}()
		<-done
	}
}

// startDetached starts fn, if any, in a goroutine nobody waits for.
func startDetached(fn func()) {
	if fn != nil {
		go fn()
	}
}

// fakeTimer is a timer of a Fake. Its fields are guarded by f.mu, except f,
// c, fn and order, which never change.
type fakeTimer struct {
	f        *Fake
	order    uint64 // creation order among f's timers
	c        chan time.Time
	fn       func()
	deadline time.Time
	index    int // position in f.pending, or -1 when not pending
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

// Stop prevents the timer from firing. It returns true if the timer was
// pending, or if it had fired but its value was still unreceived in C
// (Stop then discards the value, as time.Timer does since Go 1.23). After
// Stop returns, C yields nothing until the timer is Reset and fires again.
func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.disarmLocked()
}

// Reset re-arms the timer to fire d after the fake's current time, with
// d <= 0 firing at once. Its result and its effect on C are those of Stop:
// no value from before the Reset can be received after it.
func (t *fakeTimer) Reset(d time.Duration) bool {
	f := t.f
	f.mu.Lock()
	was := t.disarmLocked()
	fn := f.armLocked(t, d)
	f.mu.Unlock()
	startDetached(fn)
	return was
}

// disarmLocked removes t from the pending set and drains C, reporting
// whether either had something to undo.
func (t *fakeTimer) disarmLocked() bool {
	was := false
	if t.index >= 0 {
		heap.Remove(&t.f.pending, t.index)
		t.f.notifyLocked()
		was = true
	}
	if t.c != nil {
		select {
		case <-t.c:
			was = true
		default:
		}
	}
	return was
}

// fireLocked delivers t's deadline on its channel, or returns its callback.
// t must not be in the pending set.
func (t *fakeTimer) fireLocked() func() {
	if t.fn != nil {
		return t.fn
	}
	select {
	case t.c <- t.deadline:
	default:
		// C is drained whenever the timer is re-armed, so it is empty
		// here; the default only guards against blocking.
	}
	return nil
}

// fakeHeap orders pending timers by deadline, then creation order.
type fakeHeap []*fakeTimer

func (h fakeHeap) Len() int { return len(h) }

func (h fakeHeap) Less(i, j int) bool {
	if !h[i].deadline.Equal(h[j].deadline) {
		return h[i].deadline.Before(h[j].deadline)
	}
	return h[i].order < h[j].order
}

func (h fakeHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *fakeHeap) Push(x any) {
	t := x.(*fakeTimer)
	t.index = len(*h)
	*h = append(*h, t)
}

func (h *fakeHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*h = old[:len(old)-1]
	return t
}
