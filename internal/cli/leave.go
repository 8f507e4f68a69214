package cli

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Leaving: PUT /v1/agent/leave and `holdfast leave`, as Consul's. The
// agent leaves its gossip pool gracefully and stops. A server of a
// cluster first hands over its leadership if it leads; the leader then
// sees it left, takes it out of the raft configuration and deregisters
// its node (invalidating the sessions bound to it). This is how a server
// is taken out of a cluster for good; a server stopped with SIGTERM or
// SIGINT does not leave, so that a restart keeps it a voter.

// leaveTimeout bounds each step of a leave: handing the leadership over,
// and the gossip announcement.
const leaveTimeout = 5 * time.Second

// agentLeave is an agent's leave: leave runs the steps, and done is
// closed once they ran, for the agent's main loop to stop.
type agentLeave struct {
	leave func() error
	once  sync.Once
	done  chan struct{}
	err   error
}

func newAgentLeave(leave func() error) *agentLeave {
	return &agentLeave{leave: leave, done: make(chan struct{})}
}

// run runs the leave once; later calls wait for it and return its error.
func (l *agentLeave) run() error {
	l.once.Do(func() {
		l.err = l.leave()
		close(l.done)
	})
	<-l.done
	return l.err
}

// serveHTTP answers PUT /v1/agent/leave once the agent has left: 200 with
// no body, or 500 saying what failed (the agent stops either way).
func (l *agentLeave) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut && r.Method != http.MethodPost {
		w.Header().Set("Allow", "PUT")
		http.Error(w, fmt.Sprintf("method %s not allowed", r.Method), http.StatusMethodNotAllowed)
		return
	}
	if err := l.run(); err != nil {
		http.Error(w, "leaving: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// withLeave serves /v1/agent/leave from l and the rest from next.
func withLeave(l *agentLeave, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/agent/leave" {
			l.serveHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

const leaveUsage = `
Usage: holdfast leave [options]

  Makes the agent at -http-addr leave its gossip pool gracefully and stop.
  A server of a cluster hands over its leadership first if it leads, and
  is then taken out of the raft configuration by the leader: the way to
  retire a server. (A server stopped with Ctrl-C or SIGTERM stays a
  member, so that a restart finds its place.) Sessions bound to the
  agent's node are invalidated.
`

func runLeave(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "leave", leaveUsage)
	var hf httpFlags
	hf.register(fs)
	if done, err := parseNoArgs(stdio, fs, args); done {
		return err
	}
	cl, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cl.Agent().Leave(ctx); err != nil {
		return fail(stdio, "Error leaving: "+err.Error())
	}
	say(stdio, "Graceful leave complete")
	return nil
}
