package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

func FuzzSessionCreateDecode(f *testing.F) {
	for _, s := range []string{
		``, `null`, `{}`, `{"LockDelay":5}`, `{"LockDelay":"20ns"}`, `{"LockDelay":"15s"}`, `{"LockDelay":1.5e9}`,
		`{"LockDelay":-3}`, `{"LockDelay":"20"}`, `{"LockDelay":true}`, `{"Checks":[]}`, `{"NodeChecks":[]}`,
		`{"Checks":["a","serfHealth"]}`, `{"NodeChecks":["a"],"Checks":["b"]}`, `{"Behavior":"delete","TTL":"30s"}`,
		`{"TTL":"-1s"}`, `{"name":"x","node":"n2","lockdelay":"1m"}`, `{"ServiceChecks":[{"ID":"s","Namespace":"default"}]}`,
		`{"LockDelay":1e400}`, `{} x`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := decodeSessionCreate(body, testNode)
		if err != nil {
			if KindOf(err) != KindInvalid {
				t.Fatalf("error %v has kind %d, want Invalid", err, KindOf(err))
			}
			return
		}
		if s.LockDelay < 0 || (s.LockDelay > 0 && s.LockDelay < lockDelayUnit) {
			t.Fatalf("LockDelay %v: below 1000ns must have been read as seconds", s.LockDelay)
		}
		if s.Behavior != state.BehaviorRelease && s.Behavior != state.BehaviorDelete {
			t.Fatalf("Behavior %q", s.Behavior)
		}
		if s.Node == "" {
			t.Fatal("empty Node")
		}
		if s.ID != "" {
			t.Fatal("the HTTP layer must not pick the ID")
		}
		seen := map[string]bool{}
		for _, c := range s.NodeChecks {
			if c == "" || seen[c] {
				t.Fatalf("NodeChecks %q: empty or duplicate", s.NodeChecks)
			}
			seen[c] = true
		}
		for _, c := range s.ServiceChecks {
			if c.ID == "" {
				t.Fatal("service check without ID")
			}
		}
		if s.TTL != "" {
			if d, err := time.ParseDuration(s.TTL); err != nil || d < 0 {
				t.Fatalf("TTL %q passed: %v", s.TTL, err)
			}
		}
		// It must survive the FSM's JSON envelope unchanged.
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back state.Session
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.LockDelay != s.LockDelay || back.TTL != s.TTL || len(back.NodeChecks) != len(s.NodeChecks) {
			t.Fatalf("round trip changed %+v into %+v", s, back)
		}
	})
}

var fuzzMethods = [...]string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPost}

