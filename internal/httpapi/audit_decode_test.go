package httpapi_test

// Audit of how the HTTP API decodes and validates session, catalog and
// prepared-query requests, run against a real in-process server
// (internal/servertest: raft in memory, fake clock, loopback listener).

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/servertest"
)

type daResp = auditResp

type daSrv struct {
	t *testing.T
	s *servertest.Server
}

func daNew(t *testing.T) *daSrv {
	t.Helper()
	return &daSrv{t: t, s: servertest.New(t, servertest.Options{})}
}

func (d *daSrv) do(method, path, body string) *daResp {
	d.t.Helper()
	return auditDo(d.t, d.s.URL, method, path, body)
}

func (d *daSrv) want(method, path, body string, code int, wantBody string) *daResp {
	d.t.Helper()
	r := d.do(method, path, body)
	if r.Code != code || (wantBody != "*" && r.Body != wantBody) {
		d.t.Fatalf("%s %s %.120s: got %d %q, want %d %q", method, path, body, r.Code, r.Body, code, wantBody)
	}
	return r
}

func (d *daSrv) id(r *daResp) string {
	d.t.Helper()
	var out struct{ ID string }
	if err := json.Unmarshal([]byte(r.Body), &out); err != nil || out.ID == "" {
		d.t.Fatalf("no ID in %q: %v", r.Body, err)
	}
	return out.ID
}

type daSession struct {
	ID, Name, Node, Behavior, TTL string
	LockDelay                     time.Duration
	NodeChecks                    []string
}

func (d *daSrv) info(id string) *daSession {
	d.t.Helper()
	var out []*daSession
	r := d.want("GET", "/v1/session/info/"+id, "", 200, "*")
	if err := json.Unmarshal([]byte(r.Body), &out); err != nil {
		d.t.Fatal(err)
	}
	if len(out) == 0 {
		return nil
	}
	return out[0]
}

type daCheck struct {
	Node, CheckID, Name, Status, ServiceID string
}

func (d *daSrv) checks(node string) map[string]daCheck {
	d.t.Helper()
	var out []daCheck
	r := d.want("GET", "/v1/health/node/"+node, "", 200, "*")
	if err := json.Unmarshal([]byte(r.Body), &out); err != nil {
		d.t.Fatal(err)
	}
	m := map[string]daCheck{}
	for _, c := range out {
		m[c.CheckID] = c
	}
	return m
}

// ---- findings ----

// Finding: a catalog check registered with a Name but no CheckID is refused
// with 400 "Must provide a CheckID". Consul's Catalog.Register runs
// checkPreApply on every check (agent/consul/catalog_endpoint.go):
// `if check.CheckID == "" && check.Name != "" { check.CheckID = Name }`,
// so {"Check":{"Name":"alive","Status":"passing"}} registers check "alive".
// Scripts and clients written for Consul that name checks only break.
func TestAuditDecodeCatalogCheckIDDefaultsToName(t *testing.T) {
	d := daNew(t)
	d.want("PUT", "/v1/catalog/register",
		`{"Node":"n2","Address":"10.0.0.2","Check":{"Name":"alive","Status":"passing"},`+
			`"Checks":[{"Name":"disk","Status":"warning"}]}`, 200, "true")
	cs := d.checks("n2")
	if cs["alive"].Status != "passing" || cs["disk"].Status != "warning" {
		t.Fatalf("checks %+v, want alive=passing and disk=warning", cs)
	}
}

// Finding: when one registration carries the same CheckID in both Check and
// Checks, holdfast applies Check first and Checks after it, so the Checks
// entry wins. Consul appends Check after Checks (`args.Checks =
// append(args.Checks, args.Check)` in Catalog.Register) and the single
// Check wins. The same body leaves a different status in the two servers
// (here warning instead of passing; with critical vs passing, sessions
// bound to the check are invalidated on one and kept on the other).
func TestAuditDecodeCatalogCheckAppliedAfterChecks(t *testing.T) {
	d := daNew(t)
	d.want("PUT", "/v1/catalog/register",
		`{"Node":"n2","Address":"10.0.0.2","Check":{"CheckID":"c","Status":"passing"},`+
			`"Checks":[{"CheckID":"c","Status":"warning"}]}`, 200, "true")
	if got := d.checks("n2")["c"].Status; got != "passing" {
		t.Fatalf("check c is %q, want passing (Check is applied after Checks, as in Consul)", got)
	}
}

