package watch_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/watch"
)

// source is a single watched object whose index and existence a test moves,
// closing the current channel on each change (close-and-replace).
type source struct {
	mu    sync.Mutex
	idx   uint64
	found bool
	ch    chan struct{}
	evals int
}

func newSource(idx uint64, found bool) *source {
	return &source{idx: idx, found: found, ch: make(chan struct{})}
}

func (s *source) set(idx uint64, found bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idx, s.found = idx, found
	close(s.ch)
	s.ch = make(chan struct{})
}

func (s *source) query(ws watch.Set) (uint64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evals++
	ws.Add(s.ch)
	return s.idx, s.found, nil
}

func (s *source) evaluations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.evals
}

// run starts Block in a goroutine and returns a channel that yields its
// error, after waiting until Block has evaluated want times.
func run(t *testing.T, clk *clocktest.Fake, src *source, min uint64) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- watch.Block(context.Background(), clk, watch.Options{MinIndex: min, Wait: time.Minute}, src.query)
	}()
	return done
}

func waitEvals(t *testing.T, src *source, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for src.evaluations() < n {
		select {
		case <-ctx.Done():
			t.Fatalf("Block evaluated %d times, want %d", src.evaluations(), n)
		default:
			time.Sleep(time.Millisecond) // polling another goroutine's progress, not waiting for a timer
		}
	}
}

func expectDone(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Block did not return")
	}
}

func expectBlocked(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("Block returned (%v), want it still waiting", err)
	default:
	}
}

func TestNonBlockingEvaluatesOnce(t *testing.T) {
	src := newSource(5, true)
	if err := watch.Block(context.Background(), clocktest.NewFake(time.Unix(0, 0)), watch.Options{}, src.query); err != nil {
		t.Fatal(err)
	}
	if src.evaluations() != 1 {
		t.Fatalf("evaluations = %d", src.evaluations())
	}
}

func TestReturnsAtOnceWhenIndexMovedOrIsAhead(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	expectDone(t, run(t, clk, newSource(6, true), 5))  // moved past
	expectDone(t, run(t, clk, newSource(6, false), 5)) // moved, even if missing
	expectDone(t, run(t, clk, newSource(3, true), 5))  // client ahead of us
}

func TestWakesOnChange(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	src := newSource(5, true)
	done := run(t, clk, src, 5)
	waitEvals(t, src, 1)
	expectBlocked(t, done)
	src.set(7, true)
	expectDone(t, done)
}

func TestMissingStaysMissingReBaselines(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	src := newSource(5, false)
	done := run(t, clk, src, 5)
	waitEvals(t, src, 1)
	src.set(6, false) // an unrelated write moved the table index
	waitEvals(t, src, 2)
	expectBlocked(t, done)
	src.set(7, true) // now it exists
	expectDone(t, done)
}

func TestDeletionEndsTheWait(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	src := newSource(5, true)
	done := run(t, clk, src, 5)
	waitEvals(t, src, 1)
	src.set(6, false) // the object was deleted
	expectDone(t, done)
}

func TestTimeoutReturnsCurrentState(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	src := newSource(5, true)
	done := run(t, clk, src, 5)
	waitEvals(t, src, 1)
	if err := clk.BlockUntilWaiters(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute - time.Nanosecond)
	expectBlocked(t, done)
	clk.Advance(time.Nanosecond)
	expectDone(t, done)
	if n := src.evaluations(); n != 2 {
		t.Fatalf("evaluations = %d, want 2 (one more after the timeout)", n)
	}
}

func TestContextCancelled(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	src := newSource(5, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- watch.Block(ctx, clk, watch.Options{MinIndex: 5, Wait: time.Minute}, src.query) }()
	waitEvals(t, src, 1)
	cancel()
	select {
	case err := <-done:
		if err != context.Canceled {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Block ignored cancellation")
	}
}

// Stop ends a parked query as if its wait had run out: it answers with the
// current state (no error), once evaluated again, and does not need the
// clock to move. A server that shuts down uses it so that its parked
// queries do not hold the shutdown for their wait.
func TestStopAnswersLikeATimeout(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	src := newSource(5, true)
	stop, stopNow := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- watch.Block(context.Background(), clk, watch.Options{MinIndex: 5, Wait: time.Minute, Stop: stop}, src.query)
	}()
	waitEvals(t, src, 1)
	expectBlocked(t, done)
	stopNow()
	expectDone(t, done)
	if n := src.evaluations(); n != 2 {
		t.Fatalf("evaluations = %d, want 2 (one more after the stop)", n)
	}
}
