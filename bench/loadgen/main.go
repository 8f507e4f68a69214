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
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/bench/loadkit"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg loadkit.Config
	cfg.Register(fs, 100_000)
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:8500", "server HTTP address (host:port or URL)")
	fs.StringVar(&cfg.Target, "name", "holdfast", "target name printed in the result")
	fs.StringVar(&lockClient, "lock-client", "consul", "lock-contend: consul (every waiter races an acquire on each release, as Consul's Go client does) or recipe (holdfast's fair queue, api/recipe.Lock)")
	fs.StringVar(&transport, "transport", "holdfast", "client transport: holdfast (api.Transport, what holdfast's Go client uses) or stdlib (net/http's Transport, what Consul's Go client uses)")
	cpuProfile := fs.String("cpuprofile", "", "write the load generator's own CPU profile to this file (for go tool pprof)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "loadgen:", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "loadgen:", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	if lockClient != "consul" && lockClient != "recipe" {
		fmt.Fprintln(stderr, "loadgen: -lock-client must be consul or recipe")
		return 2
	}
	if transport != "holdfast" && transport != "stdlib" {
		fmt.Fprintln(stderr, "loadgen: -transport must be holdfast or stdlib")
		return 2
	}
	if err := cfg.Check(); err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return 2
	}
	return loadkit.Run("loadgen", &cfg, stdout, stderr,
		func(ctx context.Context, el *loadkit.ErrLog, pw *loadkit.ProcWatch) (*loadkit.Result, error) {
			return runWorkload(ctx, &cfg, el, pw)
		})
}

// lockClient selects how lock-contend contends (-lock-client).
var lockClient = "consul"

// transport selects the client transport (-transport).
var transport = "holdfast"

// bench carries what every workload needs.
type bench struct {
	cfg *loadkit.Config
	c   *consul
	el  *loadkit.ErrLog
	pw  *loadkit.ProcWatch
	pfx string // unique key prefix of this run, no trailing slash
}

func runWorkload(ctx context.Context, cfg *loadkit.Config, el *loadkit.ErrLog, pw *loadkit.ProcWatch) (*loadkit.Result, error) {
	conns := cfg.Clients
	if cfg.Workload == loadkit.WorkloadWatchWake {
		conns = cfg.Watchers + 1
	}
	b := &bench{
		cfg: cfg,
		c:   newConsul(cfg.Addr, conns, cfg.Timeout),
		el:  el,
		pw:  pw,
		pfx: cfg.Prefix + "/" + loadkit.RunID(),
	}
	defer b.c.close()
	switch cfg.Workload {
	case loadkit.WorkloadSessionChurn:
		return b.sessionChurn(ctx)
	case loadkit.WorkloadLockOwn:
		return b.lockOwn(ctx)
	case loadkit.WorkloadLockContend:
		if lockClient == "recipe" {
			return b.lockContendRecipe(ctx)
		}
		return b.lockContend(ctx)
	case loadkit.WorkloadPut:
		return b.put(ctx)
	case loadkit.WorkloadGetConsistent:
		return b.getConsistent(ctx)
	case loadkit.WorkloadWatchWake:
		return b.watchWake(ctx)
	case loadkit.WorkloadSessionsKeepalive:
		return b.sessionsKeepalive(ctx)
	case loadkit.WorkloadPing:
		return b.ping(ctx)
	}
	return nil, fmt.Errorf("unknown workload %q", cfg.Workload)
}

func (b *bench) result(clients int, ops int64, lat *loadkit.Hist, elapsed time.Duration, unit, latName string) *loadkit.Result {
	return &loadkit.Result{Clients: clients, Ops: ops, Lat: lat, Elapsed: elapsed, Unit: unit, LatName: latName}
}

// ---- session-churn: create + destroy one session per op.

func (b *bench) sessionChurn(ctx context.Context) (*loadkit.Result, error) {
	b.pw.MeasureStart()
	ops, lat, el := loadkit.Loop(ctx, b.cfg.Clients, b.cfg.Duration, b.cfg.MaxOps, b.el, "session churn",
		func(ctx context.Context, _ int) error {
			id, err := b.c.createSession(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return b.c.destroySession(ctx, id)
		})
	return b.result(b.cfg.Clients, ops, lat, el, "ops", "op"), nil
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
						b.el.Add("renew lock session", err)
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
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.SetupTimeout)
	defer cancel()
	for _, id := range ids {
		if err := b.c.destroySession(ctx, id); err != nil {
			b.el.Add("destroy session", err)
		}
	}
}

