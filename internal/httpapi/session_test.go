package httpapi

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

func TestSessionCreateDefaultsAndJSON(t *testing.T) {
	e := newEnv(t)
	id := e.createSession("")
	idx := e.b.index()
	want := `[{"ID":"` + id + `","Name":"","Node":"node1","LockDelay":15000000000,"Behavior":"release","TTL":"",` +
		`"NodeChecks":["serfHealth"],"ServiceChecks":null,"CreateIndex":` + u64(idx) + `,"ModifyIndex":` + u64(idx) + `}]`
	r := e.do("GET", "/v1/session/info/"+id, "").want(t, 200, want)
	if r.Header.Get("X-Consul-Index") != u64(idx) {
		t.Fatalf("index %s", r.Header.Get("X-Consul-Index"))
	}
	// An explicit JSON null body is all defaults too.
	e.createSession("null")
	e.createSession("  \n")
	e.do("GET", "/v1/session/list", "").want(t, 200, "*")
}

func TestSessionCreateBody(t *testing.T) {
	e := newEnv(t)
	id := e.createSession(`{"name":"n1","lockdelay":"1s","behavior":"delete","ttl":"30s","NodeChecks":[]}`)
	var out []map[string]interface{}
	e.do("GET", "/v1/session/info/"+id, "").want(t, 200, "*").json(t, &out)
	s := out[0]
	if s["Name"] != "n1" || s["LockDelay"] != float64(time.Second) || s["Behavior"] != "delete" ||
		s["TTL"] != "30s" || s["Node"] != testNode {
		t.Fatalf("session %v", s)
	}
	if nc, ok := s["NodeChecks"].([]interface{}); !ok || len(nc) != 0 {
		t.Fatalf("NodeChecks %#v, want []", s["NodeChecks"])
	}
}

