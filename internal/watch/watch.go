// Package watch runs blocking queries: a read is evaluated, and if its
// index has not passed the caller's, the goroutine parks on the watch
// channels the read registered until one of them fires or the wait runs out.
//
// The channels come from the state store: go-memdb's for most tables (each
// radix node the read touched closes its channel when anything below it
// changes, and a fresh channel replaces it), and the store's own for KV
// keys and prefixes and for sessions. Either way a wake-up is a closed
// channel, cheap and specific to what the read looked at.
package watch

import (
	"context"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/holdfast/holdfast/clock"
)

// Set collects the channels a read depends on. A nil Set ignores Add, which
// is what a non-blocking read passes.
type Set = memdb.WatchSet

// NewSet returns an empty Set.
func NewSet() Set { return memdb.NewWatchSet() }

// Query evaluates a read once, registering what it depends on in ws.
// It returns the index of the result and whether the thing it looked for
// exists (a list that came back empty counts as found: only a single missing
// object is re-baselined, see Block).
type Query func(ws Set) (index uint64, found bool, err error)

// Options for Block.
type Options struct {
	// MinIndex is the index the caller has already seen. Zero means do not
	// block: evaluate once and return.
	MinIndex uint64
	// Wait bounds how long Block parks in total. It must be positive when
	// MinIndex is not zero.
	Wait time.Duration
	// Stop, if not nil, ends the wait early when it is done, as if Wait
	// had run out: a server that shuts down answers its parked queries
	// with what it has instead of holding its shutdown for them.
	Stop context.Context
}

// Block evaluates q until its result moves past opts.MinIndex, the wait
// runs out, or ctx ends. The caller keeps the result of the last evaluation
// from inside q; when Block returns nil that result is the answer (after a
// timeout it is simply the current state, which may not have changed).
//
// Rules:
//   - the first evaluation returns at once if its index is above MinIndex;
//   - an index below MinIndex (the caller is ahead of us, or state was
//     restored from an older snapshot) returns at once so the client resets;
//   - after a wake-up, a single object that was missing at the previous
//     evaluation and is still missing re-baselines
//     MinIndex to the current index and keeps waiting, so writes to
//     unrelated keys do not turn into a storm of 404s.
//
// Block returns ctx.Err() if ctx ends first; clk drives the wait.
func Block(ctx context.Context, clk clock.Clock, opts Options, q Query) error {
	if opts.MinIndex == 0 {
		_, _, err := q(nil)
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if opts.Stop != nil {
		defer context.AfterFunc(opts.Stop, cancel)()
	}
	// The wait's timer is armed after the first evaluation: a query that
	// answers at once needs none, and once it is armed the caller's first
	// read is done (tests wait for it before writing).
	var t clock.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()

	min := opts.MinIndex
	prevFound := true
	for first := true; ; first = false {
		ws := NewSet()
		idx, found, err := q(ws)
		if err != nil {
			return err
		}
		switch {
		case idx < min:
			return nil
		case idx > min && (first || found || prevFound):
			// Changed: it exists, or it existed last time and is now gone.
			return nil
		case idx > min:
			min = idx // missing before and still missing: re-baseline, keep waiting
		}
		prevFound = found
		if t == nil {
			t = clk.AfterFunc(opts.Wait, cancel)
		}
		if err := ws.WatchCtx(wctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Timed out: the last evaluation stands, but evaluate once more
			// so the answer reflects anything that landed in between.
			_, _, err := q(nil)
			return err
		}
	}
}
