package clocktest_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/clock/clocktest"
)

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// testCtx bounds every blocking wait so that a bug fails the test instead of
// hanging it. It is a safety net, never a way to let time pass.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ready reports whether a value can be received from c right now, and
// returns it.
func ready(c <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-c:
		return v, true
	default:
		return time.Time{}, false
	}
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

func TestNowAdvanceSet(t *testing.T) {
	f := clocktest.NewFake(epoch)
	if got := f.Now(); !got.Equal(epoch) {
		t.Fatalf("Now = %v, want %v", got, epoch)
	}
	f.Advance(90 * time.Second)
	if got, want := f.Now(), epoch.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("after Advance: Now = %v, want %v", got, want)
	}
	if got := clock.Since(f, epoch); got != 90*time.Second {
		t.Fatalf("Since = %v, want 90s", got)
	}
	f.Advance(0)
	later := epoch.Add(time.Hour)
	f.Set(later)
	if got := f.Now(); !got.Equal(later) {
		t.Fatalf("after Set: Now = %v, want %v", got, later)
	}
	f.Set(later) // setting the current time is allowed
	mustPanic(t, "Advance(-1)", func() { f.Advance(-1) })
	mustPanic(t, "Set(past)", func() { f.Set(epoch) })
	if got := f.Now(); !got.Equal(later) {
		t.Fatalf("a refused move changed the time to %v", got)
	}
}

func TestTimerFiresExactlyAtDeadline(t *testing.T) {
	f := clocktest.NewFake(epoch)
	tm := f.NewTimer(time.Second)
	if n := f.Waiters(); n != 1 {
		t.Fatalf("Waiters = %d, want 1", n)
	}
	f.Advance(time.Second - time.Nanosecond)
	if v, ok := ready(tm.C()); ok {
		t.Fatalf("timer fired a nanosecond early with %v", v)
	}
	if n := f.Waiters(); n != 1 {
		t.Fatalf("Waiters = %d, want 1", n)
	}
	f.Advance(time.Nanosecond)
	v, ok := ready(tm.C())
	if !ok {
		t.Fatal("timer did not fire at its deadline")
	}
	if want := epoch.Add(time.Second); !v.Equal(want) {
		t.Fatalf("C gave %v, want the deadline %v", v, want)
	}
	if n := f.Waiters(); n != 0 {
		t.Fatalf("Waiters = %d after firing, want 0", n)
	}
	f.Advance(time.Hour)
	if _, ok := ready(tm.C()); ok {
		t.Fatal("a one-shot timer fired twice")
	}
}

func TestSetFiresDueTimers(t *testing.T) {
	f := clocktest.NewFake(epoch)
	a := f.NewTimer(time.Minute)
	b := f.NewTimer(time.Minute + time.Nanosecond)
	f.Set(epoch.Add(time.Minute))
	if _, ok := ready(a.C()); !ok {
		t.Error("timer due at the new time did not fire")
	}
	if _, ok := ready(b.C()); ok {
		t.Error("timer due a nanosecond after the new time fired")
	}
}

func TestChannelValueArrivesOnJumpPastDeadline(t *testing.T) {
	f := clocktest.NewFake(epoch)
	tm := f.NewTimer(time.Second)
	f.Advance(time.Hour)
	v, ok := ready(tm.C())
	if !ok {
		t.Fatal("timer did not fire")
	}
	if want := epoch.Add(time.Second); !v.Equal(want) {
		t.Fatalf("C gave %v, want the deadline %v", v, want)
	}
}

func TestNonPositiveDurationFiresAtOnce(t *testing.T) {
	f := clocktest.NewFake(epoch)
	for _, d := range []time.Duration{0, -time.Second} {
		tm := f.NewTimer(d)
		v, ok := ready(tm.C())
		if !ok {
			t.Fatalf("NewTimer(%v) did not fire at once", d)
		}
		if want := epoch.Add(d); !v.Equal(want) {
			t.Fatalf("NewTimer(%v) gave %v, want %v", d, v, want)
		}
		if n := f.Waiters(); n != 0 {
			t.Fatalf("NewTimer(%v): Waiters = %d, want 0", d, n)
		}
	}

	ran := make(chan struct{})
	tm := f.AfterFunc(0, func() { close(ran) })
	select {
	case <-ran:
	case <-testCtx(t).Done():
		t.Fatal("AfterFunc(0) callback never ran")
	}
	if tm.Stop() {
		t.Error("Stop of an AfterFunc timer that already fired returned true")
	}

	tm2 := f.NewTimer(time.Hour)
	if !tm2.Reset(0) {
		t.Error("Reset of a pending timer returned false")
	}
	if _, ok := ready(tm2.C()); !ok {
		t.Error("Reset(0) did not fire at once")
	}
}

