package loadkit

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"
)

// Keeper runs the sessions-keepalive workload for any target: Cfg.Clients
// workers create their share of Cfg.Sessions sessions, renewing each one
// every Cfg.SessionTTL/2 (first renewal at a random point within the first
// interval, so renewals are spread evenly over time), then all keep
// renewing for the measured phase (Cfg.Duration), then destroy them unless
// Cfg.NoCleanup.
type Keeper struct {
	Cfg    *Config
	El     *ErrLog
	Create func(ctx context.Context, worker int) (string, error)
	// Renew reports whether the session still existed. Nil: the client
	// library keeps sessions alive by itself.
	Renew   func(ctx context.Context, worker int, id string) (alive bool, err error)
	Destroy func(ctx context.Context, worker int, id string) error
	// OnMeasure runs when every session exists, just before the measured
	// phase (typically ProcWatch.MeasureStart).
	OnMeasure func()
}

type kaItem struct {
	due time.Time
	id  string
}

type kaHeap []kaItem

func (h kaHeap) less(i, j int) bool { return h[i].due.Before(h[j].due) }

func (h *kaHeap) push(it kaItem) {
	*h = append(*h, it)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

// fixTop restores heap order after s[0].due grew.
func (h kaHeap) fixTop() {
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h.less(l, m) {
			m = l
		}
		if r < len(h) && h.less(r, m) {
			m = r
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func (h *kaHeap) popTop() {
	s := *h
	n := len(s) - 1
	s[0] = s[n]
	*h = s[:n]
	(*h).fixTop()
}

// KeeperStats is what a Keeper run measured.
type KeeperStats struct {
	Created, CreateErrs int64
	Renewals            int64 // during the measured phase
	Expired             int64 // renewals answered "no such session"
	CreateDur           time.Duration
	Measured            time.Duration // length of the measured phase
	MaxLag              time.Duration // the latest a renewal started, during the measured phase
	Lat                 Hist          // renewal latency
}

// Run creates, keeps alive and destroys the sessions. Its error says that
// not all sessions could be created (the measured phase is then skipped);
// the stats are valid either way.
func (k *Keeper) Run(ctx context.Context) (*KeeperStats, error) {
	total := k.Cfg.Sessions
	workers := k.Cfg.Clients
	interval := k.Cfg.SessionTTL / 2
	setupCtx, cancelSetup := context.WithTimeout(ctx, k.Cfg.SetupTimeout)
	defer cancelSetup()

	var createdWG sync.WaitGroup
	measureStart := make(chan struct{})
	var measureEnd time.Time // written before measureStart is closed
	stats := make([]KeeperStats, workers)
	heaps := make([]kaHeap, workers)
	var wg sync.WaitGroup
	var failed atomic.Bool
	t0 := time.Now()
	for w := 0; w < workers; w++ {
		share := total / workers
		if w < total%workers {
			share++
		}
		createdWG.Add(1)
		wg.Add(1)
		go func(w, share int) {
			defer wg.Done()
			st := &stats[w]
			h := &heaps[w]
			rnd := rand.New(rand.NewSource(time.Now().UnixNano() + int64(w)))
			measuring := false
			creating := true
			consecutive := 0
			renewOne := func() {
				it := &(*h)[0]
				now := time.Now()
				if lag := now.Sub(it.due); measuring && lag > st.MaxLag {
					st.MaxLag = lag
				}
				rctx, cancel := context.WithTimeout(ctx, k.Cfg.Timeout)
				alive, err := k.Renew(rctx, w, it.id)
				cancel()
				switch {
				case err != nil:
					k.El.Add("renew", err)
					it.due = time.Now().Add(time.Second)
					h.fixTop()
				case !alive:
					st.Expired++
					h.popTop()
				default:
					if measuring {
						st.Renewals++
						st.Lat.Record(time.Since(now))
					}
					it.due = it.due.Add(interval)
					if d := time.Now(); it.due.Before(d) {
						it.due = d.Add(interval) // fell a whole interval behind
					}
					h.fixTop()
				}
			}
			for {
				if creating && (int(st.Created) >= share || setupCtx.Err() != nil || failed.Load()) {
					creating = false
					createdWG.Done()
				}
				if !measuring && !creating {
					select {
					case <-measureStart:
						measuring = true
					default:
					}
				}
				now := time.Now()
				if measuring && !now.Before(measureEnd) || ctx.Err() != nil {
					return
				}
				if k.Renew != nil && len(*h) > 0 && !(*h)[0].due.After(now) {
					renewOne()
					continue
				}
				if creating {
					cctx, cancel := context.WithTimeout(setupCtx, k.Cfg.Timeout)
					id, err := k.Create(cctx, w)
					cancel()
					if err != nil {
						st.CreateErrs++
						consecutive++
						k.El.Add("create session", err)
						if consecutive >= 100 {
							failed.Store(true)
						}
						SleepCtx(setupCtx, ErrBackoff)
						continue
					}
					consecutive = 0
					st.Created++
					h.push(kaItem{due: time.Now().Add(time.Duration(rnd.Int63n(int64(interval))) + 1), id: id})
					continue
				}
				// Nothing due: sleep until the next renewal, the end, or the start of measuring.
				wait := time.Second
				if k.Renew != nil && len(*h) > 0 {
					wait = time.Until((*h)[0].due)
				}
				if measuring {
					if u := time.Until(measureEnd); u < wait {
						wait = u
					}
					SleepCtx(ctx, wait)
				} else {
					t := time.NewTimer(wait)
					select {
					case <-t.C:
					case <-measureStart:
					case <-ctx.Done():
					}
					t.Stop()
				}
			}
		}(w, share)
	}
	createdWG.Wait()
	createDur := time.Since(t0)
	var created int64
	for i := range stats {
		created += stats[i].Created
	}
	var runErr error
	if failed.Load() || created < int64(total) {
		runErr = fmt.Errorf("created only %d of %d sessions within %s", created, total, k.Cfg.SetupTimeout)
	}
	if k.OnMeasure != nil && runErr == nil {
		k.OnMeasure()
	}
	mStart := time.Now()
	measureEnd = mStart.Add(k.Cfg.Duration)
	if runErr != nil {
		measureEnd = mStart // stop at once
	}
	close(measureStart)
	wg.Wait()
	out := &KeeperStats{CreateDur: createDur, Measured: time.Since(mStart)}
	for i := range stats {
		s := &stats[i]
		out.Created += s.Created
		out.CreateErrs += s.CreateErrs
		out.Renewals += s.Renewals
		out.Expired += s.Expired
		if s.MaxLag > out.MaxLag {
			out.MaxLag = s.MaxLag
		}
		out.Lat.Merge(&s.Lat)
	}
	if out.Measured > k.Cfg.Duration {
		out.Measured = k.Cfg.Duration
	}

	if k.Cfg.NoCleanup {
		return out, runErr
	}
	// Clean up with the same workers, bounded in time.
	dctx, cancelD := context.WithTimeout(context.Background(), k.Cfg.SetupTimeout)
	defer cancelD()
	for w := range heaps {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for _, it := range heaps[w] {
				if dctx.Err() != nil {
					return
				}
				c, cancel := context.WithTimeout(dctx, k.Cfg.Timeout)
				if err := k.Destroy(c, w, it.id); err != nil && dctx.Err() == nil {
					k.El.Add("destroy session", err)
				}
				cancel()
			}
		}(w)
	}
	wg.Wait()
	return out, runErr
}

// KeepaliveResult turns keeper statistics into a result.
func KeepaliveResult(cfg *Config, st *KeeperStats) *Result {
	r := &Result{Clients: cfg.Clients, Ops: st.Renewals, Lat: &st.Lat, Elapsed: st.Measured, Unit: "renewals", LatName: "renew"}
	r.Int("sessions", int64(cfg.Sessions))
	r.Int("created", st.Created)
	r.Float("create_s", st.CreateDur.Seconds(), 2)
	r.Float("create_per_s", float64(st.Created)/st.CreateDur.Seconds(), 1)
	r.Int("create_errors", st.CreateErrs)
	r.Int("expired", st.Expired)
	r.Ms("renew_lag_max_ms", st.MaxLag)
	r.Float("session_ttl_s", cfg.SessionTTL.Seconds(), 0)
	return r
}
