package state_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// sessionBenchStore returns a store holding n sessions shaped like the
// server's (random UUIDs, bound to n1's serfHealth, TTL 60s) and their IDs.
func sessionBenchStore(b *testing.B, n int) (*fx, []string) {
	f := newFx(b)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = sessionID(b)
		if err := f.s.SessionCreate(f.next(), benchSession(ids[i])); err != nil {
			b.Fatal(err)
		}
	}
	return f, ids
}

func benchSession(id string) *state.Session {
	return &state.Session{ID: id, Node: "n1", LockDelay: 15 * time.Second, Behavior: state.BehaviorRelease,
		TTL: "60s", NodeChecks: []string{state.SerfCheckID}}
}

// BenchmarkSessionCreateDestroy creates and destroys one session in a store
// of 10,000, each in its own transaction (what a lone request costs).
func BenchmarkSessionCreateDestroy(b *testing.B) {
	f, _ := sessionBenchStore(b, 10000)
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = sessionID(b)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		id := ids[i%len(ids)]
		i++
		if err := f.s.SessionCreate(f.next(), benchSession(id)); err != nil {
			b.Fatal(err)
		}
		if err := f.s.SessionDestroy(f.next(), f.now, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSessionCreateBatch64 creates 64 sessions per transaction, as the
// FSM applies a raft batch, into a store of 10,000 (then destroys them,
// also in one batch, outside the timing).
func BenchmarkSessionCreateBatch64(b *testing.B) {
	f, _ := sessionBenchStore(b, 10000)
	ids := make([]string, 64)
	b.ReportAllocs()
	for b.Loop() {
		for i := range ids {
			ids[i] = fmt.Sprintf("%s-%d", sessionID(b)[:30], i)
		}
		bt := f.s.Batch()
		for _, id := range ids {
			if err := bt.SessionCreate(f.next(), benchSession(id)); err != nil {
				b.Fatal(err)
			}
		}
		bt.Commit()
		b.StopTimer()
		bt = f.s.Batch()
		for _, id := range ids {
			bt.SessionDestroy(f.next(), f.now, id)
		}
		bt.Commit()
		b.StartTimer()
	}
}

// BenchmarkSessionGet looks up a session among 10,000, as every renew and
// lock acquire does.
func BenchmarkSessionGet(b *testing.B) {
	f, ids := sessionBenchStore(b, 10000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, s := f.s.SessionGet(nil, ids[i%len(ids)]); s == nil {
			b.Fatal("missing")
		}
		i++
	}
}

// BenchmarkSessionLock acquires and releases a key with a session among
// 10,000 (the KV lock path checks the session exists).
func BenchmarkSessionLock(b *testing.B) {
	f, ids := sessionBenchStore(b, 10000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		id := ids[i%len(ids)]
		i++
		f.mustKVS(state.OpLock, state.DirEntry{Key: "k", Session: id}, true)
		f.mustKVS(state.OpUnlock, state.DirEntry{Key: "k", Session: id}, true)
	}
}

// BenchmarkSessionInvalidateCheck10k fails the serfHealth check 10,000
// sessions are bound to: one command invalidates them all.
func BenchmarkSessionInvalidateCheck10k(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		f, _ := sessionBenchStore(b, 10000)
		b.StartTimer()
		f.check("n1", state.SerfCheckID, state.HealthCritical)
		b.StopTimer()
		if _, l := f.s.SessionList(nil); len(l) != 0 {
			b.Fatalf("%d sessions left", len(l))
		}
		b.StartTimer()
	}
}
