package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/api/recipe"
	"github.com/holdfast/holdfast/bench/loadkit"
)

// lockContendRecipe is lock-contend through holdfast's own client: each
// contender is a recipe.Lock on the one key, so waiters queue in arrival
// order and only the next one is woken, as with ZooKeeper's and etcd's lock
// recipes. (lockContend is the same workload done the way Consul's Go
// client does it: every waiter races an acquire on each release.)
func (b *bench) lockContendRecipe(ctx context.Context) (*loadkit.Result, error) {
	n := b.cfg.Clients
	client, err := api.NewClient(&api.Config{Address: b.cfg.Addr,
		HTTPClient: &http.Client{Transport: newTransport(2 * n)}})
	if err != nil {
		return nil, err
	}
	key := b.pfx + "/contend"
	sessions := make([]*recipe.Session, n)
	locks := make([]*recipe.Lock, n)
	for c := 0; c < n; c++ {
		s, err := recipe.NewSession(ctx, client, &recipe.SessionOptions{Name: fmt.Sprintf("loadgen contender %d", c), LockDelay: -1})
		if err != nil {
			return nil, fmt.Errorf("creating contender %d's session: %w", c, err)
		}
		sessions[c] = s
		if locks[c], err = recipe.NewLock(s, key, nil); err != nil {
			return nil, err
		}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range sessions {
			s.Close(cctx)
		}
	}()

	ho := loadkit.NewHandoffs()
	var budget atomic.Int64
	budget.Store(b.cfg.MaxOps)
	rctx, cancel := context.WithTimeout(ctx, b.cfg.Duration)
	defer cancel()
	b.pw.MeasureStart()
	t0 := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for rctx.Err() == nil && budget.Add(-1) >= 0 {
				hold, err := locks[c].Lock(rctx)
				if err != nil {
					if rctx.Err() == nil {
						b.el.Add("lock", err)
						loadkit.SleepCtx(rctx, loadkit.ErrBackoff)
					}
					continue
				}
				g := ho.Acquired(c, time.Now())
				// Unlock with a fresh context: a hold must be given up even
				// when the run's time is over, or the next waiter starves.
				uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
				err = hold.Unlock(uctx)
				ucancel()
				if err != nil {
					b.el.Add("unlock", err)
					continue
				}
				ho.Released(c, g, time.Now())
			}
		}(c)
	}
	wg.Wait()
	elapsed := time.Since(t0)
	if elapsed > b.cfg.Duration {
		elapsed = b.cfg.Duration
	}
	return ho.Result(n, elapsed, 0), nil
}
