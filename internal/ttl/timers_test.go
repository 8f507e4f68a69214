package ttl

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/clock/clocktest"
)

// harness runs a Timers on a fake clock and records what expires.
//
// Synchronisation without sleeping: the fake fires the Timers' clock timer
// synchronously inside Advance, and the Timers goroutine is the only thing
// that wakes on it. So after an Advance that fires nothing, nothing can
// have expired, and after one that fires the timer, the test waits for the
// goroutine's wake-up to finish (the afterRun hook) before looking.
type harness struct {
	t    *testing.T
	ctx  context.Context
	clk  *clocktest.Fake
	tr   *Timers
	runs chan struct{} // one value per finished wake-up of the goroutine

	mu      sync.Mutex
	expired []string
	onID    func(id string) // optional extra action inside onExpire
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	h := &harness{
		t:    t,
		ctx:  ctx,
		clk:  clocktest.NewFake(t0),
		runs: make(chan struct{}, 1<<20),
	}
	h.tr = newTimers(h.clk, h.onExpire, func() { h.runs <- struct{}{} })
	t.Cleanup(h.tr.Close)
	return h
}

func (h *harness) onExpire(id string) {
	h.mu.Lock()
	h.expired = append(h.expired, id)
	f := h.onID
	h.mu.Unlock()
	if f != nil {
		f(id)
	}
}

// take returns and forgets what has expired so far.
func (h *harness) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	got := h.expired
	h.expired = nil
	return got
}

// advanceQuiet advances the clock by d and checks that it woke nothing.
func (h *harness) advanceQuiet(d time.Duration) {
	h.t.Helper()
	h.clk.Advance(d)
	select {
	case <-h.runs:
		h.t.Fatalf("advancing %v woke the Timers goroutine", d)
	default:
	}
	if got := h.take(); len(got) != 0 {
		h.t.Fatalf("advancing %v expired %v", d, got)
	}
}

// advanceExpect advances the clock by d, waits for the wake-up it causes
// and checks that exactly want expired, in that order.
func (h *harness) advanceExpect(d time.Duration, want ...string) {
	h.t.Helper()
	h.clk.Advance(d)
	h.waitRun()
	if got := h.take(); !slices.Equal(got, want) {
		h.t.Fatalf("advancing %v expired %v, want %v", d, got, want)
	}
}

func (h *harness) waitRun() {
	h.t.Helper()
	select {
	case <-h.runs:
	case <-h.ctx.Done():
		h.t.Fatal("the Timers goroutine never woke")
	}
}

// checkArmed checks the number of pending clock timers: one while any id
// waits, none otherwise.
func (h *harness) checkArmed() {
	h.t.Helper()
	want := 0
	if h.tr.Len() > 0 {
		want = 1
	}
	if got := h.clk.Waiters(); got != want {
		h.t.Fatalf("%d clock timers pending with %d ids waiting, want %d", got, h.tr.Len(), want)
	}
}

func TestExpiresExactlyAtTTL(t *testing.T) {
	h := newHarness(t)
	h.tr.Reset("a", 10*time.Second)
	h.tr.Reset("b", 20*time.Second)
	h.checkArmed()

	h.advanceQuiet(10*time.Second - time.Nanosecond)
	h.advanceExpect(time.Nanosecond, "a")
	if n := h.tr.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}
	h.checkArmed()

	h.advanceQuiet(10*time.Second - time.Nanosecond)
	h.advanceExpect(time.Nanosecond, "b")
	h.checkArmed()
	h.advanceQuiet(time.Hour)
}

func TestJumpPastSeveralDeadlines(t *testing.T) {
	h := newHarness(t)
	h.tr.Reset("c", 3*time.Second)
	h.tr.Reset("a", 1*time.Second)
	h.tr.Reset("b", 2*time.Second)
	h.tr.Reset("b2", 2*time.Second) // tie with b: ordered by id
	h.tr.Reset("d", 4*time.Second)
	h.advanceExpect(3*time.Second, "a", "b", "b2", "c")
	h.advanceExpect(time.Second, "d")
}

