package api

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
)

// consulSession is a session as a Consul server prints it.
const consulSession = `{"ID":"62666b3e-bab8-f381-a0dc-b9007bf11168","Name":"my-service-lock","Node":"VM-0-17-centos",` +
	`"LockDelay":15000000000,"Behavior":"release","TTL":"30s","NodeChecks":["serfHealth"],"ServiceChecks":null,` +
	`"CreateIndex":3783,"ModifyIndex":3783}`

var wantSession = &SessionEntry{
	ID: "62666b3e-bab8-f381-a0dc-b9007bf11168", Name: "my-service-lock", Node: "VM-0-17-centos",
	LockDelay: 15 * time.Second, Behavior: "release", TTL: "30s", NodeChecks: []string{"serfHealth"},
	CreateIndex: 3783, ModifyIndex: 3783,
}

func TestSessionEntryJSON(t *testing.T) {
	var se SessionEntry
	if err := json.Unmarshal([]byte(consulSession), &se); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&se, wantSession) {
		t.Fatalf("decoded %+v, want %+v", se, wantSession)
	}
	// Marshalling gives back Consul's bytes: same names, same order,
	// LockDelay in nanoseconds, Checks left out.
	if got := mustJSON(t, se); got != consulSession {
		t.Errorf("json = %s\nwant   %s", got, consulSession)
	}
	withService := SessionEntry{ID: "x", ServiceChecks: []ServiceCheck{{ID: "web", Namespace: ""}}}
	want := `{"ID":"x","Name":"","Node":"","LockDelay":0,"Behavior":"","TTL":"","NodeChecks":null,` +
		`"ServiceChecks":[{"ID":"web","Namespace":""}],"CreateIndex":0,"ModifyIndex":0}`
	if got := mustJSON(t, withService); got != want {
		t.Errorf("json = %s\nwant   %s", got, want)
	}
}