func TestStop(t *testing.T) {
	f := clocktest.NewFake(epoch)

	pending := f.NewTimer(time.Second)
	if !pending.Stop() {
		t.Error("Stop of a pending timer returned false")
	}
	if pending.Stop() {
		t.Error("second Stop returned true")
	}
	if n := f.Waiters(); n != 0 {
		t.Errorf("Waiters = %d after Stop, want 0", n)
	}
	f.Advance(time.Hour)
	if _, ok := ready(pending.C()); ok {
		t.Error("stopped timer fired")
	}

	// Fired but unreceived: Stop discards the value and reports it.
	unread := f.NewTimer(time.Second)
	f.Advance(time.Second)
	if !unread.Stop() {
		t.Error("Stop of a fired, unreceived timer returned false")
	}
	if _, ok := ready(unread.C()); ok {
		t.Error("a stale value remained in C after Stop")
	}

	// Fired and received: nothing left to stop.
	read := f.NewTimer(time.Second)
	f.Advance(time.Second)
	<-read.C()
	if read.Stop() {
		t.Error("Stop of a fired, received timer returned true")
	}
}

func TestReset(t *testing.T) {
	f := clocktest.NewFake(epoch)

	tm := f.NewTimer(time.Second)
	f.Advance(500 * time.Millisecond)
	if !tm.Reset(time.Second) {
		t.Error("Reset of a pending timer returned false")
	}
	if n := f.Waiters(); n != 1 {
		t.Errorf("Waiters = %d after Reset, want 1", n)
	}
	f.Advance(time.Second - time.Nanosecond) // old deadline passed long ago
	if _, ok := ready(tm.C()); ok {
		t.Fatal("Reset timer fired at its old deadline")
	}
	f.Advance(time.Nanosecond)
	if _, ok := ready(tm.C()); !ok {
		t.Fatal("Reset timer did not fire at its new deadline")
	}
	if tm.Reset(time.Second) {
		t.Error("Reset after a received firing returned true")
	}

	// Fired but unreceived: Reset discards the stale value.
	f.Advance(time.Second)
	if !tm.Reset(time.Minute) {
		t.Error("Reset of a fired, unreceived timer returned false")
	}
	if _, ok := ready(tm.C()); ok {
		t.Fatal("a stale value remained in C after Reset")
	}
	f.Advance(time.Minute)
	v, ok := ready(tm.C())
	if !ok {
		t.Fatal("re-armed timer did not fire")
	}
	if want := f.Now(); !v.Equal(want) {
		t.Fatalf("C gave %v, want %v", v, want)
	}

	// A stopped timer can be re-armed.
	tm.Stop()
	if tm.Reset(time.Second) {
		t.Error("Reset of a stopped timer returned true")
	}
	f.Advance(time.Second)
	if _, ok := ready(tm.C()); !ok {
		t.Fatal("timer re-armed after Stop did not fire")
	}
}

