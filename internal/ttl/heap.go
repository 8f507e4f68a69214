package ttl

import (
	"container/heap"
	"time"
)

// Heap is a set of ids, each with a deadline, ordered by deadline. It has no
// goroutines and reads no clock: the caller supplies every time. Ids with
// equal deadlines are ordered by id, so the order never depends on the
// history of calls.
//
// Set, Remove and PopExpired are O(log n) per id; Len, Next and Deadline
// are O(1). The zero Heap is empty and ready to use. A Heap is not safe for
// concurrent use: its owner serialises calls.
type Heap struct {
	byID  map[string]*entry
	order entries // a binary heap on (deadline, id)

	// Deadlines are kept as offsets from base (the first deadline Set
	// since the heap was made or cleared): 8 bytes instead of a 24-byte
	// time.Time in every entry. Offsets are taken with Time.Sub, so they
	// follow the monotonic clock whenever the times carry it, as
	// Time.Compare does; deadlines must lie within Time.Sub's range
	// (about 292 years) of each other.
	base    time.Time
	hasBase bool

	// intern, if set, gives the string an absent id is kept under (see
	// WithIntern). Clear keeps it.
	intern func(string) string
}

// entry is one id: 32 bytes, one allocation.
type entry struct {
	id    string
	at    int64 // deadline as nanoseconds after Heap.base
	index int   // position in order
}

// offset converts a deadline to an entry's at.
func (h *Heap) offset(deadline time.Time) int64 {
	if !h.hasBase {
		h.base, h.hasBase = deadline, true
	}
	return int64(deadline.Sub(h.base))
}

// Set gives id the deadline, adding id if it is absent and moving it if it
// is present.
func (h *Heap) Set(id string, deadline time.Time) {
	if e, ok := h.byID[id]; ok {
		e.at = h.offset(deadline)
		heap.Fix(&h.order, e.index)
		return
	}
	if h.byID == nil {
		h.byID = make(map[string]*entry)
	}
	if h.intern != nil {
		id = h.intern(id)
	}
	e := &entry{id: id, at: h.offset(deadline)}
	h.byID[id] = e
	heap.Push(&h.order, e)
}

// Remove drops id and reports whether it was present.
func (h *Heap) Remove(id string) bool {
	e, ok := h.byID[id]
	if !ok {
		return false
	}
	heap.Remove(&h.order, e.index)
	delete(h.byID, id)
	return true
}

// Len returns the number of ids in the heap.
func (h *Heap) Len() int { return len(h.order) }

// Deadline returns id's deadline, and false if id is absent.
func (h *Heap) Deadline(id string) (time.Time, bool) {
	e, ok := h.byID[id]
	if !ok {
		return time.Time{}, false
	}
	return h.base.Add(time.Duration(e.at)), true
}

// Next returns the id with the earliest deadline, without removing it, and
// false if the heap is empty.
func (h *Heap) Next() (id string, deadline time.Time, ok bool) {
	if len(h.order) == 0 {
		return "", time.Time{}, false
	}
	e := h.order[0]
	return e.id, h.base.Add(time.Duration(e.at)), true
}

// PopExpired removes every id whose deadline is at or before now and returns
// them in deadline order (ties by id). It returns nil if none has expired.
// The caller owns the returned slice.
func (h *Heap) PopExpired(now time.Time) []string {
	var ids []string
	if len(h.order) == 0 {
		return nil
	}
	at := int64(now.Sub(h.base))
	for len(h.order) > 0 && h.order[0].at <= at {
		e := heap.Pop(&h.order).(*entry)
		delete(h.byID, e.id)
		ids = append(ids, e.id)
	}
	return ids
}

// Clear removes every id.
func (h *Heap) Clear() {
	*h = Heap{intern: h.intern}
}

// entries implements heap.Interface; it keeps each entry's index current.
type entries []*entry

func (s entries) Len() int { return len(s) }

func (s entries) Less(i, j int) bool {
	a, b := s[i], s[j]
	if a.at != b.at {
		return a.at < b.at
	}
	return a.id < b.id
}

func (s entries) Swap(i, j int) {
	s[i], s[j] = s[j], s[i]
	s[i].index = i
	s[j].index = j
}

func (s *entries) Push(x any) {
	e := x.(*entry)
	e.index = len(*s)
	*s = append(*s, e)
}

func (s *entries) Pop() any {
	old := *s
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*s = old[:len(old)-1]
	return e
}
