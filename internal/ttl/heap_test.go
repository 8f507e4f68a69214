package ttl

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"
	"unsafe"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestHeapEmpty(t *testing.T) {
	var h Heap
	if h.Len() != 0 {
		t.Fatalf("Len = %d", h.Len())
	}
	if id, dl, ok := h.Next(); ok {
		t.Fatalf("Next = %q %v true on an empty heap", id, dl)
	}
	if got := h.PopExpired(at(time.Hour)); got != nil {
		t.Fatalf("PopExpired = %v on an empty heap", got)
	}
	if h.Remove("x") {
		t.Fatal("Remove of an absent id returned true")
	}
	if _, ok := h.Deadline("x"); ok {
		t.Fatal("Deadline of an absent id returned true")
	}
}

func TestHeapSetMoveRemove(t *testing.T) {
	var h Heap
	h.Set("a", at(3*time.Second))
	h.Set("b", at(1*time.Second))
	h.Set("c", at(2*time.Second))
	if id, dl, _ := h.Next(); id != "b" || !dl.Equal(at(time.Second)) {
		t.Fatalf("Next = %q %v, want b", id, dl)
	}
	h.Set("b", at(5*time.Second)) // move later
	if id, _, _ := h.Next(); id != "c" {
		t.Fatalf("after moving b later: Next = %q, want c", id)
	}
	h.Set("a", at(0)) // move earlier
	if id, _, _ := h.Next(); id != "a" {
		t.Fatalf("after moving a earlier: Next = %q, want a", id)
	}
	if h.Len() != 3 {
		t.Fatalf("Len = %d, want 3 (Set of a present id must not add)", h.Len())
	}
	if dl, ok := h.Deadline("b"); !ok || !dl.Equal(at(5*time.Second)) {
		t.Fatalf("Deadline(b) = %v %v", dl, ok)
	}
	if !h.Remove("a") {
		t.Fatal("Remove(a) = false")
	}
	if h.Remove("a") {
		t.Fatal("second Remove(a) = true")
	}
	if got := h.PopExpired(at(time.Hour)); !slices.Equal(got, []string{"c", "b"}) {
		t.Fatalf("PopExpired = %v, want [c b]", got)
	}
	if h.Len() != 0 {
		t.Fatalf("Len = %d after popping all", h.Len())
	}
}

func TestHeapPopExpiredBoundary(t *testing.T) {
	var h Heap
	h.Set("due", at(10*time.Second))
	h.Set("later", at(10*time.Second+time.Nanosecond))
	if got := h.PopExpired(at(10*time.Second - time.Nanosecond)); got != nil {
		t.Fatalf("a nanosecond early: PopExpired = %v", got)
	}
	if got := h.PopExpired(at(10 * time.Second)); !slices.Equal(got, []string{"due"}) {
		t.Fatalf("at the deadline: PopExpired = %v, want [due]", got)
	}
	if got := h.PopExpired(at(10*time.Second + time.Nanosecond)); !slices.Equal(got, []string{"later"}) {
		t.Fatalf("PopExpired = %v, want [later]", got)
	}
}

func TestHeapTiesOrderedByID(t *testing.T) {
	var h Heap
	for _, id := range []string{"m", "z", "a", "q"} {
		h.Set(id, at(time.Second))
	}
	h.Set("early", at(0))
	if got, want := h.PopExpired(at(time.Second)), []string{"early", "a", "m", "q", "z"}; !slices.Equal(got, want) {
		t.Fatalf("PopExpired = %v, want %v", got, want)
	}
}

func TestHeapClear(t *testing.T) {
	var h Heap
	h.Set("a", at(0))
	h.Set("b", at(0))
	h.Clear()
	if h.Len() != 0 {
		t.Fatalf("Len = %d after Clear", h.Len())
	}
	if _, ok := h.Deadline("a"); ok {
		t.Fatal("Clear kept a")
	}
	h.Set("a", at(time.Second)) // usable after Clear
	if got := h.PopExpired(at(time.Second)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("PopExpired = %v", got)
	}
}

