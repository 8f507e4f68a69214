package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestClusterClientAgentLeavesAFrozenServer: a blocking read through a
// client agent waits at the server the agent forwards to when that server
// freezes (SIGSTOP: it keeps the connection and answers nothing). Once the
// gossip pool declares it failed, the client agent gives the forward up
// and sends the read to another server, which answers with the change
// made meanwhile, instead of holding it for the read's wait (5 minutes)
// and 30 s more.
func TestClusterClientAgentLeavesAFrozenServer(t *testing.T) {
	t.Parallel()
	servers, _ := startCluster(t, 3)
	web := startClient(t, "web2", servers[0].serfAddr)
	c := web.client()
	if _, err := c.KV().Put(&api.KVPair{Key: "frozen-srv/k", Value: []byte("before")}, nil); err != nil {
		t.Fatal(err)
	}
	_, meta, err := c.KV().Get("frozen-srv/k", nil)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		val  string
		err  error
		took time.Duration
	}
	got := make(chan result, 1)
	go func() {
		start := time.Now()
		p, _, err := c.KV().Get("frozen-srv/k", (&api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 5 * time.Minute}).
			WithContext(ctxTimeout(t, 3*time.Minute)))
		r := result{err: err, took: time.Since(start)}
		if p != nil {
			r.val = string(p.Value)
		}
		got <- r
	}()

	// The server the agent forwards to, as its /v1/agent/self says.
	var s *clusterServer
	eventually(t, 10*time.Second, "the client agent's server", func() bool {
		self, err := c.Agent().Self()
		if err != nil {
			return false
		}
		to, _ := self["Stats"]["holdfast"].(map[string]interface{})["forwards_to"].(string)
		for _, srv := range servers {
			if srv.httpAddr == to {
				s = srv
			}
		}
		return s != nil
	})
	s.a.stop(t)
	frozenAt := time.Now()
	rest := others(servers, s)
	waitLeader(t, rest, 30*time.Second)
	eventually(t, 30*time.Second, "a write through "+rest[0].node, func() bool {
		_, err := rest[0].client(t).KV().Put(&api.KVPair{Key: "frozen-srv/k", Value: []byte("after")}, nil)
		return err == nil
	})
	select {
	case r := <-got:
		if r.err != nil || r.val != "after" {
			t.Fatalf("the blocking read through the client agent: %q %v after %v, want the change", r.val, r.err, r.took)
		}
		t.Logf("%s froze; the blocking read through the client agent returned the change %v later",
			s.node, time.Since(frozenAt).Round(time.Millisecond))
	case <-time.After(90 * time.Second):
		t.Fatalf("the blocking read through the client agent still waits on the frozen %s", s.node)
	}
	if !strings.Contains(web.stderr.String(), "giving up the forwards waiting on a server that stopped being the one to ask") {
		t.Errorf("the client agent's log does not say it gave up forwards waiting on %s", s.node)
	}
}
