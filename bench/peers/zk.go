package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/holdfast/holdfast/bench/loadkit"
)

// ZooKeeper mapping of the workloads:
//   session          = connection (a ZooKeeper session lives as long as its
//                      connection; the client library pings to keep it)
//   lock             = zk.Lock (ephemeral sequential node, watch on the
//                      predecessor): a fair queue, like etcd's Mutex
//   put              = Set on existing nodes
//   get-consistent   = Sync + Get (a plain Get may be stale)
//   watch            = GetW (one-shot: re-armed every round)
// Every benchmark client has its own connection.

type zkBench struct {
	common
	conns []*zk.Conn
}

var zkACL = zk.WorldACL(zk.PermAll)

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

// zkConnect opens a session and waits until the server has granted it.
func zkConnect(ctx context.Context, addr string, sessionTimeout, wait time.Duration) (*zk.Conn, error) {
	conn, events, err := zk.Connect([]string{addr}, sessionTimeout, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}))
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				return conn, nil
			}
			if ev.State == zk.StateAuthFailed || ev.State == zk.StateExpired {
				conn.Close()
				return nil, fmt.Errorf("zk session: %v", ev.State)
			}
		case <-t.C:
			conn.Close()
			return nil, fmt.Errorf("no zk session from %s within %s", addr, wait)
		case <-ctx.Done():
			conn.Close()
			return nil, fmt.Errorf("no zk session from %s: %w", addr, ctx.Err())
		}
	}
}

// ensurePath creates path and its parents as plain nodes.
func ensurePath(c *zk.Conn, path string) error {
	p := ""
	for _, part := range strings.Split(strings.Trim(path, "/"), "/") {
		p += "/" + part
		if _, err := c.Create(p, nil, 0, zkACL); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", p, err)
		}
	}
	return nil
}

