package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// answer is what the stand-in agent replies to the one request a command
// makes.
type answer struct {
	code   int
	header map[string]string
	body   string
}

// agentStub stands in for a holdfast agent: it records each request as a
// line "METHOD /path?query body" and answers with a fixed reply.
type agentStub struct {
	mu       sync.Mutex
	requests []string
	reply    answer
	srv      *httptest.Server
}

func newAgentStub(t *testing.T, reply answer) *agentStub {
	t.Helper()
	a := &agentStub{reply: reply}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		line := r.Method + " " + r.URL.Path
		if q := flatQuery(r.URL.Query()); q != "" {
			line += "?" + q
		}
		if len(b) > 0 {
			line += " " + string(b)
		}
		a.mu.Lock()
		a.requests = append(a.requests, line)
		a.mu.Unlock()
		h := w.Header()
		h.Set("X-Consul-Index", "5")
		h.Set("X-Consul-KnownLeader", "true")
		h.Set("X-Consul-LastContact", "0")
		for k, v := range a.reply.header {
			h.Set(k, v)
		}
		code := a.reply.code
		if code == 0 {
			code = 200
		}
		w.WriteHeader(code)
		io.WriteString(w, a.reply.body)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *agentStub) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.requests...)
}

// flatQuery renders a query sorted, with valueless parameters bare and
// values unescaped, e.g. "keys&separator=/".
func flatQuery(q url.Values) string {
	var parts []string
	for _, kv := range strings.Split(q.Encode(), "&") {
		if kv == "" {
			continue
		}
		kv = strings.TrimSuffix(kv, "=")
		if u, err := url.QueryUnescape(kv); err == nil {
			kv = u
		}
		parts = append(parts, kv)
	}
	return strings.Join(parts, "&")
}

// cliCase is one run of the command line against the stub.
type cliCase struct {
	name     string
	args     []string
	stdin    string
	reply    answer
	wantReq  string // the one request expected; "" means none
	wantOut  string
	wantErr  string
	wantCode int
}

// runCLI runs args through Run with the stub's address in
// HOLDFAST_HTTP_ADDR, and returns stdout, stderr and the exit code.
func runCLI(t *testing.T, a *agentStub, args []string, stdin string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	env := map[string]string{"HOLDFAST_HTTP_ADDR": a.srv.URL}
	stdio := Stdio{In: strings.NewReader(stdin), Out: &out, Err: &errb, Getenv: func(k string) string { return env[k] }}
	err := Run(context.Background(), args, stdio)
	if ee, ok := err.(*ExitError); err != nil && (!ok || !ee.Silent) {
		// main prints non-silent errors; mimic it.
		errb.WriteString(err.Error() + "\n")
	}
	return out.String(), errb.String(), ExitCode(err)
}

func runCases(t *testing.T, cases []cliCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reply := tc.reply
			if reply.body == "" && reply.code == 0 {
				reply.body = "true"
			}
			a := newAgentStub(t, reply)
			out, errs, code := runCLI(t, a, tc.args, tc.stdin)
			if out != tc.wantOut {
				t.Errorf("stdout:\n%q\nwant:\n%q", out, tc.wantOut)
			}
			if errs != tc.wantErr {
				t.Errorf("stderr:\n%q\nwant:\n%q", errs, tc.wantErr)
			}
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d", code, tc.wantCode)
			}
			reqs := a.seen()
			switch {
			case tc.wantReq == "" && len(reqs) != 0:
				t.Errorf("requests %q, want none", reqs)
			case tc.wantReq != "" && (len(reqs) != 1 || reqs[0] != tc.wantReq):
				t.Errorf("requests %q, want [%q]", reqs, tc.wantReq)
			}
		})
	}
}

const sid = "4ee167e5-32f4-0b21-2f25-d02b861dc06c"

