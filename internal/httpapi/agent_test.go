package httpapi

import (
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/agent"
	"github.com/holdfast/holdfast/internal/state"
)

// agentEnv is newEnv with a real agent writing through the fake backend.
func agentEnv(t *testing.T) *env {
	e := newEnv(t)
	ag := agent.New(agent.Config{Node: testNode, Clock: e.clk, Catalog: e.b})
	t.Cleanup(func() { ag.Close() })
	e.h = New(e.b, Options{Clock: e.clk, Agent: ag})
	return e
}

func TestAgentCheckRegisterAndUpdate(t *testing.T) {
	e := agentEnv(t)
	e.do("PUT", "/v1/agent/check/register", `{"ID":"app","Name":"App","Notes":"n","TTL":"15s","Status":"passing"}`).want(t, 200, "")
	e.do("PUT", "/v1/agent/check/warn/app?note=slow", "").want(t, 200, "")

	var checks map[string]*state.HealthCheck
	e.do("GET", "/v1/agent/checks", "").want(t, 200, "*").json(t, &checks)
	c := checks["app"]
	if c == nil || c.Status != "warning" || c.Output != "slow" || c.Name != "App" || c.Notes != "n" ||
		c.Type != "ttl" || c.Definition.TTL != "15s" || c.Node != testNode || c.ServiceTags == nil {
		t.Fatalf("agent check %+v", c)
	}
	if cc := e.b.store.Check(testNode, "app"); cc == nil || cc.Status != "warning" {
		t.Fatalf("catalog check %+v", cc)
	}

	e.do("PUT", "/v1/agent/check/update/app", `{"Status":"passing","Output":"ok"}`).want(t, 200, "")
	e.do("PUT", "/v1/agent/check/fail/app", "").want(t, 200, "")
	if cc := e.b.store.Check(testNode, "app"); cc.Status != "critical" {
		t.Fatalf("after fail: %+v", cc)
	}
	// Durations may be numbers of nanoseconds, as in Consul.
	e.do("PUT", "/v1/agent/check/register", `{"Name":"tcp","TCP":"127.0.0.1:1","Interval":5000000000,"Timeout":1e9}`).want(t, 200, "")
	e.do("GET", "/v1/agent/checks", "").want(t, 200, "*").json(t, &checks)
	if c := checks["tcp"]; c == nil || c.Definition.Interval != "5s" || c.Definition.Timeout != "1s" {
		t.Fatalf("tcp check %+v", c)
	}

	e.do("PUT", "/v1/agent/check/deregister/app", "").want(t, 200, "")
	if cc := e.b.store.Check(testNode, "app"); cc != nil {
		t.Fatalf("deregistered check still in the catalog: %+v", cc)
	}
	e.do("GET", "/v1/agent/check/pass/tcp", "").want(t, 405, "method GET not allowed")
}

func TestAgentCheckErrors(t *testing.T) {
	e := agentEnv(t)
	cases := []struct{ path, body, want string }{
		{"/v1/agent/check/register", `{"Name":"x"}`,
			`Check "x" has no type: give one of TTL, HTTP (with Interval) or TCP (with Interval); holdfast runs no script, Docker, gRPC, UDP, H2PING, OS-service or alias checks`},
		{"/v1/agent/check/register", `{"Name":"x","Args":["/bin/true"],"Interval":"10s"}`,
			`Check "x" is a script check: holdfast runs only TTL, HTTP and TCP checks`},
		{"/v1/agent/check/register", `{"Name":"x","GRPC":"127.0.0.1:9","Interval":"10s"}`,
			`Check "x" is a gRPC check: holdfast runs only TTL, HTTP and TCP checks`},
		{"/v1/agent/check/register", `{"Name":"x","HTTP":"http://127.0.0.1:1/","Interval":"100ms"}`,
			`Interval 100ms of check "x" is below the minimum of 1s`},
		{"/v1/agent/check/register", `{"Name":"x","TTL":"soon"}`,
			`Request decode failed: invalid duration "soon": time: invalid duration "soon"`},
		{"/v1/agent/check/register", `{"Name":"x","TTL":"10s","HTTP":"http://127.0.0.1/","Interval":"10s"}`,
			`Check "x" has more than one type (TTL, HTTP): give only one of TTL, HTTP and TCP`},
		{"/v1/agent/check/register", ``, `Missing check definition: the request body is empty`},
		{"/v1/agent/check/update/x", `{"Status":"fine"}`, `Invalid check status: 'fine': use passing, warning or critical`},
		{"/v1/agent/service/register", `{"Name":"web","Kind":"connect-proxy"}`,
			`Service kind "connect-proxy" is not supported: holdfast registers only typical services`},
		{"/v1/agent/service/register", `{"Port":80}`, `Missing service name`},
		{"/v1/agent/service/register", `{"Name":"web","Check":{"TCP":"127.0.0.1:1","Interval":"1ms"}}`,
			`Interval 1ms of check "service:web" is below the minimum of 1s (in the definition of service "web")`},
	}
	for _, c := range cases {
		e.do("PUT", c.path, c.body).want(t, 400, c.want)
	}
	e.do("PUT", "/v1/agent/check/pass/nope", "").want(t, 404, `Unknown check ID "nope": no such check is registered on this agent`)
	e.do("PUT", "/v1/agent/service/deregister/nope", "").want(t, 404, `Unknown service ID "nope": no such service is registered on this agent`)
	e.do("PUT", "/v1/agent/check/register", `{"Name":"tcp","TCP":"127.0.0.1:1","Interval":"10s"}`).want(t, 200, "")
	e.do("PUT", "/v1/agent/check/pass/tcp", "").want(t, 400, `Check "tcp" is a TCP check, not a TTL check: only TTL checks can be updated`)
	// Nothing the refused requests named reached the catalog.
	_, all := e.b.store.ChecksInState(nil, state.HealthAny)
	if len(all) != 2 { // serfHealth and tcp
		t.Fatalf("catalog checks after refused requests: %d", len(all))
	}
}

