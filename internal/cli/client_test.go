package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/agent"
	"github.com/holdfast/holdfast/internal/gossip"
	"github.com/holdfast/holdfast/internal/httpapi"
	"github.com/holdfast/holdfast/internal/servertest"
	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// clientFixture is a client agent's HTTP side in front of an in-process
// server, with the server learned through a real (loopback) gossip pool.
type clientFixture struct {
	server *servertest.Server
	agent  *clientAgent
	url    string
}

func newClientFixture(t *testing.T) *clientFixture {
	t.Helper()
	st := servertest.New(t, servertest.Options{})
	_, cli, _ := gossipPair(t, st.Addr)
	// The leader would register the client's node when it joins; this
	// server has no gossip, so register it by hand.
	if err := st.Register(context.Background(), &state.RegisterRequest{Node: "cli1", Address: "127.0.0.1",
		Check: &state.HealthCheck{CheckID: state.SerfCheckID, Status: state.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	ca := newClientAgent("cli1", "dc1", "127.0.0.1:18510", cli, hclog.NewNullLogger())
	hs := httptest.NewServer(ca)
	t.Cleanup(hs.Close)
	return &clientFixture{server: st, agent: ca, url: hs.URL}
}

func do(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func TestClientAgentSessionsDefaultToItsNode(t *testing.T) {
	f := newClientFixture(t)
	for _, tc := range []struct{ name, body, node string }{
		{"no body", "", "cli1"},
		{"empty object", "{}", "cli1"},
		{"empty node", `{"Node":"","TTL":"15s"}`, "cli1"},
		{"null node", `{"Node":null,"Name":"x"}`, "cli1"},
		{"lower-case empty node", `{"node":"","Name":"y"}`, "cli1"},
		{"node given", `{"Node":"node1"}`, "node1"},
		{"node given in lower case", `{"node":"node1"}`, "node1"},
	} {
		code, body := do(t, "PUT", f.url+"/v1/session/create", tc.body)
		if code != 200 {
			t.Fatalf("%s: %d %s", tc.name, code, body)
		}
		var out struct{ ID string }
		json.Unmarshal([]byte(body), &out)
		_, sess := f.server.State().SessionGet(nil, out.ID)
		if sess == nil || sess.Node != tc.node {
			t.Fatalf("%s: session %+v, want node %s", tc.name, sess, tc.node)
		}
		if tc.name == "empty node" && sess.TTL != "15s" {
			t.Fatalf("the rewrite lost a field: %+v", sess)
		}
	}
	// A body that is not an object goes to the server as it is, and the
	// server's error comes back.
	code, body := do(t, "PUT", f.url+"/v1/session/create", `[1,2]`)
	if code != 400 {
		t.Fatalf("array body: %d %s", code, body)
	}
	// Only session creation is rewritten.
	code, body = do(t, "PUT", f.url+"/v1/kv/k", `{}`)
	if code != 200 || body != "true" {
		t.Fatalf("kv put: %d %s", code, body)
	}
	if _, e := f.server.State().KVGet(nil, "k"); e == nil || string(e.Value) != "{}" {
		t.Fatalf("kv value: %+v", e)
	}
}

func TestClientAgentForwards(t *testing.T) {
	f := newClientFixture(t)
	// Writes, reads with query strings and headers go through.
	if code, body := do(t, "PUT", f.url+"/v1/kv/a/b%2Fc?flags=7", "v"); code != 200 || body != "true" {
		t.Fatalf("put: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", f.url+"/v1/kv/a/b%2Fc", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Consul-Index") == "" || !strings.Contains(string(b), `"Flags":7`) {
		t.Fatalf("get: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	if _, e := f.server.State().KVGet(nil, "a/b/c"); e == nil {
		t.Fatal("the key did not reach the server")
	}
	// Errors of the server come back as they are.
	if code, _ := do(t, "GET", f.url+"/v1/kv/missing", ""); code != 404 {
		t.Fatalf("missing key: %d", code)
	}

	// /v1/agent/self is the client's own.
	code, body := do(t, "GET", f.url+"/v1/agent/self", "")
	var self map[string]map[string]interface{}
	if err := json.Unmarshal([]byte(body), &self); err != nil || code != 200 {
		t.Fatalf("self: %d %s", code, body)
	}
	if self["Config"]["NodeName"] != "cli1" || self["Config"]["Server"] != false || self["Member"]["Status"] != float64(1) ||
		self["Member"]["Tags"].(map[string]interface{})["role"] != "client" {
		t.Fatalf("self: %v", self)
	}
	// /v1/agent/members is the client's view of the pool.
	code, body = do(t, "GET", f.url+"/v1/agent/members", "")
	if code != 200 || !strings.Contains(body, `"Name":"cli1"`) || !strings.Contains(body, `"Name":"srv1"`) {
		t.Fatalf("members: %d %s", code, body)
	}
}

func TestClientAgentWithoutServers(t *testing.T) {
	p, err := gossip.New(gossip.Config{Name: "lonely", BindAddr: "127.0.0.1", Profile: gossip.ProfileFast})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown()
	hs := httptest.NewServer(newClientAgent("lonely", "dc1", "x", p, hclog.NewNullLogger()))
	defer hs.Close()
	code, body := do(t, "GET", hs.URL+"/v1/kv/k", "")
	if code != 500 || body != "No known Consul servers" {
		t.Fatalf("no servers: %d %q", code, body)
	}
	// The agent's own endpoints still answer.
	if code, _ := do(t, "GET", hs.URL+"/v1/agent/self", ""); code != 200 {
		t.Fatalf("self: %d", code)
	}
	// Without a local agent, check and service endpoints are refused:
	// forwarded, they would act on a server's node.
	for _, path := range []string{"/v1/agent/checks", "/v1/agent/services", "/v1/agent/check/register", "/v1/agent/check/pass/x", "/v1/agent/service/register"} {
		code, body := do(t, "PUT", hs.URL+path, "{}")
		if code != 501 || !strings.Contains(body, "runs no checks or services") {
			t.Fatalf("%s: %d %q", path, code, body)
		}
	}
}

func TestClientAgentServerUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	_, cli, _ := gossipPair(t, dead)
	hs := httptest.NewServer(newClientAgent("cli1", "dc1", "x", cli, hclog.NewNullLogger()))
	defer hs.Close()
	code, body := do(t, "GET", hs.URL+"/v1/kv/k", "")
	if code != 500 || !strings.Contains(body, "forwarding to the server at "+dead+" failed") {
		t.Fatalf("dead server: %d %q", code, body)
	}
}

func TestServerHTTPAddr(t *testing.T) {
	for _, tc := range []struct{ tag, addr, want string }{
		{"127.0.0.1:8500", "10.0.0.1", "127.0.0.1:8500"},
		{"0.0.0.0:8500", "10.0.0.1", "10.0.0.1:8500"},
		{"[::]:8500", "10.0.0.1", "10.0.0.1:8500"},
		{":8500", "10.0.0.2", "10.0.0.2:8500"},
		{"srv.example:8500", "10.0.0.1", "srv.example:8500"},
	} {
		got := gossip.Member{Addr: tc.addr, Tags: map[string]string{"http": tc.tag}}.TagAddr("http")
		if got != tc.want {
			t.Errorf("TagAddr(%s, %s) = %s, want %s", tc.tag, tc.addr, got, tc.want)
		}
	}
}

func TestParseGossipFlags(t *testing.T) {
	o, err := parseGossipFlags("127.0.0.1:0", "fast", []string{"10.0.0.1", "10.0.0.2:9000"})
	if err != nil || o.bindAddr != "127.0.0.1" || o.bindPort != 0 || o.profile != gossip.ProfileFast ||
		strings.Join(o.joins, ",") != "10.0.0.1:8301,10.0.0.2:9000" {
		t.Fatalf("%+v %v", o, err)
	}
	if o, err := parseGossipFlags(":8301", "", nil); err != nil || o.bindAddr != "0.0.0.0" || o.profile != gossip.ProfileLAN {
		t.Fatalf("%+v %v", o, err)
	}
	for _, tc := range []struct{ serf, prof, join, err string }{
		{"nope", "lan", "", `bad -serf-addr "nope": want host:port`},
		{"127.0.0.1:x", "lan", "", `port "x" is not a number`},
		{"127.0.0.1:8301", "slow", "", `bad -gossip-profile: unknown profile "slow"`},
		{"127.0.0.1:8301", "lan", "a:b:c", `bad -join: bad join address "a:b:c"`},
		{"127.0.0.1:8301", "lan", "10.0.0.1:0", `bad -join: bad join address "10.0.0.1:0"`},
	} {
		var joins []string
		if tc.join != "" {
			joins = []string{tc.join}
		}
		if _, err := parseGossipFlags(tc.serf, tc.prof, joins); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("parseGossipFlags(%q, %q, %q) = %v, want %q", tc.serf, tc.prof, tc.join, err, tc.err)
		}
	}
}

type fakePool []gossip.Member

func (f fakePool) Members() []gossip.Member { return f }
func (f fakePool) Member(name string) (gossip.Member, bool) {
	for _, m := range f {
		if m.Name == name {
			return m, true
		}
	}
	return gossip.Member{}, false
}

// livePool is a fakePool whose members a test changes while the client
// agent reads them.
type livePool struct {
	mu sync.Mutex
	ms fakePool
}

func (p *livePool) Members() []gossip.Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]gossip.Member(nil), p.ms...)
}

func (p *livePool) Member(name string) (gossip.Member, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ms.Member(name)
}

func (p *livePool) set(ms fakePool) {
	p.mu.Lock()
	p.ms = ms
	p.mu.Unlock()
}

func TestClientAgentPicksAServer(t *testing.T) {
	srv := func(name, http string, st gossip.Status) gossip.Member {
		return gossip.Member{Name: name, Addr: "10.0.0.1", Status: st, Tags: map[string]string{"role": "server", "http": http}}
	}
	pool := fakePool{
		{Name: "c", Status: gossip.StatusAlive, Tags: map[string]string{"role": "client", "http": "10.0.0.9:8500"}},
		srv("s0", "10.0.0.10:8500", gossip.StatusLeft),
		srv("s1", "10.0.0.11:8500", gossip.StatusFailed),
		srv("s2", "10.0.0.12:8500", gossip.StatusAlive),
		srv("s3", "10.0.0.13:8500", gossip.StatusAlive),
		srv("s4", "", gossip.StatusAlive),
	}
	c := newClientAgent("c", "dc1", "x", pool, hclog.NewNullLogger())
	if got := c.server(); got != "10.0.0.12:8500" {
		t.Fatalf("first pick: %s", got)
	}
	// Sticky while it works; after a failed forward, the next one.
	c.last, c.skip = "10.0.0.13:8500", ""
	if got := c.server(); got != "10.0.0.13:8500" {
		t.Fatalf("sticky: %s", got)
	}
	c.skip = "10.0.0.13:8500"
	if got := c.server(); got != "10.0.0.12:8500" {
		t.Fatalf("after a failure: %s", got)
	}
	// No live server: try a failed one (it may be back), never one that left.
	c.pool = fakePool{pool[0], pool[1], pool[2]}
	if got := c.server(); got != "10.0.0.11:8500" {
		t.Fatalf("failed fallback: %s", got)
	}
	c.pool = fakePool{pool[0], pool[1]}
	if got := c.server(); got != "" {
		t.Fatalf("only a left server: %q", got)
	}
}

// A client agent runs its own checks: a TTL check registered through it
// lands in the server's catalog on the client's node, and letting it lapse
// invalidates a session bound to it.
func TestClientAgentRunsItsOwnChecks(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	c := newClientAgent("client1", "dc1", "x", fakePool{{Name: "node1", Addr: "127.0.0.1",
		Status: gossip.StatusAlive, Tags: map[string]string{"role": "server", "http": srv.Addr}}}, hclog.NewNullLogger())
	clk := clocktest.NewFake(servertest.Epoch)
	ag := agent.New(agent.Config{Node: "client1", Clock: clk, Catalog: &agent.HTTPCatalog{Base: func() (string, error) {
		return "http://" + c.server(), nil
	}}})
	defer ag.Close()
	c.local = httpapi.AgentHandler(ag, "dc1", httpapi.Options{})
	hs := httptest.NewServer(c)
	defer hs.Close()

	if code, body := do(t, "PUT", hs.URL+"/v1/agent/check/register", `{"ID":"app","Name":"app","TTL":"10s","Status":"passing"}`); code != 200 {
		t.Fatalf("register: %d %q", code, body)
	}
	code, body := do(t, "GET", srv.URL+"/v1/health/node/client1", "")
	if code != 200 || !strings.Contains(body, `"CheckID":"app"`) || !strings.Contains(body, `"Status":"passing"`) {
		t.Fatalf("server catalog: %d %s", code, body)
	}
	code, body = do(t, "PUT", hs.URL+"/v1/session/create", `{"NodeChecks":["app"]}`)
	if code != 200 || !strings.Contains(body, `"ID"`) {
		t.Fatalf("session create through the client: %d %s", code, body)
	}
	var created struct{ ID string }
	if err := json.Unmarshal([]byte(body), &created); err != nil {
		t.Fatal(err)
	}
	if err := clk.BlockUntilWaiters(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second) // the TTL lapses on the client: critical, session invalidated
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body = do(t, "GET", srv.URL+"/v1/session/info/"+created.ID, "")
		if code == 200 && strings.TrimSpace(body) == "[]" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session bound to the lapsed client check still alive: %s", body)
		}
		runtime.Gosched()
	}
}

