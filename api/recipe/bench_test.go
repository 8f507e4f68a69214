package recipe

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	capi "github.com/hashicorp/consul/api"
)

// BenchmarkLockHandoff passes one lock around 32 contenders, holdfast's
// fair Lock against Consul's api.Lock on the same in-process server. Each
// op is one hand-off; wake-ms is the median time from a holder starting
// its Unlock to the next holder's Lock returning.
//
//	go test ./api/recipe -run - -bench LockHandoff -benchtime 500x
func BenchmarkLockHandoff(b *testing.B) {
	const contenders = 32
	b.Run("holdfast", func(b *testing.B) {
		srv := newServer(b)
		locks := make([]func(context.Context) (func(), error), contenders)
		for i := range locks {
			l := mustLock(b, lockSession(b, srv, nil), "bench/lock", nil)
			locks[i] = func(ctx context.Context) (func(), error) {
				h, err := l.Lock(ctx)
				if err != nil {
					return nil, err
				}
				return func() { h.Unlock(context.Background()) }, nil
			}
		}
		runHandoffs(b, locks)
	})
	b.Run("consul", func(b *testing.B) {
		srv := newServer(b)
		cc := consulClient(b, srv)
		locks := make([]func(context.Context) (func(), error), contenders)
		for i := range locks {
			l, err := cc.LockOpts(&capi.LockOptions{Key: "bench/lock"})
			if err != nil {
				b.Fatal(err)
			}
			locks[i] = func(ctx context.Context) (func(), error) {
				stop := make(chan struct{})
				go func() {
					<-ctx.Done()
					close(stop)
				}()
				ch, err := l.Lock(stop)
				if err != nil || ch == nil {
					return nil, context.Canceled
				}
				return func() { l.Unlock() }, nil
			}
		}
		runHandoffs(b, locks)
	})
}

func runHandoffs(b *testing.B, locks []func(context.Context) (func(), error)) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		left     atomic.Int64
		mu       sync.Mutex
		released time.Time
		wakes    []time.Duration
		wg       sync.WaitGroup
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	for _, lock := range locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				unlock, err := lock(ctx)
				if err != nil {
					return
				}
				now := time.Now()
				mu.Lock()
				if !released.IsZero() {
					wakes = append(wakes, now.Sub(released))
				}
				last := left.Add(-1) <= 0
				released = time.Now()
				mu.Unlock()
				if last {
					cancel()
				}
				unlock()
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if len(wakes) > 0 {
		sort.Slice(wakes, func(i, j int) bool { return wakes[i] < wakes[j] })
		b.ReportMetric(float64(wakes[len(wakes)/2].Microseconds())/1000, "wake-ms")
		b.ReportMetric(float64(wakes[len(wakes)*99/100].Microseconds())/1000, "p99-wake-ms")
	}
}
