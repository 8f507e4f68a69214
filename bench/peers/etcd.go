package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// etcd mapping of the workloads:
//   session          = lease (Grant / Revoke / LeaseKeepAlive)
//   lock             = concurrency.Mutex on a session (a lease kept alive)
//   put              = Put
//   get-consistent   = Get (linearizable, the default)
//   watch            = Watch
// Every benchmark client has its own client and so its own connection,
// like the HTTP clients of loadgen each have their own keep-alive one.

type etcdBench struct {
	cfg *config
	el  *errLog
	pw  *procWatch
	pfx string
	cli []*clientv3.Client
}

func newEtcdClient(ctx context.Context, addr string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:            []string{addr},
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    30 * time.Second,
		DialKeepAliveTimeout: 10 * time.Second,
		Logger:               zap.NewNop(),
		Context:              ctx,
	})
}

func runEtcd(ctx context.Context, cfg *config, el *errLog, pw *procWatch) (*Result, error) {
	b := &etcdBench{cfg: cfg, el: el, pw: pw, pfx: "/" + cfg.prefix + "/" + runID()}
	n := cfg.clients
	if cfg.workload == wWatchWake {
		n = cfg.watchers + 1
	}
	defer func() {
		for _, c := range b.cli {
			c.Close()
		}
	}()
	if cfg.workload == wPing {
		return b.ping(ctx)
	}
	for i := 0; i < n; i++ {
		c, err := newEtcdClient(ctx, cfg.addr)
		if err != nil {
			return nil, fmt.Errorf("connecting to etcd at %s: %w", cfg.addr, err)
		}
		b.cli = append(b.cli, c)
	}
	switch cfg.workload {
	case wSessionChurn:
		return b.sessionChurn(ctx)
	case wLockOwn:
		return b.locks(ctx, false)
	case wLockContend:
		return b.locks(ctx, true)
	case wPut:
		return b.put(ctx)
	case wGet:
		return b.get(ctx)
	case wWatchWake:
		return b.watchWake(ctx)
	case wKeepalive:
		return b.keepalive(ctx)
	}
	return nil, errors.New("unknown workload")
}

func (b *etcdBench) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.cfg.timeout)
}

func (b *etcdBench) sessionChurn(ctx context.Context) (*Result, error) {
	b.pw.measureStart()
	ops, lat, el := loop(ctx, b.cfg.clients, b.cfg.duration, b.cfg.maxOps, b.el, "lease churn",
		func(ctx context.Context, c int) error {
			rc, cancel := b.reqCtx(ctx)
			defer cancel()
			g, err := b.cli[c].Grant(rc, 10)
			if err != nil {
				return err
			}
			_, err = b.cli[c].Revoke(rc, g.ID)
			return err
		})
	return &Result{Clients: b.cfg.clients, Ops: ops, Lat: lat, Elapsed: el, Unit: "ops", LatName: "op"}, nil
}

// sessions makes one concurrency.Session (lease kept alive by the client)
// per benchmark client.
func (b *etcdBench) sessions(ctx context.Context) ([]*concurrency.Session, func(), error) {
	var ss []*concurrency.Session
	closeAll := func() {
		for _, s := range ss {
			s.Close() // revokes the lease, deleting its lock keys
		}
	}
	for _, c := range b.cli {
		s, err := concurrency.NewSession(c, concurrency.WithTTL(30))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("creating lock session: %w", err)
		}
		ss = append(ss, s)
	}
	return ss, closeAll, nil
}

func (b *etcdBench) locks(ctx context.Context, contend bool) (*Result, error) {
	ss, closeAll, err := b.sessions(ctx)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	n := b.cfg.clients
	mus := make([]*concurrency.Mutex, n)
	for c := range mus {
		key := fmt.Sprintf("%s/own/%d", b.pfx, c)
		if contend {
			key = b.pfx + "/contend"
		}
		mus[c] = concurrency.NewMutex(ss[c], key)
	}
	if !contend {
		b.pw.measureStart()
		ops, lat, el := loop(ctx, n, b.cfg.duration, b.cfg.maxOps, b.el, "lock cycle",
			func(ctx context.Context, c int) error {
				rc, cancel := b.reqCtx(ctx)
				defer cancel()
				if err := mus[c].Lock(rc); err != nil {
					return err
				}
				return mus[c].Unlock(rc)
			})
		return &Result{Clients: n, Ops: ops, Lat: lat, Elapsed: el, Unit: "cycles", LatName: "cycle"}, nil
	}
	return contendLoop(ctx, b.cfg, b.el, b.pw, func(ctx context.Context, c int) (func(context.Context) error, error) {
		if err := mus[c].Lock(ctx); err != nil {
			return nil, err
		}
		return mus[c].Unlock, nil
	})
}

