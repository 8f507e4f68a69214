package cli

import (
	"testing"
)

const sessionJSON = `{"ID":"62666b3e-bab8-f381-a0dc-b9007bf11168","Name":"my-service-lock","Node":"VM-0-17-centos",` +
	`"LockDelay":15000000000,"Behavior":"release","TTL":"30s","NodeChecks":["serfHealth"],"ServiceChecks":null,` +
	`"CreateIndex":3783,"ModifyIndex":3783}`

const bareSessionJSON = `{"ID":"adf4238a-882b-9ddc-4a9d-5b6758e4159e","Name":"","Node":"n2",` +
	`"LockDelay":0,"Behavior":"delete","TTL":"","NodeChecks":[],"ServiceChecks":[{"ID":"web","Namespace":""}],` +
	`"CreateIndex":4000,"ModifyIndex":4000}`

func TestSessionCreate(t *testing.T) {
	created := answer{body: `{"ID":"62666b3e-bab8-f381-a0dc-b9007bf11168"}`}
	const id = "62666b3e-bab8-f381-a0dc-b9007bf11168\n"
	runCases(t, []cliCase{
		{name: "defaults send no body", args: []string{"session", "create"}, reply: created,
			wantReq: "PUT /v1/session/create", wantOut: id},
		{name: "all settings", args: []string{"session", "create", "-name", "my-service-lock", "-ttl", "30s",
			"-behavior", "delete", "-lock-delay", "5s", "-node", "n1"}, reply: created,
			wantReq: `PUT /v1/session/create {"Behavior":"delete","LockDelay":"5000ms","Name":"my-service-lock","Node":"n1","TTL":"30s"}`,
			wantOut: id},
		{name: "lock-delay 0 is really sent", args: []string{"session", "create", "-lock-delay", "0"}, reply: created,
			wantReq: `PUT /v1/session/create {"LockDelay":"0ms"}`, wantOut: id},
		{name: "lock-delay 0s too", args: []string{"session", "create", "-lock-delay=0s", "-ttl=10s"}, reply: created,
			wantReq: `PUT /v1/session/create {"LockDelay":"0ms","TTL":"10s"}`, wantOut: id},
		{name: "checks replace serfHealth", args: []string{"session", "create", "-check", "disk", "-check", "serfHealth"}, reply: created,
			wantReq: `PUT /v1/session/create {"NodeChecks":["disk","serfHealth"]}`, wantOut: id},
		{name: "no checks", args: []string{"session", "create", "-no-checks", "-ttl", "15s"}, reply: created,
			wantReq: `PUT /v1/session/create {"NodeChecks":[],"TTL":"15s"}`, wantOut: id},
		{name: "checks and no-checks", args: []string{"session", "create", "-no-checks", "-check", "a"},
			wantErr: "Error! Cannot specify both -check and -no-checks\n", wantCode: 1},
		{name: "stray argument", args: []string{"session", "create", "x"},
			wantErr: "Error! Too many arguments (expected 0, got 1)\n", wantCode: 1},
		{name: "server refuses", args: []string{"session", "create", "-ttl", "5s"},
			reply:    answer{code: 500, body: "Invalid Session TTL '5000000000', must be between [10s=24h0m0s]"},
			wantReq:  `PUT /v1/session/create {"TTL":"5s"}`,
			wantErr:  "Error! Failed to create session: Unexpected response code: 500 (Invalid Session TTL '5000000000', must be between [10s=24h0m0s])\n",
			wantCode: 1},
	})
}

func TestSessionCreateBadLockDelay(t *testing.T) {
	a := newAgentStub(t, answer{})
	_, errs, code := runCLI(t, a, []string{"session", "create", "-lock-delay", "15"}, "")
	const want = `invalid value "15" for flag -lock-delay: parse error`
	if code != 1 || len(errs) < len(want) || errs[:len(want)] != want {
		t.Fatalf("code %d stderr %q", code, errs)
	}
	if len(a.seen()) != 0 {
		t.Fatal("request sent")
	}
}