func TestResetPushesExpiry(t *testing.T) {
	h := newHarness(t)
	h.tr.Reset("a", 10*time.Second)
	h.advanceQuiet(6 * time.Second)
	h.tr.Reset("a", 10*time.Second) // renew: now due at 16s
	h.advanceQuiet(4 * time.Second) // the old deadline passes quietly
	h.advanceQuiet(6*time.Second - time.Nanosecond)
	h.advanceExpect(time.Nanosecond, "a")
	h.checkArmed()
}

func TestResetCanShortenExpiry(t *testing.T) {
	h := newHarness(t)
	h.tr.Reset("a", time.Hour)
	h.tr.Reset("a", time.Second)
	h.advanceQuiet(time.Second - time.Nanosecond)
	h.advanceExpect(time.Nanosecond, "a")
}

func TestResetNotEarliestLeavesTimerAlone(t *testing.T) {
	h := newHarness(t)
	h.tr.Reset("first", time.Second)
	h.tr.Reset("second", 2*time.Second)
	h.tr.Reset("second", 5*time.Second)
	h.advanceExpect(time.Second, "first")
	h.advanceQuiet(4*time.Second - time.Nanosecond)
	h.advanceExpect(time.Nanosecond, "second")
}

func TestResetInThePastExpiresAtOnce(t *testing.T) {
	h := newHarness(t)
	h.tr.Reset("later", time.Minute)
	h.tr.Reset("now", 0)
	h.waitRun() // the clock timer fired on re-arming; no Advance needed
	if got := h.take(); !slices.Equal(got, []string{"now"}) {
		t.Fatalf("expired %v, want [now]", got)
	}
	h.checkArmed()
	h.advanceExpect(time.Minute, "later")
}

func TestRemoveCancels(t *testing.T) {
	h := newHarness(t)
	h.tr.Reset("a", time.Second)
	h.tr.Reset("b", 2*time.Second)
	if !h.tr.Remove("a") {
		t.Fatal("Remove(a) = false")
	}
	if h.tr.Remove("a") {
		t.Fatal("second Remove(a) = true")
	}
	if h.tr.Remove("never") {
		t.Fatal("Remove of an unknown id = true")
	}
	h.checkArmed()
	h.advanceQuiet(2*time.Second - time.Nanosecond)
	h.advanceExpect(time.Nanosecond, "b")

	h.tr.Reset("c", time.Second)
	h.tr.Remove("c")
	h.checkArmed() // removing the last id stops the clock timer
	h.advanceQuiet(time.Hour)
}

func TestClearCancelsAll(t *testing.T) {
	h := newHarness(t)
	for i := range 1000 {
		h.tr.Reset(fmt.Sprint(i), time.Duration(i+1)*time.Millisecond)
	}
	h.tr.Clear()
	if n := h.tr.Len(); n != 0 {
		t.Fatalf("Len = %d after Clear", n)
	}
	h.checkArmed()
	h.advanceQuiet(time.Hour)

	// Regaining leadership: the Timers is usable again.
	h.tr.Reset("again", time.Second)
	h.advanceExpect(time.Second, "again")
}

func TestCancelDuringDelivery(t *testing.T) {
	// Ids that expire at the same wake-up are delivered one by one; a
	// Remove, Reset or Clear made by onExpire (or by anyone) before an
	// id's turn cancels that id's delivery.
	h := newHarness(t)
	h.onID = func(id string) {
		switch id {
		case "a":
			h.tr.Remove("b")
			h.tr.Reset("c", time.Minute) // renewed just in time
		case "d":
			h.tr.Clear()
		}
	}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		h.tr.Reset(id, time.Second)
	}
	h.tr.Reset("f", time.Hour)
	h.advanceExpect(time.Second, "a", "d")
	if n := h.tr.Len(); n != 0 {
		t.Fatalf("Len = %d after Clear, want 0", n)
	}
	h.checkArmed()
	h.advanceQuiet(2 * time.Hour)
}