func TestSessionLockDelayDecoding(t *testing.T) {
	for _, c := range []struct {
		body string
		want time.Duration
		err  string
	}{
		{`{}`, 15 * time.Second, ""},
		{`{"LockDelay":null}`, 15 * time.Second, ""},
		{`{"LockDelay":0}`, 0, ""},
		{`{"LockDelay":5}`, 5 * time.Second, ""},
		{`{"LockDelay":999}`, 999 * time.Second, ""},
		{`{"LockDelay":1000}`, 1000 * time.Nanosecond, ""},
		{`{"LockDelay":1500000000}`, 1500 * time.Millisecond, ""},
		{`{"LockDelay":1.5}`, time.Second, ""},
		{`{"LockDelay":1e3}`, time.Microsecond, ""},
		{`{"LockDelay":"15s"}`, 15 * time.Second, ""},
		{`{"LockDelay":"15000ms"}`, 15 * time.Second, ""},
		{`{"LockDelay":"20ns"}`, 20 * time.Second, ""},
		{`{"LockDelay":"0s"}`, 0, ""},
		{`{"lockDELAY":"2s"}`, 2 * time.Second, ""},
		{`{"LockDelay":"20"}`, 0, `Request decode failed: time: missing unit in duration "20"`},
		{`{"LockDelay":"soon"}`, 0, `Request decode failed: time: invalid duration "soon"`},
		{`{"LockDelay":-1}`, 0, "Request decode failed: LockDelay -1ns must not be negative"},
		{`{"LockDelay":"-5s"}`, 0, "Request decode failed: LockDelay -5s must not be negative"},
		{`{"LockDelay":1e30}`, 0, "Request decode failed: LockDelay 1e30 is out of range"},
		{`{"LockDelay":99999999999999999999}`, 0, "Request decode failed: LockDelay 99999999999999999999 is out of range"},
		{`{"LockDelay":true}`, 0, "Request decode failed: " + errLockDelayType.Error()},
		{`{"LockDelay":[1]}`, 0, "Request decode failed: " + errLockDelayType.Error()},
	} {
		s, err := decodeSessionCreate([]byte(c.body), testNode)
		if c.err != "" {
			if err == nil || err.Error() != c.err || KindOf(err) != KindInvalid {
				t.Errorf("%s: err %v, want %q", c.body, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if s.LockDelay != c.want {
			t.Errorf("%s: LockDelay %v, want %v", c.body, s.LockDelay, c.want)
		}
	}
}

func TestSessionCheckFixups(t *testing.T) {
	serf := state.SerfCheckID
	for _, c := range []struct {
		body string
		want []string
	}{
		{``, []string{serf}},
		{`{}`, []string{serf}},
		{`{"NodeChecks":[]}`, []string{}},
		{`{"Checks":[]}`, []string{}},
		{`{"Checks":null}`, []string{}},
		{`{"Checks":["serfHealth"]}`, []string{serf}},
		{`{"Checks":["a"]}`, []string{serf, "a"}},
		{`{"Checks":["a","serfHealth"]}`, []string{serf, "a"}},
		{`{"NodeChecks":["a"]}`, []string{"a"}},
		{`{"NodeChecks":["a","b"],"Checks":["c"]}`, []string{"a", "b", "c"}},
		{`{"NodeChecks":[],"Checks":["a"]}`, []string{}},
		{`{"nodechecks":["x"]}`, []string{"x"}},
	} {
		s, err := decodeSessionCreate([]byte(c.body), testNode)
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if !reflect.DeepEqual(s.NodeChecks, c.want) {
			t.Errorf("%s: NodeChecks %q, want %q", c.body, s.NodeChecks, c.want)
		}
	}
	s, err := decodeSessionCreate([]byte(`{"ServiceChecks":[{"ID":"svc","Namespace":""}]}`), testNode)
	if err != nil || len(s.ServiceChecks) != 1 || s.ServiceChecks[0].ID != "svc" {
		t.Fatalf("service checks: %+v %v", s, err)
	}
	if _, err := decodeSessionCreate([]byte(`{"ServiceChecks":[{"Namespace":"x"}]}`), testNode); err == nil {
		t.Fatal("a service check without ID was accepted")
	}
	if _, err := decodeSessionCreate([]byte(`{"NodeChecks":[""]}`), testNode); err == nil {
		t.Fatal("an empty check ID was accepted")
	}
}

func TestSessionCreateErrors(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct{ body, want string }{
		{`{"Behavior":"bogus"}`, "Invalid Behavior setting 'bogus'"},
		{`{"TTL":"abc"}`, `Session TTL 'abc' invalid: time: invalid duration "abc"`},
		{`{"TTL":"5s"}`, "Invalid Session TTL '5000000000', must be between [10s=24h0m0s]"},
		{`{"TTL":"-10s"}`, "Invalid Session TTL '-10000000000': must not be negative"},
		{`{"TTL":10}`, "*"},
		{`{"Name":`, "Request decode failed: unexpected EOF"},
		{`[]`, "*"},
		{`{} {}`, "Request decode failed: unexpected data after the JSON value"},
		{`{"Checks":["nope"]}`, "Missing check 'nope' registration"},
		{`{"Node":"elsewhere"}`, "Missing node registration"},
	} {
		r := e.do("PUT", "/v1/session/create", c.body).want(t, 400, c.want)
		if c.want == "*" && !strings.HasPrefix(r.Body, "Request decode failed: ") {
			t.Errorf("%s: %q", c.body, r.Body)
		}
	}
	e.do("PUT", "/v1/catalog/register", `{"Node":"node1","Address":"127.0.0.1","Check":{"CheckID":"bad","Status":"critical"}}`).
		want(t, 200, "true")
	e.do("PUT", "/v1/session/create", `{"Checks":["bad"]}`).want(t, 400, "Check 'bad' is in critical state")
	e.do("PUT", "/v1/session/create", `{"Behavior":""}`).want(t, 200, "*")
	e.do("PUT", "/v1/session/create", `{"TTL":"10s","Unknown":1}`).want(t, 200, "*")
}

func TestSessionDestroyRenewInfo(t *testing.T) {
	e := newEnv(t)
	id := e.createSession(`{"TTL":"15s"}`)

	var renewed []map[string]interface{}
	e.do("PUT", "/v1/session/renew/"+id, "").want(t, 200, "*").json(t, &renewed)
	if len(renewed) != 1 || renewed[0]["ID"] != id || renewed[0]["TTL"] != "15s" {
		t.Fatalf("renew %v", renewed)
	}
	e.do("PUT", "/v1/session/renew/nope", "").want(t, 404, "Session id 'nope' not found")
	e.do("PUT", "/v1/session/renew/", "").want(t, 400, "Missing session")
	e.do("PUT", "/v1/session/renew", "").want(t, 400, "Missing session")

	e.do("GET", "/v1/session/info/nope", "").want(t, 200, "[]")
	e.do("GET", "/v1/session/info/", "").want(t, 400, "Missing session")
	e.do("GET", "/v1/session/node/", "").want(t, 400, "Missing node name")
	e.do("GET", "/v1/session/node/nobody", "").want(t, 200, "[]")

	var list []map[string]interface{}
	e.do("GET", "/v1/session/node/"+testNode, "").want(t, 200, "*").json(t, &list)
	if len(list) != 1 || list[0]["ID"] != id {
		t.Fatalf("node sessions %v", list)
	}

	e.do("PUT", "/v1/session/destroy/"+id, "").want(t, 200, "true")
	e.do("PUT", "/v1/session/destroy/"+id, "").want(t, 200, "true")
	e.do("PUT", "/v1/session/destroy/", "").want(t, 400, "Missing session")
	e.do("PUT", "/v1/session/destroy", "").want(t, 400, "Missing session")
	e.do("GET", "/v1/session/info/"+id, "").want(t, 200, "[]")
	e.do("GET", "/v1/session/list", "").want(t, 200, "[]")
	e.do("PUT", "/v1/session/renew/"+id, "").want(t, 404, "Session id '"+id+"' not found")
}

func TestSessionInvalidationReleasesLocks(t *testing.T) {
	e := newEnv(t)
	rel := e.createSession(`{"LockDelay":0}`)
	del := e.createSession(`{"LockDelay":0,"Behavior":"delete"}`)
	e.do("PUT", "/v1/kv/r?acquire="+rel, "v").want(t, 200, "true")
	e.do("PUT", "/v1/kv/d?acquire="+del, "v").want(t, 200, "true")
	// Deregistering the node's serfHealth check invalidates both.
	e.do("PUT", "/v1/catalog/deregister", `{"Node":"node1","CheckID":"serfHealth"}`).want(t, 200, "true")
	e.do("GET", "/v1/session/list", "").want(t, 200, "[]")
	if got := getEntry(t, e, "r"); got.Session != "" {
		t.Fatalf("release session left %+v", got)
	}
	e.do("GET", "/v1/kv/d", "").want(t, 404, "")
}
