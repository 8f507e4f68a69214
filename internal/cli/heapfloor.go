package cli

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
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

// heapFloor is one running floor; its fields are set before it starts.
type heapFloor struct {
	floor uint64
	base  int             // the per cent GOGC gave at the start
	live  func() uint64   // the live heap after the last collection
	set   func(p int) int // debug.SetGCPercent
	mu    sync.Mutex      // guards cur and stop
	cur   int
	stop  bool
	seen  func() // tests: called after each adjustment
}

// adjust sets the per cent for the live heap now, if it moved by more than
// an eighth, and reports whether the floor still runs.
func (h *heapFloor) adjust() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stop {
		return false
	}
	p := floorPercent(h.live(), h.floor, h.base)
	if d := p - h.cur; d > h.cur/8 || -d > h.cur/8 {
		h.set(p)
		h.cur = p
	}
	if h.seen != nil {
		h.seen()
	}
	return true
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
// live heap until the returned function is called. The goal is process-wide,
// so only the first of several agents in one process (tests) sets it; the
// others get a no-op. A floor of 0, or GOGC=off, leaves the collector alone.
func startHeapFloor(floor uint64) (stop func()) {
	base := gcPercent()
	floorMu.Lock()
	defer floorMu.Unlock()
	if floor == 0 || base < 0 || floorActive != nil {
		return func() {}
	}
	h := &heapFloor{floor: floor, base: base, cur: base, live: liveHeap, set: debug.SetGCPercent}
	floorActive = h
	h.adjust()
	armFloor(h)
	return func() {
		h.halt()
		floorMu.Lock()
		if floorActive == h {
			floorActive = nil
		}
		floorMu.Unlock()
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
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 100
	}
	return int(int64(s[0].Value.Uint64()))
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