func runZK(ctx context.Context, cfg *loadkit.Config, el *loadkit.ErrLog, pw *loadkit.ProcWatch) (*loadkit.Result, error) {
	b := &zkBench{common: newCommon(cfg, el, pw)}
	if cfg.Workload == loadkit.WorkloadPing {
		return b.ping(ctx)
	}
	n := cfg.Clients
	switch cfg.Workload {
	case loadkit.WorkloadWatchWake:
		n = cfg.Watchers + 1
	case loadkit.WorkloadSessionsKeepalive:
		n = 1
	}
	defer func() {
		for _, c := range b.conns {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := zkConnect(ctx, cfg.Addr, 10*time.Second, cfg.Timeout)
		if err != nil {
			return nil, fmt.Errorf("connecting to ZooKeeper at %s: %w", cfg.Addr, err)
		}
		b.conns = append(b.conns, c)
	}
	if err := ensurePath(b.conns[0], b.pfx); err != nil {
		return nil, err
	}
	defer b.cleanup()
	switch cfg.Workload {
	case loadkit.WorkloadSessionChurn:
		return b.sessionChurn(ctx)
	case loadkit.WorkloadLockOwn:
		return b.lockOwn(ctx)
	case loadkit.WorkloadLockContend:
		return b.lockContend(ctx)
	case loadkit.WorkloadPut:
		return b.put(ctx)
	case loadkit.WorkloadGetConsistent:
		return b.get(ctx)
	case loadkit.WorkloadWatchWake:
		return b.watchWake(ctx)
	case loadkit.WorkloadSessionsKeepalive:
		return b.keepalive(ctx)
	}
	return nil, errors.New("unknown workload")
}

// cleanup deletes the run's nodes (bounded in count and time) so that
// repeated runs do not grow the tree.
func (b *zkBench) cleanup() {
	c := b.conns[0]
	deadline := time.Now().Add(b.cfg.SetupTimeout)
	var del func(p string, depth int) error
	del = func(p string, depth int) error {
		if time.Now().After(deadline) || depth > 8 {
			return errors.New("cleanup cut short")
		}
		kids, _, err := c.Children(p)
		if err != nil {
			if errors.Is(err, zk.ErrNoNode) {
				return nil
			}
			return err
		}
		for _, k := range kids {
			if err := del(p+"/"+k, depth+1); err != nil {
				return err
			}
		}
		if err := c.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		return nil
	}
	if err := del(b.pfx, 0); err != nil {
		b.el.Add("cleanup", err)
	}
}

func (b *zkBench) sessionChurn(ctx context.Context) (*loadkit.Result, error) {
	b.pw.MeasureStart()
	ops, lat, el := loadkit.Loop(ctx, b.cfg.Clients, b.cfg.Duration, b.cfg.MaxOps, b.el, "session churn",
		func(ctx context.Context, _ int) error {
			c, err := zkConnect(ctx, b.cfg.Addr, 10*time.Second, b.cfg.Timeout)
			if err != nil {
				return err
			}
			c.Close() // sends closeSession and waits for the answer
			return nil
		})
	return &loadkit.Result{Clients: b.cfg.Clients, Ops: ops, Lat: lat, Elapsed: el, Unit: "ops", LatName: "op"}, nil
}

func (b *zkBench) lockOwn(ctx context.Context) (*loadkit.Result, error) {
	n := b.cfg.Clients
	locks := make([]*zk.Lock, n)
	for c := range locks {
		locks[c] = zk.NewLock(b.conns[c], fmt.Sprintf("%s/own/%d", b.pfx, c), zkACL)
	}
	b.pw.MeasureStart()
	ops, lat, el := loadkit.Loop(ctx, n, b.cfg.Duration, b.cfg.MaxOps, b.el, "lock cycle",
		func(ctx context.Context, c int) error {
			if err := locks[c].Lock(); err != nil {
				return err
			}
			return locks[c].Unlock()
		})
	return &loadkit.Result{Clients: n, Ops: ops, Lat: lat, Elapsed: el, Unit: "cycles", LatName: "cycle"}, nil
}

func (b *zkBench) lockContend(ctx context.Context) (*loadkit.Result, error) {
	n := b.cfg.Clients
	locks := make([]*zk.Lock, n)
	for c := range locks {
		locks[c] = zk.NewLock(b.conns[c], b.pfx+"/contend", zkACL)
	}
	// zk.Lock has no context; a waiter still queued when the run ends is
	// served once the holders before it have released, which they do.
	return b.contendLoop(ctx, func(ctx context.Context, c int) (func(context.Context) error, error) {
		if err := locks[c].Lock(); err != nil {
			return nil, err
		}
		return func(context.Context) error { return locks[c].Unlock() }, nil
	})
}

// makeNodes creates prefix0..prefix(n-1) with values, with bounded concurrency.
func (b *zkBench) makeNodes(ctx context.Context, prefix string, n int) error {
	rnd := loadkit.NewRands(1)[0]
	ctx, cancel := context.WithTimeout(ctx, b.cfg.SetupTimeout)
	defer cancel()
	var next atomic.Int64
	errs := make(chan error, len(b.conns))
	var wg sync.WaitGroup
	for w := range b.conns {
		wg.Add(1)
		go func(c *zk.Conn, val []byte) {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				_, err := c.Create(prefix+strconv.FormatInt(i, 10), val, 0, zkACL)
				if err != nil && !errors.Is(err, zk.ErrNodeExists) {
					errs <- err
					cancel()
					return
				}
			}
		}(b.conns[w], loadkit.RandValue(rnd, b.cfg.ValueSize))
	}
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("creating nodes: %w", err)
	default:
	}
	return ctx.Err()
}

func (b *zkBench) put(ctx context.Context) (*loadkit.Result, error) {
	prefix := b.pfx + "/put-"
	if err := b.makeNodes(ctx, prefix, b.cfg.Keys); err != nil {
		return nil, err
	}
	return b.keyLoop(ctx, "set", prefix, func(_ context.Context, c int, rnd *rand.Rand, path string) error {
		_, err := b.conns[c].Set(path, loadkit.RandValue(rnd, b.cfg.ValueSize), -1)
		return err
	}), nil
}

func (b *zkBench) get(ctx context.Context) (*loadkit.Result, error) {
	prefix := b.pfx + "/get-"
	if err := b.makeNodes(ctx, prefix, b.cfg.Keys); err != nil {
		return nil, err
	}
	return b.keyLoop(ctx, "sync+get", prefix, func(_ context.Context, c int, _ *rand.Rand, path string) error {
		if _, err := b.conns[c].Sync(path); err != nil {
			return err
		}
		_, _, err := b.conns[c].Get(path)
		return err
	}), nil
}