func TestExpireHookMayRearmItself(t *testing.T) {
	h := newHarness(t)
	h.onID = func(id string) { h.tr.Reset(id, time.Second) }
	h.tr.Reset("beat", time.Second)
	for range 3 {
		h.advanceQuiet(time.Second - time.Nanosecond)
		h.advanceExpect(time.Nanosecond, "beat")
	}
}

func TestHundredThousandExpireInOrder(t *testing.T) {
	const n = 100_000
	h := newHarness(t)
	// Session i is due at (i+1) ms; insert in a shuffled order.
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%06d", i)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, i := range r.Perm(n) {
		h.tr.Reset(ids[i], time.Duration(i+1)*time.Millisecond)
	}
	if got := h.tr.Len(); got != n {
		t.Fatalf("Len = %d, want %d", got, n)
	}
	if got := h.clk.Waiters(); got != 1 {
		t.Fatalf("%d clock timers for %d ids, want 1", got, n)
	}

	// Step a few single milliseconds: exactly one id each.
	next := 0
	for range 5 {
		h.advanceQuiet(time.Millisecond - time.Nanosecond)
		h.advanceExpect(time.Nanosecond, ids[next])
		next++
	}
	// Then in steps of 97 ms: exactly the ids due in each step, in order.
	const step = 97
	for next < n {
		end := min(next+step, n)
		h.advanceExpect(step*time.Millisecond, ids[next:end]...)
		next = end
	}
	if got := h.tr.Len(); got != 0 {
		t.Fatalf("Len = %d at the end", got)
	}
	h.checkArmed()
}

func TestHundredThousandInOneJump(t *testing.T) {
	const n = 100_000
	h := newHarness(t)
	r := rand.New(rand.NewPCG(5, 6))
	want := make([]string, n)
	for i, p := range r.Perm(n) {
		// Many ties: 1000 distinct deadlines for 100k ids.
		id := fmt.Sprintf("s%06d", p)
		want[i] = id
		h.tr.Reset(id, time.Duration(p/100+1)*time.Second)
	}
	slices.Sort(want) // deadline order is id order here, ties included
	h.advanceExpect(time.Hour, want...)
}

func TestClose(t *testing.T) {
	h := newHarness(t)
	h.tr.Reset("a", time.Second)
	h.tr.Close()
	h.tr.Close() // twice is fine
	h.tr.Reset("b", time.Second)
	if n := h.tr.Len(); n != 0 {
		t.Fatalf("Len = %d after Close", n)
	}
	if n := h.clk.Waiters(); n != 0 {
		t.Fatalf("%d clock timers pending after Close", n)
	}
	h.clk.Advance(time.Hour)
	if got := h.take(); len(got) != 0 {
		t.Fatalf("expired %v after Close", got)
	}
}

func TestConcurrentCallers(t *testing.T) {
	h := newHarness(t)
	const workers, per = 8, 500
	var wg sync.WaitGroup
	var removed sync.Map
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range per {
				id := fmt.Sprintf("w%d-%d", w, i)
				h.tr.Reset(id, time.Duration(1+r.IntN(1000))*time.Millisecond)
				h.tr.Reset(id, time.Duration(1+r.IntN(1000))*time.Millisecond)
				if r.IntN(4) == 0 {
					h.tr.Remove(id)
					removed.Store(id, true)
				}
				_ = h.tr.Len()
			}
		})
	}
	wg.Wait()
	left := h.tr.Len()
	h.clk.Advance(time.Hour)
	h.waitRun()
	got := h.take()
	if len(got) != left {
		t.Fatalf("%d ids expired, want the %d that were left", len(got), left)
	}
	seen := map[string]bool{}
	for _, id := range got {
		if seen[id] {
			t.Fatalf("%s expired twice", id)
		}
		seen[id] = true
		if _, ok := removed.Load(id); ok {
			t.Fatalf("removed id %s expired", id)
		}
	}
	if left+countMap(&removed) != workers*per {
		t.Fatalf("%d left + %d removed != %d", left, countMap(&removed), workers*per)
	}
}

func countMap(m *sync.Map) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}