// ---- lock-own: acquire + release on a key of one's own.

func (b *bench) lockOwn(ctx context.Context) (*loadkit.Result, error) {
	hs, err := b.holdSessions(ctx, b.cfg.Clients)
	if err != nil {
		return nil, err
	}
	defer hs.stop()
	b.pw.MeasureStart()
	ops, lat, el := loadkit.Loop(ctx, b.cfg.Clients, b.cfg.Duration, b.cfg.MaxOps, b.el, "lock cycle",
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
	return b.result(b.cfg.Clients, ops, lat, el, "cycles", "cycle"), nil
}

// ---- lock-contend: every client wants one key.

func (b *bench) lockContend(ctx context.Context) (*loadkit.Result, error) {
	n := b.cfg.Clients
	hs, err := b.holdSessions(ctx, n)
	if err != nil {
		return nil, err
	}
	defer hs.stop()
	key := b.pfx + "/contend"
	const wait = 5 * time.Second
	ho := loadkit.NewHandoffs()
	var failedAcq, budget atomic.Int64
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
			sid := hs.ids[c]
			for rctx.Err() == nil && budget.Add(-1) >= 0 {
				ok, err := b.c.acquire(rctx, key, sid)
				if err != nil {
					if rctx.Err() == nil {
						b.el.Add("acquire", err)
						loadkit.SleepCtx(rctx, loadkit.ErrBackoff)
					}
					continue
				}
				if ok {
					g := ho.Acquired(c, time.Now())
					ok, err := b.c.release(rctx, key, sid)
					at := time.Now()
					switch {
					case err != nil:
						if rctx.Err() == nil {
							b.el.Add("release", err)
						}
					case !ok:
						b.el.Add("release", errors.New("release of a held lock answered false"))
					default:
						ho.Released(c, g, at)
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
							b.el.Add("blocking get", err)
							loadkit.SleepCtx(rctx, loadkit.ErrBackoff)
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
	if elapsed > b.cfg.Duration {
		elapsed = b.cfg.Duration
	}
	return ho.Result(n, elapsed, failedAcq.Load()), nil
}

// ---- put: PUT to random keys.

func (b *bench) value(rnd *rand.Rand) []byte { return loadkit.RandValue(rnd, b.cfg.ValueSize) }

func (b *bench) put(ctx context.Context) (*loadkit.Result, error) {
	rnds := loadkit.NewRands(b.cfg.Clients)
	b.pw.MeasureStart()
	ops, lat, el := loadkit.LoopRate(ctx, b.cfg.Clients, b.cfg.Duration, b.cfg.MaxOps, b.cfg.Rate, b.el, "put",
		func(ctx context.Context, c int) error {
			rnd := rnds[c]
			key := b.pfx + "/put/" + strconv.Itoa(rnd.Intn(b.cfg.Keys))
			return b.c.put(ctx, key, b.value(rnd))
		})
	return b.result(b.cfg.Clients, ops, lat, el, "ops", "op"), nil
}

// ---- get-consistent: linearizable reads of keys written beforehand.

// writeKeys writes keys prefix/0..n-1 with bounded concurrency.
func (b *bench) writeKeys(ctx context.Context, prefix string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.SetupTimeout)
	defer cancel()
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < b.cfg.Clients; w++ {
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

func (b *bench) getConsistent(ctx context.Context) (*loadkit.Result, error) {
	prefix := b.pfx + "/get/"
	if err := b.writeKeys(ctx, prefix, b.cfg.Keys); err != nil {
		return nil, err
	}
	rnds := loadkit.NewRands(b.cfg.Clients)
	b.pw.MeasureStart()
	ops, lat, el := loadkit.LoopRate(ctx, b.cfg.Clients, b.cfg.Duration, b.cfg.MaxOps, b.cfg.Rate, b.el, "get",
		func(ctx context.Context, c int) error {
			key := prefix + strconv.Itoa(rnds[c].Intn(b.cfg.Keys))
			e, err := b.c.get(ctx, key, true, 0, 0)
			if err == nil && !e.found {
				err = fmt.Errorf("GET %s: written key not found", key)
			}
			return err
		})
	return b.result(b.cfg.Clients, ops, lat, el, "ops", "op"), nil
}

// ---- watch-wake: K blocking queries on one key, one PUT, time to each wake.

type wakeRound struct {
	t0    atomic.Int64 // UnixNano when the PUT was about to be sent; 0 before
	armed sync.WaitGroup
	done  sync.WaitGroup
}

func (b *bench) watchWake(ctx context.Context) (*loadkit.Result, error) {
	k := b.cfg.Watchers
	key := b.pfx + "/watch"
	if err := b.c.put(ctx, key, []byte("0")); err != nil {
		return nil, fmt.Errorf("writing the watched key: %w", err)
	}
	e, err := b.c.get(ctx, key, false, 0, 0)
	if err != nil {
		return nil, err
	}
	const wait = 10 * time.Second
	hists := make([]loadkit.Hist, k)
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
				rctx, cancel := context.WithTimeout(tctx, b.cfg.Timeout+wait)
				woke := false
				for !woke && rctx.Err() == nil {
					r, err := b.c.get(rctx, key, false, idx, wait)
					if err != nil {
						if rctx.Err() == nil {
							b.el.Add("watch", err)
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

	b.pw.MeasureStart()
	t0 := time.Now()
	end := t0.Add(b.cfg.Duration)
	var rounds int64
	for time.Now().Before(end) && ctx.Err() == nil && rounds*int64(k) < b.cfg.MaxOps {
		rd := &wakeRound{}
		rd.armed.Add(k)
		rd.done.Add(k)
		for _, ch := range starts {
			ch <- rd
		}
		rd.armed.Wait()
		time.Sleep(loadkit.WakePause) // lets the server park the queries it has read
		rd.t0.Store(time.Now().UnixNano())
		rounds++
		if err := b.c.put(ctx, key, []byte(strconv.FormatInt(rounds, 10))); err != nil {
			b.el.Add("watched put", err)
		}
		rd.done.Wait()
	}
	elapsed := time.Since(t0)
	for _, ch := range starts {
		close(ch)
	}
	wg.Wait()
	return loadkit.WakeResult(k, hists, rounds, missed.Load(), elapsed), nil
}

// ---- sessions-keepalive: many TTL sessions, each renewed every TTL/2.

func (b *bench) sessionsKeepalive(ctx context.Context) (*loadkit.Result, error) {
	k := &loadkit.Keeper{
		Cfg: b.cfg,
		El:  b.el,
		Create: func(ctx context.Context, _ int) (string, error) {
			return b.c.createSession(ctx, b.cfg.SessionTTL)
		},
		Renew: func(ctx context.Context, _ int, id string) (bool, error) {
			return b.c.renewSession(ctx, id)
		},
		Destroy: func(ctx context.Context, _ int, id string) error {
			return b.c.destroySession(ctx, id)
		},
		OnMeasure: b.pw.MeasureStart,
	}
	st, err := k.Run(ctx)
	return loadkit.KeepaliveResult(b.cfg, st), err
}

// ---- ping: is the server up and serving writes and linearizable reads?

func (b *bench) ping(ctx context.Context) (*loadkit.Result, error) {
	key := b.cfg.Prefix + "/ping"
	b.pw.MeasureStart()
	t0 := time.Now()
	end := t0.Add(b.cfg.Duration)
	var last error
	for tries := 0; time.Now().Before(end) && ctx.Err() == nil && tries < 100000; tries++ {
		s := time.Now()
		err := b.c.put(ctx, key, []byte("1"))
		if err == nil {
			_, err = b.c.get(ctx, key, true, 0, 0)
		}
		if err == nil {
			lat := &loadkit.Hist{}
			lat.Record(time.Since(s))
			return b.result(1, 1, lat, time.Since(t0), "ops", "op"), nil
		}
		last = err
		loadkit.SleepCtx(ctx, 100*time.Millisecond)
	}
	return b.result(1, 0, &loadkit.Hist{}, time.Since(t0), "ops", "op"), fmt.Errorf("not ready: %v", last)
}