// A client agent that starts again does not leave the checks its last run
// registered frozen in the catalog: nothing runs them any more, and a TTL
// check left passing would keep the sessions bound to it alive for ever.
// Once it knows a server it drops them (which ends those sessions); checks
// registered through the catalog API, serfHealth, and checks it runs now
// are left alone.
func TestClientAgentDropsChecksOfItsLastRun(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	ctx := context.Background()
	// The last run of client1 registered "old" (and a session is bound to
	// it); "manual" came through the catalog API.
	if err := srv.Register(ctx, &state.RegisterRequest{Node: "client1", Address: "127.0.0.1",
		Checks: []*state.HealthCheck{
			{CheckID: state.SerfCheckID, Status: state.HealthPassing},
			{CheckID: "old", Status: state.HealthPassing, Type: "ttl"},
			{CheckID: "kept", Status: state.HealthPassing, Type: "ttl"},
			{CheckID: "manual", Status: state.HealthPassing},
		}}); err != nil {
		t.Fatal(err)
	}
	code, body := do(t, "PUT", srv.URL+"/v1/session/create", `{"Node":"client1","NodeChecks":["old"]}`)
	if code != 200 {
		t.Fatalf("session create: %d %s", code, body)
	}
	var created struct{ ID string }
	if err := json.Unmarshal([]byte(body), &created); err != nil {
		t.Fatal(err)
	}

	pool := &livePool{}
	c := newClientAgent("client1", "dc1", "x", pool, hclog.NewNullLogger())
	clk := clocktest.NewFake(servertest.Epoch)
	ag := agent.New(agent.Config{Node: "client1", Clock: clk, Catalog: &agent.HTTPCatalog{Base: func() (string, error) {
		return "http://" + c.server(), nil
	}}})
	defer ag.Close()
	done := make(chan struct{})
	sctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); <-done }()
	go func() {
		defer close(done)
		c.settleChecks(sctx, ag, clk)
	}()
	// No server known yet: it waits and tries again.
	if err := clk.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := ag.RegisterCheck(ctx, &state.CheckDefinition{ID: "kept", Name: "kept", TTL: time.Minute, Status: state.HealthPassing}); err == nil {
		t.Fatal("registered a check with no server to write it through")
	}
	pool.set(fakePool{{Name: "node1", Addr: "127.0.0.1", Status: gossip.StatusAlive,
		Tags: map[string]string{"role": "server", "http": srv.Addr}}})
	if err := ag.RegisterCheck(ctx, &state.CheckDefinition{ID: "kept", Name: "kept", TTL: time.Minute, Status: state.HealthPassing}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(joinRetryFirst)
	<-done
	code, body = do(t, "GET", srv.URL+"/v1/health/node/client1", "")
	var checks []struct{ CheckID string }
	if err := json.Unmarshal([]byte(body), &checks); code != 200 || err != nil {
		t.Fatalf("node checks: %d %s %v", code, body, err)
	}
	var ids []string
	for _, c := range checks {
		ids = append(ids, c.CheckID)
	}
	if got := strings.Join(ids, " "); got != "kept manual serfHealth" {
		t.Fatalf("checks of client1 after the restart: %s", got)
	}
	if code, body := do(t, "GET", srv.URL+"/v1/session/info/"+created.ID, ""); code != 200 || body != "[]" {
		t.Fatalf("session bound to the dropped check: %d %s", code, body)
	}
}

