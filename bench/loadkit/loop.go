package loadkit

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"
)

// ErrLog counts errors and prints the first few. Its zero value counts
// without printing. It is safe for concurrent use if its writer is (Run
// gives it the command's stderr).
type ErrLog struct {
	w       io.Writer
	n       atomic.Int64
	printed atomic.Int64
}

// Add counts err; the first five are printed as "error: what: err".
func (e *ErrLog) Add(what string, err error) {
	e.n.Add(1)
	if e.w != nil && e.printed.Add(1) <= 5 {
		fmt.Fprintf(e.w, "error: %s: %v\n", what, err)
	}
}

// Count is the number of errors added.
func (e *ErrLog) Count() int64 { return e.n.Load() }

// ErrBackoff keeps a failing client from spinning.
const ErrBackoff = 5 * time.Millisecond

// Loop runs op in n goroutines until dur has passed, ctx ends, or maxOps ops
// have been started in total. An op in flight at the deadline is allowed to
// finish (each request has its own timeout) so that it leaves nothing half
// done, but only ops that completed by the deadline are counted. Failures
// go to el. op gets the client number. Each client starts its next op as
// soon as the last one ends (a closed loop); LoopRate offers a fixed rate.
func Loop(ctx context.Context, n int, dur time.Duration, maxOps int64, el *ErrLog, what string,
	op func(ctx context.Context, client int) error) (ops int64, lat *Hist, elapsed time.Duration) {
	return LoopRate(ctx, n, dur, maxOps, 0, el, what, op)
}

// LoopRate is Loop with the ops offered at rate per second in all (0: a
// closed loop, as Loop). Client c's k-th op is due at start + (k + c/n) *
// n/rate, so the n clients' ops interleave evenly. A client that is early
// sleeps until its op is due and times the op from when it woke (a late
// wake-up is the load generator's, not the server's); a client that is late
// because its previous op ran long times the op from when it was due, so a
// server that falls behind the rate shows it in the latencies instead of
// quietly being offered less (what wrk2 calls coordinated omission).
func LoopRate(ctx context.Context, n int, dur time.Duration, maxOps int64, rate float64, el *ErrLog, what string,
	op func(ctx context.Context, client int) error) (ops int64, lat *Hist, elapsed time.Duration) {
	var started atomic.Int64
	var done atomic.Int64
	hists := make([]Hist, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	end := t0.Add(dur)
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(n) / rate * float64(time.Second))
	}
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			h := &hists[c]
			due := t0.Add(interval * time.Duration(c) / time.Duration(n))
			for ctx.Err() == nil && time.Now().Before(end) && started.Add(1) <= maxOps {
				s := time.Now()
				if interval > 0 {
					if !due.Before(end) {
						return
					}
					if s.Before(due) {
						SleepCtx(ctx, due.Sub(s))
						s = time.Now()
					} else {
						s = due
					}
					due = due.Add(interval)
				}
				err := op(ctx, c)
				f := time.Now()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					el.Add(what, err)
					SleepCtx(ctx, ErrBackoff)
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
	return done.Load(), MergeAll(hists), elapsed
}

// SleepCtx sleeps for d or until ctx ends.
func SleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// NewRands returns n independent random sources, one per client.
func NewRands(n int) []*rand.Rand {
	r := make([]*rand.Rand, n)
	for i := range r {
		r[i] = rand.New(rand.NewSource(time.Now().UnixNano() + int64(i)))
	}
	return r
}

// RandValue returns n random letters and digits: a value to write.
func RandValue(rnd *rand.Rand, n int) []byte {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	v := make([]byte, n)
	for i := range v {
		v[i] = letters[rnd.Intn(len(letters))]
	}
	return v
}
