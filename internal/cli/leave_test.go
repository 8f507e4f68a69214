package cli

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

func TestLeaveCommand(t *testing.T) {
	runCases(t, []cliCase{
		{name: "leave", args: []string{"leave"},
			wantReq: "PUT /v1/agent/leave",
			wantOut: "Graceful leave complete\n"},
		{name: "leave refused", args: []string{"leave"},
			reply:   answer{code: 500, body: "leaving: gossip: leaving: timeout"},
			wantReq: "PUT /v1/agent/leave",
			wantErr: "Error leaving: Unexpected response code: 500 (leaving: gossip: leaving: timeout)\n", wantCode: 1},
		{name: "arguments", args: []string{"leave", "now"},
			wantErr: "Error! Too many arguments (expected 0, got 1)\n", wantCode: 1},
	})
}

// TestAgentLeaveEndpoint: the leave runs once however often it is asked,
// every caller is answered after it ran, with its error if it failed, and
// done is closed for the agent to stop.
func TestAgentLeaveEndpoint(t *testing.T) {
	var runs atomic.Int64
	fail := errors.New("gossip: leaving: timeout")
	l := newAgentLeave(func() error { runs.Add(1); return fail })
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "next") })
	hs := httptest.NewServer(withLeave(l, next))
	defer hs.Close()

	for _, c := range []struct {
		method, path string
		code         int
		body         string
	}{
		{"GET", "/v1/agent/leave", 405, "method GET not allowed"},
		{"PUT", "/v1/agent/leave", 500, "leaving: gossip: leaving: timeout"},
		{"PUT", "/v1/agent/leave", 500, "leaving: gossip: leaving: timeout"},
		{"GET", "/v1/agent/self", 200, "next"},
	} {
		if code, body := do(t, c.method, hs.URL+c.path, ""); code != c.code || body != c.body {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.path, code, body, c.code, c.body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the leave ran %d times, want once", n)
	}
	select {
	case <-l.done:
	default:
		t.Error("done is not closed after the leave ran")
	}
}
