package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	hapi "github.com/holdfast/holdfast/api"
)

// TestFencingAcrossCrashes is a small Jepsen-style run of the one promise
// a lock service exists for. Contenders take one lock in turn and, while
// they hold it, write to a guarded resource with writes fenced by their
// hold's sequencer (check-lock in the same transaction). A zombie
// contender takes the lock and then stops renewing its session, as a
// process frozen by a long pause would, waits until the server has freed
// the session, and then writes under the sequencer it still has. Meanwhile
// the agent is killed with SIGKILL and restarted on its data directory,
// three times.
//
// What must hold at the end, read from the restarted agent:
//   - every fenced write that was answered true is there (durability);
//   - every write answered false left nothing, and no zombie write was
//     ever accepted (fencing);
//   - in the order of their ModifyIndex, the accepted writes carry lock
//     indexes that never go down, and writes under one lock index come
//     from one session (mutual exclusion, as the server saw it).
//
// The run is bounded: it ends once enough has happened or after a minute,
// and the minimum counts it checks make sure it tested something.
func TestFencingAcrossCrashes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raftAddr := freeAddr(t)
	opts := agentOpts{dataDir: dir, raftAddr: raftAddr, extra: []string{"-session-ttl-min", "1s"}}
	a := startAgent(t, opts)

	// Clients dial whichever agent is current: a restarted one listens on
	// a new HTTP port.
	var cur atomic.Pointer[string]
	setCur := func(a *agent) { addr := a.httpAddr; cur.Store(&addr) }
	setCur(a)
	var d net.Dialer
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, *cur.Load())
		},
		MaxIdleConnsPerHost: 16,
	}}
	t.Cleanup(hc.CloseIdleConnections)
	c, err := hapi.NewClient(&hapi.Config{Address: "holdfast.test", HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}

	const (
		lockKey     = "chaos/lock"
		honest      = 3
		crashes     = 3
		ackPerCrash = 25 // accepted fenced writes between crashes
		zombiesMin  = 2  // zombie writes refused, at least
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run, stop := context.WithCancel(ctx)
	defer stop()

	type write struct {
		key, val string
	}
	var (
		mu      sync.Mutex
		acked   []write  // answered true
		refused []string // keys of writes answered false
		wg      sync.WaitGroup
	)
	const zombiePrefix = "chaos/res/zombie-"
	zombiesIn := func(keys []string) (n int) {
		for _, k := range keys {
			if strings.HasPrefix(k, zombiePrefix) {
				n++
			}
		}
		return n
	}
	counts := func() (acks, zombieRefusals int) {
		mu.Lock()
		defer mu.Unlock()
		return len(acked), zombiesIn(refused)
	}
	retry := func() bool { // back off after an error; false once the run is over
		select {
		case <-run.Done():
			return false
		case <-time.After(20 * time.Millisecond):
			return true
		}
	}
	// session makes a session without lock-delay; honest ones are renewed
	// by the caller.
	session := func(ttl string) string {
		for {
			id, _, err := c.Session().Create(run, &hapi.SessionEntry{TTL: ttl, LockDelay: -1}, nil)
			if err == nil {
				return id
			}
			if !retry() {
				return ""
			}
		}
	}
	// take blocks until sid holds lockKey and returns the hold's
	// sequencer; ok is false if the run ended or the session is gone.
	take := func(sid string) (seq hapi.Sequencer, ok bool) {
		var idx uint64
		for run.Err() == nil {
			got, _, err := c.KV().Acquire(run, &hapi.KVPair{Key: lockKey, Session: sid}, nil)
			if err != nil {
				if strings.Contains(err.Error(), "invalid session") {
					return seq, false
				}
				retry()
				continue
			}
			q := &hapi.QueryOptions{} // won: read the hold at once
			if !got {
				// Lost: sleep on the key until it changes.
				q = &hapi.QueryOptions{WaitIndex: idx, WaitTime: 200 * time.Millisecond}
			}
			p, qm, err := c.KV().Get(run, lockKey, q)
			if err != nil {
				retry()
				continue
			}
			idx = qm.LastIndex
			if got && p != nil && p.Session == sid {
				return hapi.Sequencer{Key: lockKey, Session: sid, LockIndex: p.LockIndex}, true
			}
		}
		return seq, false
	}
	// fenced writes one resource key under seq and records the answer; a
	// write whose answer was lost (the agent died with it in flight) is
	// recorded as neither.
	fenced := func(seq hapi.Sequencer, key string, zombie bool) {
		val := fmt.Sprintf("%s/%d", seq.Session, seq.LockIndex)
		ok, _, err := c.KV().PutFenced(run, &hapi.KVPair{Key: key, Value: []byte(val)}, seq, nil)
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case ok && zombie:
			t.Errorf("zombie write %s under %+v accepted after its session was gone", key, seq)
		case ok:
			acked = append(acked, write{key, val})
		default:
			refused = append(refused, key)
		}
	}

	for h := 0; h < honest; h++ {
		wg.Add(1)
		go func(h int) {
			defer wg.Done()
			n := 0
			for run.Err() == nil {
				sid := session("10s")
				if sid == "" {
					return
				}
				renewed := make(chan struct{})
				rctx, rstop := context.WithCancel(run)
				go func() { // renew at a third of the TTL until told to stop
					defer close(renewed)
					for {
						select {
						case <-rctx.Done():
							return
						case <-time.After(3 * time.Second):
						}
						c.Session().Renew(rctx, sid, nil)
					}
				}()
				for run.Err() == nil {
					seq, ok := take(sid)
					if !ok {
						break
					}
					for i := 0; i < 3; i++ {
						n++
						fenced(seq, fmt.Sprintf("chaos/res/h%d-%d", h, n), false)
					}
					for run.Err() == nil {
						if _, _, err := c.KV().ReleaseFenced(run, &hapi.KVPair{Key: lockKey, Session: sid}, seq.LockIndex, nil); err == nil || !retry() {
							break
						}
					}
				}
				rstop()
				<-renewed
			}
		}(h)
	}
	wg.Add(1)
	go func() { // the zombie
		defer wg.Done()
		n := 0
		for run.Err() == nil {
			sid := session("1s") // never renewed
			if sid == "" {
				return
			}
			seq, ok := take(sid)
			if !ok {
				continue // it lapsed before the lock came its way
			}
			// Frozen: wait until the server has freed the session.
			for run.Err() == nil {
				se, _, err := c.Session().Info(run, sid, nil)
				if err == nil && se == nil {
					break
				}
				retry()
			}
			n++
			fenced(seq, fmt.Sprintf("%s%d", zombiePrefix, n), true)
		}
	}()

	// The crashes, each after enough progress; then a little more progress
	// and enough refused zombies.
	progress := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				stop()
				wg.Wait()
				acks, zs := counts()
				t.Fatalf("gave up waiting for %s (%d writes accepted, %d zombies refused)", what, acks, zs)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	for i := 1; i <= crashes; i++ {
		want := i * ackPerCrash
		progress(fmt.Sprintf("%d accepted writes before crash %d", want, i), func() bool { acks, _ := counts(); return acks >= want })
		a.kill()
		a = startAgent(t, opts)
		setCur(a)
	}
	final := (crashes + 1) * ackPerCrash
	progress("progress after the last restart", func() bool {
		acks, zs := counts()
		return acks >= final && zs >= zombiesMin
	})
	stop()
	wg.Wait()

	// What the restarted agent holds.
	pairs, _, err := c.KV().List(ctx, "chaos/res/", &hapi.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]*hapi.KVPair{}
	for _, p := range pairs {
		have[p.Key] = p
	}
	for _, w := range acked {
		if p := have[w.key]; p == nil || string(p.Value) != w.val {
			t.Errorf("accepted write %s = %q missing after the crashes (found %v)", w.key, w.val, p)
		}
	}
	for _, k := range refused {
		if p := have[k]; p != nil {
			t.Errorf("write %s was answered false but is there: %q", k, p.Value)
		}
	}
	sort.Slice(pairs, func(i, j int) bool { return pairs[i].ModifyIndex < pairs[j].ModifyIndex })
	var lastIdx uint64
	lastSess := ""
	for _, p := range pairs {
		if strings.HasPrefix(p.Key, zombiePrefix) {
			t.Errorf("a zombie write is in the store: %s = %q", p.Key, p.Value)
		}
		sess, li, ok := strings.Cut(string(p.Value), "/")
		idx, err := strconv.ParseUint(li, 10, 64)
		if !ok || err != nil {
			t.Fatalf("%s holds %q", p.Key, p.Value)
		}
		switch {
		case idx < lastIdx:
			t.Errorf("%s (ModifyIndex %d) was written under lock index %d after a write under %d", p.Key, p.ModifyIndex, idx, lastIdx)
		case idx == lastIdx && sess != lastSess:
			t.Errorf("%s: sessions %s and %s both wrote under lock index %d", p.Key, lastSess, sess, idx)
		}
		lastIdx, lastSess = idx, sess
	}
	t.Logf("%d crashes; %d fenced writes accepted and all there after them, %d refused (%d of them zombies'), lock index reached %d",
		crashes, len(acked), len(refused), zombiesIn(refused), lastIdx)
}