// TestRealClock is a smoke test of Timers on the real clock: the fake's
// timers follow the same contract, but the real ones are what production
// runs on.
func TestRealClock(t *testing.T) {
	expired := make(chan string, 10)
	tr := New(clock.Real(), func(id string) { expired <- id })
	defer tr.Close()
	tr.Reset("slow", time.Hour)
	tr.Reset("quick", 2*time.Millisecond)
	tr.Reset("removed", time.Millisecond)
	tr.Remove("removed")
	select {
	case id := <-expired:
		if id != "quick" {
			t.Fatalf("expired %q, want quick", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing expired on the real clock")
	}
	if n := tr.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}
}

func ExampleTimers() {
	clk := clocktest.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	expired := make(chan string, 1)
	timers := New(clk, func(id string) { expired <- id })
	defer timers.Close()

	timers.Reset("session-1", 15*time.Second)
	clk.Advance(15 * time.Second)
	fmt.Println(<-expired)
	// Output: session-1
}

// BenchmarkReset100k renews sessions round-robin among 100,000 live ones on
// the real clock, so every renewal moves the earliest deadline (the worst
// case: the clock timer is re-armed on every call).
func BenchmarkReset100k(b *testing.B) {
	const n = 100_000
	tr := New(clock.Real(), func(string) {})
	defer tr.Close()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("session-%06d", i)
		tr.Reset(ids[i], time.Hour)
	}
	i := 0
	for b.Loop() {
		tr.Reset(ids[i%n], time.Hour)
		i++
	}
}

// BenchmarkResetRandom100k renews random sessions among 100,000, so most
// renewals leave the clock timer alone.
func BenchmarkResetRandom100k(b *testing.B) {
	const n = 100_000
	tr := New(clock.Real(), func(string) {})
	defer tr.Close()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("session-%06d", i)
		tr.Reset(ids[i], time.Hour)
	}
	r := rand.New(rand.NewPCG(8, 9))
	for b.Loop() {
		tr.Reset(ids[r.IntN(n)], time.Hour)
	}
}

func TestTimersWithIntern(t *testing.T) {
	canon := "session-1"
	var mu sync.Mutex
	var interned []string
	expired := make(chan string, 1)
	clk := clocktest.NewFake(t0)
	tr := New(clk, func(id string) { expired <- id }, WithIntern(func(id string) string {
		mu.Lock()
		defer mu.Unlock()
		interned = append(interned, id)
		if id == canon {
			return canon
		}
		return id
	}))
	defer tr.Close()
	tr.Reset(string([]byte(canon)), 10*time.Second)
	tr.Reset(canon, 10*time.Second) // a renewal: already there
	clk.Advance(10 * time.Second)
	select {
	case id := <-expired:
		if id != canon || unsafe.StringData(id) != unsafe.StringData(canon) {
			t.Fatalf("expired %q, not the interned string", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing expired")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(interned, []string{canon}) {
		t.Fatalf("intern called for %v, want once", interned)
	}
}

// Pending is what onExpire uses to tell an expiry that fired from one that
// a Reset since overtook: false for the id being expired, true again once
// it is Reset, false after Remove or Clear.
func TestPending(t *testing.T) {
	h := newHarness(t)
	if h.tr.Pending("a") {
		t.Fatal("an id never Reset is pending")
	}
	h.tr.Reset("a", 10*time.Second)
	if !h.tr.Pending("a") {
		t.Fatal("a Reset id is not pending")
	}
	var inExpire, afterReset bool
	h.onID = func(id string) {
		inExpire = h.tr.Pending(id)
		h.tr.Reset(id, 10*time.Second) // a renewal that lost the race
		afterReset = h.tr.Pending(id)
	}
	h.advanceExpect(10*time.Second, "a")
	if inExpire || !afterReset {
		t.Fatalf("Pending in onExpire = %v, after a Reset there = %v; want false, true", inExpire, afterReset)
	}
	h.onID = nil
	h.tr.Remove("a")
	if h.tr.Pending("a") {
		t.Fatal("a removed id is pending")
	}
	h.tr.Reset("b", time.Second)
	h.tr.Clear()
	if h.tr.Pending("b") {
		t.Fatal("an id is pending after Clear")
	}
}
