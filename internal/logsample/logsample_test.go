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
