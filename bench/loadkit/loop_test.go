package loadkit

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLoopStopsAtMaxOps(t *testing.T) {
	var calls atomic.Int64
	ops, lat, elapsed := Loop(context.Background(), 4, time.Minute, 100, &ErrLog{}, "op",
		func(context.Context, int) error { calls.Add(1); return nil })
	if ops != 100 || calls.Load() != 100 || lat.Count() != 100 {
		t.Fatalf("ops=%d calls=%d lat_n=%d, want 100", ops, calls.Load(), lat.Count())
	}
	if elapsed >= time.Minute {
		t.Fatalf("elapsed %v: did not stop at -max-ops", elapsed)
	}
}

func TestLoopCountsOnlyOpsDoneByTheDeadline(t *testing.T) {
	const dur = 100 * time.Millisecond
	ops, lat, elapsed := Loop(context.Background(), 1, dur, 1000, &ErrLog{}, "op",
		func(context.Context, int) error { time.Sleep(30 * time.Millisecond); return nil })
	// The op in flight at the deadline finishes but does not count.
	if ops > 3 || lat.Count() != uint64(ops) || lat.Max() > dur {
		t.Fatalf("ops=%d lat_n=%d max=%v", ops, lat.Count(), lat.Max())
	}
	if elapsed != dur {
		t.Fatalf("elapsed %v, want it capped at %v", elapsed, dur)
	}
}

// lockedBuffer is a bytes.Buffer that many goroutines may write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestLoopLogsErrors(t *testing.T) {
	var w lockedBuffer
	el := &ErrLog{w: &w}
	ops, _, _ := Loop(context.Background(), 2, 50*time.Millisecond, 1000, el, "thing",
		func(context.Context, int) error { return errors.New("nope") })
	if ops != 0 || el.Count() < 2 {
		t.Fatalf("ops=%d errors=%d", ops, el.Count())
	}
	if n := strings.Count(w.String(), "error: thing: nope\n"); n != 5 {
		t.Fatalf("%d errors printed, want the first 5: %q", n, w.String())
	}
}

func TestLoopEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	el := &ErrLog{}
	start := time.Now()
	Loop(ctx, 2, time.Minute, 1<<40, el, "op", func(ctx context.Context, _ int) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if time.Since(start) > 10*time.Second || el.Count() != 0 {
		t.Fatalf("took %v, %d errors (a cancelled run's errors are not failures)", time.Since(start), el.Count())
	}
}

func TestRandValue(t *testing.T) {
	v := RandValue(rand.New(rand.NewSource(1)), 64)
	if len(v) != 64 {
		t.Fatalf("len %d", len(v))
	}
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			t.Fatalf("byte %q in %q", c, v)
		}
	}
	if len(RandValue(NewRands(1)[0], 0)) != 0 {
		t.Fatal("-value-size 0 must give empty values")
	}
}

func TestWakeResult(t *testing.T) {
	hs := make([]Hist, 3)
	for i := range hs {
		hs[i].Record(time.Duration(i+1) * time.Millisecond)
		hs[i].Record(time.Duration(i+1) * time.Millisecond)
	}
	r := WakeResult(3, hs, 2, 1, time.Second)
	if r.Ops != 6 || r.Lat.Count() != 6 || r.Lat.Max() != 3*time.Millisecond || r.Unit != "wakes" || r.LatName != "wake" {
		t.Fatalf("result %+v", r)
	}
	if !strings.HasSuffix(r.Line(), " rounds=2 missed=1") {
		t.Fatalf("line %s", r.Line())
	}
}