// Finding: a check Definition's Interval/Timeout/DeregisterCriticalServiceAfter
// are decoded as plain strings. Consul's CatalogRegister decodes them with
// NewDurationFixer("interval","timeout","deregistercriticalserviceafter"):
// a JSON number is nanoseconds and a string must parse as a Go duration.
// holdfast refuses the number (400 "cannot unmarshal number into Go struct
// field HealthCheckDefinition...", a Go type name, not a sentence) and
// stores a string that is no duration at all ("soon") without complaint.
func TestAuditDecodeCatalogCheckDefinitionDurations(t *testing.T) {
	d := daNew(t)
	r := d.do("PUT", "/v1/catalog/register",
		`{"Node":"n2","Address":"10.0.0.2","Check":{"CheckID":"c","Status":"passing","Definition":{"Interval":10000000000,"Timeout":1000000000}}}`)
	if r.Code != 200 {
		t.Errorf("numeric Definition.Interval (ns, accepted by Consul): %d %q", r.Code, r.Body)
	}
	r = d.do("PUT", "/v1/catalog/register",
		`{"Node":"n3","Address":"10.0.0.3","Check":{"CheckID":"c","Status":"passing","Definition":{"Interval":"soon"}}}`)
	if r.Code != 400 {
		t.Errorf("Definition.Interval \"soon\" (Consul: 400 Request decode failed: time: invalid duration): %d %q", r.Code, r.Body)
	}
}

// Finding: parseLockDelay documents "Unlike Consul, a negative ... delay is
// an error" and refuses -1 and "-5s", but a negative value that truncates
// to 0ns (-0.5, "-0.5ns", "-0.9ns") is accepted as a lock-delay of 0 and
// the session is created. Negative input must be refused whatever its
// magnitude (session.go parseLockDelay checks d < 0 only after truncating).
func TestAuditDecodeSessionNegativeFractionalLockDelay(t *testing.T) {
	d := daNew(t)
	for _, body := range []string{`{"LockDelay":-0.5}`, `{"LockDelay":"-0.5ns"}`, `{"LockDelay":"-0.9ns"}`} {
		r := d.do("PUT", "/v1/session/create", body)
		if r.Code != 400 || !strings.Contains(r.Body, "negative") {
			t.Errorf("%s: got %d %q, want 400 saying the LockDelay is negative", body, r.Code, r.Body)
		}
	}
	d.want("GET", "/v1/session/list", "", 200, "[]")
}

// Finding: DELETE /v1/query/<unknown id> answers 404 "query not found": a
// bare state-package error that neither names the query nor matches the
// sentence holdfast itself gives for PUT of the same id ("Cannot modify
// non-existent prepared query: '<id>'", which is Consul's text for update
// and delete alike, prepared_query_endpoint.go Apply).
func TestAuditDecodeQueryDeleteUnknownSentence(t *testing.T) {
	d := daNew(t)
	d.want("PUT", "/v1/query/nope", `{"Service":{"Service":"web"}}`, 404, "Cannot modify non-existent prepared query: 'nope'")
	d.want("DELETE", "/v1/query/nope", "", 404, "Cannot modify non-existent prepared query: 'nope'")
}

// ---- confirmations ----

