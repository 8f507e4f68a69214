package cli

import (
	"math"
	"runtime"
	"strings"
	"sync/atomic"
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

func TestBusyFloor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		rate        float64
		least, most uint64
		want        uint64
	}{
		{0, 8 * mib, 64 * mib, 8 * mib},
		{16 * mib, 8 * mib, 64 * mib, 8 * mib},   // a quarter second is 4 MiB: the least
		{128 * mib, 8 * mib, 64 * mib, 32 * mib}, // a quarter second of it
		{1 << 40, 8 * mib, 64 * mib, 64 * mib},   // the most
		{128 * mib, 8 * mib, 8 * mib, 8 * mib},   // most = least: fixed
		{128 * mib, 8 * mib, 0, 8 * mib},         // no most: fixed
		{math.NaN(), 8 * mib, 64 * mib, 8 * mib},
		{math.Inf(1), 8 * mib, 64 * mib, 64 * mib},
	} {
		if got := busyFloor(c.rate, c.least, c.most); got != c.want {
			t.Errorf("busyFloor(%g, %d, %d) = %d, want %d", c.rate, c.least, c.most, got, c.want)
		}
	}
}

func TestHeapFloorTick(t *testing.T) {
	const mib = 1 << 20
	var allocs uint64
	var sets []int
	collected := 0
	h := &heapFloor{floor: 8 * mib, most: 64 * mib, base: 100, cur: 100,
		live:    func() uint64 { return 4 * mib },
		allocs:  func() uint64 { return allocs },
		set:     func(p int) int { sets = append(sets, p); return 0 },
		collect: func() { collected++ }}
	h.adjust() // as startHeapFloor does: the least floor, 4 + 8 MiB
	if len(sets) != 1 || sets[0] != 200 {
		t.Fatalf("start set %v, want [200]", sets)
	}
	allocs += 128 * mib // 128 MiB/s: a quarter of a second is 32 MiB
	if !h.tick(time.Second) || sets[len(sets)-1] != 800 {
		t.Fatalf("busy tick set %v, want 800 last", sets)
	}
	allocs += 1024 * mib // 2 GiB/s over half a second: the most, 64 MiB
	h.tick(time.Second / 2)
	if sets[len(sets)-1] != 1600 || collected != 0 {
		t.Fatalf("busier tick set %v (collected %d), want 1600 last and no collection", sets, collected)
	}
	allocs += mib // the load has ended
	h.tick(time.Second)
	if sets[len(sets)-1] != 200 || collected != 1 {
		t.Fatalf("quiet tick set %v, collected %d; want 200 last and one collection", sets, collected)
	}
	n := len(sets)
	h.tick(time.Second) // still quiet: nothing to change or give back
	if len(sets) != n || collected != 1 {
		t.Fatalf("a second quiet tick set %v, collected %d", sets[n:], collected)
	}
	allocs += 40 * mib // 40 MiB/s: 10 MiB, less than twice the least floor
	h.tick(time.Second)
	h.tick(time.Second)
	if collected != 1 {
		t.Fatalf("a small rise and fall collected %d times, want still 1", collected)
	}
	h.halt()
	if h.tick(time.Second) {
		t.Fatal("tick reports running after halt")
	}
}

// TestHeapFloorFollowTicks checks that follow ticks the floor on its period
// and returns once done is closed.
func TestHeapFloorFollowTicks(t *testing.T) {
	seen := make(chan struct{}, 16)
	var allocs atomic.Uint64
	h := &heapFloor{floor: 1 << 20, most: 1 << 30, base: 100, cur: 100,
		live:   func() uint64 { return 1 << 20 },
		allocs: func() uint64 { return allocs.Add(1 << 20) },
		set:    func(p int) int { return 0 },
		seen: func() {
			select {
			case seen <- struct{}{}:
			default:
			}
		}}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		h.follow(done, time.Millisecond)
		close(exited)
	}()
	deadline := time.After(30 * time.Second) // a failure guard, not a timing assertion
	for n := 0; n < 2; n++ {
		select {
		case <-seen:
		case <-deadline:
			t.Fatalf("follow ticked %d times", n)
		}
	}
	close(done)
	select {
	case <-exited:
	case <-deadline:
		t.Fatal("follow did not return after done was closed")
	}
}

func TestAgentRefusesFloorsTooLarge(t *testing.T) {
	for _, args := range [][]string{
		{"agent", "-dev", "-gc-floor", "1048577"},
		{"agent", "-dev", "-gc-floor-busy", "18446744073709551615"},
	} {
		_, errOut, code := caRun(t, nil, "", args...)
		if code != 1 || !strings.Contains(errOut, "at most 1048576 (1 TiB)") {
			t.Errorf("%v: exit %d, stderr %q; want 1 and the limit", args, code, errOut)
		}
	}
}
