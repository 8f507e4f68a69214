// Package clock is the one place holdfast reads time from. Everything that
// waits, expires or stamps takes a Clock, so tests can drive time with
// clocktest.Fake instead of sleeping.
//
// Real() is safe for concurrent use; so must every implementation be.
package clock

import (
	"context"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that sends the time on C() once d has passed.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine once d has passed.
	// The returned Timer's C() is nil.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a one-shot timer made by a Clock. Stop and Reset follow the
// contract of time.Timer (Go 1.23+ semantics: no stale value is left in C
// after Stop or Reset).
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Sleep waits d on c. It returns nil once d has passed, or ctx's error if
// ctx ends first.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Since is Now().Sub(t) on c.
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// Real returns the system clock.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{t: time.NewTimer(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return realTimer{t: time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }
