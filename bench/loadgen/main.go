// Command loadgen puts load on a server that speaks Consul's HTTP API
// (holdfast, or Consul itself) and prints one result line per run. See
// bench/README.md for the workloads and how to read the output.
//
//	go run ./bench/loadgen -addr 127.0.0.1:8500 -workload put -clients 32 -duration 10s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http/httptrace"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	cfg.register(fs, 100_000)
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:8500", "server HTTP address (host:port or URL)")
	fs.StringVar(&cfg.target, "name", "holdfast", "target name printed in the result")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := cfg.check(); err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return 2
	}
	startWatchdog("loadgen", cfg.watchdogLimit())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	el := &errLog{w: stderr}
	if cfg.quiet {
		el.w = nil
	}
	r, err := runWorkload(ctx, &cfg, el)
	if r != nil {
		fmt.Fprintln(stdout, r.Line())
		if cfg.jsonOut {
			fmt.Fprintln(stdout, r.JSON())
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return 1
	}
	if r.Ops == 0 {
		fmt.Fprintln(stderr, "loadgen: no operation succeeded")
		return 1
	}
	return 0
}

// bench carries what every workload needs.
type bench struct {
	cfg *config
	c   *consul
	el  *errLog
	pw  *procWatch
	pfx string // unique key prefix of this run, no trailing slash
}

func runWorkload(ctx context.Context, cfg *config, el *errLog) (*Result, error) {
	conns := cfg.clients
	if cfg.workload == wWatchWake {
		conns = cfg.watchers + 1
	}
	b := &bench{
		cfg: cfg,
		c:   newConsul(cfg.addr, conns, cfg.timeout),
		el:  el,
		pfx: cfg.prefix + "/" + runID(),
	}
	defer b.c.close()
	b.pw = newProcWatch(cfg.pid, el)
	var r *Result
	var err error
	switch cfg.workload {
	case wSessionChurn:
		r, err = b.sessionChurn(ctx)
	case wLockOwn:
		r, err = b.lockOwn(ctx)
	case wLockContend:
		r, err = b.lockContend(ctx)
	case wPut:
		r, err = b.put(ctx)
	case wGet:
		r, err = b.getConsistent(ctx)
	case wWatchWake:
		r, err = b.watchWake(ctx)
	case wKeepalive:
		r, err = b.sessionsKeepalive(ctx)
	case wPing:
		r, err = b.ping(ctx)
	}
	if r != nil {
		r.Target = cfg.target
		r.Workload = cfg.workload
		r.Errors = el.count()
		b.pw.finish(r)
	}
	return r, err
}

func (b *bench) result(clients int, ops int64, lat *Hist, elapsed time.Duration, unit, latName string) *Result {
	return &Result{Clients: clients, Ops: ops, Lat: lat, Elapsed: elapsed, Unit: unit, LatName: latName}
}

// ---- session-churn: create + destroy one session per op.

func (b *bench) sessionChurn(ctx context.Context) (*Result, error) {
	b.pw.measureStart()
	ops, lat, el := loop(ctx, b.cfg.clients, b.cfg.duration, b.cfg.maxOps, b.el, "session churn",
		func(ctx context.Context, _ int) error {
			id, err := b.c.createSession(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return b.c.destroySession(ctx, id)
		})
	return b.result(b.cfg.clients, ops, lat, el, "ops", "op"), nil
}

// ---- sessions held by lock workloads: one per client, renewed in the
// background so that they outlive any -duration.

type heldSessions struct {
	ids  []string
	stop func()
}

func (b *bench) holdSessions(ctx context.Context, n int) (*heldSessions, error) {
	const ttl = 30 * time.Second
	h := &heldSessions{}
	for i := 0; i < n; i++ {
		id, err := b.c.createSession(ctx, ttl)
		if err != nil {
			b.destroyAll(h.ids)
			return nil, fmt.Errorf("creating lock session: %w", err)
		}
		h.ids = append(h.ids, id)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
				for _, id := range h.ids {
					if _, err := b.c.renewSession(rctx, id); err != nil && rctx.Err() == nil {
						b.el.add("renew lock session", err)
					}
				}
			}
		}
	}()
	h.stop = func() {
		cancel()
		<-done
		b.destroyAll(h.ids)
	}
	return h, nil
}

func (b *bench) destroyAll(ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.setupTimeout)
	defer cancel()
	for _, id := range ids {
		if err := b.c.destroySession(ctx, id); err != nil {
			b.el.add("destroy session", err)
		}
	}
}

// ---- lock-own: acquire + release on a key of one's own.

func (b *bench) lockOwn(ctx context.Context) (*Result, error) {
	hs, err := b.holdSessions(ctx, b.cfg.clients)
	if err != nil {
		return nil, err
	}
	defer hs.stop()
	b.pw.measureStart()
	ops, lat, el := loop(ctx, b.cfg.clients, b.cfg.duration, b.cfg.maxOps, b.el, "lock cycle",
		func(ctx context.Context, c int) error {
			key := fmt.Sprintf("%s/own/%d", b.pfx, c)
			ok, err := b.c.acquire(ctx, key, hs.ids[c])
			if err != nil {
				return err
			}
			if !ok {
				return errors.New("acquire of an own key answered false")
			}
			ok, err = b.c.release(ctx, key, hs.ids[c])
			if err == nil && !ok {
				err = errors.New("release of a held key answered false")
			}
			return err
		})
	return b.result(b.cfg.clients, ops, lat, el, "cycles", "cycle"), nil
}

// ---- lock-contend: every client wants one key.

func (b *bench) lockContend(ctx context.Context) (*Result, error) {
	n := b.cfg.clients
	hs, err := b.holdSessions(ctx, n)
	if err != nil {
		return nil, err
	}
	defer hs.stop()
	key := b.pfx + "/contend"
	const wait = 5 * time.Second
	ho := &handoffs{measure: true}
	var failedAcq, budget atomic.Int64
	budget.Store(b.cfg.maxOps)
	rctx, cancel := context.WithTimeout(ctx, b.cfg.duration)
	defer cancel()
	b.pw.measureStart()
	t0 := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			sid := hs.ids[c]
			for rctx.Err() == nil && budget.Add(-1) >= 0 {
				ok, err := b.c.acquire(rctx, key, sid)
				if err != nil {
					if rctx.Err() == nil {
						b.el.add("acquire", err)
						sleepCtx(rctx, errBackoff)
					}
					continue
				}
				if ok {
					g := ho.acquired(c, time.Now())
					ok, err := b.c.release(rctx, key, sid)
					at := time.Now()
					switch {
					case err != nil:
						if rctx.Err() == nil {
							b.el.add("release", err)
						}
					case !ok:
						b.el.add("release", errors.New("release of a held lock answered false"))
					default:
						ho.released(c, g, at)
					}
					continue
				}
				failedAcq.Add(1)
				// Wait until the key has no holder, then try again.
				var idx uint64
				for rctx.Err() == nil && budget.Add(-1) >= 0 {
					e, err := b.c.get(rctx, key, false, idx, wait)
					if err != nil {
						if rctx.Err() == nil {
							b.el.add("blocking get", err)
							sleepCtx(rctx, errBackoff)
						}
						break
					}
					if !e.found || e.session == "" {
						break
					}
					if e.index < idx {
						idx = 0 // the index went backwards: start over
					} else {
						idx = e.index
					}
					if idx == 0 {
						idx = 1
					}
				}
			}
		}(c)
	}
	wg.Wait()
	elapsed := time.Since(t0)
	if elapsed > b.cfg.duration {
		elapsed = b.cfg.duration
	}
	ho.mu.Lock()
	defer ho.mu.Unlock()
	r := b.result(n, ho.handoffs, &ho.gap, elapsed, "handoffs", "gap")
	r.Int("acquires", ho.acquires)
	r.Float("acquires_per_s", float64(ho.acquires)/elapsed.Seconds(), 1)
	r.Int("reacquires", ho.reacquires)
	r.Int("acquire_false", failedAcq.Load())
	r.Int("gap_early", ho.early)
	return r, nil
}

