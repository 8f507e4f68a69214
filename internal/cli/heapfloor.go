package cli

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// The agent's heap floor: the garbage collector runs when the heap has grown
// by GOGC per cent of what was live after the last collection. A server's
// live heap is small (a few MiB with a few thousand keys), so at GOGC=100 a
// busy agent collects many times a second, and a profile of PUTs at 32
// clients spends about a twentieth of the server's CPU on it. The floor lets
// the heap grow by at least floor bytes between collections, raising the
// per cent while the live heap is small; once the live heap is larger than
// the floor over the per cent, GOGC rules alone, so a server holding 100,000
// sessions uses no more memory than it did. The runtime's minimum heap (4
// MiB at GOGC=100) grows with the per cent, so while the live heap is under
// 4 MiB the goal is more than live + floor: about twice the floor.
//
// The floor is adjusted after each collection, from the finalizer of an
// object made for that purpose (a finalizer runs once the collection that
// found its object unreachable is over).
//
// A busy agent allocates far more than the floor between collections: at
// 35,000 PUTs/s about 180 MB/s, a collection every 50 ms with an 8 MiB
// floor, each stopping the world twice and taking one of two Ps for its
// marking. So once a second the floor follows the allocation rate, up to
// a most floor (-gc-floor-busy): what a quarter of a second allocates. When
// the load ends it is back at the least floor within a second, and the
// heap's growth goes back to the system at once, so an idle agent keeps
// the memory of the fixed floor.

// floorPercent returns the GOGC per cent that lets a heap with live bytes
// grow by at least floor bytes, and never less than base. It is capped at
// 100 times base. Before the first collection (live 0) it is base: the
// runtime's first goal is 4 MiB times the per cent, which a floor would
// swell.
func floorPercent(live, floor uint64, base int) int {
	if base <= 0 || floor == 0 || live == 0 {
		return base // live is 0 before the first collection
	}
	p := floor * 100 / live
	if p > uint64(base)*100 {
		p = uint64(base) * 100
	}
	if p < uint64(base) {
		return base
	}
	return int(p)
}

// maxFloorMiB bounds -gc-floor and -gc-floor-busy, so that their bytes
// (MiB << 20) cannot wrap around.
const maxFloorMiB = 1 << 20

// busyInterval is how far apart a busy agent's collections are aimed to
// be: the floor is what the agent allocates in that time, between the
// least and the most floor.
const busyInterval = 250 * time.Millisecond

// busyFloor returns the floor for an allocation rate in bytes per second:
// what busyInterval of it allocates, no less than least and no more than
// most (most <= least: always least).
func busyFloor(rate float64, least, most uint64) uint64 {
	f := rate * busyInterval.Seconds()
	switch {
	case most <= least || !(f > float64(least)): // also a NaN rate
		return least
	case f >= float64(most):
		return most
	}
	return uint64(f)
}

// heapFloor is one running floor; its fields are set before it starts.
type heapFloor struct {
	floor  uint64          // the least floor, what an idle agent keeps
	most   uint64          // the most floor, for a busy agent (<= floor: fixed)
	base   int             // the per cent GOGC gave at the start
	live   func() uint64   // the live heap after the last collection
	allocs func() uint64   // bytes allocated since the process started
	set    func(p int) int // debug.SetGCPercent
	// collect runs when a raised floor (more than twice the least) falls
	// back to the least, i.e. a burst has ended: a quiet agent allocates
	// too little to reach even the lower goal soon, and until a collection
	// the heap, and the memory the runtime keeps from the system, stay at
	// the busy size. debug.FreeOSMemory: a collection, then every free
	// page back to the system at once.
	collect func()
	mu      sync.Mutex // guards the fields below
	cur     int
	want    uint64 // the floor now: floor, or more while busy
	last    uint64 // allocs at the last tick
	stop    bool
	seen    func() // tests: called after each adjustment
}

// adjust sets the per cent for the live heap now, if it moved by more than
// an eighth, and reports whether the floor still runs.
func (h *heapFloor) adjust() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.adjustLocked()
}