func TestSessionIDCommands(t *testing.T) {
	const id = "62666b3e-bab8-f381-a0dc-b9007bf11168"
	runCases(t, []cliCase{
		{name: "destroy", args: []string{"session", "destroy", id},
			wantReq: "PUT /v1/session/destroy/" + id, wantOut: "Success! Destroyed session: " + id + "\n"},
		{name: "destroy error", args: []string{"session", "destroy", id}, reply: answer{code: 500, body: "No cluster leader"},
			wantReq: "PUT /v1/session/destroy/" + id,
			wantErr: "Error! Failed to destroy session: Unexpected response code: 500 (No cluster leader)\n", wantCode: 1},
		{name: "destroy without id", args: []string{"session", "destroy"},
			wantErr: "Error! Missing session ID argument\n", wantCode: 1},
		{name: "destroy two", args: []string{"session", "destroy", "a", "b"},
			wantErr: "Error! Too many arguments (expected 1, got 2)\n", wantCode: 1},

		{name: "renew", args: []string{"session", "renew", id}, reply: answer{body: "[" + sessionJSON + "]"},
			wantReq: "PUT /v1/session/renew/" + id, wantOut: "Success! Renewed session: " + id + "\n"},
		{name: "renew unknown", args: []string{"session", "renew", "e1b10c14"},
			reply:   answer{code: 404, body: "Session id 'e1b10c14' not found"},
			wantReq: "PUT /v1/session/renew/e1b10c14", wantErr: "Error! Session e1b10c14 not found\n", wantCode: 1},
		{name: "renew error", args: []string{"session", "renew", id}, reply: answer{code: 500, body: "No cluster leader"},
			wantReq: "PUT /v1/session/renew/" + id,
			wantErr: "Error! Failed to renew session: Unexpected response code: 500 (No cluster leader)\n", wantCode: 1},

		{name: "info", args: []string{"session", "info", id}, reply: answer{body: "[" + sessionJSON + "]"},
			wantReq: "GET /v1/session/info/" + id,
			wantOut: "Behavior           release\n" +
				"CreateIndex        3783\n" +
				"ID                 62666b3e-bab8-f381-a0dc-b9007bf11168\n" +
				"LockDelay          15s\n" +
				"ModifyIndex        3783\n" +
				"Name               my-service-lock\n" +
				"Node               VM-0-17-centos\n" +
				"NodeChecks         serfHealth\n" +
				"ServiceChecks      -\n" +
				"TTL                30s\n"},
		{name: "info, bare", args: []string{"session", "info", "-stale", "adf4238a"}, reply: answer{body: "[" + bareSessionJSON + "]"},
			wantReq: "GET /v1/session/info/adf4238a?stale",
			wantOut: "Behavior           delete\n" +
				"CreateIndex        4000\n" +
				"ID                 adf4238a-882b-9ddc-4a9d-5b6758e4159e\n" +
				"LockDelay          0s\n" +
				"ModifyIndex        4000\n" +
				"Name               -\n" +
				"Node               n2\n" +
				"NodeChecks         -\n" +
				"ServiceChecks      web\n" +
				"TTL                -\n"},
		{name: "info unknown", args: []string{"session", "info", "gone"}, reply: answer{body: "[]"},
			wantReq: "GET /v1/session/info/gone", wantErr: "Error! Session gone not found\n", wantCode: 1},
		{name: "info error", args: []string{"session", "info", "x"}, reply: answer{code: 500, body: "No cluster leader"},
			wantReq: "GET /v1/session/info/x",
			wantErr: "Error querying Consul agent: Unexpected response code: 500 (No cluster leader)\n", wantCode: 1},
	})
}

func TestSessionList(t *testing.T) {
	runCases(t, []cliCase{
		{name: "list", args: []string{"session", "list"}, reply: answer{body: "[" + sessionJSON + "," + bareSessionJSON + "]"},
			wantReq: "GET /v1/session/list",
			wantOut: "ID                                    Name             Node            Behavior  TTL  LockDelay  Checks\n" +
				"62666b3e-bab8-f381-a0dc-b9007bf11168  my-service-lock  VM-0-17-centos  release   30s  15s        serfHealth\n" +
				"adf4238a-882b-9ddc-4a9d-5b6758e4159e  -                n2              delete    -    0s         web\n"},
		{name: "of a node", args: []string{"session", "list", "-node", "n2"}, reply: answer{body: "[" + bareSessionJSON + "]"},
			wantReq: "GET /v1/session/node/n2",
			wantOut: "ID                                    Name  Node  Behavior  TTL  LockDelay  Checks\n" +
				"adf4238a-882b-9ddc-4a9d-5b6758e4159e  -     n2    delete    -    0s         web\n"},
		{name: "none", args: []string{"session", "list"}, reply: answer{body: "[]"},
			wantReq: "GET /v1/session/list", wantOut: ""},
		{name: "stray argument", args: []string{"session", "list", "x"},
			wantErr: "Error! Too many arguments (expected 0, got 1)\n", wantCode: 1},
		{name: "error", args: []string{"session", "list"}, reply: answer{code: 500, body: "No cluster leader"},
			wantReq: "GET /v1/session/list",
			wantErr: "Error querying Consul agent: Unexpected response code: 500 (No cluster leader)\n", wantCode: 1},
	})
}

// A negative -lock-delay was taken as "no lock-delay" and the session was
// created: bad input accepted, where the HTTP API refuses a negative
// LockDelay with a 400. The command must refuse it before sending
// anything.
func TestSessionCreateNegativeLockDelay(t *testing.T) {
	for _, v := range []string{"-5s", "-1ns"} {
		a := newAgentStub(t, answer{body: `{"ID":"62666b3e-bab8-f381-a0dc-b9007bf11168"}`})
		out, errs, code := runCLI(t, a, []string{"session", "create", "-lock-delay=" + v}, "")
		want := "Error! Invalid -lock-delay " + v + ": must not be negative (0 turns lock-delay off)\n"
		if code != 1 || out != "" || errs != want {
			t.Errorf("-lock-delay=%s: exit %d, stdout %q, stderr %q; want exit 1 and %q", v, code, out, errs, want)
		}
		if reqs := a.seen(); len(reqs) != 0 {
			t.Errorf("-lock-delay=%s: sent %q", v, reqs)
		}
	}
}
