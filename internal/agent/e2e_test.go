package agent_test

import (
	"context"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/internal/agent"
	"github.com/holdfast/holdfast/internal/httpapi"
	"github.com/holdfast/holdfast/internal/servertest"
)

// e2e is an in-process server (raft, fake clock) with an agent writing
// through it, served over HTTP on 127.0.0.1 to Consul's own Go client.
type e2e struct {
	srv *servertest.Server
	ag  *agent.Agent
	c   *api.Client
	ctx context.Context // bounds every blocking query of the test
}

func newE2E(t *testing.T) *e2e {
	t.Helper()
	srv := servertest.New(t, servertest.Options{})
	ag := agent.New(agent.Config{Node: srv.NodeName(), Clock: srv.Clock, Catalog: srv.Server})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	hs := httptest.NewUnstartedServer(httpapi.New(srv.Server, httpapi.Options{Clock: srv.Clock, Agent: ag}))
	hs.Config.BaseContext = func(net.Listener) context.Context { return ctx }
	hs.Start()
	t.Cleanup(func() {
		cancel()
		hs.Close()
		ag.Close()
	})
	cfg := api.DefaultConfig()
	cfg.Address = hs.Listener.Addr().String()
	cfg.Token, cfg.Datacenter = "", ""
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &e2e{srv: srv, ag: ag, c: c, ctx: ctx}
}

// waitSessionGone blocks (on the server's watch, not on time) until the
// session is invalidated, failing the test if that takes too long.
func (e *e2e) waitSessionGone(t *testing.T, id string) {
	t.Helper()
	var idx uint64
	for i := 0; i < 50; i++ {
		q := (&api.QueryOptions{WaitIndex: idx, WaitTime: time.Hour}).WithContext(e.ctx)
		s, meta, err := e.c.Session().Info(id, q)
		if err != nil {
			t.Fatalf("session info: %v", err)
		}
		if s == nil {
			return
		}
		idx = meta.LastIndex
	}
	t.Fatalf("session %s never went away", id)
}

