package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/httpapi"
	"github.com/holdfast/holdfast/internal/server"
	"github.com/holdfast/holdfast/internal/servertest"
	"github.com/holdfast/holdfast/internal/state"
)

// taSrv is a real in-process holdfast server (raft on an in-memory
// transport, fake clock) with this package's handler on a loopback
// httptest server: internal/servertest's, which an external test package
// may import.
type taSrv struct {
	t   *testing.T
	srv *server.Server
	clk *clocktest.Fake
	url string
}

func taNew(t *testing.T) *taSrv {
	t.Helper()
	s := servertest.New(t, servertest.Options{})
	return &taSrv{t: t, srv: s.Server, clk: s.Clock, url: s.URL}
}

// auditResp is an answer as the audit tests of this package read it.
type auditResp struct {
	Code   int
	Header http.Header
	Body   string
}

type taResp = auditResp

// auditDo sends one request to base+path (no body when body is "") and
// reads the whole answer.
func auditDo(t testing.TB, base, method, path, body string) *auditResp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return &auditResp{Code: res.StatusCode, Header: res.Header, Body: string(b)}
}

func (s *taSrv) do(method, path, body string) *taResp {
	s.t.Helper()
	return auditDo(s.t, s.url, method, path, body)
}

func (s *taSrv) session(body string) string {
	s.t.Helper()
	r := s.do("PUT", "/v1/session/create", body)
	if r.Code != 200 {
		s.t.Fatalf("session create: %d %s", r.Code, r.Body)
	}
	var out struct{ ID string }
	if err := json.Unmarshal([]byte(r.Body), &out); err != nil {
		s.t.Fatal(err)
	}
	return out.ID
}

// get returns the entry at key, or nil on 404.
func (s *taSrv) get(key string) *state.DirEntry {
	s.t.Helper()
	r := s.do("GET", "/v1/kv/"+key, "")
	if r.Code == 404 {
		return nil
	}
	if r.Code != 200 {
		s.t.Fatalf("GET %s: %d %s", key, r.Code, r.Body)
	}
	var out []*state.DirEntry
	if err := json.Unmarshal([]byte(r.Body), &out); err != nil || len(out) != 1 {
		s.t.Fatalf("GET %s: %q %v", key, r.Body, err)
	}
	return out[0]
}

type taTxnOut struct {
	Results []struct{ KV *state.DirEntry }
	Errors  []struct {
		OpIndex int
		What    string
	}
}

func (s *taSrv) txn(body string) (*taResp, *taTxnOut) {
	s.t.Helper()
	r := s.do("PUT", "/v1/txn", body)
	var out taTxnOut
	if r.Code == 200 || r.Code == 409 {
		if err := json.Unmarshal([]byte(r.Body), &out); err != nil {
			s.t.Fatalf("txn body %q: %v", r.Body, err)
		}
	}
	return r, &out
}

func (s *taSrv) client() *api.Client {
	s.t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address = strings.TrimPrefix(s.url, "http://")
	cfg.Scheme = "http"
	cfg.Token = ""
	cfg.Datacenter = ""
	c, err := api.NewClient(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// Finding: the transaction verb "get-or-empty" (api.KVGetOrEmpty in
// github.com/hashicorp/consul/api v1.34.5, served by Consul's
// state/txn.go txnKVS since 1.x) is refused with 400 `Operation 0 has
// unknown KV verb "get-or-empty"`. Consul answers it like "get" when the
// key exists and, when it does not, with a result carrying the requested
// Key and a null Value instead of rolling the transaction back; it is a
// read, so a transaction of only such ops is served without raft.
// docs/compatibility.md does not list the verb as unsupported, so a Consul
// client that uses it breaks against holdfast.
func TestAuditTxnGetOrEmptyVerb(t *testing.T) {
	s := taNew(t)
	s.do("PUT", "/v1/kv/present", "v")
	cur := s.get("present")

	r, out := s.txn(`[{"KV":{"Verb":"get-or-empty","Key":"present"}},{"KV":{"Verb":"get-or-empty","Key":"absent"}}]`)
	if r.Code != 200 {
		t.Fatalf("get-or-empty: %d %q, want 200 with two results (Consul's txnKVS api.KVGetOrEmpty)", r.Code, r.Body)
	}
	if len(out.Results) != 2 || out.Results[0].KV == nil || string(out.Results[0].KV.Value) != "v" ||
		out.Results[0].KV.ModifyIndex != cur.ModifyIndex || out.Results[1].KV == nil ||
		out.Results[1].KV.Key != "absent" || out.Results[1].KV.Value != nil {
		t.Fatalf("get-or-empty results %s", r.Body)
	}

	// The same through Consul's own Go client.
	ok, resp, _, err := s.client().Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVGetOrEmpty, Key: "absent"}},
	}, nil)
	if err != nil || !ok || resp == nil || len(resp.Results) != 1 {
		t.Fatalf("api Txn get-or-empty: ok=%v resp=%+v err=%v", ok, resp, err)
	}
}

