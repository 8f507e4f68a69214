package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/clock/clocktest"
)

// The same timer contract must hold for Real and for the fake that tests
// use in its place; otherwise code proven on the fake could misbehave in
// production. Each clock under test comes with a way to let time pass: the
// fake is advanced, the real clock is waited on (briefly).
type subject struct {
	name string
	clk  clock.Clock
	// pass lets at least d elapse on clk.
	pass func(t *testing.T, d time.Duration)
}

func subjects() []subject {
	fake := clocktest.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	return []subject{
		{
			name: "Real",
			clk:  clock.Real(),
			pass: func(t *testing.T, d time.Duration) {
				// Wait on a timer of the real clock itself: it fires
				// only after d, and timers of the runtime fire in
				// deadline order.
				done := make(chan struct{})
				clock.Real().AfterFunc(d, func() { close(done) })
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					t.Fatal("real time did not pass")
				}
			},
		},
		{
			name: "Fake",
			clk:  fake,
			pass: func(t *testing.T, d time.Duration) { fake.Advance(d) },
		},
	}
}

func recv(t *testing.T, c <-chan time.Time) time.Time {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("timer never fired")
		return time.Time{}
	}
}

func TestTimerContract(t *testing.T) {
	const d = 2 * time.Millisecond
	for _, s := range subjects() {
		t.Run(s.name, func(t *testing.T) {
			clk := s.clk
			start := clk.Now()

			t.Run("fires", func(t *testing.T) {
				tm := clk.NewTimer(d)
				s.pass(t, 2*d)
				v := recv(t, tm.C())
				if v.Before(start.Add(d)) {
					t.Errorf("fired with %v, before its deadline %v", v, start.Add(d))
				}
				if tm.Stop() {
					t.Error("Stop after a received firing returned true")
				}
			})

			t.Run("stop pending", func(t *testing.T) {
				tm := clk.NewTimer(time.Hour)
				if !tm.Stop() {
					t.Error("Stop of a pending timer returned false")
				}
				if tm.Stop() {
					t.Error("second Stop returned true")
				}
			})

			t.Run("stop drops unreceived value", func(t *testing.T) {
				tm := clk.NewTimer(d)
				s.pass(t, 2*d)
				if !tm.Stop() {
					t.Error("Stop of a fired, unreceived timer returned false")
				}
				select {
				case v := <-tm.C():
					t.Errorf("stale value %v received after Stop", v)
				default:
				}
			})

			t.Run("reset drops unreceived value and re-arms", func(t *testing.T) {
				tm := clk.NewTimer(d)
				s.pass(t, 2*d)
				if !tm.Reset(d) {
					t.Error("Reset of a fired, unreceived timer returned false")
				}
				select {
				case v := <-tm.C():
					// A value now must come from the new arming.
					if v.Before(start.Add(2 * d)) {
						t.Errorf("stale value %v received after Reset", v)
					}
				default:
				}
				s.pass(t, 2*d)
				recv(t, tm.C())
			})

			t.Run("afterfunc", func(t *testing.T) {
				ran := make(chan struct{})
				tm := clk.AfterFunc(d, func() { close(ran) })
				if tm.C() != nil {
					t.Error("AfterFunc timer has a non-nil C")
				}
				s.pass(t, 2*d)
				select {
				case <-ran:
				case <-time.After(30 * time.Second):
					t.Fatal("AfterFunc callback never ran")
				}
				if tm.Stop() {
					t.Error("Stop after the callback ran returned true")
				}
				stopped := clk.AfterFunc(time.Hour, func() { t.Error("stopped callback ran") })
				if !stopped.Stop() {
					t.Error("Stop of a pending AfterFunc returned false")
				}
			})

			t.Run("since", func(t *testing.T) {
				from := clk.Now()
				s.pass(t, d)
				if got := clock.Since(clk, from); got < d {
					t.Errorf("Since = %v, want at least %v", got, d)
				}
			})
		})
	}
}

func TestRealNowMovesForward(t *testing.T) {
	clk := clock.Real()
	a := clk.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tm := clk.NewTimer(time.Millisecond)
	select {
	case <-tm.C():
	case <-ctx.Done():
		t.Fatal("real timer never fired")
	}
	if b := clk.Now(); !b.After(a) {
		t.Fatalf("Now went from %v to %v across a 1ms timer", a, b)
	}
}
