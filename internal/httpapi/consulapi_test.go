package httpapi

import (
	"context"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// consulEnv serves the handler over a real listener and points Consul's own
// Go client at it.
func consulEnv(t *testing.T) (*env, *api.Client) {
	t.Helper()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	srv := httptest.NewUnstartedServer(e.h)
	srv.Config.BaseContext = func(net.Listener) context.Context { return ctx }
	srv.Start()
	t.Cleanup(func() {
		cancel() // ends blocking queries still parked
		srv.Close()
	})
	cfg := api.DefaultConfig()
	cfg.Address = srv.Listener.Addr().String()
	cfg.Scheme = "http"
	cfg.Token = ""
	cfg.Datacenter = ""
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, c
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestConsulClientKV(t *testing.T) {
	e, c := consulEnv(t)
	kv := c.KV()
	if _, err := kv.Put(&api.KVPair{Key: "app/config", Value: []byte("v1"), Flags: 9}, nil); err != nil {
		t.Fatal(err)
	}
	pair, meta, err := kv.Get("app/config", nil)
	if err != nil || pair == nil {
		t.Fatalf("get: %v %v", pair, err)
	}
	if string(pair.Value) != "v1" || pair.Flags != 9 || meta.LastIndex != pair.ModifyIndex || !meta.KnownLeader {
		t.Fatalf("pair %+v meta %+v", pair, meta)
	}
	if p, _, err := kv.Get("app/missing", nil); err != nil || p != nil {
		t.Fatalf("missing key: %v %v", p, err)
	}
	if _, err := kv.Put(&api.KVPair{Key: "app/sub/x", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	pairs := must[api.KVPairs](t)(func() (api.KVPairs, error) { p, _, err := kv.List("app/", nil); return p, err }())
	if len(pairs) != 2 || pairs[0].Key != "app/config" || pairs[1].Key != "app/sub/x" {
		t.Fatalf("list %v", pairs)
	}
	keys, _, err := kv.Keys("app/", "/", nil)
	if err != nil || len(keys) != 2 || keys[0] != "app/config" || keys[1] != "app/sub/" {
		t.Fatalf("keys %v %v", keys, err)
	}

	// CAS.
	ok, _, err := kv.CAS(&api.KVPair{Key: "app/config", Value: []byte("v2"), ModifyIndex: pair.ModifyIndex + 50}, nil)
	if err != nil || ok {
		t.Fatalf("stale CAS: %v %v", ok, err)
	}
	ok, _, err = kv.CAS(&api.KVPair{Key: "app/config", Value: []byte("v2"), ModifyIndex: pair.ModifyIndex}, nil)
	if err != nil || !ok {
		t.Fatalf("CAS: %v %v", ok, err)
	}

	// Blocking Get wakes on a write.
	pair, meta, _ = kv.Get("app/config", nil)
	got := make(chan *api.KVPair, 1)
	go func() {
		p, _, err := kv.Get("app/config", &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: time.Minute})
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitParked(t, e, 1)
	if _, err := kv.Put(&api.KVPair{Key: "app/config", Value: []byte("v3")}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if string(p.Value) != "v3" {
			t.Fatalf("woke with %q", p.Value)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("blocking Get did not wake")
	}

	// Sessions, acquire, release.
	s := c.Session()
	sid, _, err := s.Create(&api.SessionEntry{Name: "kv", LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok, _, err = kv.Acquire(&api.KVPair{Key: "app/lock", Value: []byte("me"), Session: sid}, nil)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	pair, _, _ = kv.Get("app/lock", nil)
	if pair.Session != sid || pair.LockIndex != 1 {
		t.Fatalf("locked pair %+v", pair)
	}
	ok, _, err = kv.Release(&api.KVPair{Key: "app/lock", Session: "other"}, nil)
	if err != nil || ok {
		t.Fatalf("foreign release: %v %v", ok, err)
	}
	ok, _, err = kv.Release(&api.KVPair{Key: "app/lock", Session: sid}, nil)
	if err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}

	// Delete, DeleteCAS, DeleteTree.
	pair, _, _ = kv.Get("app/lock", nil)
	ok, _, err = kv.DeleteCAS(&api.KVPair{Key: "app/lock", ModifyIndex: pair.ModifyIndex + 1}, nil)
	if err != nil || ok {
		t.Fatalf("stale DeleteCAS: %v %v", ok, err)
	}
	ok, _, err = kv.DeleteCAS(pair, nil)
	if err != nil || !ok {
		t.Fatalf("DeleteCAS: %v %v", ok, err)
	}
	if _, err := kv.Delete("app/config", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.DeleteTree("app/", nil); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := kv.List("app/", nil); len(p) != 0 {
		t.Fatalf("left %v", p)
	}

	// Errors surface as Consul's client reports them.
	_, err = kv.Put(&api.KVPair{Key: "bad/../key"}, nil)
	if err == nil || err.Error() != `Unexpected response code: 400 (Invalid key "bad/../key": ".." path segments are not allowed)` {
		t.Fatalf("bad key: %v", err)
	}
}

// waitParked waits until timers blocking queries have armed their timers.
func waitParked(t *testing.T, e *env, timers int) {
	t.Helper()
	e.clk.WaitTimers(t, timers)
}

func TestConsulClientTxn(t *testing.T) {
	_, c := consulEnv(t)
	ok, resp, _, err := c.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "t/a", Value: []byte("1")}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: "t/b"}},
		{KV: &api.KVTxnOp{Verb: api.KVGet, Key: "t/a"}},
	}, nil)
	if err != nil || !ok || len(resp.Results) != 2 || string(resp.Results[1].KV.Value) != "1" {
		t.Fatalf("txn: %v %+v %v", ok, resp, err)
	}
	ok, resp, _, err = c.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: "t/a", Value: []byte("2"), Index: 1}},
	}, nil)
	if err != nil || ok || len(resp.Errors) != 1 || resp.Errors[0].OpIndex != 0 {
		t.Fatalf("rolled-back txn: %v %+v %v", ok, resp, err)
	}
}

