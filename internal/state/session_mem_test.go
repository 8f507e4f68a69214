package state_test

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// sessionID returns a random ID shaped like the server's (36 characters).
func sessionID(tb testing.TB) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// liveHeap is the live heap after a full collection.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// sessionLiveBytes creates n sessions the way the HTTP API and the FSM
// create one: bound to its node's serfHealth check, TTL "60s", behaviour
// release, decoded from the JSON of a raft log entry (so every string is
// its own allocation, as in the FSM). It returns the live heap they add,
// per session.
func sessionLiveBytes(tb testing.TB, n int) float64 {
	f := newFx(tb)
	bodies := make([][]byte, n)
	for i := range bodies {
		raw, err := json.Marshal(&state.Session{ID: sessionID(tb), Node: "n1", LockDelay: 15 * time.Second,
			Behavior: state.BehaviorRelease, TTL: "60s", NodeChecks: []string{state.SerfCheckID}})
		if err != nil {
			tb.Fatal(err)
		}
		bodies[i] = raw
	}
	before := liveHeap()
	for i := range bodies {
		var sess state.Session
		if err := json.Unmarshal(bodies[i], &sess); err != nil {
			tb.Fatal(err)
		}
		if err := f.s.SessionCreate(f.next(), &sess); err != nil {
			tb.Fatal(err)
		}
	}
	after := liveHeap()
	if p := os.Getenv("HOLDFAST_SESSION_HEAPPROFILE"); p != "" {
		writeHeapProfile(tb, p)
	}
	runtime.KeepAlive(f)
	runtime.KeepAlive(bodies)
	return float64(int64(after)-int64(before)) / float64(n)
}

// BenchmarkSessionLiveBytes reports the live heap a stored session costs.
// Run it with -benchtime=1x; the metric is B/session.
// HOLDFAST_SESSION_HEAPPROFILE=FILE also writes a heap profile (add
// -memprofilerate=1 for exact per-site figures).
func BenchmarkSessionLiveBytes(b *testing.B) {
	for b.Loop() {
		b.ReportMetric(sessionLiveBytes(b, 10000), "B/session")
	}
}

// TestSessionMemoryBudget keeps a stored session near what it costs now
// (about 240 bytes, the Session and its ID, where rows in go-memdb with
// three indexes took 1,750): an index or a per-session allocation added to
// the sessions table fails it.
func TestSessionMemoryBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	if got := sessionLiveBytes(t, 5000); got > 400 {
		t.Fatalf("a session costs the store %.0f live bytes; the budget is 400", got)
	}
}

// writeHeapProfile writes the heap profile (as of the last collection) to
// path, for go tool pprof -sample_index=inuse_space.
func writeHeapProfile(tb testing.TB, path string) {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}