func TestFiringOrder(t *testing.T) {
	f := clocktest.NewFake(epoch)
	var got []string
	record := func(name string) func() {
		// Advance runs callbacks one at a time and waits for each, so
		// appending without a lock is safe; -race checks that claim.
		return func() { got = append(got, name) }
	}
	f.AfterFunc(3*time.Second, record("c3"))
	f.AfterFunc(time.Second, record("a1"))
	tie1 := f.AfterFunc(time.Hour, record("tie-first"))
	f.AfterFunc(2*time.Second, record("b2-first"))
	f.AfterFunc(2*time.Second, record("b2-second"))
	f.AfterFunc(10*time.Second, record("late"))
	// A Reset does not move a timer behind timers made after it.
	tie1.Reset(2 * time.Second)
	// Not yet due after the Advance below.
	f.AfterFunc(10*time.Second+time.Nanosecond, record("too-late"))

	f.Advance(10 * time.Second)
	want := []string{"a1", "tie-first", "b2-first", "b2-second", "c3", "late"}
	if !slices.Equal(got, want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
	if n := f.Waiters(); n != 1 {
		t.Fatalf("Waiters = %d, want 1", n)
	}
}

func TestAfterFunc(t *testing.T) {
	f := clocktest.NewFake(epoch)
	var calls atomic.Int32
	var sawNow time.Time
	tm := f.AfterFunc(time.Second, func() {
		calls.Add(1)
		sawNow = f.Now() // calling back into the fake must not deadlock
	})
	if tm.C() != nil {
		t.Error("AfterFunc timer has a non-nil C")
	}
	f.Advance(time.Second - time.Nanosecond)
	if n := calls.Load(); n != 0 {
		t.Fatalf("callback ran %d times before its deadline", n)
	}
	f.Advance(5 * time.Second)
	// Advance has waited for the callback: its writes are visible.
	if n := calls.Load(); n != 1 {
		t.Fatalf("callback ran %d times, want 1", n)
	}
	if want := epoch.Add(5*time.Second + time.Second - time.Nanosecond); !sawNow.Equal(want) {
		t.Fatalf("callback saw Now = %v, want the new time %v", sawNow, want)
	}
	if tm.Stop() {
		t.Error("Stop after the callback ran returned true")
	}
	if tm.Reset(time.Second) {
		t.Error("Reset after the callback ran returned true")
	}
	f.Advance(time.Second)
	if n := calls.Load(); n != 2 {
		t.Fatalf("re-armed callback: %d calls, want 2", n)
	}

	stopped := f.AfterFunc(time.Second, func() { t.Error("stopped callback ran") })
	if !stopped.Stop() {
		t.Error("Stop of a pending AfterFunc returned false")
	}
	f.Advance(time.Hour)
}

func TestAfterFuncRearmsFromNewTime(t *testing.T) {
	f := clocktest.NewFake(epoch)
	var fired []time.Time
	var tm clock.Timer
	tm = f.AfterFunc(time.Second, func() {
		fired = append(fired, f.Now())
		tm.Reset(time.Second) // a periodic job re-arming itself
	})
	f.Advance(10 * time.Second)
	if len(fired) != 1 {
		t.Fatalf("a single Advance ran a re-arming callback %d times, want 1", len(fired))
	}
	if n := f.Waiters(); n != 1 {
		t.Fatalf("Waiters = %d, want the re-armed timer", n)
	}
	f.Advance(time.Second - time.Nanosecond)
	if len(fired) != 1 {
		t.Fatal("re-armed timer fired early: it must count from the time of the jump")
	}
	f.Advance(time.Nanosecond)
	if len(fired) != 2 {
		t.Fatalf("re-armed timer: %d firings, want 2", len(fired))
	}
	tm.Stop()
}

func TestAdvanceFromCallback(t *testing.T) {
	f := clocktest.NewFake(epoch)
	inner := make(chan struct{})
	f.AfterFunc(time.Second, func() {
		f.AfterFunc(time.Second, func() { close(inner) })
		f.Advance(time.Second) // nested Advance must not deadlock
	})
	f.Advance(time.Second)
	select {
	case <-inner:
	default:
		t.Fatal("the nested Advance did not run the inner callback before returning")
	}
}

// worker waits on a timer in a loop, as the code under test typically
// does, and reports each wake-up.
func worker(ctx context.Context, clk clock.Clock, every time.Duration, woke chan<- time.Time) {
	tm := clk.NewTimer(every)
	defer tm.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case v := <-tm.C():
			woke <- v
			tm.Reset(every)
		}
	}
}

func TestBlockUntilWaitersSynchronisesWithAWorker(t *testing.T) {
	ctx := testCtx(t)
	f := clocktest.NewFake(epoch)
	woke := make(chan time.Time)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		worker(wctx, f, time.Minute, woke)
	}()
	defer func() { stop(); <-done }()

	for i := 1; i <= 5; i++ {
		// Wait until the worker has (re-)armed its timer, then fire it.
		if err := f.BlockUntilWaiters(ctx, 1); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		f.Advance(time.Minute - time.Nanosecond)
		select {
		case v := <-woke:
			t.Fatalf("round %d: worker woke early at %v", i, v)
		default:
		}
		f.Advance(time.Nanosecond)
		select {
		case v := <-woke:
			if want := epoch.Add(time.Duration(i) * time.Minute); !v.Equal(want) {
				t.Fatalf("round %d: woke with %v, want %v", i, v, want)
			}
		case <-ctx.Done():
			t.Fatalf("round %d: worker never woke", i)
		}
	}
}

