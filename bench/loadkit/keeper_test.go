package loadkit

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"
)

// fakeSessions is an in-memory session store for Keeper.
type fakeSessions struct {
	mu        sync.Mutex
	next      int
	live      map[string]bool
	renewals  int
	destroyed int
	gone      bool // every renewal answers "no such session"
}

func (f *fakeSessions) keeper(cfg *Config, measured *int) *Keeper {
	f.live = map[string]bool{}
	return &Keeper{
		Cfg: cfg,
		El:  &ErrLog{},
		Create: func(context.Context, int) (string, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.next++
			id := strconv.Itoa(f.next)
			f.live[id] = true
			return id, nil
		},
		Renew: func(_ context.Context, _ int, id string) (bool, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.renewals++
			return f.live[id] && !f.gone, nil
		},
		Destroy: func(_ context.Context, _ int, id string) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			delete(f.live, id)
			f.destroyed++
			return nil
		},
		OnMeasure: func() { *measured++ },
	}
}

func keeperConfig() *Config {
	return &Config{Clients: 4, Sessions: 40, SessionTTL: 2 * time.Second, Duration: 1200 * time.Millisecond,
		Timeout: time.Second, SetupTimeout: 10 * time.Second}
}

func TestKeeperRenewsEverySessionEachInterval(t *testing.T) {
	f := &fakeSessions{}
	var measured int
	cfg := keeperConfig()
	st, err := f.keeper(cfg, &measured).Run(context.Background())
	if err != nil || measured != 1 {
		t.Fatalf("err %v, OnMeasure ran %d times", err, measured)
	}
	// 40 sessions renewed once a second for 1.2 s: about 48 renewals.
	if st.Created != 40 || st.Expired != 0 || st.Renewals < 30 || st.Renewals > 90 {
		t.Fatalf("stats %+v", st)
	}
	if st.Lat.Count() != uint64(st.Renewals) || st.Measured != cfg.Duration {
		t.Fatalf("lat_n %d measured %v", st.Lat.Count(), st.Measured)
	}
	if len(f.live) != 0 || f.destroyed != 40 {
		t.Fatalf("%d sessions left, %d destroyed", len(f.live), f.destroyed)
	}
	r := KeepaliveResult(cfg, st)
	if r.Ops != st.Renewals || r.Unit != "renewals" || r.Clients != 4 {
		t.Fatalf("result %+v", r)
	}
}

func TestKeeperCountsExpiredAndCanLeaveSessions(t *testing.T) {
	f := &fakeSessions{gone: true}
	var measured int
	cfg := keeperConfig()
	cfg.NoCleanup = true
	st, err := f.keeper(cfg, &measured).Run(context.Background())
	if err != nil || st.Created != 40 || st.Expired != 40 || st.Renewals != 0 {
		t.Fatalf("err %v stats %+v", err, st)
	}
	if f.destroyed != 0 || len(f.live) != 40 {
		t.Fatalf("-no-cleanup: %d destroyed", f.destroyed)
	}
}