// With a state file, a client agent that starts again registers its
// checks again before it drops stale ones: a session bound to a TTL check
// that still had time left lives on.
func TestClientAgentRestoresItsChecks(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	ctx := context.Background()
	if err := srv.Register(ctx, &state.RegisterRequest{Node: "client1", Address: "127.0.0.1",
		Check: &state.HealthCheck{CheckID: state.SerfCheckID, Status: state.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	pool := fakePool{{Name: "node1", Addr: "127.0.0.1", Status: gossip.StatusAlive,
		Tags: map[string]string{"role": "server", "http": srv.Addr}}}
	file := filepath.Join(t.TempDir(), clientStateFile)
	clk := clocktest.NewFake(servertest.Epoch)
	start := func() (*clientAgent, *agent.Agent) {
		c := newClientAgent("client1", "dc1", "x", pool, hclog.NewNullLogger())
		ag := agent.New(agent.Config{Node: "client1", Clock: clk, StateFile: file, Catalog: &agent.HTTPCatalog{Base: func() (string, error) {
			return "http://" + c.server(), nil
		}}})
		return c, ag
	}
	c, ag := start()
	c.settleChecks(ctx, ag, clk)
	if err := ag.RegisterCheck(ctx, &state.CheckDefinition{ID: "app", Name: "app", TTL: time.Minute, Status: state.HealthPassing}); err != nil {
		t.Fatal(err)
	}
	code, body := do(t, "PUT", srv.URL+"/v1/session/create", `{"Node":"client1","NodeChecks":["app"]}`)
	if code != 200 {
		t.Fatalf("session create: %d %s", code, body)
	}
	var created struct{ ID string }
	if err := json.Unmarshal([]byte(body), &created); err != nil {
		t.Fatal(err)
	}
	ag.Close()

	c, ag = start()
	defer ag.Close()
	c.settleChecks(ctx, ag, clk)
	if got := ag.Checks(); len(got) != 1 || got[0].CheckID != "app" || got[0].Status != state.HealthPassing {
		t.Fatalf("checks after the restart: %+v", got)
	}
	if code, body := do(t, "GET", srv.URL+"/v1/session/info/"+created.ID, ""); code != 200 || body == "[]" {
		t.Fatalf("session bound to the restored check: %d %s", code, body)
	}
}

func TestForwardBound(t *testing.T) {
	for _, c := range []struct {
		url  string
		want time.Duration
	}{
		{"/v1/kv/k", forwardTimeout},
		{"/v1/kv/k?wait=1m", forwardTimeout}, // no index: not blocking
		{"/v1/kv/k?index=5", 5*time.Minute + 5*time.Minute/16 + forwardTimeout},
		{"/v1/kv/k?index=5&wait=16s", 17*time.Second + forwardTimeout},
		{"/v1/kv/k?index=5&wait=1h", 10*time.Minute + 10*time.Minute/16 + forwardTimeout},
		{"/v1/kv/k?index=5&wait=soon", 5*time.Minute + 5*time.Minute/16 + forwardTimeout},
		{"/v1/snapshot", snapshotForwardTimeout},
	} {
		r := httptest.NewRequest("GET", c.url, nil)
		if got := forwardBound(r); got != c.want {
			t.Errorf("%s: %v, want %v", c.url, got, c.want)
		}
	}
}

// Finding: a client agent never wrote its checks and services again after
// its node was deregistered through the catalog API and registered again
// by the leader (with serfHealth alone), nor after a -dev server restarted:
// a TTL check came back only when its status next changed, a service
// never, and sessions could no longer be bound to them. keepRegistered
// watches the node and writes them again.
func TestClientAgentWritesItsChecksBackWhenTheNodeComesBack(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	ctx := context.Background()
	serf := &state.RegisterRequest{Node: "client1", Address: "127.0.0.1",
		Check: &state.HealthCheck{CheckID: state.SerfCheckID, Status: state.HealthPassing}}
	if err := srv.Register(ctx, serf); err != nil {
		t.Fatal(err)
	}
	pool := fakePool{{Name: "node1", Addr: "127.0.0.1", Status: gossip.StatusAlive,
		Tags: map[string]string{"role": "server", "http": srv.Addr}}}
	c := newClientAgent("client1", "dc1", "x", pool, hclog.NewNullLogger())
	clk := clocktest.NewFake(servertest.Epoch)
	ag := agent.New(agent.Config{Node: "client1", Clock: clk, Catalog: &agent.HTTPCatalog{Base: func() (string, error) {
		return "http://" + c.server(), nil
	}}})
	defer ag.Close()
	c.settleChecks(ctx, ag, clk)
	if err := ag.RegisterCheck(ctx, &state.CheckDefinition{ID: "hb", Name: "hb", TTL: time.Minute, Status: state.HealthPassing}); err != nil {
		t.Fatal(err)
	}
	if err := ag.RegisterService(ctx, &state.Service{ID: "web-1", Service: "web", Port: 80}, nil, false); err != nil {
		t.Fatal(err)
	}

	kctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.keepRegistered(kctx, ag, clk)
	}()
	defer func() { cancel(); <-done }()

	// What the leader does when the node is deregistered while its agent
	// lives: the node goes, with its checks and services; gossip puts it
	// back with serfHealth.
	if err := srv.Deregister(ctx, &state.DeregisterRequest{Node: "client1"}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Register(ctx, serf); err != nil {
		t.Fatal(err)
	}
	waitCtx, stop := context.WithTimeout(ctx, time.Minute) // a bound on a hang, not a timing
	defer stop()
	for {
		ws := watch.NewSet()
		st := srv.State()
		_, checks := st.NodeChecks(ws, "client1")
		_, _, svcs := st.NodeInfo(ws, "client1")
		ids := []string{}
		for _, ck := range checks {
			ids = append(ids, ck.CheckID)
		}
		if strings.Join(ids, " ") == "hb serfHealth" && len(svcs) == 1 && svcs[0].ID == "web-1" {
			break
		}
		if err := ws.WatchCtx(waitCtx); err != nil {
			t.Fatalf("the agent's check and service did not come back: checks %v, services %d", ids, len(svcs))
		}
	}
}

// Finding: a client agent joined its -join addresses once. A server that
// left (or was forgotten after a long outage) and came back with a fresh
// pool did not know the client, the client never tried the server again
// (a pool retries failed members, not ones that left), and the server,
// once its grace period was over, deregistered the live client's node and
// dropped its sessions. keepJoined joins the -join addresses again when
// no server is alive in the pool.
func TestClientAgentRejoinsAServerThatCameBack(t *testing.T) {
	newServerPool := func(port int) *gossip.Pool {
		p, err := gossip.New(gossip.Config{Name: "srv1", BindAddr: "127.0.0.1", BindPort: port, Profile: gossip.ProfileFast,
			Tags: map[string]string{"role": "server"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Shutdown() })
		return p
	}
	memberStatus := func(p *gossip.Pool, name string) gossip.Status {
		m, ok := p.Member(name)
		if !ok {
			return gossip.StatusNone
		}
		return m.Status
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond) // gossip runs on real time
		}
	}

	srv := newServerPool(0)
	addr := srv.Addr()
	_, port, _ := net.SplitHostPort(addr)
	// The pool's own reconnects (of failed members) are kept out of the
	// way: only keepJoined may bring the client back.
	cli, err := gossip.New(gossip.Config{Name: "cli1", BindAddr: "127.0.0.1", Profile: gossip.ProfileFast,
		Tags: map[string]string{"role": "client"}, ReconnectInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Shutdown()
	if _, err := cli.Join([]string{addr}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := clocktest.NewFake(time.Unix(0, 0))
	done := make(chan struct{})
	go func() {
		keepJoined(ctx, cli, []string{addr}, clk, hclog.NewNullLogger())
		close(done)
	}()

	// The server leaves and comes back on the same address, knowing nobody.
	if err := srv.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	waitFor("the client to see the server go", func() bool { return !hasLiveServer(cli.Members()) })
	var p int
	fmt.Sscan(port, &p)
	srv2 := newServerPool(p)
	if memberStatus(srv2, "cli1") != gossip.StatusNone {
		t.Fatal("the new server pool already knows the client")
	}

	// One look, a reconnect interval on, and the client is back.
	if err := clk.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(cli.Timing().Reconnect)
	waitFor("the server to know the client again", func() bool { return memberStatus(srv2, "cli1") == gossip.StatusAlive })
	waitFor("the client to see the server alive", func() bool { return hasLiveServer(cli.Members()) })
	cancel()
	<-done
}

// Finding (storage audit): two client agents on one data directory (as
// two started without -data-dir share the default one) both ran, each
// overwriting the other's registrations file, and a restart brought back
// the other agent's services under its own node. The second is refused.
func TestClientAgentDataDirIsLocked(t *testing.T) {
	dir := t.TempDir()
	args := func(node string) []string {
		return []string{"agent", "-server=false", "-node", node, "-data-dir", dir, "-http-addr", "127.0.0.1:0",
			"-serf-addr", "127.0.0.1:0", "-gossip-profile", "fast"}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := newLockLines()
	first := make(chan error, 1)
	go func() { first <- Run(ctx, args("c1"), Stdio{Out: out, Err: io.Discard}) }()
	out.waitLine(t, "the first agent running", func(l string) bool { return strings.Contains(l, "holdfast agent running") })

	var errb strings.Builder
	err := Run(context.Background(), args("c2"), Stdio{Out: io.Discard, Err: &errb})
	if err == nil || !strings.Contains(err.Error(), "already in use by pid") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("second client agent on %s: %v", dir, err)
	}
	cancel()
	if err := <-first; err != nil {
		t.Fatalf("first agent: %v", err)
	}
	// Once the first has stopped, the directory is free again.
	ctx2, cancel2 := context.WithCancel(context.Background())
	out2 := newLockLines()
	again := make(chan error, 1)
	go func() { again <- Run(ctx2, args("c2"), Stdio{Out: out2, Err: io.Discard}) }()
	out2.waitLine(t, "the agent running again", func(l string) bool { return strings.Contains(l, "holdfast agent running") })
	cancel2()
	if err := <-again; err != nil {
		t.Fatalf("agent after the first stopped: %v", err)
	}
}

// The forward's bound is on the server's answer's header: a body that
// streams on past it is not cut (the stall bound's audit: a 34 MB
// ?recurse read at 400 KiB/s through a client agent was cut at 30 s),
// and a server that sends no header is still given up on at the bound.
func TestClientAgentForwardBoundIsOnTheHeader(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/kv/mute" {
			<-r.Context().Done() // never answers
			return
		}
		for i := 0; i < 6; i++ {
			fmt.Fprintf(w, "piece %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond) // the whole body takes 600 ms, past the bound
		}
	}))
	defer upstream.Close()
	c := newClientAgent("client1", "dc1", "x", fakePool{{Name: "node1", Addr: "127.0.0.1",
		Status: gossip.StatusAlive, Tags: map[string]string{"role": "server", "http": upstream.Listener.Addr().String()}}}, hclog.NewNullLogger())
	c.forwardBound = func(*http.Request) time.Duration { return 250 * time.Millisecond }
	hs := httptest.NewServer(c)
	defer hs.Close()

	// A listing streams (a single key's value, at most 512 KiB, is read
	// whole within the bound).
	code, body := do(t, "GET", hs.URL+"/v1/kv/slow?recurse", "")
	if code != 200 || !strings.HasSuffix(body, "piece 5") {
		t.Fatalf("slow body through the client agent: %d %q, want all six pieces", code, body)
	}
	code, body = do(t, "GET", hs.URL+"/v1/kv/mute", "")
	if code != 500 || !strings.HasSuffix(body, "failed: no answer in time") {
		t.Fatalf("a server that never answers: %d %q, want the forward given up with no answer in time", code, body)
	}
}

// TestForwardsReuseConnections: 32 callers forwarding at once through an
// agent keep their connections to the server: net/http's default of two
// idle connections per host had each forward beyond two dial a connection
// and close it after one request.
func TestForwardsReuseConnections(t *testing.T) {
	var dialled atomic.Int64
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "true")
	}))
	upstream.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			dialled.Add(1)
		}
	}
	upstream.Start()
	defer upstream.Close()
	c := newClientAgent("client1", "dc1", "x", fakePool{{Name: "node1", Addr: "127.0.0.1",
		Status: gossip.StatusAlive, Tags: map[string]string{"role": "server", "http": upstream.Listener.Addr().String()}}}, hclog.NewNullLogger())
	hs := httptest.NewServer(c)
	defer hs.Close()

	const callers, each = 32, 20
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < each; j++ {
				req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/v1/kv/k%d", hs.URL, i), strings.NewReader("v"))
				resp, err := hc.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}(i)
	}
	wg.Wait()
	// One per caller, and a few more: net/http dials a new connection for
	// a request that finds none idle while another is being put back
	// (36 of 640 under the race detector). net/http's default of two idle
	// connections per host dialled 316-330.
	if n := dialled.Load(); n > 2*callers {
		t.Fatalf("%d forwards by %d callers dialled %d connections to the server; want about one per caller", callers*each, callers, n)
	}
}

