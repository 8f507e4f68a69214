package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestClusterForwardsLeaveAFrozenLeader: requests a follower has forwarded
// to a leader that then freezes (SIGSTOP: it keeps its connections and
// answers nothing, as a leader cut off by the network would) are given up
// once the follower knows another leader, instead of waiting for their
// bound (30 s, and a blocking query's wait on top) while the leader stays
// frozen. Reads are sent again to the new leader: a blocking query goes on
// waiting there and returns the change made through it, a ?consistent read
// returns the value. A write answers 500 saying it may or may not have
// been applied (or 200, if it reached the new leader first); never "no
// answer in time".
func TestClusterForwardsLeaveAFrozenLeader(t *testing.T) {
	t.Parallel()
	servers, x := startCluster(t, 3)
	x.a.waitReady()
	f := others(servers, x)[0]
	cf := f.client(t)
	if _, err := x.client(t).KV().Put(&api.KVPair{Key: "frozen/k", Value: []byte("before")}, nil); err != nil {
		t.Fatal(err)
	}
	p, meta, err := cf.KV().Get("frozen/k", nil)
	if err != nil || p == nil || string(p.Value) != "before" {
		t.Fatalf("read through the follower: %+v %v", p, err)
	}

	type result struct {
		what string
		val  string
		err  error
		took time.Duration
	}
	results := make(chan result, 3)
	get := func(what string, q *api.QueryOptions) {
		start := time.Now()
		p, _, err := cf.KV().Get("frozen/k", q.WithContext(ctxTimeout(t, 2*time.Minute)))
		r := result{what: what, err: err, took: time.Since(start)}
		if p != nil {
			r.val = string(p.Value)
		}
		results <- r
	}
	// A blocking query through the follower, waiting at the leader when it
	// freezes. The pause gives the follower time to forward it first; had
	// it not, it would still go to the frozen leader, which the follower
	// takes for the leader until the election a second later.
	go get("blocking read", &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 5 * time.Minute})
	time.Sleep(300 * time.Millisecond)
	frozenAt := time.Now()
	x.a.stop(t)
	go get("?consistent read", &api.QueryOptions{RequireConsistent: true})
	go func() {
		start := time.Now()
		_, err := cf.KV().Put(&api.KVPair{Key: "frozen/w", Value: []byte("w")}, (&api.WriteOptions{}).WithContext(ctxTimeout(t, 2*time.Minute)))
		results <- result{what: "write", err: err, took: time.Since(start)}
	}()

	y := waitLeader(t, others(servers, x), 30*time.Second)
	t.Logf("%s frozen; %s leads %v later", x.node, y.node, time.Since(frozenAt).Round(time.Millisecond))
	got := map[string]result{}
	for len(got) < 2 {
		r := <-results
		got[r.what] = r
	}
	// The blocking read has not returned: it waits at the new leader.
	if r, ok := got["blocking read"]; ok {
		t.Fatalf("the blocking read returned before any change: %+v", r)
	}
	if r := got["?consistent read"]; r.err != nil || r.val != "before" {
		t.Errorf("?consistent read through %s: %q %v after %v", f.node, r.val, r.err, r.took)
	}
	if r := got["write"]; r.err != nil && !strings.Contains(r.err.Error(), "lost the leadership before it answered; the request may or may not have been applied") {
		t.Errorf("write through %s: %v after %v", f.node, r.err, r.took)
	}
	if _, err := y.client(t).KV().Put(&api.KVPair{Key: "frozen/k", Value: []byte("after")}, nil); err != nil {
		t.Fatal(err)
	}
	r := <-results
	if r.err != nil || r.val != "after" {
		t.Fatalf("blocking read through %s: %q %v after %v, want the change made through the new leader", f.node, r.val, r.err, r.took)
	}
	for _, r := range []result{got["?consistent read"], got["write"], r} {
		t.Logf("%s through %s: answered %v after it was sent (%v)", r.what, f.node, r.took.Round(time.Millisecond), r.err)
	}
	if !strings.Contains(f.a.stderr.String(), "giving up the forwards waiting on a server that stopped being the one to ask") {
		t.Errorf("%s's log does not say it gave up forwards waiting on the frozen leader", f.node)
	}
}

// TestClusterWriteWaitsOutAnElection: a write sent to a server while the
// cluster has no leader (two of three servers frozen, so the third has
// stepped down) waits for one, up to Consul's rpc_hold_timeout of 7 s,
// instead of failing at once with "No cluster leader"; when the others
// are resumed and a leader is elected, it is answered true.
func TestClusterWriteWaitsOutAnElection(t *testing.T) {
	t.Parallel()
	servers, _ := startCluster(t, 3)
	s := servers[0]
	var resumes []func()
	for _, o := range others(servers, s) {
		resumes = append(resumes, o.a.stop(t))
	}
	eventually(t, 20*time.Second, s.node+" knows no leader", func() bool {
		l, err := s.client(t).Status().Leader()
		return err == nil && l == ""
	})
	type result struct {
		ok   bool
		err  error
		took time.Duration
	}
	got := make(chan result, 1)
	go func() {
		start := time.Now()
		ok, _, err := s.client(t).KV().CAS(&api.KVPair{Key: "election/k", Value: []byte("v"), ModifyIndex: 0}, nil)
		got <- result{ok, err, time.Since(start)}
	}()
	select {
	case r := <-got:
		t.Fatalf("the write was answered while no leader was known: %v %v after %v", r.ok, r.err, r.took)
	case <-time.After(time.Second):
	}
	for _, resume := range resumes {
		resume()
	}
	r := <-got
	if r.err != nil || !r.ok {
		t.Fatalf("the write through %s: %v %v after %v, want true once a leader was elected", s.node, r.ok, r.err, r.took)
	}
	t.Logf("the write waited %v for the election", r.took.Round(time.Millisecond))
}

// TestClusterWriteThroughFollowerRidesOutLeaderKill: writes sent through a
// follower right after the leader is killed (SIGKILL: its port refuses,
// while the follower still takes it for the leader) are not refused: the
// follower sends each again once another leader is known (the refused
// connection carried nothing), and they are answered true.
func TestClusterWriteThroughFollowerRidesOutLeaderKill(t *testing.T) {
	t.Parallel()
	servers, leader := startCluster(t, 3)
	f := others(servers, leader)[0]
	cf := f.client(t)
	if _, err := cf.KV().Put(&api.KVPair{Key: "kill/before", Value: []byte("v")}, nil); err != nil {
		t.Fatal(err)
	}
	leader.a.kill()
	killed := time.Now()
	for i := 0; i < 3; i++ {
		start := time.Now()
		ok, _, err := cf.KV().CAS(&api.KVPair{Key: fmt.Sprintf("kill/after/%d", i), Value: []byte("v"), ModifyIndex: 0}, nil)
		if err != nil || !ok {
			t.Fatalf("write %d through %s, %v after the leader's kill: %v %v", i, f.node, start.Sub(killed).Round(time.Millisecond), ok, err)
		}
		t.Logf("write %d through %s, sent %v after the kill, answered true in %v", i, f.node,
			start.Sub(killed).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	}
}
