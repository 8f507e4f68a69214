package httpapi

import (
	"context"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

func TestPreparedQueries(t *testing.T) {
	e := newEnv(t)
	s := e.createSession("")
	e.do("POST", "/v1/query", "").want(t, 400, "Request decode failed: the request body is empty (want a prepared query as JSON)")
	r := e.do("POST", "/v1/query", `{"Name":"web","Session":"`+s+`","Service":{"Service":"web","OnlyPassing":true,
		"Failover":{"NearestN":3}},"DNS":{"TTL":"10s"}}`).want(t, 200, "*")
	var created struct{ ID string }
	r.json(t, &created)
	if created.ID == "" {
		t.Fatal("no ID")
	}

	var got []map[string]interface{}
	e.do("GET", "/v1/query/"+created.ID, "").want(t, 200, "*").json(t, &got)
	if len(got) != 1 || got[0]["Name"] != "web" || got[0]["Session"] != s ||
		got[0]["Service"].(map[string]interface{})["OnlyPassing"] != true {
		t.Fatalf("query %v", got)
	}
	e.do("GET", "/v1/query", "").want(t, 200, "*").json(t, &got)
	if len(got) != 1 {
		t.Fatalf("list %v", got)
	}

	e.do("PUT", "/v1/query/"+created.ID, `{"Name":"web2","Service":{"Service":"web"}}`).want(t, 200, "")
	e.do("GET", "/v1/query/"+created.ID, "").json(t, &got)
	if got[0]["Name"] != "web2" || got[0]["ID"] != created.ID {
		t.Fatalf("after update %v", got)
	}
	e.do("PUT", "/v1/query/nope", `{"Service":{"Service":"web"}}`).want(t, 404, "Cannot modify non-existent prepared query: 'nope'")

	e.do("DELETE", "/v1/query/"+created.ID, "").want(t, 200, "")
	e.do("GET", "/v1/query/"+created.ID, "").want(t, 404, "Query not found")
	e.do("DELETE", "/v1/query/"+created.ID, "").want(t, 404, "Cannot modify non-existent prepared query: '"+created.ID+"'")
	e.do("GET", "/v1/query", "").want(t, 200, "[]")
}

func TestPreparedQueryErrors(t *testing.T) {
	e := newEnv(t)
	e.do("POST", "/v1/query", `{"Name":"x"}`).want(t, 400, "Must provide a Service name to query")
	e.do("POST", "/v1/query", `{"Service":{"Service":"web"},"Session":"ghost"}`).want(t, 400, `invalid session "ghost"`)
	e.do("POST", "/v1/query", `{"Service":{"Service":"web"},"Template":{"Type":"name_prefix_match"}}`).
		want(t, 400, "Prepared query templates are not supported")
	e.do("POST", "/v1/query", `{`).want(t, 400, "Request decode failed: unexpected EOF")
	e.do("GET", "/v1/query/abc/execute", "").want(t, 404, "Query not found")
	e.do("GET", "/v1/query/abc/explain", "").want(t, 404, "Query not found")
	e.do("GET", "/v1/query/abc/other", "").want(t, 404, `Invalid URL path: unknown prepared query action "other"`)
	e.do("GET", "/v1/query/", "").want(t, 400, "Missing query ID")

	// A query bound to a session goes when the session does.
	s := e.createSession("")
	e.do("POST", "/v1/query", `{"Service":{"Service":"web"},"Session":"`+s+`"}`).want(t, 200, "*")
	e.do("PUT", "/v1/session/destroy/"+s, "").want(t, 200, "true")
	e.do("GET", "/v1/query", "").want(t, 200, "[]")
}

func TestFence(t *testing.T) {
	e := newEnv(t)
	s1 := e.createSession(`{"LockDelay":0}`)
	s2 := e.createSession(`{"LockDelay":0}`)
	e.do("PUT", "/v1/kv/res/lock?acquire="+s1, "").want(t, 200, "true")

	before := e.b.consistent.Load()
	r := wantFence(t, e, "/v1/fence/res/lock?session="+s1+"&lock-index=1", true, s1, 1)
	if r.Header.Get("X-Consul-Effective-Consistency") != "consistent" || e.b.consistent.Load() != before+1 {
		t.Fatal("fence check is not consistent by default")
	}
	if r.Header.Get("X-Consul-Index") != u64(getEntry(t, e, "res/lock").ModifyIndex) {
		t.Fatalf("index %s", r.Header.Get("X-Consul-Index"))
	}
	r = e.do("GET", "/v1/fence/res/lock?stale&session="+s1+"&lock-index=1", "").want(t, 200, "*")
	if r.Header.Get("X-Consul-Effective-Consistency") != "stale" {
		t.Fatal("?stale ignored")
	}
	wantFence(t, e, "/v1/fence/res/lock?session="+s1+"&lock-index=2", false, s1, 1)
	wantFence(t, e, "/v1/fence/res/lock?session="+s2+"&lock-index=1", false, s1, 1)

	e.do("PUT", "/v1/kv/res/lock?release="+s1, "").want(t, 200, "true")
	e.do("PUT", "/v1/kv/res/lock?acquire="+s2, "").want(t, 200, "true")
	wantFence(t, e, "/v1/fence/res/lock?session="+s1+"&lock-index=1", false, s2, 2)
	wantFence(t, e, "/v1/fence/none?session="+s1+"&lock-index=1", false, "", 0)

	e.do("GET", "/v1/fence/res/lock?lock-index=1", "").want(t, 400, "Missing session: give the sequencer's ?session=")
	e.do("GET", "/v1/fence/res/lock?session=x", "").want(t, 400, "Missing lock-index: give the sequencer's ?lock-index=")
	e.do("GET", "/v1/fence/res/lock?session=x&lock-index=0", "").want(t, 400, "Invalid lock-index 0: a held lock's index is at least 1")
	e.do("GET", "/v1/fence/res/lock?session=x&lock-index=q", "").
		want(t, 400, `Invalid lock-index "q": must be an unsigned 64-bit integer`)
	e.do("GET", "/v1/fence/?session=x&lock-index=1", "").want(t, 400, "Missing key name")
	e.do("GET", "/v1/fence/a/../b?session=x&lock-index=1", "").want(t, 400, `Invalid key "a/../b": ".." path segments are not allowed`)

	// Blocking: the check wakes when the sequencer goes stale.
	cur := e.do("GET", "/v1/fence/res/lock?session="+s2+"&lock-index=2", "").want(t, 200, "*")
	ch := e.block("GET", "/v1/fence/res/lock?session="+s2+"&lock-index=2&index="+cur.Header.Get("X-Consul-Index"))
	e.do("PUT", "/v1/session/destroy/"+s2, "").want(t, 200, "true")
	var f fenceJSON
	recv(t, ch).want(t, 200, "*").json(t, &f)
	if f.Valid || f.Session != "" || f.LockIndex != 2 || f.Reason == "" {
		t.Fatalf("after the holder's session ended: %+v", f)
	}
}

// Consul refuses a prepared query whose Name is the ID of another query
// ("name '<n>' aliases an existing query ID"): queries are looked up by ID
// or name, and such a name could never be reached by name. holdfast
// accepted it.
func TestQueryNameAliasingAnID(t *testing.T) {
	e := newEnv(t)
	var first struct{ ID string }
	e.do("POST", "/v1/query", `{"Name":"orig","Service":{"Service":"web"}}`).want(t, 200, "*").json(t, &first)
	want := "Name '" + first.ID + "' aliases an existing query ID"
	e.do("POST", "/v1/query", `{"Name":"`+first.ID+`","Service":{"Service":"evil"}}`).want(t, 400, want)

	var second struct{ ID string }
	e.do("POST", "/v1/query", `{"Name":"other","Service":{"Service":"web"}}`).want(t, 200, "*").json(t, &second)
	e.do("PUT", "/v1/query/"+second.ID, `{"Name":"`+first.ID+`","Service":{"Service":"web"}}`).want(t, 400, want)
	// IDs are found in any case, so a name that is another query's ID in
	// upper case would run that query when executed by name.
	upper := strings.ToUpper(first.ID)
	e.do("POST", "/v1/query", `{"Name":"`+upper+`","Service":{"Service":"evil"}}`).
		want(t, 400, "Name '"+upper+"' aliases an existing query ID")
	// A query may carry its own ID as its name.
	e.do("PUT", "/v1/query/"+first.ID, `{"Name":"`+first.ID+`","Service":{"Service":"web"}}`).want(t, 200, "")

	var list []struct{ ID, Name string }
	e.do("GET", "/v1/query", "").want(t, 200, "*").json(t, &list)
	if len(list) != 2 {
		t.Fatalf("queries %+v, want 2", list)
	}
}

// wantFence checks a GET /v1/fence answer: Valid, Session and LockIndex,
// and a Reason exactly when it is not valid. It returns the response.
func wantFence(t *testing.T, e *env, url string, valid bool, session string, lockIndex uint64) *resp {
	t.Helper()
	r := e.do("GET", url, "").want(t, 200, "*")
	var f fenceJSON
	r.json(t, &f)
	if f.Valid != valid || f.Session != session || f.LockIndex != lockIndex || (f.Reason == "") != valid {
		t.Fatalf("GET %s: %s, want Valid %v, Session %q, LockIndex %d", url, r.Body, valid, session, lockIndex)
	}
	return r
}

// Finding: a query's NodeMeta, ServiceMeta and IgnoreCheckIDs were dropped
// without a word, so executing it returned the nodes the query excluded.
// Fields holdfast cannot apply are refused; their zero values, which
// Consul's Go client always sends, and Failover (nothing to fail over to in
// one datacenter) are accepted.
func TestPreparedQueryRefusesFieldsItCannotApply(t *testing.T) {
	e := newEnv(t)
	for field, service := range map[string]string{
		"Service.NodeMeta":       `"NodeMeta":{"rack":"b"}`,
		"Service.ServiceMeta":    `"ServiceMeta":{"ver":"2"}`,
		"Service.IgnoreCheckIDs": `"IgnoreCheckIDs":["ec"]`,
		"Service.Connect":        `"Connect":true`,
		"Service.Peer":           `"Peer":"other"`,
		"Service.SamenessGroup":  `"SamenessGroup":"g"`,
	} {
		e.do("POST", "/v1/query", `{"Name":"q","Service":{"Service":"api",`+service+`}}`).
			want(t, 400, "Prepared query field "+field+" is not supported by holdfast: the query would not return what it asks for")
	}
	e.do("GET", "/v1/query", "").want(t, 200, "[]")

	// What api.PreparedQueryDefinition{} encodes to, with a service name.
	zero := `{"ID":"","Name":"q","Session":"","Token":"","Service":{"Service":"api","SamenessGroup":"","Failover":{"NearestN":2,"Datacenters":null,"Targets":null},
		"IgnoreCheckIDs":null,"OnlyPassing":false,"Near":"","Tags":null,"NodeMeta":null,"ServiceMeta":null,"Connect":false,"Peer":""},
		"DNS":{"TTL":""},"Template":{"Type":"","Regexp":"","RemoveEmptyTags":false}}`
	var created struct{ ID string }
	e.do("POST", "/v1/query", zero).want(t, 200, "*").json(t, &created)
	e.do("PUT", "/v1/query/"+created.ID, strings.Replace(zero, `"NodeMeta":null`, `"NodeMeta":{"a":"b"}`, 1)).
		want(t, 400, "Prepared query field Service.NodeMeta is not supported by holdfast: the query would not return what it asks for")
}

// Finding: ?node-meta on catalog and health reads was ignored, so the
// answer held nodes without the metadata asked for. It is refused, as
// ?filter is.
func TestNodeMetaFilterRefused(t *testing.T) {
	e := newEnv(t)
	for _, path := range []string{"/v1/catalog/nodes", "/v1/catalog/services", "/v1/catalog/service/web", "/v1/health/service/web"} {
		e.do("GET", path+"?node-meta=rack:b", "").want(t, 400, "Node metadata filters (?node-meta=) are not supported by holdfast")
		e.do("GET", path, "").want(t, 200, "*")
	}
}

// Finding: /v1/catalog/datacenters was not served, so the Go client's
// Catalog().Datacenters() failed.
func TestCatalogDatacenters(t *testing.T) {
	e := newEnv(t)
	e.do("GET", "/v1/catalog/datacenters", "").want(t, 200, `["dc1"]`)
	e.do("PUT", "/v1/catalog/datacenters", "").want(t, 405, "method PUT not allowed")
}

// Finding: a query's ID in upper case was not found (404), where Consul,
// which parses IDs as UUIDs, finds it. IDs in UUID form are folded to the
// lower case holdfast makes them in, for every /v1/query/<id> action.
func TestQueryIDAnyCase(t *testing.T) {
	e := newEnv(t)
	var created struct{ ID string }
	// An ID with letters in it, as the server's random ones have.
	created.ID = "abcdef01-2345-4678-9abc-def012345678"
	if _, err := e.b.QuerySet(context.Background(), &state.PreparedQuery{ID: created.ID, Name: "web",
		Service: state.ServiceQuery{Service: "web"}}); err != nil {
		t.Fatal(err)
	}
	up := strings.ToUpper(created.ID)
	if !isUUID(up) {
		t.Fatalf("%q is not a UUID", up)
	}
	var got []struct{ ID, Name string }
	e.do("GET", "/v1/query/"+up, "").want(t, 200, "*").json(t, &got)
	if len(got) != 1 || got[0].ID != created.ID {
		t.Fatalf("GET by upper-case ID: %+v", got)
	}
	e.do("GET", "/v1/query/"+up+"/execute", "").want(t, 200, "*")
	e.do("PUT", "/v1/query/"+up, `{"Name":"web2","Service":{"Service":"web"}}`).want(t, 200, "")
	e.do("GET", "/v1/query/"+created.ID, "").want(t, 200, "*").json(t, &got)
	if got[0].Name != "web2" {
		t.Fatalf("update by upper-case ID: %+v", got)
	}
	e.do("DELETE", "/v1/query/"+up, "").want(t, 200, "")
	e.do("GET", "/v1/query", "").want(t, 200, "[]")
	for _, s := range []string{"", "web", "0123456789abcdef0123456789abcdef0123", "0123456-789a-bcde-f012-3456789abcdef", "g1234567-89ab-cdef-0123-456789abcdef"} {
		if isUUID(s) {
			t.Errorf("isUUID(%q) = true", s)
		}
	}
}

// Finding: every oversized body was refused pointing at kv_max_value_size,
// the KV setting, also a transaction's (Consul names txn_max_req_len) and
// a query's or a registration's (no setting: no pointer).
func TestTooLargeNamesTheRightSetting(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxValueSize = 8; o.MaxTxnSize = 8 })
	e.do("PUT", "/v1/kv/k", "123456789").want(t, 413,
		"Request body(9 bytes) too large, max size: 8 bytes. See "+maxSizeDoc+".")
	e.do("PUT", "/v1/txn", "[        ]").want(t, 413,
		"Request body(10 bytes) too large, max size: 8 bytes. See "+txnSizeDoc+".")
	e.do("POST", "/v1/query", `{"Name":"q"}`).want(t, 413, "Request body(12 bytes) too large, max size: 8 bytes.")
	e.do("PUT", "/v1/catalog/register", `{"Node":"n"}`).want(t, 413, "Request body(12 bytes) too large, max size: 8 bytes.")
}