// A client agent sets aside a server that answered "No cluster leader"
// (one out of its cluster, or of a cluster that lost its majority), and
// sends the request, and the next ones, to another: the server applied
// nothing. A server of another datacenter is never picked. (The cluster
// audit: a client agent kept failing every request on one such server.)
func TestClientAgentLeavesServerWithoutLeader(t *testing.T) {
	var hitsA, hitsB, hitsDC2 atomic.Int64
	leaderless := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsA.Add(1)
		http.Error(w, "No cluster leader", http.StatusInternalServerError)
	}))
	defer leaderless.Close()
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsB.Add(1)
		io.WriteString(w, "true")
	}))
	defer healthy.Close()
	otherDC := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsDC2.Add(1)
		io.WriteString(w, "true")
	}))
	defer otherDC.Close()
	srv := func(name, addr, dc string) gossip.Member {
		return gossip.Member{Name: name, Addr: "127.0.0.1", Status: gossip.StatusAlive,
			Tags: map[string]string{"role": "server", "dc": dc, "http": addr}}
	}
	c := newClientAgent("client1", "dc1", "x", fakePool{
		srv("a-dc2", otherDC.Listener.Addr().String(), "dc2"),
		srv("b-leaderless", leaderless.Listener.Addr().String(), "dc1"),
		srv("c-healthy", healthy.Listener.Addr().String(), "dc1"),
	}, hclog.NewNullLogger())
	hs := httptest.NewServer(c)
	defer hs.Close()

	for i := 0; i < 4; i++ {
		if code, body := do(t, "PUT", hs.URL+"/v1/kv/k", "v"); code != 200 || body != "true" {
			t.Fatalf("request %d (the first refused by the leaderless server): %d %q, want the healthy server's", i+1, code, body)
		}
	}
	if a, b, d := hitsA.Load(), hitsB.Load(), hitsDC2.Load(); a != 1 || b != 4 || d != 0 {
		t.Fatalf("hits: leaderless %d, healthy %d, other datacenter %d; want 1, 4, 0", a, b, d)
	}
}