// A TTL check kept passing keeps a session (and its lock) alive; letting
// the TTL lapse invalidates the session at the TTL and releases the lock.
func TestE2ETTLCheckHoldsALock(t *testing.T) {
	e := newE2E(t)
	agentAPI, kv := e.c.Agent(), e.c.KV()
	const ttl = 10 * time.Second
	err := agentAPI.CheckRegister(&api.AgentCheckRegistration{ID: "app-alive", Name: "app heartbeat",
		AgentServiceCheck: api.AgentServiceCheck{TTL: ttl.String(), Status: api.HealthPassing}})
	if err != nil {
		t.Fatal(err)
	}
	sid, _, err := e.c.Session().Create(&api.SessionEntry{Name: "leader",
		NodeChecks: []string{"serfHealth", "app-alive"}, LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok, _, err := kv.Acquire(&api.KVPair{Key: "service/leader", Value: []byte("me"), Session: sid}, nil)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}

	for i := 0; i < 6; i++ {
		e.srv.Clock.Advance(ttl - time.Second)
		if err := agentAPI.UpdateTTL("app-alive", "still here", api.HealthPassing); err != nil {
			t.Fatal(err)
		}
	}
	pair, meta, err := kv.Get("service/leader", nil)
	if err != nil || pair == nil || pair.Session != sid {
		t.Fatalf("lock lost while the check was kept passing: %+v %v", pair, err)
	}

	// Let it lapse: a nanosecond short, the lock is still held.
	e.srv.Clock.Advance(ttl - time.Nanosecond)
	checks, err := agentAPI.Checks()
	if err != nil || checks["app-alive"] == nil || checks["app-alive"].Status != api.HealthPassing {
		t.Fatalf("agent checks at TTL-1ns: %+v %v", checks, err)
	}
	if s, _, err := e.c.Session().Info(sid, nil); err != nil || s == nil {
		t.Fatalf("session gone before its check's TTL: %v", err)
	}
	e.srv.Clock.Advance(time.Nanosecond)
	idx := meta.LastIndex
	for i := 0; ; i++ {
		if i == 50 {
			t.Fatal("the lock was never released")
		}
		q := (&api.QueryOptions{WaitIndex: idx, WaitTime: time.Hour}).WithContext(e.ctx)
		pair, meta, err = kv.Get("service/leader", q)
		if err != nil {
			t.Fatal(err)
		}
		if pair != nil && pair.Session == "" {
			break
		}
		idx = meta.LastIndex
	}
	if s, _, err := e.c.Session().Info(sid, nil); err != nil || s != nil {
		t.Fatalf("session still there after its check expired: %+v %v", s, err)
	}
	hc, _, err := e.c.Health().Node(e.srv.NodeName(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range hc {
		if c.CheckID == "app-alive" && (c.Status != api.HealthCritical || !strings.HasPrefix(c.Output, "TTL expired")) {
			t.Fatalf("catalog check %+v", c)
		}
	}
	// A new session cannot bind to the critical check until it passes.
	if _, _, err := e.c.Session().Create(&api.SessionEntry{NodeChecks: []string{"serfHealth", "app-alive"}}, nil); err == nil ||
		!strings.Contains(err.Error(), "Check 'app-alive' is in critical state") {
		t.Fatalf("session on a critical check: %v", err)
	}
	if err := agentAPI.PassTTL("app-alive", "back"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.c.Session().Create(&api.SessionEntry{NodeChecks: []string{"serfHealth", "app-alive"}}, nil); err != nil {
		t.Fatalf("session after the check passed again: %v", err)
	}
}

// A prepared query bound to a session is deleted when the session is
// invalidated, here by its service check lapsing.
func TestE2EQueryVanishesWithItsSession(t *testing.T) {
	e := newE2E(t)
	err := e.c.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "web", Port: 8080, Tags: []string{"v1"},
		Check: &api.AgentServiceCheck{TTL: "10s", Status: api.HealthPassing}})
	if err != nil {
		t.Fatal(err)
	}
	sid, _, err := e.c.Session().Create(&api.SessionEntry{NodeChecks: []string{"serfHealth"},
		ServiceChecks: []api.ServiceCheck{{ID: "service:web"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pq := e.c.PreparedQuery()
	qid, _, err := pq.Create(&api.PreparedQueryDefinition{Name: "web-q", Session: sid,
		Service: api.ServiceQuery{Service: "web"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, _, err := pq.Execute("web-q", nil)
	if err != nil || res.Service != "web" || len(res.Nodes) != 1 || res.Nodes[0].Service.Port != 8080 ||
		res.Datacenter != "dc1" || res.Nodes[0].Node.Node != e.srv.NodeName() {
		t.Fatalf("execute: %+v %v", res, err)
	}

	e.srv.Clock.Advance(10 * time.Second)
	e.waitSessionGone(t, sid)
	if _, _, err := pq.Get(qid, nil); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("query still there after its session was invalidated: %v", err)
	}
	if _, _, err := pq.Execute("web-q", nil); err == nil || !strings.Contains(err.Error(), "Query not found") {
		t.Fatalf("execute of the deleted query: %v", err)
	}
}

// Execute returns only healthy instances; catalog and health endpoints
// answer in shapes Consul's client decodes.
func TestE2EExecuteAndHealth(t *testing.T) {
	e := newE2E(t)
	ag := e.c.Agent()
	reg := func(id string, tags []string, status string) {
		t.Helper()
		err := ag.ServiceRegister(&api.AgentServiceRegistration{ID: id, Name: "web", Tags: tags, Port: 80,
			Address: "10.0.0.1", Check: &api.AgentServiceCheck{CheckID: id + "-ttl", TTL: "1m", Status: status}})
		if err != nil {
			t.Fatal(err)
		}
	}
	reg("web-1", []string{"v1", "primary"}, api.HealthPassing)
	reg("web-2", []string{"v2"}, api.HealthWarning)
	reg("web-3", []string{"v2"}, api.HealthCritical)

	pq := e.c.PreparedQuery()
	mk := func(name string, sq api.ServiceQuery) {
		t.Helper()
		if _, _, err := pq.Create(&api.PreparedQueryDefinition{Name: name, Service: sq}, nil); err != nil {
			t.Fatal(err)
		}
	}
	mk("any", api.ServiceQuery{Service: "web"})
	mk("passing", api.ServiceQuery{Service: "web", OnlyPassing: true})
	mk("not-v2", api.ServiceQuery{Service: "web", Tags: []string{"!v2"}})
	mk("v2", api.ServiceQuery{Service: "web", Tags: []string{"V2"}})
	ids := func(name string) string {
		t.Helper()
		res, _, err := pq.Execute(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range res.Nodes {
			out = append(out, n.Service.ID)
		}
		return strings.Join(out, ",")
	}
	for q, want := range map[string]string{"any": "web-1,web-2", "passing": "web-1", "not-v2": "web-1", "v2": "web-2"} {
		if got := ids(q); got != want {
			t.Errorf("execute %s: %q, want %q", q, got, want)
		}
	}

	entries, _, err := e.c.Health().Service("web", "", true, nil)
	if err != nil || len(entries) != 1 || entries[0].Service.ID != "web-1" || len(entries[0].Checks) != 2 {
		t.Fatalf("health service ?passing: %+v %v", entries, err)
	}
	if entries[0].Checks[0].CheckID != "serfHealth" || entries[0].Checks[1].CheckID != "web-1-ttl" {
		t.Fatalf("checks of an entry: %+v", entries[0].Checks)
	}
	all, _, err := e.c.Health().Service("web", "v2", false, nil)
	if err != nil || len(all) != 2 {
		t.Fatalf("health service ?tag=v2: %+v %v", all, err)
	}
	crit, _, err := e.c.Health().State(api.HealthCritical, nil)
	if err != nil || len(crit) != 1 || crit[0].CheckID != "web-3-ttl" || crit[0].ServiceName != "web" {
		t.Fatalf("health state critical: %+v %v", crit, err)
	}
	svcs, _, err := e.c.Catalog().Services(nil)
	if err != nil || strings.Join(svcs["web"], ",") != "v1,primary,v2" {
		t.Fatalf("catalog services: %v %v", svcs, err)
	}
	cs, _, err := e.c.Catalog().Service("web", "primary", nil)
	if err != nil || len(cs) != 1 || cs[0].ServiceID != "web-1" || cs[0].ServiceAddress != "10.0.0.1" || cs[0].Node != e.srv.NodeName() {
		t.Fatalf("catalog service: %+v %v", cs, err)
	}
	local, err := ag.Services()
	if err != nil || len(local) != 3 || local["web-2"].Tags[0] != "v2" {
		t.Fatalf("agent services: %+v %v", local, err)
	}

	// web-3 recovers; a blocking reader of the passing instances sees it.
	_, meta, err := e.c.Health().Service("web", "", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan []*api.ServiceEntry, 1)
	go func() {
		q := (&api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: time.Hour}).WithContext(e.ctx)
		es, _, err := e.c.Health().Service("web", "", true, q)
		if err != nil {
			t.Error(err)
		}
		done <- es
	}()
	if err := ag.PassTTL("web-3-ttl", ""); err != nil {
		t.Fatal(err)
	}
	select {
	case es := <-done:
		if len(es) != 2 || es[1].Service.ID != "web-3" {
			t.Fatalf("after web-3 passed: %+v", es)
		}
	case <-e.ctx.Done():
		t.Fatal("blocking health query never woke")
	}
	if got := ids("passing"); got != "web-1,web-3" {
		t.Fatalf("execute passing after recovery: %q", got)
	}
}

// A client agent's checks: the agent runs on the client's node and writes
// through a server's HTTP API (HTTPCatalog), and serves only the agent
// endpoints itself (httpapi.AgentHandler). Its TTL check lapsing
// invalidates a session of the client's node held on the server.
func TestE2EClientAgentThroughHTTP(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ag := agent.New(agent.Config{Node: "client1", Clock: srv.Clock,
		Catalog: &agent.HTTPCatalog{Base: func() (string, error) { return srv.URL, nil }}})
	defer ag.Close()
	hs := httptest.NewServer(httpapi.AgentHandler(ag, "dc1", httpapi.Options{Clock: srv.Clock}))
	defer hs.Close()

	client := func(addr string) *api.Client {
		cfg := api.DefaultConfig()
		cfg.Address, cfg.Token, cfg.Datacenter = addr, "", ""
		c, err := api.NewClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	server, local := client(srv.Addr), client(hs.Listener.Addr().String())
	// The client's node, as gossip would register it.
	if _, err := server.Catalog().Register(&api.CatalogRegistration{Node: "client1", Address: "127.0.0.2",
		Check: &api.AgentCheck{CheckID: "serfHealth", Status: api.HealthPassing}}, nil); err != nil {
		t.Fatal(err)
	}
	err := local.Agent().CheckRegister(&api.AgentCheckRegistration{ID: "worker", Name: "worker",
		AgentServiceCheck: api.AgentServiceCheck{TTL: "10s", Status: api.HealthPassing}})
	if err != nil {
		t.Fatal(err)
	}
	sid, _, err := server.Session().Create(&api.SessionEntry{Node: "client1", NodeChecks: []string{"serfHealth", "worker"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &e2e{srv: srv, c: server, ctx: ctx}
	srv.Clock.Advance(9 * time.Second)
	if err := local.Agent().PassTTL("worker", ""); err != nil {
		t.Fatal(err)
	}
	srv.Clock.Advance(9 * time.Second)
	if s, _, err := server.Session().Info(sid, nil); err != nil || s == nil {
		t.Fatalf("session lost while the client's check was kept passing: %v", err)
	}
	srv.Clock.Advance(time.Second)
	e.waitSessionGone(t, sid)
	checks, _, err := server.Health().Node("client1", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if c.CheckID == "worker" && c.Status != api.HealthCritical {
			t.Fatalf("client check on the server: %+v", c)
		}
	}
	// Everything else is not the agent handler's to serve.
	if _, _, err := local.Catalog().Services(nil); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("catalog through the agent-only handler: %v", err)
	}
}