func TestKVPut(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "license.lic")
	if err := os.WriteFile(file, []byte("from a file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "nope")
	_, statErr := os.ReadFile(missing)

	const k = "redis/config/minconns"
	runCases(t, []cliCase{
		{name: "plain", args: []string{"kv", "put", k, "10"},
			wantReq: "PUT /v1/kv/" + k + " 10", wantOut: "Success! Data written to: " + k + "\n"},
		{name: "no data", args: []string{"kv", "put", "webapp/beta/active"},
			wantReq: "PUT /v1/kv/webapp/beta/active", wantOut: "Success! Data written to: webapp/beta/active\n"},
		{name: "empty data", args: []string{"kv", "put", "k", ""},
			wantReq: "PUT /v1/kv/k", wantOut: "Success! Data written to: k\n"},
		{name: "flags", args: []string{"kv", "put", "-flags=42", "k", "v"},
			wantReq: "PUT /v1/kv/k?flags=42 v", wantOut: "Success! Data written to: k\n"},
		{name: "session alone is ignored", args: []string{"kv", "put", "-session=" + sid, "k", "v"},
			wantReq: "PUT /v1/kv/k v", wantOut: "Success! Data written to: k\n"},
		{name: "data from stdin", args: []string{"kv", "put", "k", "-"}, stdin: "abcd1234\n",
			wantReq: "PUT /v1/kv/k abcd1234\n", wantOut: "Success! Data written to: k\n"},
		{name: "dash-prefixed data is literal", args: []string{"kv", "put", "k", "-5"},
			wantReq: "PUT /v1/kv/k -5", wantOut: "Success! Data written to: k\n"},
		{name: "data from file", args: []string{"kv", "put", "k", "@" + file},
			wantReq: "PUT /v1/kv/k from a file\n", wantOut: "Success! Data written to: k\n"},
		{name: "missing file", args: []string{"kv", "put", "k", "@" + missing},
			wantErr: "Error! Failed to read file: " + statErr.Error() + "\n", wantCode: 1},
		{name: "base64", args: []string{"kv", "put", "-base64", "k", "aGVsbG8="},
			wantReq: "PUT /v1/kv/k hello", wantOut: "Success! Data written to: k\n"},
		{name: "bad base64", args: []string{"kv", "put", "-base64", "k", "*"},
			wantErr: "Error! Cannot base 64 decode data: illegal base64 data at input byte 0\n", wantCode: 1},
		{name: "server error", args: []string{"kv", "put", "k", "v"}, reply: answer{code: 500, body: "No cluster leader"},
			wantReq: "PUT /v1/kv/k v", wantErr: "Error! Failed writing data: Unexpected response code: 500 (No cluster leader)\n", wantCode: 1},
		{name: "leading slash", args: []string{"kv", "put", "/k", "v"},
			wantErr: "Error! Failed writing data: Invalid key. Key must not begin with a '/': /k\n", wantCode: 1},
		{name: "missing key", args: []string{"kv", "put"},
			wantErr: "Error! Missing KEY argument\n", wantCode: 1},
		{name: "too many arguments", args: []string{"kv", "put", "a", "b", "c"},
			wantErr: "Error! Too many arguments (expected 1 or 2, got 3)\n", wantCode: 1},

		{name: "acquire", args: []string{"kv", "put", "-acquire", "-session=" + sid, k, "1"},
			wantReq: "PUT /v1/kv/" + k + "?acquire=" + sid + " 1", wantOut: "Success! Lock acquired on: " + k + "\n"},
		{name: "acquire refused", args: []string{"kv", "put", "-acquire", "-session=79c92b78-0c0a-b273-2c34-24d538c2c558", k, "2"},
			reply:   answer{body: "false"},
			wantReq: "PUT /v1/kv/" + k + "?acquire=79c92b78-0c0a-b273-2c34-24d538c2c558 2", wantErr: "Error! Did not acquire lock\n", wantCode: 1},
		{name: "acquire error", args: []string{"kv", "put", "-acquire", "-session=nope", "k"},
			reply:   answer{code: 500, body: `invalid session "nope"`},
			wantReq: "PUT /v1/kv/k?acquire=nope", wantErr: "Error! Failed writing data: Unexpected response code: 500 (invalid session \"nope\")\n", wantCode: 1},
		{name: "release wipes the value", args: []string{"kv", "put", "-release", "-session=" + sid, k},
			wantReq: "PUT /v1/kv/" + k + "?release=" + sid, wantOut: "Success! Lock released on: " + k + "\n"},
		{name: "release refused", args: []string{"kv", "put", "-release", "-session=79c92b78", k, "1"},
			reply:   answer{body: "false"},
			wantReq: "PUT /v1/kv/" + k + "?release=79c92b78 1", wantErr: "Error! Did not release lock\n", wantCode: 1},
		{name: "release error prints the key", args: []string{"kv", "put", "-release", "-session=s", "k"},
			reply:   answer{code: 500, body: "boom"},
			wantReq: "PUT /v1/kv/k?release=s", wantErr: "Error! Failed writing data: k\n", wantCode: 1},
		{name: "release without session", args: []string{"kv", "put", "-release", k, "10"},
			wantErr: "Error! Missing -session (required with -acquire and -release)\n", wantCode: 1},
		{name: "acquire without session", args: []string{"kv", "put", "-acquire", k},
			wantErr: "Error! Missing -session (required with -acquire and -release)\n", wantCode: 1},

		{name: "cas", args: []string{"kv", "put", "-cas", "-modify-index=844", "config/redis/maxconns", "5"},
			wantReq: "PUT /v1/kv/config/redis/maxconns?cas=844 5", wantOut: "Success! Data written to: config/redis/maxconns\n"},
		{name: "cas failed", args: []string{"kv", "put", "-cas", "-modify-index=3", "k", "5"}, reply: answer{body: "false"},
			wantReq: "PUT /v1/kv/k?cas=3 5", wantErr: "Error! Did not write to k: CAS failed\n", wantCode: 1},
		{name: "cas zero on existing key", args: []string{"kv", "put", "-cas", "k", "5"}, reply: answer{body: "false"},
			wantReq: "PUT /v1/kv/k?cas=0 5", wantErr: "Error! Did not write to k: CAS performed with index=0 and key already exists.\n", wantCode: 1},
		{name: "cas zero creates", args: []string{"kv", "put", "-cas", "-modify-index=0", "k", "5"},
			wantReq: "PUT /v1/kv/k?cas=0 5", wantOut: "Success! Data written to: k\n"},
		{name: "cas error", args: []string{"kv", "put", "-cas", "-modify-index=3", "k"}, reply: answer{code: 500, body: "No cluster leader"},
			wantReq: "PUT /v1/kv/k?cas=3", wantErr: "Error! Did not write to k: Unexpected response code: 500 (No cluster leader)\n", wantCode: 1},
	})
}

func TestKVPutBadFlag(t *testing.T) {
	a := newAgentStub(t, answer{body: "true"})
	out, errs, code := runCLI(t, a, []string{"kv", "put", "-bogus", "k"}, "")
	if code != 1 || out != "" || !strings.HasPrefix(errs, "flag provided but not defined: -bogus\nUsage: holdfast kv put") {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out, errs)
	}
	out, errs, code = runCLI(t, a, []string{"kv", "put", "-h"}, "")
	if code != 0 || out != "" || !strings.HasPrefix(errs, "Usage: holdfast kv put") || !strings.Contains(errs, "-modify-index") {
		t.Fatalf("-h: code %d, stdout %q, stderr %q", code, out, errs)
	}
	if len(a.seen()) != 0 {
		t.Fatal("requests sent")
	}
}

