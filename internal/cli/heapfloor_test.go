package cli

import (
	"runtime"
	"testing"
	"time"
)

func TestFloorPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, floor uint64
		base, want  int
	}{
		{0, 32 * mib, 100, 100},         // before the first collection
		{4 * mib, 32 * mib, 100, 800},   // goal 4 + 32 MiB
		{3 * mib, 32 * mib, 100, 1066},  // rounded down
		{32 * mib, 32 * mib, 100, 100},  // the floor is GOGC's own growth
		{200 * mib, 32 * mib, 100, 100}, // large heap: GOGC alone
		{200 * mib, 32 * mib, 50, 50},   // a lower GOGC is kept
		{4 * mib, 32 * mib, 200, 800},   // a higher GOGC counts toward it
		{16 * mib, 0, 100, 100},         // no floor
		{4 * mib, 32 * mib, -1, -1},     // GOGC=off
		{1, 32 * mib, 100, 10000},       // capped at 100 times base
		{100 * 1024, 32 * mib, 100, 10000},
	} {
		if got := floorPercent(c.live, c.floor, c.base); got != c.want {
			t.Errorf("floorPercent(%d, %d, %d) = %d, want %d", c.live, c.floor, c.base, got, c.want)
		}
	}
}

func TestHeapFloorAdjust(t *testing.T) {
	const mib = 1 << 20
	live := uint64(4 * mib)
	var sets []int
	h := &heapFloor{floor: 32 * mib, base: 100, cur: 100,
		live: func() uint64 { return live },
		set:  func(p int) int { sets = append(sets, p); return 0 }}
	if !h.adjust() || len(sets) != 1 || sets[0] != 800 {
		t.Fatalf("first adjustment set %v, want [800]", sets)
	}
	live = 4*mib + mib/4 // goal moves by less than an eighth: left alone
	h.adjust()
	if len(sets) != 1 {
		t.Fatalf("a small move set %v", sets)
	}
	live = 64 * mib
	h.adjust()
	if len(sets) != 2 || sets[1] != 100 {
		t.Fatalf("a large heap set %v, want GOGC back at 100", sets)
	}
	h.halt()
	if h.adjust() {
		t.Fatal("adjust reports running after halt")
	}
	if got := sets[len(sets)-1]; got != 100 {
		t.Fatalf("halt left the per cent at %d", got)
	}
}

// TestHeapFloorFollowsCollections checks the runtime hook: a finalizer made
// for the purpose runs after each collection and re-arms itself.
func TestHeapFloorFollowsCollections(t *testing.T) {
	seen := make(chan struct{}, 16)
	var sets []int
	h := &heapFloor{floor: 1 << 40, base: 100, cur: 100, live: liveHeap,
		set:  func(p int) int { sets = append(sets, p); return 0 },
		seen: func() { seen <- struct{}{} }}
	armFloor(h)
	defer h.halt()
	deadline := time.After(30 * time.Second) // a failure guard, not a timing assertion
	for n := 0; n < 2; {
		runtime.GC()
		select {
		case <-seen:
			n++
		case <-deadline:
			t.Fatalf("the floor saw %d collections of the several forced", n)
		case <-time.After(10 * time.Millisecond):
			// the finalizer goroutine has not run yet: collect again
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(sets) == 0 || sets[0] != 10000 {
		t.Fatalf("a floor of 1 TiB set %v, want the cap 10000", sets)
	}
}
