package main

// Workload drivers that etcd and ZooKeeper share.

import (
	"context"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"
)

// contendLoop runs lock-contend with a blocking lock call: lock returns
// once client c holds the lock, and the function to release it.
func contendLoop(ctx context.Context, cfg *config, el *errLog, pw *procWatch,
	lock func(ctx context.Context, c int) (func(context.Context) error, error)) (*Result, error) {
	n := cfg.clients
	ho := &handoffs{measure: true}
	var budget atomic.Int64
	budget.Store(cfg.maxOps)
	rctx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	pw.measureStart()
	t0 := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for rctx.Err() == nil && budget.Add(-1) >= 0 {
				unlock, err := lock(rctx, c)
				if err != nil {
					if rctx.Err() == nil {
						el.add("lock", err)
						sleepCtx(rctx, errBackoff)
					}
					continue
				}
				g := ho.acquired(c, time.Now())
				// Release even after the end of the run, so no one is left waiting.
				uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.timeout)
				err = unlock(uctx)
				at := time.Now()
				ucancel()
				if err != nil {
					el.add("unlock", err)
					continue
				}
				ho.released(c, g, at)
			}
		}(c)
	}
	wg.Wait()
	elapsed := time.Since(t0)
	if elapsed > cfg.duration {
		elapsed = cfg.duration
	}
	ho.mu.Lock()
	defer ho.mu.Unlock()
	r := &Result{Clients: n, Ops: ho.handoffs, Lat: &ho.gap, Elapsed: elapsed, Unit: "handoffs", LatName: "gap"}
	r.Int("acquires", ho.acquires)
	r.Float("acquires_per_s", float64(ho.acquires)/elapsed.Seconds(), 1)
	r.Int("reacquires", ho.reacquires)
	r.Int("acquire_false", 0)
	r.Int("gap_early", ho.early)
	return r, nil
}

func randValue(rnd *rand.Rand, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	v := make([]byte, n)
	for i := range v {
		v[i] = letters[rnd.Intn(len(letters))]
	}
	return string(v)
}

func newRands(n int) []*rand.Rand {
	r := make([]*rand.Rand, n)
	for i := range r {
		r[i] = rand.New(rand.NewSource(time.Now().UnixNano() + int64(i)))
	}
	return r
}

// wakeRound is one write that every watcher should see.
type wakeRound struct {
	n    int64
	t0   time.Time
	left atomic.Int64
	done chan struct{}
}

func (rd *wakeRound) seen() {
	if rd.left.Add(-1) == 0 {
		close(rd.done)
	}
}

// wakeLoop drives watch-wake rounds for targets whose watchers are armed
// once: write(n) must write value n to the watched key; watchers report
// each event through the round returned by cur().
func wakeLoop(ctx context.Context, cfg *config, el *errLog, pw *procWatch, k int, cur *atomic.Pointer[wakeRound],
	write func(ctx context.Context, n int64) error) (rounds, missed int64, elapsed time.Duration) {
	pw.measureStart()
	t0 := time.Now()
	end := t0.Add(cfg.duration)
	for time.Now().Before(end) && ctx.Err() == nil && rounds*int64(k) < cfg.maxOps {
		rounds++
		rd := &wakeRound{n: rounds, done: make(chan struct{})}
		rd.left.Store(int64(k))
		rd.t0 = time.Now()
		cur.Store(rd)
		if err := write(ctx, rounds); err != nil {
			el.add("watched write", err)
			missed += int64(k)
			continue
		}
		t := time.NewTimer(cfg.timeout)
		select {
		case <-rd.done:
		case <-t.C:
			missed += rd.left.Load()
		case <-ctx.Done():
		}
		t.Stop()
	}
	cur.Store(nil)
	return rounds, missed, time.Since(t0)
}

func pingResult(ops int64, d time.Duration) *Result {
	lat := &Hist{}
	if ops > 0 {
		lat.Record(d)
	}
	return &Result{Clients: 1, Ops: ops, Lat: lat, Elapsed: d, Unit: "ops", LatName: "op"}
}
