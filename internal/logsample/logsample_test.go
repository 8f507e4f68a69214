package logsample

import (
	"testing"
	"time"
)

func TestSamplerLogsOncePerInterval(t *testing.T) {
	s := Sampler{Every: 10 * time.Second}
	t0 := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	if n := s.Note(t0); n != 1 {
		t.Fatalf("first event: report %d, want 1", n)
	}
	for i := 1; i <= 5; i++ {
		if n := s.Note(t0.Add(time.Duration(i) * time.Second)); n != 0 {
			t.Fatalf("event %d within the interval: report %d, want 0", i, n)
		}
	}
	if n := s.Note(t0.Add(10 * time.Second)); n != 6 {
		t.Fatalf("first event after the interval: report %d, want 6 (five held back and itself)", n)
	}
	if n := s.Note(t0.Add(25 * time.Second)); n != 1 {
		t.Fatalf("a lone event later: report %d, want 1", n)
	}
}

// Finding (verification of the sampled lines): 12,000 sessions lapsing at
// once were logged as one line saying 1, and the 11,999 others only with
// a lapse 26 s later, or never. The count held back is flushed when its
// interval ends.
func TestSamplerFlushesABurst(t *testing.T) {
	flushed := make(chan int, 1)
	s := Sampler{Every: 20 * time.Millisecond, Flush: func(n int) { flushed <- n }}
	now := time.Now()
	if n := s.Note(now); n != 1 {
		t.Fatalf("first event: report %d, want 1", n)
	}
	for i := 0; i < 99; i++ {
		if n := s.Note(now); n != 0 {
			t.Fatalf("event in the burst: report %d", n)
		}
	}
	select {
	case n := <-flushed:
		if n != 99 {
			t.Fatalf("flushed %d, want the 99 held back", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the burst was never flushed")
	}
	// Nothing held back: no flush, and the next event is reported at once.
	if n := s.Note(now.Add(time.Second)); n != 1 {
		t.Fatalf("event after the flush: report %d, want 1", n)
	}
}
