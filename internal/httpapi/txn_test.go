package httpapi

import (
	"reflect"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

func TestTxnSetGet(t *testing.T) {
	e := newEnv(t)
	r := e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"set","Key":"a","Value":"aGk=","Flags":3},"Node":null,"Service":null,"Check":null},
		{"kv":{"verb":"get","key":"a"}}]`).want(t, 200, "*")
	idx := u64(e.b.index())
	want := `{"Results":[{"KV":{"LockIndex":0,"Key":"a","Flags":3,"Value":null,"CreateIndex":` + idx + `,"ModifyIndex":` + idx + `}},` +
		`{"KV":{"LockIndex":0,"Key":"a","Flags":3,"Value":"aGk=","CreateIndex":` + idx + `,"ModifyIndex":` + idx + `}}],"Errors":null}`
	if r.Body != want {
		t.Fatalf("body\n%s\nwant\n%s", r.Body, want)
	}
	e.do("PUT", "/v1/txn", `[]`).want(t, 200, `{"Results":null,"Errors":null}`)
}

func TestTxnFieldMapping(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"cas","Key":"a","Index":0}},{"KV":{"Verb":"check-index","Key":"b","Index":9}},
		{"KV":{"Verb":"delete-cas","Key":"c","Index":8}},{"KV":{"Verb":"check-lock","Key":"d","Session":"s","LockIndex":4,"Index":2}},
		{"KV":{"Verb":"unlock","Key":"e","Session":"s","LockIndex":5}},{"KV":{"Verb":"lock","Key":"f","Session":"s","LockIndex":6,"Index":3}}]`).
		want(t, 409, "*")
	ops := e.b.lastTxn
	if len(ops) != 6 {
		t.Fatalf("%d ops reached the backend", len(ops))
	}
	for i, want := range []state.DirEntry{
		{Key: "a"}, {Key: "b", ModifyIndex: 9}, {Key: "c", ModifyIndex: 8},
		{Key: "d", Session: "s", LockIndex: 4}, {Key: "e", Session: "s", LockIndex: 5}, {Key: "f", Session: "s"},
	} {
		got := ops[i].KV.Entry
		got.Value = nil
		if !reflect.DeepEqual(got, want) {
			t.Errorf("op %d: %+v, want %+v", i, got, want)
		}
	}
}

func TestTxnRollback(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/a", "1").want(t, 200, "true")
	e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"set","Key":"b","Value":"Mg=="}},{"KV":{"Verb":"cas","Key":"a","Index":1}}]`).
		want(t, 409, `{"Results":null,"Errors":[{"OpIndex":1,"What":"failed to set key \"a\", index is stale"}]}`)
	e.do("GET", "/v1/kv/b", "").want(t, 404, "")
}

func TestTxnLocksAndFencing(t *testing.T) {
	e := newEnv(t)
	s := e.createSession(`{"LockDelay":"5s"}`)
	e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"lock","Key":"l","Session":"`+s+`"}}]`).want(t, 200, "*")
	e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"check-lock","Key":"l","Session":"`+s+`","LockIndex":1}},
		{"KV":{"Verb":"set","Key":"guarded","Value":"eA=="}}]`).want(t, 200, "*")
	r := e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"check-lock","Key":"l","Session":"`+s+`","LockIndex":2}}]`).want(t, 409, "*")
	if !strings.Contains(r.Body, "failed lock check") {
		t.Fatalf("body %s", r.Body)
	}
	e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"unlock","Key":"l","Session":"`+s+`","LockIndex":7}}]`).want(t, 409, "*")
	e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"unlock","Key":"l","Session":"`+s+`","LockIndex":1}}]`).want(t, 200, "*")

	// Lock-delay after invalidation.
	e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"lock","Key":"l","Session":"`+s+`"}}]`).want(t, 200, "*")
	e.do("PUT", "/v1/session/destroy/"+s, "").want(t, 200, "true")
	s2 := e.createSession("")
	e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"lock","Key":"l","Session":"`+s2+`"}}]`).
		want(t, 409, `{"Results":null,"Errors":[{"OpIndex":0,"What":"failed to lock key \"l\" due to lock delay"}]}`)
}