// Confirms: a transaction is all-or-nothing, its results carry the
// indexes a GET then shows, and the LockIndex only moves forward across
// lock/unlock in one transaction, across transactions, and across a
// release by session invalidation.
func TestAuditTxnAtomicIndexesLockIndex(t *testing.T) {
	s := taNew(t)
	sa := s.session(`{"LockDelay":"0s"}`)
	sb := s.session(`{"LockDelay":"0s"}`)
	s.do("PUT", "/v1/kv/keep", "old")
	keep := s.get("keep")

	// A failing op at the end rolls back every write before it.
	r, out := s.txn(`[{"KV":{"Verb":"set","Key":"keep","Value":"bmV3"}},{"KV":{"Verb":"lock","Key":"l","Session":"` + sa + `"}},
		{"KV":{"Verb":"delete","Key":"keep"}},{"KV":{"Verb":"check-index","Key":"keep","Index":1}}]`)
	if r.Code != 409 || len(out.Errors) != 1 || out.Errors[0].OpIndex != 3 || out.Results != nil {
		t.Fatalf("rollback: %d %s", r.Code, r.Body)
	}
	if got := s.get("keep"); got == nil || got.ModifyIndex != keep.ModifyIndex || string(got.Value) != "old" {
		t.Fatalf("half-applied: keep = %+v", got)
	}
	if s.get("l") != nil {
		t.Fatal("half-applied: l was locked")
	}

	// lock, unlock, lock in one transaction: 1, 1, 2.
	r, out = s.txn(`[{"KV":{"Verb":"lock","Key":"l","Session":"` + sa + `","Value":"YQ=="}},{"KV":{"Verb":"unlock","Key":"l","Session":"` + sa + `"}},
		{"KV":{"Verb":"lock","Key":"l","Session":"` + sb + `","Flags":9}},{"KV":{"Verb":"get","Key":"l"}}]`)
	if r.Code != 200 || len(out.Results) != 4 {
		t.Fatalf("%d %s", r.Code, r.Body)
	}
	for i, want := range []uint64{1, 1, 2, 2} {
		if out.Results[i].KV.LockIndex != want {
			t.Fatalf("result %d LockIndex %d, want %d: %s", i, out.Results[i].KV.LockIndex, want, r.Body)
		}
	}
	g := s.get("l")
	last := out.Results[3].KV
	if g.LockIndex != last.LockIndex || g.CreateIndex != last.CreateIndex || g.ModifyIndex != last.ModifyIndex ||
		g.Session != sb || g.Flags != 9 || out.Results[2].KV.ModifyIndex != g.ModifyIndex {
		t.Fatalf("GET %+v vs results %s", g, r.Body)
	}

	// Invalidation releases at the same LockIndex; the next acquire is 3,
	// and a plain write in between keeps it (docs/compatibility.md §1).
	s.do("PUT", "/v1/session/destroy/"+sb, "")
	if g := s.get("l"); g.Session != "" || g.LockIndex != 2 {
		t.Fatalf("after invalidation %+v", g)
	}
	s.do("PUT", "/v1/kv/l", "plain")
	if r := s.do("PUT", "/v1/kv/l?acquire="+sa, "x"); r.Body != "true" {
		t.Fatalf("acquire %d %s", r.Code, r.Body)
	}
	if g := s.get("l"); g.LockIndex != 3 || g.Session != sa {
		t.Fatalf("after re-acquire %+v", g)
	}
}

