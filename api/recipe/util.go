package recipe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/clock"
)

// Sequencer names one hold of a lock: its key, the holding session and the
// key's LockIndex at acquisition. See api.Sequencer.
type Sequencer = api.Sequencer

// ErrSessionLost is returned by calls that wait for a hold when the session
// they wait with ends (Lost or closed) first. It wraps the session's Err.
var ErrSessionLost = errors.New("recipe: session lost")

// sessionLost is ErrSessionLost with the session's reason.
func sessionLost(s *Session) error {
	if err := s.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrSessionLost, err)
	}
	return ErrSessionLost
}

// withSession returns a context that is also cancelled when s ends, with
// ErrSessionLost as its cause. stop releases it.
func withSession(ctx context.Context, s *Session) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	go func() {
		select {
		case <-s.Done():
			cancel(ErrSessionLost)
		case <-stop:
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		close(stop)
		cancel(context.Canceled)
	}
}

// ctxErr turns the error of a call made under a withSession context into
// what the recipe returns: ErrSessionLost if the session ended, the
// context's error if it was cancelled, else err itself.
func ctxErr(ctx context.Context, s *Session, err error) error {
	if ctx.Err() != nil {
		if errors.Is(context.Cause(ctx), ErrSessionLost) {
			return sessionLost(s)
		}
		return ctx.Err()
	}
	return err
}

// backoff is the wait before retrying after the n-th consecutive
// transient error (n from 1): 250ms doubling up to 4s.
func backoff(n int) time.Duration {
	d := 250 * time.Millisecond
	for i := 1; i < n && d < 4*time.Second; i++ {
		d *= 2
	}
	return min(d, 4*time.Second)
}

// cleanupCtx is a context for giving things back after the caller's context
// ended: not cancelled with it, but bounded on clk by d.
func cleanupCtx(ctx context.Context, clk clock.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := clk.AfterFunc(d, cancel)
	return c, func() {
		t.Stop()
		cancel()
	}
}

// nextIndex is the WaitIndex for the read after one that returned idx,
// when the previous WaitIndex was prev: an index that went backwards
// (snapshot restore, reaped tombstones) starts over from 0.
func nextIndex(prev, idx uint64) uint64 {
	if idx < prev {
		return 0
	}
	return idx
}

// isClosed reports whether ch is closed (or has a value ready).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