func FuzzKVQuery(f *testing.F) {
	for _, c := range []struct {
		m          uint8
		key, query string
	}{
		{0, "foo", ""}, {0, "", "recurse"}, {0, "", "keys&separator=/"}, {0, "a/", "keys&seperator=%2F"},
		{0, "k", "raw"}, {0, "k", "index=5&wait=10s"}, {0, "k", "stale&consistent"}, {0, "k", "index=x"},
		{0, "k", "wait=-1s&index=3"}, {0, "k", "max_stale=5s"}, {0, "k", "cached&consistent"},
		{1, "k", "flags=42"}, {1, "k", "cas=0"}, {1, "k", "cas=1&acquire=s"}, {1, "k", "acquire="},
		{1, "k", "release=s&lock-index=3"}, {1, "k", "lock-index=3"}, {1, "", ""}, {1, "a/../b", ""},
		{1, " k", ""}, {1, "k\t", ""}, {1, "a//b", "flags=18446744073709551616"}, {2, "k", "recurse&cas=1"},
		{2, "", "recurse"}, {2, "k", "cas=abc"}, {3, "k", ""}, {0, "k", "dc=dc2"}, {0, "..", "pretty"},
	} {
		f.Add(c.m, c.key, c.query)
	}
	h := New(newFakeBackend(newFakeClock()), Options{}).(*handler)
	f.Fuzz(func(t *testing.T, m uint8, key, rawQuery string) {
		method := fuzzMethods[int(m)%len(fuzzMethods)]
		q, _ := url.ParseQuery(rawQuery) // what r.URL.Query() does
		has := func(n string) bool { _, ok := q[n]; return ok }

		if _, err := h.parseRead(q); err != nil && KindOf(err) != KindInvalid {
			t.Fatalf("parseRead: %v has kind %d", err, KindOf(err))
		}
		p, err := parseKV(method, key, q)
		switch {
		case err != nil && method == http.MethodPost:
			if KindOf(err) != KindMethodNotAllowed {
				t.Fatalf("POST: %v", err)
			}
		case err != nil:
			if KindOf(err) != KindInvalid {
				t.Fatalf("%v has kind %d, want Invalid", err, KindOf(err))
			}
		default:
			if validateKey(key) != nil {
				t.Fatalf("accepted bad key %q", key)
			}
			switch method {
			case http.MethodGet:
				if key == "" && !p.keys && !p.recurse {
					t.Fatal("accepted a single GET of the empty key")
				}
			case http.MethodPut:
				if key == "" || count(has, "cas", "acquire", "release") > 1 {
					t.Fatalf("accepted PUT %q ?%s", key, rawQuery)
				}
				switch p.req.Op {
				case state.OpSet, state.OpCAS:
				case state.OpLock, state.OpUnlock:
					if p.req.Entry.Session == "" {
						t.Fatal("lock op without session")
					}
				default:
					t.Fatalf("PUT became %q", p.req.Op)
				}
			case http.MethodDelete:
				if (key == "" && p.req.Op != state.OpDeleteTree) || count(has, "recurse", "cas") > 1 {
					t.Fatalf("accepted DELETE %q ?%s", key, rawQuery)
				}
			}
			if p.req.Entry.Key != "" && p.req.Entry.Key != key {
				t.Fatalf("key %q became %q", key, p.req.Entry.Key)
			}
		}

		// The whole handler, on a fresh store, with a context that is
		// already over so that a blocking query cannot park.
		e := newEnv(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		req := (&http.Request{Method: method, URL: &url.URL{Path: "/v1/kv/" + key, RawQuery: rawQuery},
			Header: http.Header{}, Body: http.NoBody, Host: "x"}).WithContext(ctx)
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		switch rec.Code {
		case 200, 400, 404, 405, 413:
		case 500:
			if rec.Body.String() != errCancelled.Msg {
				t.Fatalf("%s %q ?%s: 500 %q", method, key, rawQuery, rec.Body.String())
			}
		default:
			t.Fatalf("%s %q ?%s: status %d %q", method, key, rawQuery, rec.Code, rec.Body.String())
		}
	})
}

func FuzzTxnDecode(f *testing.F) {
	for _, s := range []string{
		`[]`, `[{"KV":{"Verb":"set","Key":"a","Value":"aGk=","Flags":3}}]`,
		`[{"KV":{"Verb":"cas","Key":"a","Index":4}},{"KV":{"Verb":"get","Key":"a"}}]`,
		`[{"KV":{"Verb":"check-lock","Key":"l","Session":"s","LockIndex":2}}]`,
		`[{"KV":{"Verb":"unlock","Key":"l","Session":"s","LockIndex":1}}]`,
		`[{"KV":{"Verb":"delete-tree","Key":""}},{"KV":{"Verb":"get-tree","Key":""}}]`,
		`[{"KV":{"Verb":"lock","Key":"k"}}]`, `[{"Node":{}}]`, `[{"KV":null,"Check":null}]`, `[null]`,
		`[{"kv":{"verb":"check-not-exists","key":"x"}}]`, `[{"KV":{"Verb":"set","Key":"a/../b"}}]`,
		`[{"KV":{"Verb":"delete-cas","Key":"d","Index":18446744073709551615}}]`, `{"KV":{}}`, `[{"KV":{"Verb":"set","Key":" "}}]`,
	} {
		f.Add([]byte(s))
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body []byte) {
		const maxValue = 64
		ops, err := decodeTxn(body, maxValue)
		if err != nil {
			if k := KindOf(err); k != KindInvalid && k != KindTooLarge {
				t.Fatalf("%v has kind %d", err, k)
			}
			return
		}
		if len(ops) > state.MaxTxnOps {
			t.Fatalf("%d ops accepted", len(ops))
		}
		for i, op := range ops {
			if op == nil || op.KV == nil {
				t.Fatalf("op %d is empty", i)
			}
			known := false
			for _, tv := range txnVerbs {
				known = known || tv.op == op.KV.Op
			}
			if !known {
				t.Fatalf("op %d: verb %q", i, op.KV.Op)
			}
			k := op.KV.Entry.Key
			if validateKey(k) != nil || (k == "" && op.KV.Op != state.OpGetTree && op.KV.Op != state.OpDeleteTree) {
				t.Fatalf("op %d: key %q accepted", i, k)
			}
			if len(op.KV.Entry.Value) > maxValue {
				t.Fatalf("op %d: %d-byte value accepted", i, len(op.KV.Entry.Value))
			}
		}
		// The FSM carries ops as JSON: they must come back the same...
		b, err := json.Marshal(ops)
		if err != nil {
			t.Fatal(err)
		}
		var back []*state.TxnOp
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, ops) && len(ops) > 0 {
			t.Fatalf("round trip changed the ops:\n%s", b)
		}
		// ...and the store must take them without panicking.
		st := state.New()
		st.Txn(2, now, ops)
	})
}