// Finding: Failover and DNS were accepted and dropped, so reading a query
// back (or executing it, for DNS.TTL) did not show what was written, and
// their bad values (a negative NearestN, a TTL that is no duration) were
// accepted; a failover Peer, which holdfast cannot reach, was accepted
// where Service.Peer is refused; explain answered 501.
func TestPreparedQueryFailoverDNSAndExplain(t *testing.T) {
	e := newEnv(t)
	var created struct{ ID string }
	e.do("POST", "/v1/query", `{"Name":"api","Service":{"Service":"api","Failover":{"NearestN":3,"Datacenters":["dc2","dc3"]}},
		"DNS":{"TTL":"10s"}}`).want(t, 200, "*").json(t, &created)
	type def struct {
		ID      string
		Service struct {
			Service  string
			Failover state.QueryFailover
		}
		DNS state.QueryDNS
	}
	var got []def
	e.do("GET", "/v1/query/"+created.ID, "").want(t, 200, "*").json(t, &got)
	if len(got) != 1 || got[0].Service.Failover.NearestN != 3 || strings.Join(got[0].Service.Failover.Datacenters, ",") != "dc2,dc3" ||
		got[0].DNS.TTL != "10s" {
		t.Fatalf("read back %+v", got)
	}
	var exec struct {
		Service string
		DNS     struct{ TTL string }
	}
	e.do("GET", "/v1/query/api/execute", "").want(t, 200, "*").json(t, &exec)
	if exec.Service != "api" || exec.DNS.TTL != "10s" {
		t.Fatalf("execute %+v", exec)
	}
	var explained struct{ Query def }
	e.do("GET", "/v1/query/api/explain", "").want(t, 200, "*").json(t, &explained)
	if explained.Query.ID != created.ID || explained.Query.DNS.TTL != "10s" || explained.Query.Service.Failover.NearestN != 3 {
		t.Fatalf("explain %+v", explained)
	}
	e.do("GET", "/v1/query/"+strings.ToUpper(created.ID)+"/explain", "").want(t, 200, "*")

	// Targets by datacenter are kept; they may not come with NearestN or
	// Datacenters.
	e.do("PUT", "/v1/query/"+created.ID, `{"Name":"api","Service":{"Service":"api","Failover":{"Targets":[{"Datacenter":"dc2"}]}}}`).want(t, 200, "")
	got = nil
	e.do("GET", "/v1/query/"+created.ID, "").want(t, 200, "*").json(t, &got)
	if ts := got[0].Service.Failover.Targets; len(ts) != 1 || ts[0].Datacenter != "dc2" || got[0].DNS.TTL != "" {
		t.Fatalf("after update %+v", got)
	}

	for body, want := range map[string]string{
		`{"Service":{"Service":"api","Failover":{"NearestN":-1}}}`:                                      "Service.Failover.NearestN must be 0 or more, not -1",
		`{"Service":{"Service":"api","Failover":{"NearestN":1,"Targets":[{"Datacenter":"dc2"}]}}}`:      "Service.Failover.Targets cannot be given together with NearestN or Datacenters",
		`{"Service":{"Service":"api","Failover":{"Datacenters":["a"],"Targets":[{"Datacenter":"b"}]}}}`: "Service.Failover.Targets cannot be given together with NearestN or Datacenters",
		`{"Service":{"Service":"api","Failover":{"Targets":[{"Datacenter":"b"},{"Peer":"p"}]}}}`:        "Prepared query field Service.Failover.Targets[1].Peer is not supported by holdfast: the query would not return what it asks for",
		`{"Service":{"Service":"api"},"DNS":{"TTL":"bogus"}}`:                                           `DNS.TTL "bogus" is not a duration such as "10s"`,
		`{"Service":{"Service":"api"},"DNS":{"TTL":"-1s"}}`:                                             `DNS.TTL "-1s" must not be negative`,
		`{"Service":{"Service":"api"},"Token":"<hidden>"}`:                                              `Token "<hidden>" is how Consul shows a token it hides, not a token: submit the query's own token, or none`,
		`{"ID":"` + created.ID + `","Service":{"Service":"api"}}`:                                       `A new prepared query cannot carry an ID ("` + created.ID + `"): the server assigns one; update a query with PUT /v1/query/<id>`,
	} {
		e.do("POST", "/v1/query", body).want(t, 400, want)
		// An update is refused the same way and changes nothing, but
		// may carry its own ID (Consul's Go client sends it).
		if !strings.HasPrefix(body, `{"ID"`) {
			e.do("PUT", "/v1/query/"+created.ID, body).want(t, 400, want)
		}
	}
	e.do("PUT", "/v1/query/"+created.ID, `{"ID":"`+created.ID+`","Name":"api","Service":{"Service":"api"}}`).want(t, 200, "")
	var list []def
	e.do("GET", "/v1/query", "").want(t, 200, "*").json(t, &list)
	if len(list) != 1 || list[0].ID != created.ID {
		t.Fatalf("queries %+v", list)
	}
}