func TestParseGossipKey(t *testing.T) {
	k32 := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	k16 := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, empty := write("good", k32+"\n"), write("empty", " \n")
	for _, c := range []struct {
		encrypt, file string
		size          int
		err           string
	}{
		{"", "", 0, ""},
		{k32, "", 32, ""},
		{k16, "", 16, ""},
		{"", good, 32, ""},
		{k32, good, 0, "with -encrypt or -encrypt-file, not both"},
		{"not base64!", "", 0, "-encrypt is not base64 (holdfast keygen makes a key)"},
		{base64.StdEncoding.EncodeToString([]byte("short")), "", 0, "-encrypt decodes to 5 bytes; a gossip key is 16, 24 or 32 bytes"},
		{"", empty, 0, "the key in -encrypt-file " + empty + " is empty"},
		{"", filepath.Join(dir, "missing"), 0, "reading -encrypt-file"},
	} {
		key, err := parseGossipKey(c.encrypt, c.file)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("parseGossipKey(%q, %q) = %v, want %q", c.encrypt, c.file, err, c.err)
			}
			continue
		}
		if err != nil || len(key) != c.size {
			t.Errorf("parseGossipKey(%q, %q) = %d bytes, %v; want %d", c.encrypt, c.file, len(key), err, c.size)
		}
	}
}

// holdfast keygen prints a fresh 32-byte key each time, one -encrypt takes.
func TestKeygen(t *testing.T) {
	var keys []string
	for i := 0; i < 2; i++ {
		var out, errb bytes.Buffer
		if err := Run(context.Background(), []string{"keygen"}, Stdio{Out: &out, Err: &errb}); err != nil {
			t.Fatalf("keygen: %v %s", err, errb.String())
		}
		k := strings.TrimSpace(out.String())
		if key, err := parseGossipKey(k, ""); err != nil || len(key) != 32 {
			t.Fatalf("keygen printed %q: %d bytes, %v", k, len(key), err)
		}
		keys = append(keys, k)
	}
	if keys[0] == keys[1] {
		t.Fatal("keygen printed the same key twice")
	}
}