func TestAgentRoutesWithoutAnAgent(t *testing.T) {
	e := newEnv(t)
	e.do("GET", "/v1/agent/checks", "").want(t, 501, "This server runs no local agent: agent checks and services are not available here")
	e.do("PUT", "/v1/agent/service/register", `{"Name":"web"}`).want(t, 501, "*")
}

func TestAgentServices(t *testing.T) {
	e := agentEnv(t)
	e.do("PUT", "/v1/agent/service/register", `{"ID":"web-1","Name":"web","Tags":["v1"],"Port":8080,
		"Meta":{"a":"b"},"Check":{"TTL":"30s","Status":"passing"},"Checks":[{"CheckID":"web-tcp","TCP":"127.0.0.1:1","Interval":"10s"}]}`).want(t, 200, "")
	var svcs map[string]*agentServiceJSON
	e.do("GET", "/v1/agent/services", "").want(t, 200, "*").json(t, &svcs)
	if s := svcs["web-1"]; s == nil || s.Service != "web" || s.Port != 8080 || s.Meta["a"] != "b" || s.Weights.Passing != 1 || s.Datacenter != testDC {
		t.Fatalf("agent services %+v", svcs)
	}
	var checks map[string]*state.HealthCheck
	e.do("GET", "/v1/agent/checks", "").want(t, 200, "*").json(t, &checks)
	if c := checks["service:web-1:1"]; c == nil || c.ServiceName != "web" || c.Status != "passing" || len(c.ServiceTags) != 1 {
		t.Fatalf("service check %+v", checks)
	}
	if checks["web-tcp"] == nil {
		t.Fatalf("second service check missing: %+v", checks)
	}
	e.do("PUT", "/v1/agent/service/deregister/web-1", "").want(t, 200, "")
	e.do("GET", "/v1/agent/services", "").want(t, 200, "{}")
	e.do("GET", "/v1/catalog/services", "").want(t, 200, "{}")
}

// registerWeb puts three instances of web in the catalog: web-1 passing,
// web-2 warning, web-3 critical; and db with no checks.
func registerWeb(t *testing.T, e *env) {
	t.Helper()
	for _, body := range []string{
		`{"Node":"node1","SkipNodeUpdate":true,"Service":{"ID":"web-1","Service":"web","Tags":["v1"],"Port":80},"Check":{"CheckID":"c1","ServiceID":"web-1","Status":"passing"}}`,
		`{"Node":"node1","SkipNodeUpdate":true,"Service":{"ID":"web-2","Service":"web","Tags":["v2"],"Port":81},"Check":{"CheckID":"c2","ServiceID":"web-2","Status":"warning"}}`,
		`{"Node":"node2","Address":"10.0.0.2","Service":{"ID":"web-3","Service":"web","Port":80},"Checks":[{"CheckID":"serfHealth","Status":"passing"},{"CheckID":"c3","ServiceID":"web-3","Status":"critical"}]}`,
		`{"Node":"node2","SkipNodeUpdate":true,"Service":{"ID":"db","Service":"db"}}`,
	} {
		e.do("PUT", "/v1/catalog/register", body).want(t, 200, "true")
	}
}

