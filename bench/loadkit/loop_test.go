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

// At a fixed rate no more ops start than the schedule has due before the
// deadline, however fast the op is.
func TestLoopRateOffersNoMoreThanTheRate(t *testing.T) {
	const (
		clients = 4
		rate    = 200.0 // per second, in all
		dur     = 100 * time.Millisecond
	)
	var calls atomic.Int64
	ops, lat, _ := LoopRate(context.Background(), clients, dur, 1000, rate, &ErrLog{}, "op",
		func(context.Context, int) error { calls.Add(1); return nil })
	// Due times are start + k*20ms + c*5ms: at most 20 before 100 ms.
	if max := int64(rate * dur.Seconds()); calls.Load() > max || ops > max {
		t.Fatalf("calls=%d ops=%d, want at most %d at %v/s for %v", calls.Load(), ops, max, rate, dur)
	}
	if lat.Count() != uint64(ops) {
		t.Fatalf("lat_n=%d ops=%d", lat.Count(), ops)
	}
}

// An op that takes longer than the schedule allows makes the next ones
// late, and they are timed from when they were due: the backlog shows.
func TestLoopRateTimesLateOpsFromWhenDue(t *testing.T) {
	const (
		opTime = 5 * time.Millisecond
		rate   = 1000.0 // one client: an op due every 1 ms
	)
	ops, lat, _ := LoopRate(context.Background(), 1, 60*time.Millisecond, 1000, rate, &ErrLog{}, "op",
		func(context.Context, int) error { time.Sleep(opTime); return nil })
	// Op k (from 0) starts no earlier than k*5ms and was due at k*1ms, so
	// it is timed at least k*4ms + 5ms. With 3 or more ops the last was
	// timed at 13 ms or more, whatever the machine's speed.
	if ops < 3 {
		t.Skipf("only %d ops finished in 60 ms: the machine is too slow to say", ops)
	}
	if want := time.Duration(ops-1)*(opTime-time.Millisecond) + opTime; lat.Max() < want {
		t.Fatalf("%d ops, longest timed %v, want at least %v (timed from when due)", ops, lat.Max(), want)
	}
}