func TestConsulClientSessions(t *testing.T) {
	_, c := consulEnv(t)
	s := c.Session()
	id, _, err := s.Create(&api.SessionEntry{Name: "s1", TTL: "15s", LockDelay: 2 * time.Second, Behavior: api.SessionBehaviorDelete}, nil)
	if err != nil {
		t.Fatal(err)
	}
	info, meta, err := s.Info(id, nil)
	if err != nil || info == nil {
		t.Fatalf("info: %v %v", info, err)
	}
	if info.Name != "s1" || info.TTL != "15s" || info.LockDelay != 2*time.Second || info.Behavior != "delete" ||
		info.Node != testNode || len(info.NodeChecks) != 1 || info.NodeChecks[0] != "serfHealth" || meta.LastIndex == 0 {
		t.Fatalf("info %+v", info)
	}

	bare, _, err := s.CreateNoChecks(&api.SessionEntry{Name: "bare"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info, _, _ := s.Info(bare, nil); info == nil || len(info.NodeChecks) != 0 || info.LockDelay != 15*time.Second {
		t.Fatalf("no-checks session %+v", info)
	}
	nilID, _, err := s.Create(nil, nil)
	if err != nil || nilID == "" {
		t.Fatalf("default session: %v", err)
	}

	entry, _, err := s.Renew(id, nil)
	if err != nil || entry == nil || entry.ID != id {
		t.Fatalf("renew: %+v %v", entry, err)
	}
	list, _, err := s.List(nil)
	if err != nil || len(list) != 3 {
		t.Fatalf("list: %v %v", list, err)
	}
	list, _, err = s.Node(testNode, nil)
	if err != nil || len(list) != 3 {
		t.Fatalf("node: %v %v", list, err)
	}

	if _, err := s.Destroy(id, nil); err != nil {
		t.Fatal(err)
	}
	if entry, _, err := s.Renew(id, nil); err != nil || entry != nil {
		t.Fatalf("renew of a destroyed session: %+v %v", entry, err)
	}
	if info, _, err := s.Info(id, nil); err != nil || info != nil {
		t.Fatalf("info of a destroyed session: %+v %v", info, err)
	}

	// RenewPeriodic stops with ErrSessionExpired once the session is gone.
	done := make(chan error, 1)
	go func() { done <- s.RenewPeriodic("20ms", id, nil, nil) }() // renews every 10ms
	select {
	case err := <-done:
		if err != api.ErrSessionExpired {
			t.Fatalf("RenewPeriodic: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RenewPeriodic did not notice the session is gone")
	}

	if _, _, err := s.Create(&api.SessionEntry{Behavior: "bogus"}, nil); err == nil ||
		err.Error() != "Unexpected response code: 400 (Invalid Behavior setting 'bogus')" {
		t.Fatalf("bad behavior: %v", err)
	}
}

func TestConsulClientCatalogAgentStatus(t *testing.T) {
	_, c := consulEnv(t)
	name, err := c.Agent().NodeName()
	if err != nil || name != testNode {
		t.Fatalf("agent node name %q %v", name, err)
	}
	if l, err := c.Status().Leader(); err != nil || l != "127.0.0.1:8300" {
		t.Fatalf("leader %q %v", l, err)
	}
	if p, err := c.Status().Peers(); err != nil || len(p) != 1 {
		t.Fatalf("peers %v %v", p, err)
	}
	_, err = c.Catalog().Register(&api.CatalogRegistration{
		Node: "web1", Address: "10.0.0.1",
		Service: &api.AgentService{ID: "web-1", Service: "web", Port: 80, Tags: []string{"a"}},
		Check: &api.AgentCheck{CheckID: "alive", Name: "alive", Status: api.HealthPassing, ServiceID: "web-1",
			Definition: api.HealthCheckDefinition{HTTP: "http://10.0.0.1/", IntervalDuration: 10 * time.Second}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodes, _, err := c.Catalog().Nodes(nil)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("nodes %v %v", nodes, err)
	}
	node, _, err := c.Catalog().Node("web1", nil)
	if err != nil || node == nil || node.Node.Address != "10.0.0.1" || node.Services["web-1"].Port != 80 {
		t.Fatalf("node %+v %v", node, err)
	}
	if n, _, err := c.Catalog().Node("ghost", nil); err != nil || n != nil {
		t.Fatalf("unknown node %+v %v", n, err)
	}
	checks, _, err := c.Health().Node("web1", nil)
	if err != nil || len(checks) != 1 || checks[0].ServiceName != "web" || checks[0].Status != "passing" {
		t.Fatalf("checks %v %v", checks, err)
	}
	if _, err := c.Catalog().Deregister(&api.CatalogDeregistration{Node: "web1"}, nil); err != nil {
		t.Fatal(err)
	}
	q, _, err := c.PreparedQuery().Create(&api.PreparedQueryDefinition{Name: "q", Service: api.ServiceQuery{Service: "web"}}, nil)
	if err != nil || q == "" {
		t.Fatalf("query create %q %v", q, err)
	}
	defs, _, err := c.PreparedQuery().Get(q, nil)
	if err != nil || len(defs) != 1 || defs[0].Service.Service != "web" {
		t.Fatalf("query get %v %v", defs, err)
	}
	if _, err := c.PreparedQuery().Update(&api.PreparedQueryDefinition{ID: q, Name: "q2", DNS: api.QueryDNSOptions{TTL: "10s"},
		Service: api.ServiceQuery{Service: "web", Failover: api.QueryFailoverOptions{NearestN: 2, Datacenters: []string{"dc2"}}}}, nil); err != nil {
		t.Fatal(err)
	}
	defs, _, err = c.PreparedQuery().Get(q, nil)
	if err != nil || len(defs) != 1 || defs[0].Name != "q2" || defs[0].DNS.TTL != "10s" || defs[0].Service.Failover.NearestN != 2 ||
		len(defs[0].Service.Failover.Datacenters) != 1 {
		t.Fatalf("query get after update %+v %v", defs, err)
	}
	res, _, err := c.PreparedQuery().Execute("q2", nil)
	if err != nil || res.Service != "web" || res.DNS.TTL != "10s" {
		t.Fatalf("execute %+v %v", res, err)
	}
	if _, err := c.PreparedQuery().Delete(q, nil); err != nil {
		t.Fatal(err)
	}
}

func TestConsulClientLock(t *testing.T) {
	e, c := consulEnv(t)
	l1, err := c.LockKey("service/leader")
	if err != nil {
		t.Fatal(err)
	}
	lost1, err := l1.Lock(nil)
	if err != nil || lost1 == nil {
		t.Fatalf("lock: %v", err)
	}
	pair, _, _ := c.KV().Get("service/leader", nil)
	if pair == nil || pair.Flags != api.LockFlagValue || pair.Session == "" || pair.LockIndex != 1 {
		t.Fatalf("lock key %+v", pair)
	}

	// A second contender waits until the first unlocks.
	l2, err := c.LockOpts(&api.LockOptions{Key: "service/leader", Value: []byte("two")})
	if err != nil {
		t.Fatal(err)
	}
	got2 := make(chan (<-chan struct{}), 1)
	go func() {
		ch, err := l2.Lock(nil)
		if err != nil {
			t.Error(err)
		}
		got2 <- ch
	}()
	// l1's monitor and l2's wait are both parked.
	waitParked(t, e, 2)
	select {
	case <-got2:
		t.Fatal("second lock acquired while the first is held")
	case <-time.After(50 * time.Millisecond):
	}
	if err := l1.Unlock(); err != nil {
		t.Fatal(err)
	}
	var lost2 <-chan struct{}
	select {
	case lost2 = <-got2:
	case <-time.After(5 * time.Second):
		t.Fatal("second lock never acquired")
	}
	select {
	case <-lost1:
	case <-time.After(5 * time.Second):
		t.Fatal("first lock's channel not closed after Unlock")
	}
	pair, _, _ = c.KV().Get("service/leader", nil)
	if string(pair.Value) != "two" || pair.LockIndex != 2 {
		t.Fatalf("after hand-over %+v", pair)
	}

	// Losing the session closes the lost channel.
	if _, err := c.Session().Destroy(pair.Session, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost2:
	case <-time.After(5 * time.Second):
		t.Fatal("lost channel not closed after the session was destroyed")
	}
	if err := l2.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := l1.Destroy(); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if p, _, _ := c.KV().Get("service/leader", nil); p != nil {
		t.Fatalf("lock key left behind: %+v", p)
	}
}

func TestConsulClientSemaphore(t *testing.T) {
	e, c := consulEnv(t)
	newSem := func() *api.Semaphore {
		s, err := c.SemaphorePrefix("service/sem", 2)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s1, s2, s3 := newSem(), newSem(), newSem()
	if ch, err := s1.Acquire(nil); err != nil || ch == nil {
		t.Fatalf("s1: %v", err)
	}
	if ch, err := s2.Acquire(nil); err != nil || ch == nil {
		t.Fatalf("s2: %v", err)
	}
	got3 := make(chan (<-chan struct{}), 1)
	go func() {
		ch, err := s3.Acquire(nil)
		if err != nil {
			t.Error(err)
		}
		got3 <- ch
	}()
	waitParked(t, e, 3) // two monitors and s3's wait
	select {
	case <-got3:
		t.Fatal("third holder admitted over the limit")
	case <-time.After(50 * time.Millisecond):
	}
	if err := s1.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case ch := <-got3:
		if ch == nil {
			t.Fatal("s3 gave up")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("third holder never admitted")
	}
	if err := s2.Release(); err != nil {
		t.Fatal(err)
	}
	if err := s3.Release(); err != nil {
		t.Fatal(err)
	}
	if err := s1.Destroy(); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if keys, _, _ := c.KV().Keys("service/sem/", "", nil); len(keys) != 0 {
		t.Fatalf("semaphore keys left: %v", keys)
	}
}