func TestTxnDecodeErrors(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxValueSize = 4 })
	many := "[" + strings.Repeat(`{"KV":{"Verb":"get","Key":"k"}},`, 128) + `{"KV":{"Verb":"get","Key":"k"}}]`
	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`[{"KV":{"Verb":"explode","Key":"k"}}]`, 400, `Operation 0 has unknown KV verb "explode"`},
		{`[{"KV":{"Verb":"get","Key":"k"}},{"KV":{"Verb":"","Key":"k"}}]`, 400, `Operation 1 has unknown KV verb ""`},
		{many, 413, "Transaction contains too many operations (129 > 128)"},
		{`[{"Node":{"Verb":"get","Node":{"Node":"n"}}}]`, 400, "Operation 0 is a Node operation: holdfast transactions support only KV operations"},
		{`[{"KV":{"Verb":"get","Key":"k"},"Check":{}}]`, 400, "Operation 0 is a Check operation: holdfast transactions support only KV operations"},
		{`[{}]`, 400, "Operation 0 has no KV part"},
		{`[null]`, 400, "Operation 0 is null"},
		{`[{"KV":{"Verb":"set","Key":"k","Value":"!!"}}]`, 400, "*"},
		{`{"KV":{}}`, 400, "*"},
		{`[{"KV":{"Verb":"set","Key":""}}]`, 400, "Operation 0 (set) is missing a key name"},
		{`[{"KV":{"Verb":"set","Key":"a/../b"}}]`, 400, `Operation 0: Invalid key "a/../b": ".." path segments are not allowed`},
		{`[{"KV":{"Verb":"lock","Key":"k"}}]`, 400, "Operation 0 (lock) is missing a session"},
		{`[{"KV":{"Verb":"set","Key":"k","Value":"MTIzNDU="}}]`, 413, `Value for key "k" is too large (5 > 4 bytes)`},
		{`[{"KV":{"Verb":"set","Key":"k","Flags":-1}}]`, 400, "*"},
	} {
		r := e.do("PUT", "/v1/txn", c.body).want(t, c.code, c.want)
		if c.want == "*" && !strings.HasPrefix(r.Body, "Failed to parse body: ") {
			t.Errorf("%s: %q", c.body, r.Body)
		}
	}
	e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"get-tree","Key":""}},{"KV":{"Verb":"check-not-exists","Key":"zz"}}]`).
		want(t, 200, `{"Results":null,"Errors":null}`)
}

// A rolled-back transaction answers 409 with a JSON body; Consul encodes
// that body like every other JSON answer, so ?pretty gives four-space
// indentation and a trailing newline there too (spec §0). holdfast used to
// write the 409 body compact whatever the query said.
func TestTxnConflictHonoursPretty(t *testing.T) {
	e := newEnv(t)
	body := `[{"KV":{"Verb":"get","Key":"absent"}}]`

	want := `{
    "Results": null,
    "Errors": [
        {
            "OpIndex": 0,
            "What": "key \"absent\" doesn't exist"
        }
    ]
}
`
	r := e.do("PUT", "/v1/txn?pretty", body).want(t, 409, want)
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("409 Content-Type %q", ct)
	}

	// Without ?pretty the body stays compact.
	e.do("PUT", "/v1/txn", body).
		want(t, 409, `{"Results":null,"Errors":[{"OpIndex":0,"What":"key \"absent\" doesn't exist"}]}`)

	// The 200 answer of the same endpoint already honoured ?pretty; keep
	// the two in step.
	e.do("PUT", "/v1/txn?pretty", `[]`).want(t, 200, "{\n    \"Results\": null,\n    \"Errors\": null\n}\n")
}

// A transaction that only reads answers with a read's headers, as Consul's
// does (its client parses them into QueryMeta); one that writes does not.
func TestTxnReadOnlyHasReadHeaders(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/a", "1").want(t, 200, "true")
	r := e.do("GET", "/v1/kv/a", "").want(t, 200, "*")
	idx := r.Header.Get("X-Consul-Index")

	for _, c := range []struct {
		body string
		code int
	}{
		{`[{"KV":{"Verb":"get","Key":"a"}},{"KV":{"Verb":"check-not-exists","Key":"b"}}]`, 200},
		{`[{"KV":{"Verb":"get","Key":"absent"}}]`, 409}, // rolled back, still a read
	} {
		body := c.body
		r := e.do("PUT", "/v1/txn", body).want(t, c.code, "*")
		if got := r.Header.Get("X-Consul-Index"); got != idx {
			t.Errorf("%s: X-Consul-Index %q, want %q", body, got, idx)
		}
		if r.Header.Get("X-Consul-Knownleader") != "true" || r.Header.Get("X-Consul-Lastcontact") == "" {
			t.Errorf("%s: headers %v", body, r.Header)
		}
	}
	r = e.do("PUT", "/v1/txn", `[{"KV":{"Verb":"get","Key":"a"}},{"KV":{"Verb":"set","Key":"c","Value":"MQ=="}}]`).want(t, 200, "*")
	if got := r.Header.Get("X-Consul-Index"); got != "" {
		t.Errorf("a writing transaction has X-Consul-Index %q", got)
	}
}

// A transaction that only reads is a read: it goes through no log entry,
// and it honours ?stale and ?consistent like any read.
func TestTxnReadOnlyIsARead(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/a", "1").want(t, 200, "true")
	e.b.mu.Lock()
	e.b.lastTxn = nil
	e.b.mu.Unlock()
	body := `[{"KV":{"Verb":"get","Key":"a"}},{"KV":{"Verb":"check-not-exists","Key":"b"}}]`
	for q, mode := range map[string]string{"": "leader", "?stale": "stale", "?consistent": "consistent"} {
		before := e.b.consistent.Load()
		r := e.do("PUT", "/v1/txn"+q, body).want(t, 200, "*")
		if got := r.Header.Get("X-Consul-Effective-Consistency"); got != mode {
			t.Errorf("%q: consistency %q, want %q", q, got, mode)
		}
		if asked := e.b.consistent.Load() - before; asked != map[bool]int64{true: 1, false: 0}[mode == "consistent"] {
			t.Errorf("%q: %d consistent-read checks", q, asked)
		}
		var out struct {
			Results []struct{ KV struct{ Key, Value string } }
		}
		r.json(t, &out)
		if len(out.Results) != 1 || out.Results[0].KV.Key != "a" || out.Results[0].KV.Value != "MQ==" {
			t.Errorf("%q: %s", q, r.Body)
		}
	}
	e.b.mu.Lock()
	defer e.b.mu.Unlock()
	if e.b.lastTxn != nil {
		t.Fatal("a read-only transaction went to the backend's Txn (a log entry)")
	}
}
