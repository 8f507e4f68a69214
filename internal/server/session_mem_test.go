package server

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// BenchmarkSessionServerLiveBytes reports the live heap one TTL session
// costs the whole server (state, timers, raft), created as PUT
// /v1/session/create does with defaults: bound to this node's serfHealth,
// TTL "60s", behaviour release. Run with -benchtime=1x; the metric is
// B/session. HOLDFAST_SESSION_HEAPPROFILE=FILE also writes a heap profile
// (add -memprofilerate=1 for exact per-site figures).
func BenchmarkSessionServerLiveBytes(b *testing.B) {
	const n = 10000
	for b.Loop() {
		s := newBenchServer(b)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := s.WaitForSelfRegistration(ctx); err != nil {
			b.Fatal(err)
		}
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.HeapAlloc

		var next atomic.Int64
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for next.Add(1) <= n {
					in := &state.Session{Node: "bench", LockDelay: 15 * time.Second, Behavior: state.BehaviorRelease,
						TTL: "60s", NodeChecks: []string{state.SerfCheckID}}
					if _, err := s.SessionCreate(ctx, in); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		cancel()
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(int64(ms.HeapAlloc)-int64(before))/n, "B/session")
		if got := s.timers.Len(); got != n {
			b.Fatalf("%d timers, want %d", got, n)
		}
		if p := os.Getenv("HOLDFAST_SESSION_HEAPPROFILE"); p != "" {
			f, err := os.Create(p)
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
		runtime.KeepAlive(s)
	}
}

// BenchmarkSessionRenew10k renews sessions among 10,000 TTL sessions, as
// PUT /v1/session/renew does (without HTTP): a state read and a timer reset.
func BenchmarkSessionRenew10k(b *testing.B) {
	const n = 10000
	s := newBenchServer(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.WaitForSelfRegistration(ctx); err != nil {
		b.Fatal(err)
	}
	ids := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
				id, err := s.SessionCreate(ctx, &state.Session{Node: "bench", Behavior: state.BehaviorRelease,
					TTL: "60s", NodeChecks: []string{state.SerfCheckID}})
				if err != nil {
					b.Error(err)
					return
				}
				ids[i] = id
			}
		})
	}
	wg.Wait()
	b.ReportAllocs()
	b.ResetTimer()
	var k atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := k.Add(7919) % n
			if _, err := s.SessionRenew(ctx, ids[i]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
