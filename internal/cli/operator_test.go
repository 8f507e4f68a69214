package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/internal/server"
	"github.com/holdfast/holdfast/internal/servertest"
)

func TestOperatorRaftCommands(t *testing.T) {
	conf := `{"Servers":[` +
		`{"ID":"n1","Node":"n1","Address":"127.0.0.1:8300","Leader":true,"ProtocolVersion":"3","Voter":true},` +
		`{"ID":"n2","Node":"n2","Address":"127.0.0.1:8310","Leader":false,"ProtocolVersion":"3","Voter":true}],"Index":9}`
	runCases(t, []cliCase{
		{name: "list-peers", args: []string{"operator", "raft", "list-peers"},
			reply:   answer{body: conf},
			wantReq: "GET /v1/operator/raft/configuration",
			wantOut: "Node  ID  Address         State     Voter  RaftProtocol\n" +
				"n1    n1  127.0.0.1:8300  leader    true   3\n" +
				"n2    n2  127.0.0.1:8310  follower  true   3\n"},
		{name: "list-peers -stale", args: []string{"operator", "raft", "list-peers", "-stale"},
			reply:   answer{body: `{"Servers":[],"Index":1}`},
			wantReq: "GET /v1/operator/raft/configuration?stale",
			wantOut: "Node  ID  Address  State  Voter  RaftProtocol\n"},
		{name: "list-peers without a leader", args: []string{"operator", "raft", "list-peers"},
			reply:   answer{code: 500, body: "No cluster leader"},
			wantReq: "GET /v1/operator/raft/configuration",
			wantErr: "Error getting peers: Unexpected response code: 500 (No cluster leader)\n", wantCode: 1},
		{name: "remove-peer by id", args: []string{"operator", "raft", "remove-peer", "-id", "n2"},
			wantReq: "DELETE /v1/operator/raft/peer?id=n2",
			wantOut: "Removed peer with id \"n2\"\n"},
		{name: "remove-peer by address", args: []string{"operator", "raft", "remove-peer", "-address", "127.0.0.1:8310"},
			wantReq: "DELETE /v1/operator/raft/peer?address=127.0.0.1:8310",
			wantOut: "Removed peer with address \"127.0.0.1:8310\"\n"},
		{name: "remove-peer unknown", args: []string{"operator", "raft", "remove-peer", "-id", "x"},
			reply:   answer{code: 404, body: `no such raft peer: no server with ID "x"`},
			wantReq: "DELETE /v1/operator/raft/peer?id=x",
			wantErr: "Error removing peer: Unexpected response code: 404 (no such raft peer: no server with ID \"x\")\n", wantCode: 1},
		{name: "remove-peer needs one of -id and -address", args: []string{"operator", "raft", "remove-peer"},
			wantErr: "Error! Give exactly one of -id and -address\n", wantCode: 1},
		{name: "remove-peer both", args: []string{"operator", "raft", "remove-peer", "-id", "a", "-address", "b:1"},
			wantErr: "Error! Give exactly one of -id and -address\n", wantCode: 1},
		{name: "list-peers arguments", args: []string{"operator", "raft", "list-peers", "x"},
			wantErr: "Error! Too many arguments (expected 0, got 1)\n", wantCode: 1},
	})
}

// TestOperatorRaftEndpoints runs the endpoints on a real single server,
// through holdfast's own client.
func TestOperatorRaftEndpoints(t *testing.T) {
	s := servertest.New(t, servertest.Options{NodeName: "solo"})
	hs := httptest.NewServer(withOperatorRoutes(s.Server, http.NotFoundHandler()))
	defer hs.Close()
	cl, err := api.NewClient(&api.Config{Address: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conf, err := cl.Operator().RaftGetConfiguration(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(conf.Servers) != 1 {
		t.Fatalf("configuration %+v", conf)
	}
	if srv := conf.Servers[0]; srv.ID != "solo" || srv.Node != "solo" || !srv.Leader || !srv.Voter || srv.ProtocolVersion != "3" {
		t.Fatalf("server %+v", srv)
	}

	cases := []struct {
		method, path string
		code         int
		body         string
	}{
		{"DELETE", "/v1/operator/raft/peer", 400, "Must specify either ?id with the server's ID or ?address with IP:port of peer to remove"},
		{"DELETE", "/v1/operator/raft/peer?id=a&address=b", 400, "Must specify either ?id with the server's ID or ?address with IP:port of peer to remove"},
		{"DELETE", "/v1/operator/raft/peer?id=ghost", 404, "no such raft peer: no server with ID \"ghost\""},
		{"DELETE", "/v1/operator/raft/peer?address=10.0.0.1:1", 404, "no such raft peer: no server at address \"10.0.0.1:1\""},
		{"PUT", "/v1/operator/raft/peer?id=solo", 405, "method PUT not allowed"},
		{"POST", "/v1/operator/raft/configuration", 405, "method POST not allowed"},
	}
	for _, c := range cases {
		if code, body := do(t, c.method, hs.URL+c.path, ""); code != c.code || body != c.body {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.path, code, body, c.code, c.body)
		}
	}
	// The server is still the one voter.
	if conf, err := cl.Operator().RaftGetConfiguration(ctx, &api.QueryOptions{AllowStale: true}); err != nil || len(conf.Servers) != 1 {
		t.Fatalf("after the refusals: %+v %v", conf, err)
	}
}

func TestBootstrapMode(t *testing.T) {
	cases := []struct {
		expect     int
		joins, dev bool
		mode       server.BootstrapMode
		err        string
	}{
		{expect: 0, mode: server.BootstrapAlone},
		{expect: 1, joins: true, mode: server.BootstrapAlone},
		{expect: 0, joins: true, mode: server.BootstrapNone},
		{expect: 3, joins: true, mode: server.BootstrapExpect},
		{expect: 0, dev: true, mode: server.BootstrapAlone},
		{expect: 1, joins: true, dev: true, mode: server.BootstrapAlone},
		{expect: 3, dev: true, err: "-dev keeps the raft state in memory"},
		{expect: 0, joins: true, dev: true, err: "-dev keeps the raft state in memory"},
		{expect: -1, err: "-bootstrap-expect must be 0 or more, not -1"},
	}
	for _, c := range cases {
		mode, desc, err := bootstrapMode(c.expect, c.joins, c.dev)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: error %v, want %q", c, err, c.err)
			}
			continue
		}
		if err != nil || mode != c.mode || desc == "" {
			t.Errorf("%+v: %v %q %v", c, mode, desc, err)
		}
	}
}