func entryIDs(es []serviceEntryJSON) string {
	var out []string
	for _, x := range es {
		out = append(out, x.Node.Node+"/"+x.Service.ID)
	}
	return strings.Join(out, ",")
}

func TestHealthService(t *testing.T) {
	e := newEnv(t)
	registerWeb(t, e)
	var es []serviceEntryJSON
	r := e.do("GET", "/v1/health/service/web", "").want(t, 200, "*")
	r.json(t, &es)
	if got := entryIDs(es); got != "node1/web-1,node1/web-2,node2/web-3" {
		t.Fatalf("all: %s", got)
	}
	if len(es[0].Checks) != 2 || es[0].Checks[0].CheckID != "serfHealth" || es[0].Checks[1].CheckID != "c1" {
		t.Fatalf("checks of web-1: %+v", es[0].Checks)
	}
	if es[0].Node.Datacenter != testDC || es[0].Service.CreateIndex == 0 {
		t.Fatalf("entry %+v %+v", es[0].Node, es[0].Service)
	}
	if r.Header.Get("X-Consul-Index") == "" {
		t.Fatal("no X-Consul-Index")
	}
	for q, want := range map[string]string{
		"?passing":             "node1/web-1",
		"?passing=1":           "node1/web-1",
		"?passing=false":       "node1/web-1,node1/web-2,node2/web-3",
		"?tag=v2":              "node1/web-2",
		"?tag=V1&passing=true": "node1/web-1",
	} {
		es = nil
		e.do("GET", "/v1/health/service/web"+q, "").want(t, 200, "*").json(t, &es)
		if got := entryIDs(es); got != want {
			t.Errorf("%s: %q, want %q", q, got, want)
		}
	}
	e.do("GET", "/v1/health/service/web?passing=maybe", "").want(t, 400, `Invalid value "maybe" for ?passing: use true or false`)
	e.do("GET", "/v1/health/service/web?filter=Service.Port==80", "").want(t, 400, "Filter expressions (?filter=) are not supported by holdfast")
	e.do("GET", "/v1/health/service/nope", "").want(t, 200, "[]")
}

// A blocking ?passing reader wakes when an instance's check changes.
func TestHealthServiceBlocks(t *testing.T) {
	e := newEnv(t)
	registerWeb(t, e)
	r := e.do("GET", "/v1/health/service/web?passing", "").want(t, 200, "*")
	ch := e.block("GET", "/v1/health/service/web?passing&index="+r.Header.Get("X-Consul-Index"))
	e.do("PUT", "/v1/catalog/register", `{"Node":"node1","SkipNodeUpdate":true,"Check":{"CheckID":"c2","ServiceID":"web-2","Status":"passing"}}`).want(t, 200, "true")
	var es []serviceEntryJSON
	(<-ch).want(t, 200, "*").json(t, &es)
	if got := entryIDs(es); got != "node1/web-1,node1/web-2" {
		t.Fatalf("after web-2 passed: %s", got)
	}
}

func TestHealthChecksAndState(t *testing.T) {
	e := newEnv(t)
	registerWeb(t, e)
	var cs []*state.HealthCheck
	e.do("GET", "/v1/health/checks/web", "").want(t, 200, "*").json(t, &cs)
	if len(cs) != 3 || cs[0].CheckID != "c1" || cs[2].CheckID != "c3" || cs[0].ServiceName != "web" {
		t.Fatalf("health checks: %+v", cs)
	}
	e.do("GET", "/v1/health/checks/db", "").want(t, 200, "[]")
	for st, n := range map[string]int{"any": 5, "passing": 3, "warning": 1, "critical": 1} {
		cs = nil
		e.do("GET", "/v1/health/state/"+st, "").want(t, 200, "*").json(t, &cs)
		if len(cs) != n {
			t.Errorf("state %s: %d checks, want %d", st, len(cs), n)
		}
	}
	e.do("GET", "/v1/health/state/sick", "").want(t, 400, `Invalid check state "sick": use any, passing, warning or critical`)
	e.do("GET", "/v1/health/state/", "").want(t, 400, `Missing check state: use any, passing, warning or critical`)
}

func TestCatalogServices(t *testing.T) {
	e := newEnv(t)
	registerWeb(t, e)
	e.do("GET", "/v1/catalog/services", "").want(t, 200, `{"db":[],"web":["v1","v2"]}`)
	var out []*catalogServiceJSON
	e.do("GET", "/v1/catalog/service/web?tag=v1", "").want(t, 200, "*").json(t, &out)
	if len(out) != 1 || out[0].ServiceID != "web-1" || out[0].Node != "node1" || out[0].Address != "127.0.0.1" ||
		out[0].ServicePort != 80 || out[0].Datacenter != testDC {
		t.Fatalf("catalog service: %+v", out)
	}
	e.do("GET", "/v1/catalog/service/nope", "").want(t, 200, "[]")
}

