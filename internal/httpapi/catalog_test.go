package httpapi

import (
	"strings"
	"testing"
)

func TestCatalogRegisterAndRead(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/catalog/register", `{"Node":"web1","Address":"10.0.0.1","ID":"b1f2c3d4-0000-4000-8000-000000000001",
		"TaggedAddresses":{"lan":"10.0.0.1"},"NodeMeta":{"rack":"r1"},
		"Service":{"ID":"web-1","Service":"web","Tags":["v1"],"Port":80,"Weights":{"Passing":1}},
		"Check":{"CheckID":"web-alive","Name":"alive","Status":"passing","ServiceID":"web-1",
			"Definition":{"HTTP":"http://10.0.0.1/","Interval":"10s"}},
		"Checks":[{"CheckID":"disk","Status":"warning"}]}`).want(t, 200, "true")

	var nodes []map[string]interface{}
	r := e.do("GET", "/v1/catalog/nodes", "").want(t, 200, "*")
	r.json(t, &nodes)
	if len(nodes) != 2 || nodes[1]["Node"] != "web1" || nodes[1]["Address"] != "10.0.0.1" {
		t.Fatalf("nodes %v", nodes)
	}
	if r.Header.Get("X-Consul-Index") == "" {
		t.Fatal("no index")
	}

	var ns struct {
		Node     map[string]interface{}
		Services map[string]map[string]interface{}
	}
	e.do("GET", "/v1/catalog/node/web1", "").want(t, 200, "*").json(t, &ns)
	if ns.Node["Node"] != "web1" || ns.Services["web-1"]["Service"] != "web" || ns.Services["web-1"]["Port"] != float64(80) {
		t.Fatalf("node services %+v", ns)
	}
	e.do("GET", "/v1/catalog/node/nobody", "").want(t, 200, "null")
	e.do("GET", "/v1/catalog/node/", "").want(t, 400, "Missing node name")

	var checks []map[string]interface{}
	e.do("GET", "/v1/health/node/web1", "").want(t, 200, "*").json(t, &checks)
	if len(checks) != 2 {
		t.Fatalf("checks %v", checks)
	}
	byID := map[string]map[string]interface{}{}
	for _, c := range checks {
		byID[c["CheckID"].(string)] = c
	}
	if byID["web-alive"]["ServiceName"] != "web" || byID["disk"]["Status"] != "warning" {
		t.Fatalf("checks %v", byID)
	}
	if tags, ok := byID["disk"]["ServiceTags"].([]interface{}); !ok || len(tags) != 0 {
		t.Fatalf("ServiceTags %#v, want []", byID["disk"]["ServiceTags"])
	}
	e.do("GET", "/v1/health/node/nobody", "").want(t, 200, "[]")

	e.do("PUT", "/v1/catalog/deregister", `{"Node":"web1","ServiceID":"web-1"}`).want(t, 200, "true")
	e.do("GET", "/v1/health/node/web1", "").json(t, &checks)
	if len(checks) != 1 {
		t.Fatalf("after service deregister: %v", checks)
	}
	e.do("PUT", "/v1/catalog/deregister", `{"Node":"web1"}`).want(t, 200, "true")
	e.do("GET", "/v1/catalog/node/web1", "").want(t, 200, "null")
}

func TestCatalogRegisterErrors(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct{ body, want string }{
		{``, "Missing node registration: the request body is empty"},
		{`{"Address":"1.2.3.4"}`, "Must provide node"},
		{`{"Node":"n"}`, "Must provide address if SkipNodeUpdate is not set"},
		{`{"Node":"n","Address":"a","Check":{"Node":"m","CheckID":"c"}}`, `Check "c" belongs to node "m", not "n"`},
		{`{"Node":"n","Address":"a","Check":{"CheckID":"c","Status":"sad"}}`,
			`Invalid check status "sad": must be passing, warning or critical`},
		{`{"Node":"n","Address":"a","Check":{"Status":"passing"}}`, "Must provide a CheckID"},
		{`{"Node":"n","Address":"a","Service":{"ID":"x"}}`, "Must provide service name"},
		{`{"Node":5}`, "*"},
	} {
		e.do("PUT", "/v1/catalog/register", c.body).want(t, 400, c.want)
	}
	e.do("PUT", "/v1/catalog/register", `{"Node":"node1","SkipNodeUpdate":true,"Check":{"CheckID":"x","Status":"passing"}}`).
		want(t, 200, "true")
	e.do("PUT", "/v1/catalog/deregister", ``).want(t, 400, "Must provide node")
	e.do("PUT", "/v1/catalog/deregister", `{"Node":"n","CheckID":"a","ServiceID":"b"}`).
		want(t, 400, "Give CheckID or ServiceID, not both")
	e.do("PUT", "/v1/catalog/deregister", `{"Node":"ghost"}`).want(t, 200, "true")
}

func TestAgentAndStatus(t *testing.T) {
	e := newEnv(t)
	var self struct {
		Config map[string]interface{}
		Stats  map[string]map[string]string
	}
	e.do("GET", "/v1/agent/self", "").want(t, 200, "*").json(t, &self)
	if self.Config["NodeName"] != testNode || self.Config["Datacenter"] != testDC {
		t.Fatalf("self %v", self)
	}
	// The backend's sections and the runtime's, side by side.
	if self.Stats["raft"]["state"] != "Leader" || self.Stats["holdfast"]["leader"] != "true" || self.Stats["runtime"]["os"] == "" {
		t.Fatalf("self Stats %v", self.Stats)
	}
	e.do("GET", "/v1/status/leader", "").want(t, 200, `"127.0.0.1:8300"`)
	e.do("GET", "/v1/status/peers", "").want(t, 200, `["127.0.0.1:8300"]`)
}

// The README promises that ?filter is refused rather than ignored, and
// /v1/catalog/services, /v1/health/service and /v1/health/state do refuse
// it. The node listings answered 200 with everything, so a client asking
// for a subset got what it meant to exclude.
func TestCatalogNodeReadsRefuseFilter(t *testing.T) {
	e := newEnv(t)
	const want = "Filter expressions (?filter=) are not supported by holdfast"
	for _, p := range []string{
		"/v1/catalog/nodes?filter=Node%3D%3Dother",
		"/v1/catalog/node/" + testNode + "?filter=Service%3D%3Dweb",
		"/v1/health/node/" + testNode + "?filter=Status%3D%3Dcritical",
	} {
		r := e.do("GET", p, "")
		if r.Code != 400 || r.Body != want {
			t.Errorf("GET %s: %d %q, want 400 %q", p, r.Code, r.Body, want)
		}
	}
	// An empty filter is no filter.
	e.do("GET", "/v1/catalog/nodes?filter=", "").want(t, 200, "*")
}

// A registration or deregistration body names its datacenter. ?dc=other
// is refused with 400, but "Datacenter":"other" in the body was stored as
// is (register) or ignored (deregister), so a deregistration meant for
// another datacenter removed the local node of that name, with its
// sessions. Consul fills in its own datacenter when none is given and
// forwards the rest; holdfast serves one datacenter and must refuse them.
func TestCatalogBodyDatacenter(t *testing.T) {
	e := newEnv(t)
	const unknown = `Unknown datacenter "dc9": this server only serves "dc1"`
	e.do("PUT", "/v1/catalog/register", `{"Node":"far","Address":"10.0.0.9","Datacenter":"dc9"}`).want(t, 400, unknown)
	e.do("GET", "/v1/catalog/node/far", "").want(t, 200, "null")

	// No datacenter, or ours in any case: the node is ours, and says so.
	e.do("PUT", "/v1/catalog/register", `{"Node":"web1","Address":"10.0.0.1"}`).want(t, 200, "true")
	e.do("PUT", "/v1/catalog/register", `{"Node":"web2","Address":"10.0.0.2","Datacenter":"DC1"}`).want(t, 200, "true")
	var nodes []struct{ Node, Datacenter string }
	e.do("GET", "/v1/catalog/nodes", "").want(t, 200, "*").json(t, &nodes)
	for _, n := range nodes {
		if n.Datacenter != testDC {
			t.Errorf("node %s: Datacenter %q, want %q", n.Node, n.Datacenter, testDC)
		}
	}
	var ns struct{ Node struct{ Datacenter string } }
	e.do("GET", "/v1/catalog/node/web1", "").want(t, 200, "*").json(t, &ns)
	if ns.Node.Datacenter != testDC {
		t.Errorf("catalog/node/web1: Datacenter %q, want %q", ns.Node.Datacenter, testDC)
	}

	// A deregistration for another datacenter must not touch ours.
	id := e.createSession(`{"Node":"web1","NodeChecks":[]}`)
	e.do("PUT", "/v1/catalog/deregister", `{"Node":"web1","Datacenter":"dc9"}`).want(t, 400, unknown)
	e.do("GET", "/v1/catalog/node/web1", "").want(t, 200, "*")
	if r := e.do("GET", "/v1/session/info/"+id, ""); !strings.Contains(r.Body, id) {
		t.Fatalf("the session on web1 was invalidated: %s", r.Body)
	}
	e.do("PUT", "/v1/catalog/deregister", `{"Node":"web1","Datacenter":"dc1"}`).want(t, 200, "true")
	e.do("GET", "/v1/catalog/node/web1", "").want(t, 200, "null")
}