// TestHeapAgainstModel runs random operations on a Heap and on a plain map,
// and checks that they agree after every step.
func TestHeapAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h Heap
	model := map[string]time.Time{}
	now := t0
	for step := range 20000 {
		id := fmt.Sprintf("s%d", r.IntN(200))
		switch op := r.IntN(10); {
		case op < 5:
			dl := now.Add(time.Duration(r.IntN(1000)-100) * time.Millisecond)
			h.Set(id, dl)
			model[id] = dl
		case op < 7:
			_, want := model[id]
			if got := h.Remove(id); got != want {
				t.Fatalf("step %d: Remove(%s) = %v, want %v", step, id, got, want)
			}
			delete(model, id)
		default:
			now = now.Add(time.Duration(r.IntN(100)) * time.Millisecond)
			var want []string
			for id, dl := range model {
				if !dl.After(now) {
					want = append(want, id)
				}
			}
			sort.Slice(want, func(i, j int) bool {
				a, b := model[want[i]], model[want[j]]
				if !a.Equal(b) {
					return a.Before(b)
				}
				return want[i] < want[j]
			})
			for _, id := range want {
				delete(model, id)
			}
			if got := h.PopExpired(now); !slices.Equal(got, want) {
				t.Fatalf("step %d: PopExpired(%v) = %v, want %v", step, now, got, want)
			}
		}
		if h.Len() != len(model) {
			t.Fatalf("step %d: Len = %d, want %d", step, h.Len(), len(model))
		}
		if id, dl, ok := h.Next(); ok {
			for mid, mdl := range model {
				if mdl.Before(dl) || (mdl.Equal(dl) && mid < id) {
					t.Fatalf("step %d: Next = %s@%v but %s@%v is earlier", step, id, dl, mid, mdl)
				}
			}
		} else if len(model) != 0 {
			t.Fatalf("step %d: Next found nothing in a heap of %d", step, len(model))
		}
	}
}

func BenchmarkHeapSet100k(b *testing.B) {
	const n = 100_000
	ids := make([]string, n)
	var h Heap
	for i := range ids {
		ids[i] = fmt.Sprintf("session-%06d", i)
		h.Set(ids[i], at(time.Duration(i)*time.Millisecond))
	}
	i := 0
	for b.Loop() {
		// Renew the earliest session to a deadline past all others, as
		// round-robin renewals do: the worst case for the heap.
		h.Set(ids[i%n], at(time.Duration(n+i)*time.Millisecond))
		i++
	}
}

func TestHeapMonotonicDeadlines(t *testing.T) {
	// Deadlines from the real clock carry monotonic readings; offsets from
	// the heap's base follow them, and what comes back is the same instant.
	var h Heap
	now := time.Now()
	h.Set("b", now.Add(2*time.Second))
	h.Set("a", now.Add(time.Second))
	h.Set("c", now.Add(-time.Second)) // before the base
	if id, dl, _ := h.Next(); id != "c" || !dl.Equal(now.Add(-time.Second)) {
		t.Fatalf("Next = %s %v", id, dl)
	}
	if dl, _ := h.Deadline("b"); !dl.Equal(now.Add(2 * time.Second)) {
		t.Fatalf("Deadline(b) = %v, want %v", dl, now.Add(2*time.Second))
	}
	if got := h.PopExpired(now.Add(time.Second - 1)); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("PopExpired = %v", got)
	}
	if got := h.PopExpired(now.Add(time.Second)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("PopExpired = %v", got)
	}
	// A heap emptied and reused keeps its base; one cleared gets a new one.
	h.Clear()
	later := now.Add(time.Hour)
	h.Set("d", later)
	if dl, _ := h.Deadline("d"); !dl.Equal(later) {
		t.Fatalf("Deadline(d) = %v, want %v", dl, later)
	}
}

func TestHeapIntern(t *testing.T) {
	canon := map[string]string{}
	var calls []string
	h := Heap{intern: func(id string) string {
		calls = append(calls, id)
		if c, ok := canon[id]; ok {
			return c
		}
		return id
	}}
	keep := "session-a"
	canon[keep] = keep
	h.Set(string([]byte("session-a")), at(time.Second)) // a copy: the heap keeps the canonical one
	h.Set("session-a", at(2*time.Second))               // present: not interned again
	h.Set("session-b", at(3*time.Second))
	if !slices.Equal(calls, []string{"session-a", "session-b"}) {
		t.Fatalf("intern called for %v, want each new id once", calls)
	}
	for id, e := range h.byID {
		if id != e.id || (id == keep && unsafe.StringData(e.id) != unsafe.StringData(keep)) {
			t.Fatalf("entry %q keeps %q, not the interned string", id, e.id)
		}
	}
	h.Clear()
	h.Set("session-c", at(0))
	if len(calls) != 3 {
		t.Fatal("Clear dropped the intern function")
	}
	if got := h.PopExpired(at(0)); !slices.Equal(got, []string{"session-c"}) {
		t.Fatalf("PopExpired = %v", got)
	}
}
