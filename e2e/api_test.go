package e2e

import (
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestSessions drives the session endpoints through Consul's client:
// create with every default, info, renew, list, destroy.
func TestSessions(t *testing.T) {
	t.Parallel()
	a := startAgent(t, agentOpts{dev: true})
	s := a.client().Session()

	id, _, err := s.Create(nil, nil)
	if err != nil {
		t.Fatalf("create with defaults: %v", err)
	}
	info, meta, err := s.Info(id, nil)
	if err != nil || info == nil {
		t.Fatalf("info: %v %v", info, err)
	}
	if info.ID != id || info.Node != a.node || info.Behavior != "release" || info.LockDelay != 15*time.Second ||
		info.TTL != "" || len(info.NodeChecks) != 1 || info.NodeChecks[0] != "serfHealth" ||
		info.CreateIndex == 0 || meta.LastIndex < info.CreateIndex || !meta.KnownLeader {
		t.Fatalf("defaults: %+v meta %+v", info, meta)
	}

	ttlID, _, err := s.Create(&api.SessionEntry{Name: "with-ttl", TTL: "10s", Behavior: "delete", LockDelay: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	renewed, _, err := s.Renew(ttlID, nil)
	if err != nil || renewed == nil || renewed.ID != ttlID || renewed.TTL != "10s" || renewed.Behavior != "delete" ||
		renewed.LockDelay != time.Second || renewed.Name != "with-ttl" {
		t.Fatalf("renew: %+v %v", renewed, err)
	}

	list, _, err := s.List(nil)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %v %v", list, err)
	}
	seen := map[string]bool{}
	for _, e := range list {
		seen[e.ID] = true
	}
	if !seen[id] || !seen[ttlID] {
		t.Fatalf("list %v lacks %s or %s", list, id, ttlID)
	}
	node, _, err := s.Node(a.node, nil)
	if err != nil || len(node) != 2 {
		t.Fatalf("node sessions: %v %v", node, err)
	}

	if _, err := s.Destroy(id, nil); err != nil {
		t.Fatal(err)
	}
	if info, _, err := s.Info(id, nil); err != nil || info != nil {
		t.Fatalf("info after destroy: %+v %v", info, err)
	}
	// The 404 of a renew comes back from Consul's client as no entry and
	// no error.
	if e, _, err := s.Renew(id, nil); err != nil || e != nil {
		t.Fatalf("renew of a destroyed session: %+v %v", e, err)
	}
	// Destroying an unknown session succeeds.
	if _, err := s.Destroy(id, nil); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
	if list, _, err := s.List(nil); err != nil || len(list) != 1 || list[0].ID != ttlID {
		t.Fatalf("list after destroy: %v %v", list, err)
	}
}

// TestKVAcquireRelease: two sessions contend for a key through ?acquire
// and ?release.
func TestKVAcquireRelease(t *testing.T) {
	t.Parallel()
	a := startAgent(t, agentOpts{dev: true})
	c := a.client()
	kv, s := c.KV(), c.Session()
	s1, _, err := s.Create(&api.SessionEntry{Name: "one"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, _, err := s.Create(&api.SessionEntry{Name: "two"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const key = "e2e/lock"
	step := func(what string, f func(*api.KVPair, *api.WriteOptions) (bool, *api.WriteMeta, error), p *api.KVPair, want bool) {
		t.Helper()
		ok, _, err := f(p, nil)
		if err != nil || ok != want {
			t.Fatalf("%s: %v %v, want %v", what, ok, err, want)
		}
	}
	get := func() *api.KVPair {
		t.Helper()
		p, _, err := kv.Get(key, nil)
		if err != nil || p == nil {
			t.Fatalf("get: %v %v", p, err)
		}
		return p
	}

	step("s1 acquires", kv.Acquire, &api.KVPair{Key: key, Value: []byte("one"), Session: s1}, true)
	step("s2 is refused", kv.Acquire, &api.KVPair{Key: key, Value: []byte("two"), Session: s2}, false)
	step("s2 cannot release", kv.Release, &api.KVPair{Key: key, Session: s2}, false)
	if p := get(); p.Session != s1 || p.LockIndex != 1 || string(p.Value) != "one" {
		t.Fatalf("held by s1: %+v", p)
	}
	step("s1 re-acquires", kv.Acquire, &api.KVPair{Key: key, Value: []byte("one again"), Session: s1}, true)
	if p := get(); p.Session != s1 || p.LockIndex != 1 || string(p.Value) != "one again" {
		t.Fatalf("re-acquired: %+v", p)
	}
	step("s1 releases", kv.Release, &api.KVPair{Key: key, Value: []byte("free"), Session: s1}, true)
	// A voluntary release starts no lock-delay: s2 gets it at once.
	step("s2 acquires", kv.Acquire, &api.KVPair{Key: key, Value: []byte("two"), Session: s2}, true)
	p := get()
	if p.Session != s2 || p.LockIndex != 2 || string(p.Value) != "two" {
		t.Fatalf("held by s2: %+v", p)
	}

	// Destroying the holder releases the key and starts its lock-delay
	// (15s by default): s1 is refused, and holdfast says how long is left.
	if _, err := s.Destroy(s2, nil); err != nil {
		t.Fatal(err)
	}
	if p := get(); p.Session != "" || p.LockIndex != 2 || string(p.Value) != "two" {
		t.Fatalf("after destroy: %+v", p)
	}
	code, body, hdr, err := rawPut(ctxTimeout(t, 10*time.Second), a.url(), "/v1/kv/"+key+"?acquire="+s1, "x")
	if err != nil || code != 200 || body != "false" {
		t.Fatalf("acquire during lock-delay: %d %q %v", code, body, err)
	}
	left, err := time.ParseDuration(hdr.Get("X-Holdfast-Lock-Delay"))
	if err != nil || left <= 0 || left > 15*time.Second {
		t.Fatalf("X-Holdfast-Lock-Delay %q: %v", hdr.Get("X-Holdfast-Lock-Delay"), err)
	}
}

// TestLockHandoff: client B blocks in api.Lock while client A holds the
// lock, and gets it as soon as A unlocks; the two never hold it together.
func TestLockHandoff(t *testing.T) {
	t.Parallel()
	a := startAgent(t, agentOpts{dev: true})
	ca, cb := a.client(), a.client()
	const key = "e2e/service/leader"
	lockA, err := ca.LockKey(key)
	if err != nil {
		t.Fatal(err)
	}
	lockB, err := cb.LockOpts(&api.LockOptions{Key: key, Value: []byte("B")})
	if err != nil {
		t.Fatal(err)
	}

	var holders atomic.Int32
	enter := func(who string) {
		if n := holders.Add(1); n != 1 {
			t.Errorf("%s entered with %d holders", who, n)
		}
	}
	leave := func() { holders.Add(-1) }

	lostA, err := lockA.Lock(nil)
	if err != nil || lostA == nil {
		t.Fatalf("A: %v", err)
	}
	enter("A")

	stopB := make(chan struct{})
	defer close(stopB)
	gotB := make(chan error, 1)
	var lostB <-chan struct{}
	go func() {
		ch, err := lockB.Lock(stopB)
		if err == nil && ch != nil {
			enter("B")
			lostB = ch
		} else if err == nil {
			err = errStopped
		}
		gotB <- err
	}()

	// B has made its session and is waiting: two lock sessions exist, and
	// B's Lock has not returned while A holds the key.
	eventually(t, 10*time.Second, "B's lock session appears", func() bool {
		list, _, err := ca.Session().List(nil)
		return err == nil && len(list) == 2
	})
	pair, _, err := ca.KV().Get(key, nil)
	if err != nil || pair == nil || pair.Flags != api.LockFlagValue {
		t.Fatalf("lock key: %+v %v", pair, err)
	}
	select {
	case err := <-gotB:
		t.Fatalf("B returned from Lock while A held it: %v", err)
	case <-lostA:
		t.Fatal("A lost the lock")
	default:
	}
	heldBy := pair.Session

	leave()
	unlockedAt := time.Now()
	if err := lockA.Unlock(); err != nil {
		t.Fatalf("A unlock: %v", err)
	}
	select {
	case err := <-gotB:
		if err != nil {
			t.Fatalf("B: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B did not get the lock within 10s of A's unlock")
	}
	// An unlock is a release, not an invalidation: no lock-delay, so the
	// hand-off is prompt (Consul's client would sleep 5s after a refusal).
	if d := time.Since(unlockedAt); d > 4*time.Second {
		t.Errorf("hand-off took %v", d)
	}
	pair, _, err = cb.KV().Get(key, nil)
	if err != nil || pair == nil || pair.Session == "" || pair.Session == heldBy || string(pair.Value) != "B" || pair.LockIndex != 2 {
		t.Fatalf("after hand-off: %+v %v (A's session %s)", pair, err, heldBy)
	}
	select {
	case <-lostB:
		t.Fatal("B's lock is lost")
	default:
	}
	leave()
	if err := lockB.Unlock(); err != nil {
		t.Fatalf("B unlock: %v", err)
	}
	if err := lockB.Destroy(); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if p, _, err := cb.KV().Get(key, nil); err != nil || p != nil {
		t.Fatalf("key after Destroy: %+v %v", p, err)
	}
}

var errStopped = &stoppedError{}

type stoppedError struct{}

func (*stoppedError) Error() string { return "Lock returned nil: stopped" }

// TestSemaphore: three contenders for a semaphore of limit 2. Two get in at
// once, the third waits, and gets in when one of the two releases; never
// more than two hold it.
func TestSemaphore(t *testing.T) {
	t.Parallel()
	a := startAgent(t, agentOpts{dev: true})
	const prefix = "e2e/sem"
	var (
		mu      sync.Mutex
		holders int
		most    int
	)
	enter := func() {
		mu.Lock()
		holders++
		if holders > most {
			most = holders
		}
		mu.Unlock()
	}
	leave := func() {
		mu.Lock()
		holders--
		mu.Unlock()
	}

	sems := make([]*api.Semaphore, 3)
	for i := range sems {
		s, err := a.client().SemaphoreOpts(&api.SemaphoreOptions{Prefix: prefix, Limit: 2, Value: []byte{byte('a' + i)}})
		if err != nil {
			t.Fatal(err)
		}
		sems[i] = s
	}
	for i := 0; i < 2; i++ {
		lost, err := sems[i].Acquire(nil)
		if err != nil || lost == nil {
			t.Fatalf("contender %d: %v", i, err)
		}
		enter()
	}

	stop := make(chan struct{})
	defer close(stop)
	got := make(chan error, 1)
	go func() {
		lost, err := sems[2].Acquire(stop)
		if err == nil && lost == nil {
			err = errStopped
		}
		if err == nil {
			enter()
		}
		got <- err
	}()

	c := a.client()
	// The third contender has written its contender key and waits.
	eventually(t, 10*time.Second, "third contender key", func() bool {
		pairs, _, err := c.KV().List(prefix+"/", nil)
		return err == nil && len(pairs) == 4 // three contenders and .lock
	})
	select {
	case err := <-got:
		t.Fatalf("third contender got in over the limit: %v", err)
	default:
	}
	if h := lockHolders(t, c, prefix); len(h) != 2 {
		t.Fatalf(".lock holders %v", h)
	}

	leave()
	if err := sems[0].Release(); err != nil {
		t.Fatalf("release: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("third contender: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("third contender did not get in within 10s of a release")
	}
	if h := lockHolders(t, c, prefix); len(h) != 2 {
		t.Fatalf(".lock holders after the hand-over %v", h)
	}
	mu.Lock()
	if most > 2 {
		t.Errorf("%d holders at once", most)
	}
	mu.Unlock()
	for _, s := range sems[1:] {
		leave()
		if err := s.Release(); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	if err := sems[2].Destroy(); err != nil {
		t.Fatalf("destroy: %v", err)
	}
}

// lockHolders reads the semaphore's .lock and returns its holders.
func lockHolders(t *testing.T, c *api.Client, prefix string) map[string]bool {
	t.Helper()
	p, _, err := c.KV().Get(prefix+"/.lock", nil)
	if err != nil || p == nil {
		t.Fatalf(".lock: %+v %v", p, err)
	}
	var l struct {
		Limit   int
		Holders map[string]bool
	}
	if err := json.Unmarshal(p.Value, &l); err != nil || l.Limit != 2 {
		t.Fatalf(".lock %q: %v", p.Value, err)
	}
	return l.Holders
}

// TestBlockingQueries: a Get with WaitIndex returns when the key changes,
// and otherwise at the end of its wait with the same index, even if other
// keys change meanwhile. Under both HTTP servers the agent can run.
func TestBlockingQueries(t *testing.T) {
	t.Parallel()
	for _, loop := range []string{"holdfast", "stdlib"} {
		t.Run(loop, func(t *testing.T) {
			t.Parallel()
			testBlockingQueries(t, startAgent(t, agentOpts{dev: true, extra: []string{"-http-server", loop}}))
		})
	}
}

func testBlockingQueries(t *testing.T, a *agent) {
	kv := a.client().KV()
	if _, err := kv.Put(&api.KVPair{Key: "e2e/watched", Value: []byte("v1")}, nil); err != nil {
		t.Fatal(err)
	}
	_, meta, err := kv.Get("e2e/watched", nil)
	if err != nil {
		t.Fatal(err)
	}
	idx := meta.LastIndex

	type result struct {
		p    *api.KVPair
		meta *api.QueryMeta
		err  error
	}
	woke := make(chan result, 1)
	go func() {
		p, m, err := a.client().KV().Get("e2e/watched", &api.QueryOptions{WaitIndex: idx, WaitTime: 20 * time.Second})
		woke <- result{p, m, err}
	}()
	if _, err := kv.Put(&api.KVPair{Key: "e2e/watched", Value: []byte("v2")}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-woke:
		if r.err != nil || r.p == nil || string(r.p.Value) != "v2" || r.meta.LastIndex <= idx || r.meta.LastIndex != r.p.ModifyIndex {
			t.Fatalf("woken Get: %+v %+v %v", r.p, r.meta, r.err)
		}
		idx = r.meta.LastIndex
	case <-time.After(15 * time.Second):
		t.Fatal("blocking Get did not return after the key changed")
	}

	// Nothing changes the key: the Get waits its 500ms (plus up to 1/16
	// jitter) and answers with the same index. A write to another key
	// does not wake it.
	timedOut := make(chan result, 1)
	start := time.Now()
	go func() {
		p, m, err := a.client().KV().Get("e2e/watched", &api.QueryOptions{WaitIndex: idx, WaitTime: 500 * time.Millisecond})
		timedOut <- result{p, m, err}
	}()
	if _, err := kv.Put(&api.KVPair{Key: "e2e/other", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-timedOut:
		elapsed := time.Since(start)
		if r.err != nil || r.p == nil || string(r.p.Value) != "v2" || r.meta.LastIndex != idx {
			t.Fatalf("timed-out Get: %+v %+v %v (index was %d)", r.p, r.meta, r.err, idx)
		}
		if elapsed < 450*time.Millisecond {
			t.Fatalf("timed-out Get returned after %v, before its wait", elapsed)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocking Get with a 500ms wait did not return")
	}

	// An index from the future answers at once with the current one.
	start = time.Now()
	_, m, err := kv.Get("e2e/watched", &api.QueryOptions{WaitIndex: idx + 1000, WaitTime: 10 * time.Second})
	if err != nil || m.LastIndex > idx+2 || time.Since(start) > 5*time.Second {
		t.Fatalf("future index: %+v %v after %v", m, err, time.Since(start))
	}
}

// TestDevAgent: `holdfast agent -dev` says where it listens and that it
// keeps nothing, serves the API there, and exits 0 on SIGTERM.
func TestDevAgent(t *testing.T) {
	t.Parallel()
	a := startAgent(t, agentOpts{dev: true, node: "devnode"})
	a.waitStdout("holdfast agent running", "node:    devnode", "http:    http://"+a.httpAddr,
		"raft:    "+a.raftAddr, "in memory")
	c := a.client()
	leader, err := c.Status().Leader()
	if err != nil || leader != a.raftAddr {
		t.Errorf("leader %q %v, want %s", leader, err, a.raftAddr)
	}
	name, err := c.Agent().NodeName()
	if err != nil || name != "devnode" {
		t.Errorf("agent node name %q %v", name, err)
	}
	if code := a.terminate(15 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	if !strings.Contains(a.stdout.String(), "shutting down") {
		t.Errorf("no word of shutting down:\n%s", a.stdout.String())
	}
}