// FuzzCheckDuration: a catalog check's Definition duration is absent, a
// number of nanoseconds or a Go duration string; whatever the bytes, it
// never panics, and what it accepts is a non-negative duration that reads
// back as itself.
func FuzzCheckDuration(f *testing.F) {
	for _, s := range []string{``, `null`, `""`, `"10s"`, `10000000000`, `1.5e9`, `-1`, `"-1s"`, `"soon"`,
		`1e300`, `"1h2m3.5s"`, `true`, `[1]`, `"\u0031s"`, `0`, `-0`, `"0"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := checkDuration(raw)
		if err != nil || got == "" {
			return
		}
		d, perr := time.ParseDuration(got)
		if perr != nil || d < 0 || d.String() != got {
			t.Fatalf("checkDuration(%q) = %q, which reads back as %v, %v", raw, got, d, perr)
		}
	})
}

// FuzzQueryDecode posts arbitrary bodies as prepared queries: every
// answer is 200 or a 4xx with a sentence, a refused body stores nothing,
// and a stored query keeps the service it asked for and none of the
// filters holdfast refuses.
func FuzzQueryDecode(f *testing.F) {
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `{"Service":{"Service":"web"}}`, `{"Name":"q","Service":{"Service":"web","Tags":["a"]}}`,
		`{"Service":{"Service":"web","NodeMeta":{"a":"b"}}}`, `{"Service":{"Service":"web","NodeMeta":{}}}`,
		`{"Service":{"Service":"web","IgnoreCheckIDs":null,"Connect":false,"Peer":"","Failover":{"NearestN":3}}}`,
		`{"Service":{"Service":"web","ServiceMeta":{"v":"1"}}}`, `{"Template":{"Type":"name_prefix_match"},"Service":{"Service":"w"}}`,
		`{"Service":{"Service":""}}`, `{"Service":"web"}`, `{"Service":{"Service":"web"}} x`, `{"Session":"nope","Service":{"Service":"w"}}`,
		`{"Service":{"Service":"w","Failover":{"Targets":[{"Datacenter":"dc2"},{"Peer":"p"}]}},"DNS":{"TTL":"10s"}}`,
		`{"Service":{"Service":"w","Failover":{"NearestN":-1}},"DNS":{"TTL":"-1h"}}`, `{"ID":"x","Token":"<hidden>","Service":{"Service":"w"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		e := newEnv(t)
		r := e.do("POST", "/v1/query", string(body))
		switch {
		case r.Code == http.StatusOK:
			var got []struct {
				Service map[string]interface{}
			}
			e.do("GET", "/v1/query", "").want(t, 200, "*").json(t, &got)
			if len(got) != 1 || got[0].Service["Service"] == "" {
				t.Fatalf("stored after 200: %+v", got)
			}
			for _, k := range []string{"NodeMeta", "ServiceMeta", "IgnoreCheckIDs", "Connect", "Peer", "SamenessGroup"} {
				if _, ok := got[0].Service[k]; ok {
					t.Fatalf("stored field %s that holdfast does not apply: %+v", k, got[0].Service)
				}
			}
		case r.Code >= 400 && r.Code < 500:
			if r.Body == "" {
				t.Fatalf("%d without a sentence", r.Code)
			}
			e.do("GET", "/v1/query", "").want(t, 200, "[]")
		default:
			t.Fatalf("answer %d %q", r.Code, r.Body)
		}
	})
}