func TestQueryExecute(t *testing.T) {
	e := newEnv(t)
	registerWeb(t, e)
	var created struct{ ID string }
	e.do("POST", "/v1/query", `{"Name":"web-any","Service":{"Service":"web"}}`).want(t, 200, "*").json(t, &created)
	e.do("POST", "/v1/query", `{"Name":"web-ok","Service":{"Service":"web","OnlyPassing":true}}`).want(t, 200, "*")
	e.do("POST", "/v1/query", `{"Name":"web-not-v2","Service":{"Service":"web","Tags":["!v2"]}}`).want(t, 200, "*")
	run := func(path string) string {
		t.Helper()
		var out executeJSON
		e.do("GET", path, "").want(t, 200, "*").json(t, &out)
		if out.Service != "web" || out.Datacenter != testDC || out.Failovers != 0 {
			t.Fatalf("execute %s: %+v", path, out)
		}
		return entryIDs(out.Nodes)
	}
	for path, want := range map[string]string{
		"/v1/query/" + created.ID + "/execute": "node1/web-1,node1/web-2",
		"/v1/query/web-any/execute":            "node1/web-1,node1/web-2",
		"/v1/query/WEB-ANY/execute?limit=1":    "node1/web-1",
		"/v1/query/web-ok/execute":             "node1/web-1",
		"/v1/query/web-not-v2/execute":         "node1/web-1",
	} {
		if got := run(path); got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
	e.do("GET", "/v1/query/nope/execute", "").want(t, 404, "Query not found")
	e.do("GET", "/v1/query/web-any/execute?limit=x", "").want(t, 400, `Invalid ?limit "x": give a whole number of results`)
	// A node check going critical takes every instance on it out.
	e.do("PUT", "/v1/catalog/register", `{"Node":"node1","SkipNodeUpdate":true,"Check":{"CheckID":"serfHealth","Status":"critical"}}`).want(t, 200, "true")
	var out executeJSON
	e.do("GET", "/v1/query/web-any/execute", "").want(t, 200, "*").json(t, &out)
	if len(out.Nodes) != 0 || out.Nodes == nil {
		t.Fatalf("execute with node1 critical: %+v", out.Nodes)
	}
}

func TestIsAgentPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/v1/agent/checks": true, "/v1/agent/services": true, "/v1/agent/check/register": true,
		"/v1/agent/check/pass/x": true, "/v1/agent/service/deregister/web": true,
		"/v1/agent/self": false, "/v1/agent/members": false, "/v1/catalog/services": false, "/v1/agent/checksx": false,
	} {
		if got := IsAgentPath(p); got != want {
			t.Errorf("IsAgentPath(%q) = %v, want %v", p, got, want)
		}
	}
}

// Re-registering a service keeps the checks it no longer lists, unless
// ?replace-existing-checks, which removes them (and their sessions).
func TestAgentServiceReplaceExistingChecks(t *testing.T) {
	e := agentEnv(t)
	def := `{"ID":"web","Name":"web","Checks":[{"CheckID":"a","TTL":"30s","Status":"passing"},{"CheckID":"b","TTL":"30s","Status":"passing"}]}`
	e.do("PUT", "/v1/agent/service/register", def).want(t, 200, "")
	sid := e.createSession(`{"NodeChecks":["serfHealth"],"ServiceChecks":[{"ID":"b"}]}`)
	only := `{"ID":"web","Name":"web","Checks":[{"CheckID":"a","TTL":"30s","Status":"passing"}]}`
	e.do("PUT", "/v1/agent/service/register", only).want(t, 200, "")
	if e.b.store.Check(testNode, "b") == nil {
		t.Fatal("check b removed without ?replace-existing-checks")
	}
	e.do("PUT", "/v1/agent/service/register?replace-existing-checks=true", only).want(t, 200, "")
	if e.b.store.Check(testNode, "b") != nil || e.b.store.Check(testNode, "a") == nil {
		t.Fatal("?replace-existing-checks did not remove exactly the unlisted check")
	}
	if _, s := e.b.store.SessionGet(nil, sid); s != nil {
		t.Fatal("session bound to the removed check survived")
	}
	var checks map[string]*state.HealthCheck
	e.do("GET", "/v1/agent/checks", "").want(t, 200, "*").json(t, &checks)
	if len(checks) != 1 || checks["a"] == nil {
		t.Fatalf("agent checks: %+v", checks)
	}
}
