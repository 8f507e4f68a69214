package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestClusterClientAgentRidesOutLeaderKill: an application talks to the
// client agent on its machine, as Consul's users do; the client agent
// forwards to a server of a cluster of three. The leader is killed with
// SIGKILL: the application's lock, held by a session on the client's node,
// stays held, and its writes through the same client agent are answered
// again within seconds (the agent tries another server when a forward
// fails, the servers elect a new leader), with no write acknowledged
// before the kill lost.
func TestClusterClientAgentRidesOutLeaderKill(t *testing.T) {
	t.Parallel()
	servers, leader := startCluster(t, 3)
	web := startClient(t, "web1", servers[0].serfAddr)
	c := web.client()

	sid, _, err := c.Session().Create(&api.SessionEntry{Name: "web1-lock", TTL: "30s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: "svc/leader", Value: []byte("web1"), Session: sid}, nil); err != nil || !ok {
		t.Fatalf("acquire through the client agent: %v %v", ok, err)
	}
	const before = 20
	for i := 0; i < before; i++ {
		if _, err := c.KV().Put(&api.KVPair{Key: fmt.Sprintf("before/%d", i), Value: []byte("v")}, nil); err != nil {
			t.Fatal(err)
		}
	}

	leader.a.kill()
	killed := time.Now()
	var answered time.Duration
	eventually(t, 30*time.Second, "a write through the client agent after the leader's kill", func() bool {
		_, err := c.KV().Put(&api.KVPair{Key: "after", Value: []byte("v")}, nil)
		if err == nil {
			answered = time.Since(killed)
		}
		return err == nil
	})
	t.Logf("a write through the client agent was answered %v after the leader's kill", answered.Round(time.Millisecond))

	p, _, err := c.KV().Get("svc/leader", nil)
	if err != nil || p == nil || p.Session != sid || p.LockIndex != 1 {
		t.Fatalf("the lock after the leader's kill: %+v %v, want held by %s", p, err, sid)
	}
	for i := 0; i < before; i++ {
		if p, _, err := c.KV().Get(fmt.Sprintf("before/%d", i), nil); err != nil || p == nil {
			t.Fatalf("before/%d after the leader's kill: %+v %v", i, p, err)
		}
	}
	// The session is renewed through the client agent, by the new leader.
	if se, _, err := c.Session().Renew(sid, nil); err != nil || se == nil {
		t.Fatalf("renew after the leader's kill: %+v %v", se, err)
	}
	if l := waitLeader(t, others(servers, leader), 10*time.Second); l == leader {
		t.Fatal("the killed server leads")
	}
}