func TestBlockUntilWaiters(t *testing.T) {
	f := clocktest.NewFake(epoch)
	ctx := testCtx(t)

	if err := f.BlockUntilWaiters(ctx, 0); err != nil {
		t.Fatalf("BlockUntilWaiters(0) = %v", err)
	}

	// Cancelled while waiting.
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- f.BlockUntilWaiters(cctx, 1) }()
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("cancelled BlockUntilWaiters = %v, want context.Canceled", err)
	}

	// Wakes when enough timers are pending, counting only pending ones.
	errc2 := make(chan error, 1)
	go func() { errc2 <- f.BlockUntilWaiters(ctx, 3) }()
	a := f.NewTimer(time.Second)
	a.Stop()
	f.NewTimer(time.Second)
	f.AfterFunc(time.Second, func() {})
	f.NewTimer(0) // fires at once, never pending
	select {
	case err := <-errc2:
		t.Fatalf("BlockUntilWaiters(3) returned %v with 2 pending timers", err)
	default:
	}
	if n := f.Waiters(); n != 2 {
		t.Fatalf("Waiters = %d, want 2", n)
	}
	a.Reset(time.Second)
	if err := <-errc2; err != nil {
		t.Fatalf("BlockUntilWaiters(3) = %v", err)
	}
}

func TestBlockUntilSeesDeadlines(t *testing.T) {
	f := clocktest.NewFake(epoch)
	ctx := testCtx(t)
	// Due a minute from now, and nothing sooner: a worker that re-armed
	// its one-minute timer, not one still under a ten-second timeout.
	rearmed := func(now time.Time, due []time.Time) bool {
		return len(due) == 1 && due[0].Equal(now.Add(time.Minute))
	}
	errc := make(chan error, 1)
	go func() { errc <- f.BlockUntil(ctx, rearmed) }()
	timeout := f.NewTimer(10 * time.Second)
	late := f.NewTimer(time.Hour)
	late.Stop()
	select {
	case err := <-errc:
		t.Fatalf("BlockUntil returned %v with only a ten-second timer pending", err)
	default:
	}
	timeout.Stop()
	interval := f.NewTimer(2 * time.Minute)
	select {
	case err := <-errc:
		t.Fatalf("BlockUntil returned %v with a timer due in two minutes", err)
	default:
	}
	interval.Reset(time.Minute)
	if err := <-errc; err != nil {
		t.Fatalf("BlockUntil = %v", err)
	}

	// The deadlines come earliest first, and cond sees the moved time.
	f.NewTimer(30 * time.Second)
	f.Advance(10 * time.Second)
	var got []time.Duration
	if err := f.BlockUntil(ctx, func(now time.Time, due []time.Time) bool {
		got = got[:0]
		for _, d := range due {
			got = append(got, d.Sub(now))
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{20 * time.Second, 50 * time.Second}; !slices.Equal(got, want) {
		t.Fatalf("deadlines from now = %v, want %v", got, want)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.BlockUntil(cctx, func(time.Time, []time.Time) bool { return false }); err != context.Canceled {
		t.Fatalf("cancelled BlockUntil = %v, want context.Canceled", err)
	}
}

func TestConcurrentUse(t *testing.T) {
	f := clocktest.NewFake(epoch)
	const workers, rounds = 8, 200
	var fired atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				d := time.Duration(1+(w*rounds+i)%50) * time.Millisecond
				switch i % 4 {
				case 0:
					tm := f.NewTimer(d)
					if i%8 == 0 {
						tm.Stop()
					}
				case 1:
					f.AfterFunc(d, func() { fired.Add(1) })
				case 2:
					tm := f.NewTimer(d)
					tm.Reset(2 * d)
					_ = f.Waiters()
				case 3:
					f.Advance(time.Millisecond)
					_ = f.Now()
				}
			}
		})
	}
	wg.Wait()
	// Flush everything still pending and check nothing is left.
	f.Advance(time.Hour)
	if n := f.Waiters(); n != 0 {
		t.Fatalf("Waiters = %d after flushing, want 0", n)
	}
	if got, want := fired.Load(), int64(workers*rounds/4); got != want {
		t.Fatalf("%d AfterFunc callbacks ran, want %d", got, want)
	}
}

func ExampleFake() {
	clk := clocktest.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	clk.AfterFunc(15*time.Second, func() { fmt.Println("session expired at", clk.Now().Format(time.TimeOnly)) })

	clk.Advance(15*time.Second - time.Nanosecond)
	fmt.Println("nothing yet")
	clk.Advance(time.Nanosecond) // returns after the callback has run
	// Output:
	// nothing yet
	// session expired at 00:00:15
}