// pairJSON is one DirEntry as the server sends it.
func pairJSON(lockIndex, createIndex, modifyIndex int, key, value64, session string) string {
	s := ""
	if session != "" {
		s = `,"Session":"` + session + `"`
	}
	v := "null"
	if value64 != "" {
		v = `"` + value64 + `"`
	}
	return `{"LockIndex":` + itoa(lockIndex) + `,"Key":"` + key + `","Flags":0,"Value":` + v + s +
		`,"CreateIndex":` + itoa(createIndex) + `,"ModifyIndex":` + itoa(modifyIndex) + `}`
}

func itoa(n int) string {
	var b []byte
	if n == 0 {
		return "0"
	}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func TestKVGet(t *testing.T) {
	const k = "redis/config/minconns"
	const s1 = "e6c8e941-4c80-1ead-cedc-80d66fb99e64"
	locked := "[" + pairJSON(1, 3874, 3937, k, "MQ==", s1) + "]"
	released := "[" + pairJSON(0, 3874, 4021, k, "", "") + "]"
	two := "[" + pairJSON(0, 3, 3, "redis/a", "MQ==", "") + "," + pairJSON(2, 4, 9, "redis/b", "Mg==", s1) + "]"

	runCases(t, []cliCase{
		{name: "value", args: []string{"kv", "get", k}, reply: answer{body: locked},
			wantReq: "GET /v1/kv/" + k, wantOut: "1\n"},
		{name: "empty value prints an empty line", args: []string{"kv", "get", k}, reply: answer{body: released},
			wantReq: "GET /v1/kv/" + k, wantOut: "\n"},
		{name: "base64", args: []string{"kv", "get", "-base64", k}, reply: answer{body: locked},
			wantReq: "GET /v1/kv/" + k, wantOut: "MQ==\n"},
		{name: "missing", args: []string{"kv", "get", "-detailed", k}, reply: answer{code: 404},
			wantReq: "GET /v1/kv/" + k, wantErr: "Error! No key exists at: " + k + "\n", wantCode: 1},
		{name: "detailed, locked", args: []string{"kv", "get", "-detailed", k}, reply: answer{body: locked},
			wantReq: "GET /v1/kv/" + k,
			wantOut: "CreateIndex      3874\n" +
				"Flags            0\n" +
				"Key              redis/config/minconns\n" +
				"LockIndex        1\n" +
				"ModifyIndex      3937\n" +
				"Session          e6c8e941-4c80-1ead-cedc-80d66fb99e64\n" +
				"Value            1\n"},
		{name: "detailed, released, empty value", args: []string{"kv", "get", "-detailed", k}, reply: answer{body: released},
			wantReq: "GET /v1/kv/" + k,
			// With an empty value the "Value" cell is the last of its line,
			// so tabwriter does not pad it: consul prints a bare "Value",
			// as the seed transcript shows.
			wantOut: "CreateIndex      3874\n" +
				"Flags            0\n" +
				"Key              redis/config/minconns\n" +
				"LockIndex        0\n" +
				"ModifyIndex      4021\n" +
				"Session          -\n" +
				"Value\n"},
		{name: "leading slash stripped", args: []string{"kv", "get", "/" + k}, reply: answer{body: locked},
			wantReq: "GET /v1/kv/" + k, wantOut: "1\n"},
		{name: "stale", args: []string{"kv", "get", "-stale", k}, reply: answer{body: locked},
			wantReq: "GET /v1/kv/" + k + "?stale", wantOut: "1\n"},
		{name: "recurse", args: []string{"kv", "get", "-recurse", "redis/"}, reply: answer{body: two},
			wantReq: "GET /v1/kv/redis/?recurse", wantOut: "redis/a:1\nredis/b:2\n"},
		{name: "recurse base64", args: []string{"kv", "get", "-recurse", "-base64", "redis/"}, reply: answer{body: two},
			wantReq: "GET /v1/kv/redis/?recurse", wantOut: "redis/a:MQ==\nredis/b:Mg==\n"},
		{name: "recurse at root", args: []string{"kv", "get", "-recurse"}, reply: answer{body: two},
			wantReq: "GET /v1/kv/?recurse", wantOut: "redis/a:1\nredis/b:2\n"},
		{name: "recurse over nothing", args: []string{"kv", "get", "-recurse", "none/"}, reply: answer{code: 404},
			wantReq: "GET /v1/kv/none/?recurse", wantOut: ""},
		{name: "recurse detailed", args: []string{"kv", "get", "-recurse", "-detailed", "redis/"}, reply: answer{body: two},
			wantReq: "GET /v1/kv/redis/?recurse",
			wantOut: "CreateIndex      3\nFlags            0\nKey              redis/a\nLockIndex        0\n" +
				"ModifyIndex      3\nSession          -\nValue            1\n" +
				"\n" +
				"CreateIndex      4\nFlags            0\nKey              redis/b\nLockIndex        2\n" +
				"ModifyIndex      9\nSession          " + s1 + "\nValue            2\n"},
		{name: "keys", args: []string{"kv", "get", "-keys", "redis/"}, reply: answer{body: `["redis/a","redis/config/"]`},
			wantReq: "GET /v1/kv/redis/?keys&separator=/", wantOut: "redis/a\nredis/config/\n"},
		{name: "keys without separator", args: []string{"kv", "get", "-keys", "-separator=", "redis/"}, reply: answer{body: `["redis/a"]`},
			wantReq: "GET /v1/kv/redis/?keys", wantOut: "redis/a\n"},
		{name: "keys at root", args: []string{"kv", "get", "-keys"}, reply: answer{body: `[]`},
			wantReq: "GET /v1/kv/?keys&separator=/", wantOut: ""},
		{name: "keys recurse", args: []string{"kv", "get", "-keys", "-recurse", "redis/"}, reply: answer{body: two},
			wantReq: "GET /v1/kv/redis/?recurse", wantOut: "redis/a\nredis/b\n"},
		{name: "keys recurse detailed leaves out Value", args: []string{"kv", "get", "-keys", "-recurse", "-detailed", "redis/"},
			reply: answer{body: two}, wantReq: "GET /v1/kv/redis/?recurse",
			wantOut: "CreateIndex      3\nFlags            0\nKey              redis/a\nLockIndex        0\n" +
				"ModifyIndex      3\nSession          -\n\n" +
				"\n" +
				"CreateIndex      4\nFlags            0\nKey              redis/b\nLockIndex        2\n" +
				"ModifyIndex      9\nSession          " + s1 + "\n\n"},
		{name: "missing key", args: []string{"kv", "get"}, wantErr: "Error! Missing KEY argument\n", wantCode: 1},
		{name: "slash is no key", args: []string{"kv", "get", "/"}, wantErr: "Error! Missing KEY argument\n", wantCode: 1},
		{name: "too many arguments", args: []string{"kv", "get", "a", "b"},
			wantErr: "Too many arguments (expected 1, got 2)\n", wantCode: 1},
		{name: "server error", args: []string{"kv", "get", k}, reply: answer{code: 500, body: "No cluster leader"},
			wantReq: "GET /v1/kv/" + k, wantErr: "Error querying Consul agent: Unexpected response code: 500 (No cluster leader)\n", wantCode: 1},
	})
}

func TestKVDelete(t *testing.T) {
	runCases(t, []cliCase{
		{name: "key", args: []string{"kv", "delete", "redis/config/minconns"},
			wantReq: "DELETE /v1/kv/redis/config/minconns", wantOut: "Success! Deleted key: redis/config/minconns\n"},
		{name: "leading slash stripped", args: []string{"kv", "delete", "/foo"},
			wantReq: "DELETE /v1/kv/foo", wantOut: "Success! Deleted key: foo\n"},
		{name: "recurse", args: []string{"kv", "delete", "-recurse", "redis/"},
			wantReq: "DELETE /v1/kv/redis/?recurse", wantOut: "Success! Deleted keys with prefix: redis/\n"},
		{name: "recurse everything", args: []string{"kv", "delete", "-recurse"},
			wantReq: "DELETE /v1/kv/?recurse", wantOut: "Success! Deleted keys with prefix: \n"},
		{name: "cas", args: []string{"kv", "delete", "-cas", "-modify-index=12", "foo"},
			wantReq: "DELETE /v1/kv/foo?cas=12", wantOut: "Success! Deleted key: foo\n"},
		{name: "cas failed", args: []string{"kv", "delete", "-cas", "-modify-index=12", "foo"}, reply: answer{body: "false"},
			wantReq: "DELETE /v1/kv/foo?cas=12", wantErr: "Error! Did not delete key foo: CAS failed\n", wantCode: 1},
		{name: "cas without index", args: []string{"kv", "delete", "-cas", "foo"},
			wantErr: "Cannot delete a key that does not exist. Provide a -modify-index greater than than 0.\n", wantCode: 1},
		{name: "index without cas", args: []string{"kv", "delete", "-modify-index=3", "foo"},
			wantErr: "Cannot specify -modify-index without -cas!\n", wantCode: 1},
		{name: "cas and recurse", args: []string{"kv", "delete", "-cas", "-modify-index=3", "-recurse", "foo"},
			wantErr: "Cannot specify both -cas and -recurse!\n", wantCode: 1},
		{name: "missing key", args: []string{"kv", "delete"}, wantErr: "Error! Missing KEY argument\n", wantCode: 1},
		{name: "too many arguments", args: []string{"kv", "delete", "a", "b", "c"},
			wantErr: "Too many arguments (expected 1, got 3)\n", wantCode: 1},
		{name: "error", args: []string{"kv", "delete", "foo"}, reply: answer{code: 500, body: "No cluster leader"},
			wantReq: "DELETE /v1/kv/foo", wantErr: "Error deleting key foo: Unexpected response code: 500 (No cluster leader)\n", wantCode: 1},
		{name: "recurse error", args: []string{"kv", "delete", "-recurse", "p"}, reply: answer{code: 500, body: "x"},
			wantReq: "DELETE /v1/kv/p?recurse", wantErr: "Error! Did not delete prefix p: Unexpected response code: 500 (x)\n", wantCode: 1},
		{name: "cas error", args: []string{"kv", "delete", "-cas", "-modify-index=1", "p"}, reply: answer{code: 500, body: "x"},
			wantReq: "DELETE /v1/kv/p?cas=1", wantErr: "Error! Did not delete key p: Unexpected response code: 500 (x)\n", wantCode: 1},
	})
}

func TestKVDispatch(t *testing.T) {
	a := newAgentStub(t, answer{body: "true"})
	tests := []struct {
		args     []string
		wantCode int
		wantErr  string // prefix of stderr
	}{
		{[]string{"kv"}, 1, "Usage: holdfast kv <subcommand>"},
		{[]string{"kv", "-h"}, 0, "Usage: holdfast kv <subcommand>"},
		{[]string{"kv", "frobnicate"}, 1, "Usage: holdfast kv <subcommand>"},
		{[]string{"kv", "get", "-h"}, 0, "Usage: holdfast kv get"},
	}
	for _, tt := range tests {
		out, errs, code := runCLI(t, a, tt.args, "")
		if code != tt.wantCode || out != "" || !strings.HasPrefix(errs, tt.wantErr) {
			t.Errorf("%v: code %d stdout %q stderr %q", tt.args, code, out, errs)
		}
	}
}

func TestHTTPAddress(t *testing.T) {
	a := newAgentStub(t, answer{body: "true"})
	// The process environment is never read.
	t.Setenv("HOLDFAST_HTTP_ADDR", "127.0.0.1:1")
	t.Setenv("CONSUL_HTTP_ADDR", "127.0.0.1:1")

	// From stdio's environment.
	if _, errs, code := runCLI(t, a, []string{"kv", "put", "k", "v"}, ""); code != 0 {
		t.Fatalf("env: code %d stderr %q", code, errs)
	}
	// -http-addr wins over the environment.
	var out, errb bytes.Buffer
	stdio := Stdio{Out: &out, Err: &errb, Getenv: func(k string) string {
		if k == "HOLDFAST_HTTP_ADDR" {
			return "127.0.0.1:1"
		}
		return ""
	}}
	err := Run(context.Background(), []string{"kv", "put", "-http-addr=" + a.srv.URL, "k", "v"}, stdio)
	if err != nil || out.String() != "Success! Data written to: k\n" {
		t.Fatalf("flag: err %v stdout %q stderr %q", err, out.String(), errb.String())
	}
	if n := len(a.seen()); n != 2 {
		t.Fatalf("%d requests reached the stub, want 2", n)
	}
	// A bad address is reported the way consul does.
	out.Reset()
	errb.Reset()
	err = Run(context.Background(), []string{"kv", "get", "-http-addr=ftp://x", "k"}, stdio)
	if ExitCode(err) != 1 || !strings.HasPrefix(errb.String(), "Error connecting to Consul agent: ") {
		t.Fatalf("bad addr: err %v stderr %q", err, errb.String())
	}
}