func (b *zkBench) watchWake(ctx context.Context) (*loadkit.Result, error) {
	k := b.cfg.Watchers
	path := b.pfx + "/watch"
	writer := b.conns[k]
	if _, err := writer.Create(path, []byte("0"), 0, zkACL); err != nil {
		return nil, fmt.Errorf("creating the watched node: %w", err)
	}
	hists := make([]loadkit.Hist, k)
	var missed atomic.Int64
	b.pw.MeasureStart()
	t0 := time.Now()
	end := t0.Add(b.cfg.Duration)
	var rounds int64
	for time.Now().Before(end) && ctx.Err() == nil && rounds*int64(k) < b.cfg.MaxOps {
		// Arm every watcher: a watch is set once GetW has been answered.
		chans := make([]<-chan zk.Event, k)
		var wg sync.WaitGroup
		for w := 0; w < k; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				_, _, ch, err := b.conns[w].GetW(path)
				if err != nil {
					b.el.Add("getw", err)
					return
				}
				chans[w] = ch
			}(w)
		}
		wg.Wait()
		time.Sleep(loadkit.WakePause) // the same pause as every target's round
		rounds++
		start := time.Now()
		if _, err := writer.Set(path, []byte(strconv.FormatInt(rounds, 10)), -1); err != nil {
			b.el.Add("watched set", err)
		}
		for w := 0; w < k; w++ {
			if chans[w] == nil {
				missed.Add(1)
				continue
			}
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				t := time.NewTimer(b.cfg.Timeout)
				defer t.Stop()
				select {
				case ev := <-chans[w]:
					if ev.Type == zk.EventNodeDataChanged {
						hists[w].Record(time.Since(start))
						return
					}
					b.el.Add("watch", fmt.Errorf("unexpected event %v %v", ev.Type, ev.Err))
				case <-t.C:
				}
				missed.Add(1)
			}(w)
		}
		wg.Wait()
	}
	return loadkit.WakeResult(k, hists, rounds, missed.Load(), time.Since(t0)), nil
}

// keepalive opens -sessions connections; the client library keeps each
// session alive by pinging every third of the session timeout, so there is
// nothing to renew by hand and renewals are reported as 0. The server's
// maxSessionTimeout (default 20 ticks = 40 s) caps -session-ttl.
func (b *zkBench) keepalive(ctx context.Context) (*loadkit.Result, error) {
	var mu sync.Mutex
	conns := map[string]*zk.Conn{}
	var next atomic.Int64
	k := &loadkit.Keeper{
		Cfg: b.cfg,
		El:  b.el,
		Create: func(ctx context.Context, _ int) (string, error) {
			c, err := zkConnect(ctx, b.cfg.Addr, b.cfg.SessionTTL, b.cfg.Timeout)
			if err != nil {
				return "", err
			}
			id := strconv.FormatInt(next.Add(1), 10)
			mu.Lock()
			conns[id] = c
			mu.Unlock()
			return id, nil
		},
		Destroy: func(ctx context.Context, _ int, id string) error {
			mu.Lock()
			c := conns[id]
			delete(conns, id)
			mu.Unlock()
			if c != nil {
				c.Close()
			}
			return nil
		},
		OnMeasure: b.pw.MeasureStart,
	}
	st, err := k.Run(ctx)
	r := loadkit.KeepaliveResult(b.cfg, st)
	// Sessions kept, not renewals made, are what a ZooKeeper run achieves.
	r.Ops = st.Created
	r.Unit = "sessions"
	return r, err
}

// ping connects, writes and reads (Sync + Get), each time on a new
// connection, until it succeeds or -duration passes.
func (b *zkBench) ping(ctx context.Context) (*loadkit.Result, error) {
	path := "/" + b.cfg.Prefix + "/ping"
	return b.pingLoop(ctx, func(ctx context.Context) error {
		c, err := zkConnect(ctx, b.cfg.Addr, 10*time.Second, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := ensurePath(c, path); err != nil {
			return err
		}
		if _, err := c.Set(path, []byte("1"), -1); err != nil {
			return err
		}
		if _, err := c.Sync(path); err != nil {
			return err
		}
		_, _, err = c.Get(path)
		return err
	})
}
