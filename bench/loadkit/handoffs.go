package loadkit

import (
	"sync"
	"time"
)

// Handoffs follows a contended lock from the clients' side. Holds are
// numbered in the order their acquisitions were seen; since a hold can only
// start after the previous one ended, that order is the lock's true order.
// The gap of a hand-off is the time from the releasing client seeing its
// release succeed to the next (different) client seeing its acquire
// succeed, both read from this process's clock. The two can be seen in
// either order, so whichever comes second computes the gap; when the
// acquire was seen first the gap counts as zero and early is incremented.
// It is safe for concurrent use.
type Handoffs struct {
	mu         sync.Mutex
	gen        int64
	acquires   int64
	handoffs   int64
	reacquires int64
	early      int64
	lastHolder int
	rel        holdEvent // last release not yet paired
	acq        holdEvent // last acquire not yet paired
	gap        Hist
	measure    bool
}

type holdEvent struct {
	gen    int64
	client int
	at     time.Time
	ok     bool
}

// NewHandoffs returns a Handoffs that counts from the first hold on.
func NewHandoffs() *Handoffs { return &Handoffs{measure: true} }

// Acquired records that client now holds the lock and returns the hold's number.
func (h *Handoffs) Acquired(client int, at time.Time) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gen++
	g := h.gen
	if h.measure {
		h.acquires++
		if g > 1 && h.lastHolder == client {
			h.reacquires++
		}
	}
	h.lastHolder = client
	if h.rel.ok && h.rel.gen == g-1 {
		h.pair(h.rel.client, h.rel.at, client, at)
		h.rel.ok = false
	} else {
		h.acq = holdEvent{g, client, at, true}
	}
	return g
}

// Released records that client's release of hold gen was acknowledged.
func (h *Handoffs) Released(client int, gen int64, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.acq.ok && h.acq.gen == gen+1 {
		h.pair(client, at, h.acq.client, h.acq.at)
		h.acq.ok = false
	} else {
		h.rel = holdEvent{gen, client, at, true}
	}
}

func (h *Handoffs) pair(from int, relAt time.Time, to int, acqAt time.Time) {
	if from == to || !h.measure {
		return
	}
	h.handoffs++
	d := acqAt.Sub(relAt)
	if d < 0 {
		h.early++
		d = 0
	}
	h.gap.Record(d)
}

// Result is the lock-contend result of clients contending for elapsed:
// hand-offs and their gaps, plus acquires, acquires_per_s, reacquires,
// acquire_false (failed acquire attempts, for targets that have them; 0
// for those whose lock call blocks) and gap_early. Call it once every
// client has stopped.
func (h *Handoffs) Result(clients int, elapsed time.Duration, acquireFalse int64) *Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &Result{Clients: clients, Ops: h.handoffs, Lat: &h.gap, Elapsed: elapsed, Unit: "handoffs", LatName: "gap"}
	r.Int("acquires", h.acquires)
	r.Float("acquires_per_s", float64(h.acquires)/elapsed.Seconds(), 1)
	r.Int("reacquires", h.reacquires)
	r.Int("acquire_false", acquireFalse)
	r.Int("gap_early", h.early)
	return r
}