// ---- put: PUT to random keys.

func (b *bench) value(rnd *rand.Rand) []byte {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	v := make([]byte, b.cfg.valueSize)
	for i := range v {
		v[i] = letters[rnd.Intn(len(letters))]
	}
	return v
}

func (b *bench) put(ctx context.Context) (*Result, error) {
	rnds := make([]*rand.Rand, b.cfg.clients)
	for i := range rnds {
		rnds[i] = rand.New(rand.NewSource(time.Now().UnixNano() + int64(i)))
	}
	b.pw.measureStart()
	ops, lat, el := loop(ctx, b.cfg.clients, b.cfg.duration, b.cfg.maxOps, b.el, "put",
		func(ctx context.Context, c int) error {
			rnd := rnds[c]
			key := b.pfx + "/put/" + strconv.Itoa(rnd.Intn(b.cfg.keys))
			return b.c.put(ctx, key, b.value(rnd))
		})
	return b.result(b.cfg.clients, ops, lat, el, "ops", "op"), nil
}

// ---- get-consistent: linearizable reads of keys written beforehand.

// writeKeys writes keys prefix/0..n-1 with bounded concurrency.
func (b *bench) writeKeys(ctx context.Context, prefix string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.setupTimeout)
	defer cancel()
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < b.cfg.clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(int64(w)))
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				if err := b.c.put(ctx, prefix+strconv.FormatInt(i, 10), b.value(rnd)); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
			}
		}(w)
	}
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("writing keys: %w", firstErr)
	}
	return ctx.Err()
}

func (b *bench) getConsistent(ctx context.Context) (*Result, error) {
	prefix := b.pfx + "/get/"
	if err := b.writeKeys(ctx, prefix, b.cfg.keys); err != nil {
		return nil, err
	}
	rnds := make([]*rand.Rand, b.cfg.clients)
	for i := range rnds {
		rnds[i] = rand.New(rand.NewSource(time.Now().UnixNano() + int64(i)))
	}
	b.pw.measureStart()
	ops, lat, el := loop(ctx, b.cfg.clients, b.cfg.duration, b.cfg.maxOps, b.el, "get",
		func(ctx context.Context, c int) error {
			key := prefix + strconv.Itoa(rnds[c].Intn(b.cfg.keys))
			e, err := b.c.get(ctx, key, true, 0, 0)
			if err == nil && !e.found {
				err = fmt.Errorf("GET %s: written key not found", key)
			}
			return err
		})
	return b.result(b.cfg.clients, ops, lat, el, "ops", "op"), nil
}

// ---- watch-wake: K blocking queries on one key, one PUT, time to each wake.

type wakeRound struct {
	t0    atomic.Int64 // UnixNano when the PUT was about to be sent; 0 before
	armed sync.WaitGroup
	done  sync.WaitGroup
}

