package logsample

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock/clocktest"
)

var t0 = time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)

func TestSamplerLogsOncePerInterval(t *testing.T) {
	clk := clocktest.NewFake(t0)
	s := Sampler{Every: 10 * time.Second, Clock: clk}
	if n := s.Note(); n != 1 {
		t.Fatalf("first event: report %d, want 1", n)
	}
	for i := 1; i <= 5; i++ {
		clk.Set(t0.Add(time.Duration(i) * time.Second))
		if n := s.Note(); n != 0 {
			t.Fatalf("event %d within the interval: report %d, want 0", i, n)
		}
	}
	clk.Set(t0.Add(10 * time.Second))
	if n := s.Note(); n != 6 {
		t.Fatalf("first event after the interval: report %d, want 6 (five held back and itself)", n)
	}
	clk.Set(t0.Add(25 * time.Second))
	if n := s.Note(); n != 1 {
		t.Fatalf("a lone event later: report %d, want 1", n)
	}
}

// Finding (verification of the sampled lines): 12,000 sessions lapsing at
// once were logged as one line saying 1, and the 11,999 others only with
// a lapse 26 s later, or never. The count held back is flushed when its
// interval ends, on the sampler's clock.
func TestSamplerFlushesABurst(t *testing.T) {
	clk := clocktest.NewFake(t0)
	flushed := make(chan int, 1)
	s := Sampler{Every: 20 * time.Millisecond, Clock: clk, Flush: func(n int) { flushed <- n }}
	if n := s.Note(); n != 1 {
		t.Fatalf("first event: report %d, want 1", n)
	}
	for i := 0; i < 99; i++ {
		if n := s.Note(); n != 0 {
			t.Fatalf("event in the burst: report %d", n)
		}
	}
	clk.Advance(20 * time.Millisecond)
	select {
	case n := <-flushed:
		if n != 99 {
			t.Fatalf("flushed %d, want the 99 held back", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the burst was never flushed")
	}
	// Nothing held back: no flush, and the next event is reported at once.
	clk.Advance(time.Second)
	if n := s.Note(); n != 1 {
		t.Fatalf("event after the flush: report %d, want 1", n)
	}
}
