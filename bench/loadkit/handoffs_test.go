package loadkit

import (
	"math"
	"testing"
	"time"
)

func TestHandoffGaps(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(ms float64) time.Time { return base.Add(time.Duration(ms * float64(time.Millisecond))) }
	h := NewHandoffs()
	// Client 0 holds, releases at 1.0; client 1 acquires at 1.5.
	g := h.Acquired(0, at(0))
	h.Released(0, g, at(1))
	g = h.Acquired(1, at(1.5))
	// Client 1's release response is seen after client 2's acquire: early.
	g2 := h.Acquired(2, at(2.0))
	h.Released(1, g, at(2.2))
	// Client 2 re-acquires itself: no hand-off, no gap.
	h.Released(2, g2, at(3))
	g = h.Acquired(2, at(3.1))
	// A release whose response never came (error): the next acquire pairs with nothing.
	g = h.Acquired(0, at(5))
	h.Released(0, g, at(6))
	h.Acquired(1, at(6.25))

	if h.acquires != 6 || h.reacquires != 1 {
		t.Fatalf("acquires=%d reacquires=%d", h.acquires, h.reacquires)
	}
	if h.handoffs != 3 || h.early != 1 {
		t.Fatalf("handoffs=%d early=%d", h.handoffs, h.early)
	}
	if h.gap.Count() != 3 || h.gap.Min() != 0 || h.gap.Max() != 500*time.Microsecond {
		t.Fatalf("gaps n=%d min=%v max=%v", h.gap.Count(), h.gap.Min(), h.gap.Max())
	}
	if q := h.gap.Quantile(0.5); math.Abs(float64(q-250*time.Microsecond)) > 0.008*float64(250*time.Microsecond) {
		t.Fatalf("median gap %v", h.gap.Quantile(0.5))
	}
}
