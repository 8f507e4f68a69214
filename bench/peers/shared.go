package main

// What the etcd and ZooKeeper drivers share.

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/bench/loadkit"
)

// common is what every target's bench carries.
type common struct {
	cfg *loadkit.Config
	el  *loadkit.ErrLog
	pw  *loadkit.ProcWatch
	pfx string // unique key (node) prefix of this run: /<-prefix>/<run id>
}

func newCommon(cfg *loadkit.Config, el *loadkit.ErrLog, pw *loadkit.ProcWatch) common {
	return common{cfg: cfg, el: el, pw: pw, pfx: "/" + cfg.Prefix + "/" + loadkit.RunID()}
}

// keyLoop runs put or get-consistent: every op picks one of -keys keys
// below prefix at random and calls op with it and the client's random
// source (for values).
func (b *common) keyLoop(ctx context.Context, what, prefix string,
	op func(ctx context.Context, c int, rnd *rand.Rand, key string) error) *loadkit.Result {
	rnds := loadkit.NewRands(b.cfg.Clients)
	b.pw.MeasureStart()
	ops, lat, el := loadkit.LoopRate(ctx, b.cfg.Clients, b.cfg.Duration, b.cfg.MaxOps, b.cfg.Rate, b.el, what,
		func(ctx context.Context, c int) error {
			return op(ctx, c, rnds[c], prefix+strconv.Itoa(rnds[c].Intn(b.cfg.Keys)))
		})
	return &loadkit.Result{Clients: b.cfg.Clients, Ops: ops, Lat: lat, Elapsed: el, Unit: "ops", LatName: "op"}
}

// contendLoop runs lock-contend with a blocking lock call: lock returns
// once client c holds the lock, and the function to release it.
func (b *common) contendLoop(ctx context.Context,
	lock func(ctx context.Context, c int) (func(context.Context) error, error)) (*loadkit.Result, error) {
	cfg := b.cfg
	n := cfg.Clients
	ho := loadkit.NewHandoffs()
	var budget atomic.Int64
	budget.Store(cfg.MaxOps)
	rctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	b.pw.MeasureStart()
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
						b.el.Add("lock", err)
						loadkit.SleepCtx(rctx, loadkit.ErrBackoff)
					}
					continue
				}
				g := ho.Acquired(c, time.Now())
				// Release even after the end of the run, so no one is left waiting.
				uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Timeout)
				err = unlock(uctx)
				at := time.Now()
				ucancel()
				if err != nil {
					b.el.Add("unlock", err)
					continue
				}
				ho.Released(c, g, at)
			}
		}(c)
	}
	wg.Wait()
	elapsed := time.Since(t0)
	if elapsed > cfg.Duration {
		elapsed = cfg.Duration
	}
	// Both targets' lock calls block rather than answer false.
	return ho.Result(n, elapsed, 0), nil
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
func (b *common) wakeLoop(ctx context.Context, k int, cur *atomic.Pointer[wakeRound],
	write func(ctx context.Context, n int64) error) (rounds, missed int64, elapsed time.Duration) {
	cfg := b.cfg
	b.pw.MeasureStart()
	t0 := time.Now()
	end := t0.Add(cfg.Duration)
	for time.Now().Before(end) && ctx.Err() == nil && rounds*int64(k) < cfg.MaxOps {
		time.Sleep(loadkit.WakePause) // the same pause as every target's round
		rounds++
		rd := &wakeRound{n: rounds, done: make(chan struct{})}
		rd.left.Store(int64(k))
		rd.t0 = time.Now()
		cur.Store(rd)
		if err := write(ctx, rounds); err != nil {
			b.el.Add("watched write", err)
			missed += int64(k)
			continue
		}
		t := time.NewTimer(cfg.Timeout)
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

// pingLoop retries try (connect, write, linearizable read) until one succeeds
// or -duration passes; the context try gets ends then too. The latency
// reported is the time until success.
func (b *common) pingLoop(ctx context.Context, try func(ctx context.Context) error) (*loadkit.Result, error) {
	b.pw.MeasureStart()
	t0 := time.Now()
	end := t0.Add(b.cfg.Duration)
	result := func(ops int64) *loadkit.Result {
		d := time.Since(t0)
		lat := &loadkit.Hist{}
		if ops > 0 {
			lat.Record(d)
		}
		return &loadkit.Result{Clients: 1, Ops: ops, Lat: lat, Elapsed: d, Unit: "ops", LatName: "op"}
	}
	var last error
	for tries := 0; time.Now().Before(end) && ctx.Err() == nil && tries < 10000; tries++ {
		tctx, cancel := context.WithDeadline(ctx, end)
		err := try(tctx)
		cancel()
		if err == nil {
			return result(1), nil
		}
		last = err
		loadkit.SleepCtx(ctx, 100*time.Millisecond)
	}
	return result(0), fmt.Errorf("not ready: %v", last)
}