func (h *heapFloor) adjustLocked() bool {
	if h.stop {
		return false
	}
	if h.want < h.floor {
		h.want = h.floor
	}
	p := floorPercent(h.live(), h.want, h.base)
	if d := p - h.cur; d > h.cur/8 || -d > h.cur/8 {
		h.set(p)
		h.cur = p
	}
	if h.seen != nil {
		h.seen()
	}
	return true
}

// tick moves the floor with the allocation rate over the elapsed time since
// the last tick and adjusts the per cent at once, so that a floor raised
// for a burst is lowered again within a tick of its end; when it falls back
// to the least, collect gives the heap's growth back to the system. It
// reports whether the floor still runs.
func (h *heapFloor) tick(elapsed time.Duration) bool {
	h.mu.Lock()
	a := h.allocs()
	before := h.want
	if elapsed > 0 && a >= h.last {
		h.want = busyFloor(float64(a-h.last)/elapsed.Seconds(), h.floor, h.most)
	}
	h.last = a
	ok := h.adjustLocked()
	ended := ok && h.want == h.floor && before > 2*h.floor
	h.mu.Unlock()
	if ended && h.collect != nil {
		h.collect()
	}
	return ok
}

// halt stops the floor and puts GOGC back.
func (h *heapFloor) halt() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.stop {
		h.stop = true
		h.set(h.base)
	}
}

var (
	floorMu     sync.Mutex
	floorActive *heapFloor
)

// startHeapFloor keeps the collector's goal at least floor bytes above the
// live heap until the returned function is called, and up to most bytes
// while the agent allocates fast (most <= floor: floor always). The goal is
// process-wide, so only the first of several agents in one process (tests)
// sets it; the others get a no-op. A floor of 0, or GOGC=off, leaves the
// collector alone.
func startHeapFloor(floor, most uint64) (stop func()) {
	base := gcPercent()
	floorMu.Lock()
	defer floorMu.Unlock()
	if floor == 0 || base < 0 || floorActive != nil {
		return func() {}
	}
	h := &heapFloor{floor: floor, most: most, base: base, cur: base, live: liveHeap, allocs: heapAllocs,
		set: debug.SetGCPercent, collect: debug.FreeOSMemory}
	h.last = h.allocs()
	floorActive = h
	h.adjust()
	armFloor(h)
	done := make(chan struct{})
	if most > floor {
		go h.follow(done, time.Second)
	}
	return func() {
		close(done)
		h.halt()
		floorMu.Lock()
		if floorActive == h {
			floorActive = nil
		}
		floorMu.Unlock()
	}
}

// follow ticks the floor every period until done is closed.
func (h *heapFloor) follow(done <-chan struct{}, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			if !h.tick(now.Sub(last)) {
				return
			}
			last = now
		}
	}
}

// floorMark is the object whose finalizer runs after a collection.
type floorMark struct{ _ [16]byte }

func armFloor(h *heapFloor) {
	runtime.SetFinalizer(new(floorMark), func(*floorMark) {
		if h.adjust() {
			armFloor(h)
		}
	})
}

// gcPercent reads GOGC's per cent as the runtime has it (-1 for off),
// without setting it.
func gcPercent() int {
	v, ok := uint64Metric("/gc/gogc:percent")
	if !ok {
		return 100
	}
	return int(int64(v))
}

// uint64Metric reads one runtime metric of kind uint64; ok is false if
// this runtime does not have it.
func uint64Metric(name string) (v uint64, ok bool) {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0, false
	}
	return s[0].Value.Uint64(), true
}

// heapAllocs reads the bytes allocated on the heap since the process
// started.
func heapAllocs() uint64 {
	v, _ := uint64Metric("/gc/heap/allocs:bytes")
	return v
}

// liveHeap reads what the collector's goal grows from: the bytes marked
// live by the last collection, plus the goroutine stacks and globals it
// scans (the runtime counts them toward the growth since Go 1.18).
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[0].Value.Uint64() == 0 {
		return 0
	}
	var n uint64
	for _, v := range s {
		if v.Value.Kind() == metrics.KindUint64 {
			n += v.Value.Uint64()
		}
	}
	return n
}