func (b *etcdBench) put(ctx context.Context) (*Result, error) {
	rnds := newRands(b.cfg.clients)
	b.pw.measureStart()
	ops, lat, el := loop(ctx, b.cfg.clients, b.cfg.duration, b.cfg.maxOps, b.el, "put",
		func(ctx context.Context, c int) error {
			rc, cancel := b.reqCtx(ctx)
			defer cancel()
			key := b.pfx + "/put/" + strconv.Itoa(rnds[c].Intn(b.cfg.keys))
			_, err := b.cli[c].Put(rc, key, randValue(rnds[c], b.cfg.valueSize))
			return err
		})
	return &Result{Clients: b.cfg.clients, Ops: ops, Lat: lat, Elapsed: el, Unit: "ops", LatName: "op"}, nil
}

func (b *etcdBench) get(ctx context.Context) (*Result, error) {
	prefix := b.pfx + "/get/"
	rnd := rand.New(rand.NewSource(1))
	sctx, cancel := context.WithTimeout(ctx, b.cfg.setupTimeout)
	for i := 0; i < b.cfg.keys; i++ {
		if _, err := b.cli[0].Put(sctx, prefix+strconv.Itoa(i), randValue(rnd, b.cfg.valueSize)); err != nil {
			cancel()
			return nil, fmt.Errorf("writing keys: %w", err)
		}
	}
	cancel()
	rnds := newRands(b.cfg.clients)
	b.pw.measureStart()
	ops, lat, el := loop(ctx, b.cfg.clients, b.cfg.duration, b.cfg.maxOps, b.el, "get",
		func(ctx context.Context, c int) error {
			rc, cancel := b.reqCtx(ctx)
			defer cancel()
			key := prefix + strconv.Itoa(rnds[c].Intn(b.cfg.keys))
			r, err := b.cli[c].Get(rc, key)
			if err == nil && len(r.Kvs) != 1 {
				err = fmt.Errorf("get %s: written key not found", key)
			}
			return err
		})
	return &Result{Clients: b.cfg.clients, Ops: ops, Lat: lat, Elapsed: el, Unit: "ops", LatName: "op"}, nil
}