// Session-create decoding as spec section 3 says, end to end.
func TestAuditDecodeSessionCreateSpecRules(t *testing.T) {
	d := daNew(t)
	d.want("PUT", "/v1/catalog/register",
		`{"Node":"node1","Address":"127.0.0.1","SkipNodeUpdate":true,"Checks":[{"CheckID":"a","Status":"passing"},{"CheckID":"w","Status":"warning"}]}`,
		200, "true")
	for _, c := range []struct {
		body      string
		lockDelay time.Duration
		checks    []string
	}{
		{``, 15 * time.Second, []string{"serfHealth"}},
		{`null`, 15 * time.Second, []string{"serfHealth"}},
		{`{"NAME":"x","lockdelay":5}`, 5 * time.Second, []string{"serfHealth"}},
		{`{"LockDelay":"20ns"}`, 20 * time.Second, []string{"serfHealth"}},
		{`{"LockDelay":"15s"}`, 15 * time.Second, []string{"serfHealth"}},
		{`{"LockDelay":2000000000}`, 2 * time.Second, []string{"serfHealth"}},
		{`{"Checks":[]}`, 15 * time.Second, []string{}},
		{`{"NodeChecks":[]}`, 15 * time.Second, []string{}},
		{`{"Checks":["serfHealth"]}`, 15 * time.Second, []string{"serfHealth"}},
		{`{"Checks":["a"]}`, 15 * time.Second, []string{"serfHealth", "a"}},
		{`{"NodeChecks":["w","w"]}`, 15 * time.Second, []string{"w"}},
	} {
		id := d.id(d.want("PUT", "/v1/session/create", c.body, 200, "*"))
		s := d.info(id)
		if s == nil || s.LockDelay != c.lockDelay || s.Node != "node1" || strings.Join(s.NodeChecks, ",") != strings.Join(c.checks, ",") {
			t.Errorf("%s: session %+v, want LockDelay %v checks %q", c.body, s, c.lockDelay, c.checks)
		}
	}
	for _, c := range []struct{ body, want string }{
		{`{"LockDelay":"20"}`, `Request decode failed: time: missing unit in duration "20"`},
		{`{"TTL":"9s"}`, "Invalid Session TTL '9000000000', must be between [10s=24h0m0s]"},
		{`{"TTL":"24h0m1s"}`, "Invalid Session TTL '86401000000000', must be between [10s=24h0m0s]"},
		{`{"Behavior":"DELETE"}`, "Invalid Behavior setting 'DELETE'"},
		{`[]`, "*"},
		{`{} x`, "Request decode failed: unexpected data after the JSON value"},
		{`{"Checks":["nope"]}`, "Missing check 'nope' registration"},
	} {
		d.want("PUT", "/v1/session/create", c.body, 400, c.want)
	}
	r := d.do("PUT", "/v1/session/create", strings.Repeat(" ", 600<<10)+"{}")
	if r.Code != 413 {
		t.Errorf("huge body: %d %q", r.Code, r.Body)
	}
	d.want("GET", "/v1/session/create", "", 405, "method GET not allowed")
	if a := d.do("POST", "/v1/session/destroy/x", "").Header.Get("Allow"); a != "OPTIONS,PUT" {
		t.Errorf("Allow %q", a)
	}
}

// Refused requests change nothing, and a query bound to a session follows
// the session it is bound to now, not the one it was created with.
func TestAuditDecodeRefusalsAndQuerySession(t *testing.T) {
	d := daNew(t)
	before := d.want("GET", "/v1/session/list", "", 200, "[]").Header.Get("X-Consul-Index")
	d.want("PUT", "/v1/session/create", `{"Checks":["nope"]}`, 400, "Missing check 'nope' registration")
	d.want("PUT", "/v1/session/create", `{"Node":"elsewhere"}`, 400, "Missing node registration")
	if after := d.want("GET", "/v1/session/list", "", 200, "[]").Header.Get("X-Consul-Index"); after != before {
		t.Fatalf("sessions index moved %s -> %s on refused creates", before, after)
	}
	d.want("PUT", "/v1/catalog/register", `{"Node":"n9","Address":"1.2.3.4","Check":{"CheckID":"c","Status":"bogus"}}`,
		400, `Invalid check status "bogus": must be passing, warning or critical`)
	d.want("GET", "/v1/catalog/node/n9", "", 200, "null")

	s1 := d.id(d.want("PUT", "/v1/session/create", `{"LockDelay":0}`, 200, "*"))
	s2 := d.id(d.want("PUT", "/v1/session/create", `{"LockDelay":0}`, 200, "*"))
	d.want("POST", "/v1/query", `{"Service":{"Service":"web"},"Session":"nope"}`, 400, `invalid session "nope"`)
	q := d.id(d.want("POST", "/v1/query", `{"Name":"q","Service":{"Service":"web"},"Session":"`+s1+`"}`, 200, "*"))
	d.want("POST", "/v1/query", `{"Name":"Q","Service":{"Service":"web"}}`, 400, `Name "Q" is in use by another query`)
	d.want("PUT", "/v1/query/"+q, `{"Name":"q","Service":{"Service":"web"},"Session":"bogus"}`, 400, `invalid session "bogus"`)
	d.want("PUT", "/v1/query/"+q, `{"Name":"q","Service":{"Service":"web"},"Session":"`+s2+`"}`, 200, "")
	d.want("PUT", "/v1/session/destroy/"+s1, "", 200, "true")
	d.want("GET", "/v1/query/"+q, "", 200, "*")
	d.want("PUT", "/v1/session/destroy/"+s2, "", 200, "true")
	d.want("GET", "/v1/query/"+q, "", 404, "Query not found")
}