func (b *bench) watchWake(ctx context.Context) (*Result, error) {
	k := b.cfg.watchers
	key := b.pfx + "/watch"
	if err := b.c.put(ctx, key, []byte("0")); err != nil {
		return nil, fmt.Errorf("writing the watched key: %w", err)
	}
	e, err := b.c.get(ctx, key, false, 0, 0)
	if err != nil {
		return nil, err
	}
	const wait = 10 * time.Second
	const settle = time.Millisecond // lets the server park the queries it has read
	hists := make([]Hist, k)
	var missed atomic.Int64
	starts := make([]chan *wakeRound, k)
	var wg sync.WaitGroup
	for w := 0; w < k; w++ {
		starts[w] = make(chan *wakeRound, 1)
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			idx := e.index
			for rd := range starts[w] {
				armed := sync.OnceFunc(rd.armed.Done)
				tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
					WroteRequest: func(httptrace.WroteRequestInfo) { armed() },
				})
				rctx, cancel := context.WithTimeout(tctx, b.cfg.timeout+wait)
				woke := false
				for !woke && rctx.Err() == nil {
					r, err := b.c.get(rctx, key, false, idx, wait)
					if err != nil {
						if rctx.Err() == nil {
							b.el.add("watch", err)
						}
						break
					}
					if r.index > idx {
						idx = r.index
						if t0 := rd.t0.Load(); t0 != 0 {
							hists[w].Record(time.Since(time.Unix(0, t0)))
							woke = true
						}
					} else if r.index < idx {
						idx = r.index
					}
				}
				cancel()
				if !woke {
					missed.Add(1)
				}
				armed()
				rd.done.Done()
			}
		}(w)
	}

	b.pw.measureStart()
	t0 := time.Now()
	end := t0.Add(b.cfg.duration)
	var rounds int64
	for time.Now().Before(end) && ctx.Err() == nil && rounds*int64(k) < b.cfg.maxOps {
		rd := &wakeRound{}
		rd.armed.Add(k)
		rd.done.Add(k)
		for _, ch := range starts {
			ch <- rd
		}
		rd.armed.Wait()
		time.Sleep(settle)
		rd.t0.Store(time.Now().UnixNano())
		rounds++
		if err := b.c.put(ctx, key, []byte(strconv.FormatInt(rounds, 10))); err != nil {
			b.el.add("watched put", err)
		}
		rd.done.Wait()
	}
	elapsed := time.Since(t0)
	for _, ch := range starts {
		close(ch)
	}
	wg.Wait()
	lat := &Hist{}
	for i := range hists {
		lat.Merge(&hists[i])
	}
	r := b.result(k, int64(lat.Count()), lat, elapsed, "wakes", "wake")
	r.Int("rounds", rounds)
	r.Int("missed", missed.Load())
	return r, nil
}

// ---- sessions-keepalive: many TTL sessions, each renewed every TTL/2.

func (b *bench) sessionsKeepalive(ctx context.Context) (*Result, error) {
	k := &keeper{
		cfg:      b.cfg,
		el:       b.el,
		workers:  b.cfg.clients,
		interval: b.cfg.sessionTTL / 2,
		create: func(ctx context.Context, _ int) (string, error) {
			return b.c.createSession(ctx, b.cfg.sessionTTL)
		},
		renew: func(ctx context.Context, _ int, id string) (bool, error) {
			return b.c.renewSession(ctx, id)
		},
		destroy: func(ctx context.Context, _ int, id string) error {
			return b.c.destroySession(ctx, id)
		},
		onMeasure: b.pw.measureStart,
	}
	st, err := k.run(ctx)
	return keepaliveResult(b.cfg, st), err
}

// ---- ping: is the server up and serving writes and linearizable reads?

func (b *bench) ping(ctx context.Context) (*Result, error) {
	key := b.cfg.prefix + "/ping"
	b.pw.measureStart()
	t0 := time.Now()
	end := t0.Add(b.cfg.duration)
	var last error
	for tries := 0; time.Now().Before(end) && ctx.Err() == nil && tries < 100000; tries++ {
		s := time.Now()
		err := b.c.put(ctx, key, []byte("1"))
		if err == nil {
			_, err = b.c.get(ctx, key, true, 0, 0)
		}
		if err == nil {
			lat := &Hist{}
			lat.Record(time.Since(s))
			return b.result(1, 1, lat, time.Since(t0), "ops", "op"), nil
		}
		last = err
		sleepCtx(ctx, 100*time.Millisecond)
	}
	return b.result(1, 0, &Hist{}, time.Since(t0), "ops", "op"), fmt.Errorf("not ready: %v", last)
}