func (b *etcdBench) watchWake(ctx context.Context) (*Result, error) {
	k := b.cfg.watchers
	key := b.pfx + "/watch"
	writer := b.cli[k]
	if _, err := writer.Put(ctx, key, "0"); err != nil {
		return nil, fmt.Errorf("writing the watched key: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cur atomic.Pointer[wakeRound]
	hists := make([]Hist, k)
	var wg sync.WaitGroup
	for w := 0; w < k; w++ {
		wch := b.cli[w].Watch(wctx, key, clientv3.WithCreatedNotify())
		select {
		case resp, ok := <-wch:
			if !ok || !resp.Created {
				return nil, fmt.Errorf("watch %d was not created: %v", w, resp.Err())
			}
		case <-time.After(b.cfg.timeout):
			return nil, fmt.Errorf("watch %d was not created in %s", w, b.cfg.timeout)
		}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for resp := range wch {
				if err := resp.Err(); err != nil && wctx.Err() == nil {
					b.el.add("watch", err)
				}
				for _, ev := range resp.Events {
					rd := cur.Load()
					if rd == nil || string(ev.Kv.Value) != strconv.FormatInt(rd.n, 10) {
						continue
					}
					hists[w].Record(time.Since(rd.t0))
					rd.seen()
				}
			}
		}(w)
	}
	rounds, missed, elapsed := wakeLoop(ctx, b.cfg, b.el, b.pw, k, &cur, func(ctx context.Context, n int64) error {
		rc, c := b.reqCtx(ctx)
		defer c()
		_, err := writer.Put(rc, key, strconv.FormatInt(n, 10))
		return err
	})
	cancel()
	wg.Wait()
	lat := &Hist{}
	for i := range hists {
		lat.Merge(&hists[i])
	}
	r := &Result{Clients: k, Ops: int64(lat.Count()), Lat: lat, Elapsed: elapsed, Unit: "wakes", LatName: "wake"}
	r.Int("rounds", rounds)
	r.Int("missed", missed)
	return r, nil
}

// keepalive grants -sessions leases and renews each every TTL/2 over one
// LeaseKeepAlive stream per worker, as etcd's own client does (it renews
// at TTL/3; TTL/2 is used here to match loadgen).
func (b *etcdBench) keepalive(ctx context.Context) (*Result, error) {
	type stream struct {
		s      pb.Lease_LeaseKeepAliveClient
		cancel context.CancelFunc
	}
	streams := make([]stream, b.cfg.clients)
	ttl := int64(b.cfg.sessionTTL / time.Second)
	defer func() {
		for _, s := range streams {
			if s.cancel != nil {
				s.cancel()
			}
		}
	}()
	k := &keeper{
		cfg:      b.cfg,
		el:       b.el,
		workers:  b.cfg.clients,
		interval: b.cfg.sessionTTL / 2,
		create: func(ctx context.Context, w int) (string, error) {
			g, err := b.cli[w].Grant(ctx, ttl)
			if err != nil {
				return "", err
			}
			return strconv.FormatInt(int64(g.ID), 10), nil
		},
		renew: func(rctx context.Context, w int, id string) (bool, error) {
			lid, _ := strconv.ParseInt(id, 10, 64)
			st := &streams[w]
			if st.s == nil {
				sctx, cancel := context.WithCancel(ctx)
				s, err := pb.NewLeaseClient(b.cli[w].ActiveConnection()).LeaseKeepAlive(sctx)
				if err != nil {
					cancel()
					return false, err
				}
				st.s, st.cancel = s, cancel
			}
			// A renewal that takes too long breaks the stream; the next one opens another.
			stopAfter := context.AfterFunc(rctx, st.cancel)
			err := st.s.Send(&pb.LeaseKeepAliveRequest{ID: lid})
			var resp *pb.LeaseKeepAliveResponse
			if err == nil {
				resp, err = st.s.Recv()
			}
			if !stopAfter() || err != nil {
				st.cancel()
				st.s = nil
				if err == nil {
					err = rctx.Err()
				}
				return false, err
			}
			return resp.TTL > 0, nil
		},
		destroy: func(ctx context.Context, w int, id string) error {
			lid, _ := strconv.ParseInt(id, 10, 64)
			_, err := b.cli[w].Revoke(ctx, clientv3.LeaseID(lid))
			return err
		},
		onMeasure: b.pw.measureStart,
	}
	st, err := k.run(ctx)
	return keepaliveResult(b.cfg, st), err
}

// ping retries connecting, writing and reading until one round succeeds
// or -duration passes.
func (b *etcdBench) ping(ctx context.Context) (*Result, error) {
	b.pw.measureStart()
	t0 := time.Now()
	end := t0.Add(b.cfg.duration)
	key := "/" + b.cfg.prefix + "/ping"
	var last error
	for tries := 0; time.Now().Before(end) && ctx.Err() == nil && tries < 10000; tries++ {
		// The client's root context bounds its dial by the time left.
		pctx, pcancel := context.WithDeadline(ctx, end)
		cli, err := newEtcdClient(pctx, b.cfg.addr)
		if err == nil {
			rc, cancel := b.reqCtx(pctx)
			_, err = cli.Put(rc, key, "1")
			if err == nil {
				_, err = cli.Get(rc, key)
			}
			cancel()
			cli.Close()
		}
		pcancel()
		if err == nil {
			return pingResult(1, time.Since(t0)), nil
		}
		last = err
		sleepCtx(ctx, 100*time.Millisecond)
	}
	return pingResult(0, time.Since(t0)), fmt.Errorf("not ready: %v", last)
}