// Confirms the KV edges the brief lists against a real server.
func TestAuditTxnKVEdges(t *testing.T) {
	s := taNew(t)
	want := func(r *taResp, code int, body string) {
		t.Helper()
		if r.Code != code || r.Body != body {
			t.Fatalf("got %d %q, want %d %q", r.Code, r.Body, code, body)
		}
	}
	max := strings.Repeat("x", 512*1024)
	want(s.do("PUT", "/v1/kv/big", max), 200, "true")
	r := s.do("PUT", "/v1/kv/big", max+"x")
	if r.Code != 413 || !strings.HasPrefix(r.Body, "Request body(524289 bytes) too large, max size: 524288 bytes.") {
		t.Fatalf("513KiB: %d %q", r.Code, r.Body)
	}
	if g := s.get("big"); len(g.Value) != len(max) {
		t.Fatal("refused body changed the value")
	}
	want(s.do("PUT", "/v1/kv/big?cas=0", "y"), 200, "false")

	sa := s.session(`{"LockDelay":"10s"}`)
	sb := s.session(`{"LockDelay":"0s"}`)
	want(s.do("PUT", "/v1/kv/lk?acquire="+sa, "v1"), 200, "true")
	first := s.get("lk")
	want(s.do("PUT", "/v1/kv/lk?release="+sb, ""), 200, "false")
	want(s.do("PUT", "/v1/kv/lk?acquire="+sa, "v2"), 200, "true")
	if g := s.get("lk"); g.LockIndex != first.LockIndex || string(g.Value) != "v2" || g.ModifyIndex <= first.ModifyIndex {
		t.Fatalf("re-acquire by holder: %+v (first %+v)", g, first)
	}
	want(s.do("PUT", "/v1/session/destroy/"+sa, ""), 200, "true")
	want(s.do("PUT", "/v1/kv/lk?acquire="+sa, ""), 400, `invalid session "`+sa+`"`)
	r = s.do("PUT", "/v1/kv/lk?acquire="+sb, "")
	if r.Body != "false" || r.Header.Get(httpapi.HeaderLockDelay) != "10s" {
		t.Fatalf("acquire in lock-delay: %q %v", r.Body, r.Header)
	}
	r, _ = s.txn(`[{"KV":{"Verb":"lock","Key":"lk","Session":"` + sb + `"}}]`)
	want(r, 409, `{"Results":null,"Errors":[{"OpIndex":0,"What":"failed to lock key \"lk\" due to lock delay"}]}`)
	s.clk.Advance(10 * time.Second)
	r, _ = s.txn(`[{"KV":{"Verb":"lock","Key":"lk","Session":"` + sb + `"}}]`)
	if r.Code != 200 || s.get("lk").LockIndex != 2 {
		t.Fatalf("lock after delay: %d %s", r.Code, r.Body)
	}

	ops := "[" + strings.Repeat(`{"KV":{"Verb":"set","Key":"m","Value":"MQ=="}},`, 127) + `{"KV":{"Verb":"get","Key":"m"}}]`
	if r, out := s.txn(ops); r.Code != 200 || len(out.Results) != 128 {
		t.Fatalf("128 ops: %d", r.Code)
	}
	want(s.do("PUT", "/v1/txn", "["+strings.Repeat(`{"KV":{"Verb":"get","Key":"m"}},`, 128)+`{"KV":{"Verb":"get","Key":"m"}}]`),
		413, "Transaction contains too many operations (129 > 128)")
}