func TestSessionCreateBody(t *testing.T) {
	tests := []struct {
		name     string
		noChecks bool
		se       *SessionEntry
		wantBody string // "" means no body at all
	}{
		{"nil sends no body", false, nil, ""},
		{"zero entry", false, &SessionEntry{}, `{}`},
		{"typical", false, &SessionEntry{Name: "my-service-lock", Behavior: "release", TTL: "30s", LockDelay: 15 * time.Second},
			`{"Behavior":"release","LockDelay":"15000ms","Name":"my-service-lock","TTL":"30s"}`},
		{"sub-millisecond lock delay rounds up", false, &SessionEntry{LockDelay: time.Microsecond}, `{"LockDelay":"1ms"}`},
		{"negative lock delay sends zero", false, &SessionEntry{LockDelay: -1}, `{"LockDelay":"0ms"}`},
		{"node and checks", false, &SessionEntry{Node: "n1", NodeChecks: []string{"serfHealth", "disk"}, ServiceChecks: []ServiceCheck{{ID: "web"}}},
			`{"Node":"n1","NodeChecks":["serfHealth","disk"],"ServiceChecks":[{"ID":"web","Namespace":""}]}`},
		{"empty node checks sent as []", false, &SessionEntry{NodeChecks: []string{}}, `{"NodeChecks":[]}`},
		{"deprecated checks", false, &SessionEntry{Checks: []string{"a"}}, `{"Checks":["a"]}`},
		{"no checks, nil", true, nil, `{"NodeChecks":[]}`},
		{"no checks overrides", true, &SessionEntry{Name: "n", NodeChecks: []string{"x"}, Behavior: "delete"},
			`{"Behavior":"delete","Name":"n","NodeChecks":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, c := newStub(t, func(seen) reply { return reply{Body: `{"ID":"adf4238a-882b-9ddc-4a9d-5b6758e4159e"}`} })
			create := c.Session().Create
			if tt.noChecks {
				create = c.Session().CreateNoChecks
			}
			id, _, err := create(context.Background(), tt.se, nil)
			if err != nil {
				t.Fatal(err)
			}
			if id != "adf4238a-882b-9ddc-4a9d-5b6758e4159e" {
				t.Errorf("id = %q", id)
			}
			req := st.last(t)
			if req.Method != "PUT" || req.Path != "/v1/session/create" {
				t.Errorf("request = %s %s", req.Method, req.Path)
			}
			if req.Body != tt.wantBody {
				t.Errorf("body = %s\nwant   %s", req.Body, tt.wantBody)
			}
			if tt.wantBody != "" && req.ContentType != "application/json" {
				t.Errorf("content type = %q", req.ContentType)
			}
		})
	}
}

func TestSessionCreateError(t *testing.T) {
	_, c := newStub(t, func(seen) reply { return reply{Code: 500, Body: "Invalid Behavior setting 'keep'"} })
	_, _, err := c.Session().Create(context.Background(), &SessionEntry{Behavior: "keep"}, nil)
	if err == nil || err.Error() != "Unexpected response code: 500 (Invalid Behavior setting 'keep')" {
		t.Fatalf("err = %v", err)
	}
}

func TestSessionRenew(t *testing.T) {
	tests := []struct {
		name    string
		reply   reply
		want    *SessionEntry
		wantErr error
	}{
		{"renewed", reply{Body: "[" + consulSession + "]"}, wantSession, nil},
		{"unknown", reply{Code: 404, Body: "Session id '62666b3e' not found"}, nil, ErrSessionNotFound},
		{"empty answer", reply{Body: "[]"}, nil, ErrSessionNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, c := newStub(t, func(seen) reply { return tt.reply })
			se, _, err := c.Session().Renew(context.Background(), "62666b3e", nil)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if !reflect.DeepEqual(se, tt.want) {
				t.Errorf("entry = %+v, want %+v", se, tt.want)
			}
			if req := st.last(t); req.Method != "PUT" || req.Path != "/v1/session/renew/62666b3e" {
				t.Errorf("request = %s %s", req.Method, req.Path)
			}
		})
	}
	_, c := newStub(t, func(seen) reply { return reply{Code: 500, Body: "No cluster leader"} })
	if _, _, err := c.Session().Renew(context.Background(), "x", nil); !IsRetryable(err) {
		t.Errorf("500 on renew: err = %v, want retryable", err)
	}
}

func TestSessionReads(t *testing.T) {
	ctx := context.Background()
	list := "[" + consulSession + "]"
	tests := []struct {
		name      string
		call      func(s *Session) (any, *QueryMeta, error)
		body      string
		wantPath  string
		wantQuery string
		want      any
	}{
		{"info", func(s *Session) (any, *QueryMeta, error) {
			return unpack(s.Info(ctx, "62666b3e-bab8-f381-a0dc-b9007bf11168", &QueryOptions{RequireConsistent: true}))
		}, list, "/v1/session/info/62666b3e-bab8-f381-a0dc-b9007bf11168", "consistent", wantSession},
		{"info of unknown", func(s *Session) (any, *QueryMeta, error) { return unpack(s.Info(ctx, "gone", nil)) },
			"[]", "/v1/session/info/gone", "", (*SessionEntry)(nil)},
		{"node", func(s *Session) (any, *QueryMeta, error) {
			return unpack(s.Node(ctx, "VM-0-17-centos", &QueryOptions{WaitIndex: 3783, WaitTime: time.Second}))
		}, list, "/v1/session/node/VM-0-17-centos", "index=3783&wait=1000ms", []*SessionEntry{wantSession}},
		{"list", func(s *Session) (any, *QueryMeta, error) { return unpack(s.List(ctx, nil)) },
			list, "/v1/session/list", "", []*SessionEntry{wantSession}},
		{"list of none", func(s *Session) (any, *QueryMeta, error) { return unpack(s.List(ctx, nil)) },
			"[]", "/v1/session/list", "", []*SessionEntry{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, c := newStub(t, func(seen) reply { return reply{Header: readHeaders("3783"), Body: tt.body} })
			got, qm, err := tt.call(c.Session())
			if err != nil {
				t.Fatal(err)
			}
			req := st.last(t)
			if req.Method != "GET" || req.Path != tt.wantPath || queryString(req.Query) != tt.wantQuery {
				t.Errorf("request = %s %s?%s, want GET %s?%s", req.Method, req.Path, queryString(req.Query), tt.wantPath, tt.wantQuery)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("result = %#v, want %#v", got, tt.want)
			}
			if qm.LastIndex != 3783 || !qm.KnownLeader {
				t.Errorf("meta = %+v", qm)
			}
		})
	}
}

func TestSessionDestroy(t *testing.T) {
	st, c := newStub(t, nil)
	if _, err := c.Session().Destroy(context.Background(), "abc", &WriteOptions{Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	req := st.last(t)
	if req.Method != "PUT" || req.Path != "/v1/session/destroy/abc" || req.Header.Get("X-Consul-Token") != "tok" {
		t.Errorf("request = %s %s token %q", req.Method, req.Path, req.Header.Get("X-Consul-Token"))
	}
}
