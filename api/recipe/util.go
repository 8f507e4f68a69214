package recipe

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// leftover is cleanup that a call which gave up could not finish because
// the server did not answer: a lock's queue entry, a semaphore's contender
// entry, a key taken without the answer arriving. Left in place, such an
// entry belongs to a live session, so a holder's Unlock hands it the lock
// or it keeps a semaphore's slot, for as long as the session lives.
//
// Its fields are guarded by the owner's acq mutex, which every method's
// caller holds; the background goroutine takes it with TryLock.
type leftover struct {
	gen  uint64
	left bool
}

// later retries undo in the background, with backoff on the session's
// clock, until it succeeds, the session ends (the server then frees what
// the session held), or a new call takes over. acq is the owner's mutex,
// held by the caller.
func (o *leftover) later(s *Session, acq *sync.Mutex, undo func(context.Context) error) {
	o.gen++
	gen := o.gen
	o.left = true
	go func() {
		ctx, stop := withSession(context.Background(), s)
		defer stop()
		for n := 1; ; n++ {
			if clock.Sleep(ctx, s.clk, backoff(n)) != nil {
				return
			}
			if !acq.TryLock() {
				continue // a call runs; it takes over if anything is still left
			}
			if !o.left || o.gen != gen {
				acq.Unlock()
				return
			}
			cctx, cancel := cleanupCtx(ctx, s.clk, s.renewTO)
			err := undo(cctx)
			cancel()
			if err == nil {
				o.left = false
			}
			acq.Unlock()
			if err == nil {
				return
			}
		}
	}()
}

// pending reports whether cleanup is still left to the background.
func (o *leftover) pending() bool { return o.left }

// takeOver says that the caller's new call now owns what was left (it
// rejoins with the same entry), so the background stands down.
func (o *leftover) takeOver() { o.left = false }

// deleteOwn deletes key if session holds it, conditioned on the entry as
// read: a delete that reaches the server late (its caller gave up on it)
// cannot remove the entry a later call made under the same key.
func deleteOwn(ctx context.Context, kv *api.KV, key, session string) error {
	e, _, err := kv.Get(ctx, key, nil)
	if err != nil || e == nil || e.Session != session {
		return err
	}
	_, _, err = kv.DeleteCAS(ctx, e, nil)
	return err
}
