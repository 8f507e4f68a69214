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

	"github.com/holdfast/holdfast/bench/loadkit"
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
	common
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

func runEtcd(ctx context.Context, cfg *loadkit.Config, el *loadkit.ErrLog, pw *loadkit.ProcWatch) (*loadkit.Result, error) {
	b := &etcdBench{common: newCommon(cfg, el, pw)}
	n := cfg.Clients
	if cfg.Workload == loadkit.WorkloadWatchWake {
		n = cfg.Watchers + 1
	}
	defer func() {
		for _, c := range b.cli {
			c.Close()
		}
	}()
	if cfg.Workload == loadkit.WorkloadPing {
		return b.ping(ctx)
	}
	for i := 0; i < n; i++ {
		c, err := newEtcdClient(ctx, cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("connecting to etcd at %s: %w", cfg.Addr, err)
		}
		b.cli = append(b.cli, c)
	}
	switch cfg.Workload {
	case loadkit.WorkloadSessionChurn:
		return b.sessionChurn(ctx)
	case loadkit.WorkloadLockOwn:
		return b.locks(ctx, false)
	case loadkit.WorkloadLockContend:
		return b.locks(ctx, true)
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

func (b *etcdBench) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.cfg.Timeout)
}

func (b *etcdBench) sessionChurn(ctx context.Context) (*loadkit.Result, error) {
	b.pw.MeasureStart()
	ops, lat, el := loadkit.Loop(ctx, b.cfg.Clients, b.cfg.Duration, b.cfg.MaxOps, b.el, "lease churn",
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
	return &loadkit.Result{Clients: b.cfg.Clients, Ops: ops, Lat: lat, Elapsed: el, Unit: "ops", LatName: "op"}, nil
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

func (b *etcdBench) locks(ctx context.Context, contend bool) (*loadkit.Result, error) {
	ss, closeAll, err := b.sessions(ctx)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	n := b.cfg.Clients
	mus := make([]*concurrency.Mutex, n)
	for c := range mus {
		key := fmt.Sprintf("%s/own/%d", b.pfx, c)
		if contend {
			key = b.pfx + "/contend"
		}
		mus[c] = concurrency.NewMutex(ss[c], key)
	}
	if !contend {
		b.pw.MeasureStart()
		ops, lat, el := loadkit.Loop(ctx, n, b.cfg.Duration, b.cfg.MaxOps, b.el, "lock cycle",
			func(ctx context.Context, c int) error {
				rc, cancel := b.reqCtx(ctx)
				defer cancel()
				if err := mus[c].Lock(rc); err != nil {
					return err
				}
				return mus[c].Unlock(rc)
			})
		return &loadkit.Result{Clients: n, Ops: ops, Lat: lat, Elapsed: el, Unit: "cycles", LatName: "cycle"}, nil
	}
	return b.contendLoop(ctx, func(ctx context.Context, c int) (func(context.Context) error, error) {
		if err := mus[c].Lock(ctx); err != nil {
			return nil, err
		}
		return mus[c].Unlock, nil
	})
}

func (b *etcdBench) put(ctx context.Context) (*loadkit.Result, error) {
	return b.keyLoop(ctx, "put", b.pfx+"/put/", func(ctx context.Context, c int, rnd *rand.Rand, key string) error {
		rc, cancel := b.reqCtx(ctx)
		defer cancel()
		_, err := b.cli[c].Put(rc, key, string(loadkit.RandValue(rnd, b.cfg.ValueSize)))
		return err
	}), nil
}

func (b *etcdBench) get(ctx context.Context) (*loadkit.Result, error) {
	prefix := b.pfx + "/get/"
	rnd := rand.New(rand.NewSource(1))
	sctx, cancel := context.WithTimeout(ctx, b.cfg.SetupTimeout)
	for i := 0; i < b.cfg.Keys; i++ {
		if _, err := b.cli[0].Put(sctx, prefix+strconv.Itoa(i), string(loadkit.RandValue(rnd, b.cfg.ValueSize))); err != nil {
			cancel()
			return nil, fmt.Errorf("writing keys: %w", err)
		}
	}
	cancel()
	return b.keyLoop(ctx, "get", prefix, func(ctx context.Context, c int, _ *rand.Rand, key string) error {
		rc, cancel := b.reqCtx(ctx)
		defer cancel()
		r, err := b.cli[c].Get(rc, key)
		if err == nil && len(r.Kvs) != 1 {
			err = fmt.Errorf("get %s: written key not found", key)
		}
		return err
	}), nil
}

func (b *etcdBench) watchWake(ctx context.Context) (*loadkit.Result, error) {
	k := b.cfg.Watchers
	key := b.pfx + "/watch"
	writer := b.cli[k]
	if _, err := writer.Put(ctx, key, "0"); err != nil {
		return nil, fmt.Errorf("writing the watched key: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cur atomic.Pointer[wakeRound]
	hists := make([]loadkit.Hist, k)
	var wg sync.WaitGroup
	for w := 0; w < k; w++ {
		wch := b.cli[w].Watch(wctx, key, clientv3.WithCreatedNotify())
		select {
		case resp, ok := <-wch:
			if !ok || !resp.Created {
				return nil, fmt.Errorf("watch %d was not created: %v", w, resp.Err())
			}
		case <-time.After(b.cfg.Timeout):
			return nil, fmt.Errorf("watch %d was not created in %s", w, b.cfg.Timeout)
		}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for resp := range wch {
				if err := resp.Err(); err != nil && wctx.Err() == nil {
					b.el.Add("watch", err)
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
	rounds, missed, elapsed := b.wakeLoop(ctx, k, &cur, func(ctx context.Context, n int64) error {
		rc, c := b.reqCtx(ctx)
		defer c()
		_, err := writer.Put(rc, key, strconv.FormatInt(n, 10))
		return err
	})
	cancel()
	wg.Wait()
	return loadkit.WakeResult(k, hists, rounds, missed, elapsed), nil
}

// keepalive grants -sessions leases and renews each every TTL/2 over one
// LeaseKeepAlive stream per worker, as etcd's own client does (it renews
// at TTL/3; TTL/2 is used here to match loadgen).
func (b *etcdBench) keepalive(ctx context.Context) (*loadkit.Result, error) {
	type stream struct {
		s      pb.Lease_LeaseKeepAliveClient
		cancel context.CancelFunc
	}
	streams := make([]stream, b.cfg.Clients)
	ttl := int64(b.cfg.SessionTTL / time.Second)
	defer func() {
		for _, s := range streams {
			if s.cancel != nil {
				s.cancel()
			}
		}
	}()
	k := &loadkit.Keeper{
		Cfg: b.cfg,
		El:  b.el,
		Create: func(ctx context.Context, w int) (string, error) {
			g, err := b.cli[w].Grant(ctx, ttl)
			if err != nil {
				return "", err
			}
			return strconv.FormatInt(int64(g.ID), 10), nil
		},
		Renew: func(rctx context.Context, w int, id string) (bool, error) {
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
		Destroy: func(ctx context.Context, w int, id string) error {
			lid, _ := strconv.ParseInt(id, 10, 64)
			_, err := b.cli[w].Revoke(ctx, clientv3.LeaseID(lid))
			return err
		},
		OnMeasure: b.pw.MeasureStart,
	}
	st, err := k.Run(ctx)
	return loadkit.KeepaliveResult(b.cfg, st), err
}

// ping connects, writes and reads, each time with a new client, until it
// succeeds or -duration passes.
func (b *etcdBench) ping(ctx context.Context) (*loadkit.Result, error) {
	key := "/" + b.cfg.Prefix + "/ping"
	return b.pingLoop(ctx, func(ctx context.Context) error {
		// The client's root context bounds its dial by the time left.
		cli, err := newEtcdClient(ctx, b.cfg.Addr)
		if err != nil {
			return err
		}
		defer cli.Close()
		rc, cancel := b.reqCtx(ctx)
		defer cancel()
		if _, err := cli.Put(rc, key, "1"); err != nil {
			return err
		}
		_, err = cli.Get(rc, key)
		return err
	})
}
