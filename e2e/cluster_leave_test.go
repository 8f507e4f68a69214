package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestClusterLeave: `holdfast leave` retires a server: it answers
// "Graceful leave complete", its process stops by itself with exit 0, and
// the leader takes it out of the raft configuration. The leader itself
// leaving hands the leadership over first, so writes go on through the
// server left. A client agent leaving has its node deregistered.
func TestClusterLeave(t *testing.T) {
	t.Parallel()
	servers, leader := startCluster(t, 3)
	follower := others(servers, leader)[0]
	web := startClient(t, "web1", servers[0].serfAddr)

	// A follower leaves.
	out, errOut, code := runHoldfast(t, "leave", "-http-addr", follower.httpAddr)
	if code != 0 || strings.TrimSpace(out) != "Graceful leave complete" {
		t.Fatalf("holdfast leave of follower %s: exit %d\nstdout: %s\nstderr: %s", follower.node, code, out, errOut)
	}
	if code := exitOf(t, follower.a, 20*time.Second); code != 0 {
		t.Fatalf("follower %s after leaving exited %d, want 0:\n%s", follower.node, code, tail(follower.a.stderr.String(), 20))
	}
	two := others(servers, follower)
	eventually(t, 20*time.Second, "the leader takes the follower out of the raft configuration", func() bool {
		rows, _, err := listPeers(leader, false)
		if err != nil || len(rows) != 2 {
			return false
		}
		for _, r := range rows {
			if r.Node == follower.node || !r.Voter {
				return false
			}
		}
		return true
	})

	// The leader leaves: the one server left takes over at once.
	out, errOut, code = runHoldfast(t, "leave", "-http-addr", leader.httpAddr)
	if code != 0 || strings.TrimSpace(out) != "Graceful leave complete" {
		t.Fatalf("holdfast leave of leader %s: exit %d\nstdout: %s\nstderr: %s", leader.node, code, out, errOut)
	}
	if code := exitOf(t, leader.a, 20*time.Second); code != 0 {
		t.Fatalf("leader %s after leaving exited %d, want 0:\n%s", leader.node, code, tail(leader.a.stderr.String(), 20))
	}
	last := others(two, leader)[0]
	eventually(t, 20*time.Second, "the last server leads alone and takes writes", func() bool {
		code, body, _, err := rawPut(ctxTimeout(t, 5*time.Second), "http://"+last.httpAddr, "/v1/kv/after-leave", "x")
		return err == nil && code == 200 && body == "true"
	})
	eventually(t, 20*time.Second, "the raft configuration is the last server alone", func() bool {
		rows, _, err := listPeers(last, false)
		return err == nil && len(rows) == 1 && rows[0].Node == last.node && rows[0].State == "leader"
	})

	// A client agent leaves: its node goes from the catalog.
	if _, _, err := last.client(t).Catalog().Node("web1", nil); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runHoldfast(t, "leave", "-http-addr", web.httpAddr)
	if code != 0 || strings.TrimSpace(out) != "Graceful leave complete" {
		t.Fatalf("holdfast leave of the client agent: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if code := exitOf(t, web, 20*time.Second); code != 0 {
		t.Fatalf("client agent after leaving exited %d, want 0", code)
	}
	eventually(t, 20*time.Second, "web1 deregistered", func() bool {
		n, _, err := last.client(t).Catalog().Node("web1", nil)
		return err == nil && n == nil
	})
}
