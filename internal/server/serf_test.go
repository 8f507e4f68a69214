package server

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/gossip"
	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// fakeMembers is a membership whose member list the test sets; the test
// feeds the matching events itself.
type fakeMembers struct {
	mu sync.Mutex
	ms []gossip.Member
}

func (f *fakeMembers) Members() []gossip.Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]gossip.Member(nil), f.ms...)
}

func (f *fakeMembers) set(ms ...gossip.Member) {
	f.mu.Lock()
	f.ms = ms
	f.mu.Unlock()
}

func member(name, addr string, st gossip.Status) gossip.Member {
	return gossip.Member{Name: name, Addr: addr, Port: 8301, Status: st, Tags: map[string]string{"role": "client"}}
}

// waitState waits until cond, which must add the watches of what it reads
// to ws, holds.
func waitState(t *testing.T, s *Server, what string, cond func(ws watch.Set) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ws := watch.NewSet()
		ws.Add(s.State().AbandonCh())
		if cond(ws) {
			return
		}
		if err := ws.WatchCtx(ctx); err != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// serfCheck reads a node's serfHealth check, watching its checks.
func serfCheck(ws watch.Set, s *Server, node string) *state.HealthCheck {
	_, cks := s.State().NodeChecks(ws, node)
	for _, c := range cks {
		if c.CheckID == state.SerfCheckID {
			return c
		}
	}
	return nil
}

func nodeOf(ws watch.Set, s *Server, name string) *state.Node {
	_, n, _ := s.State().NodeInfo(ws, name)
	return n
}

func TestSerfReconcilesEvents(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	fm := &fakeMembers{}
	fm.set(member("node1", "127.0.0.1", gossip.StatusAlive), member("c1", "10.0.0.7", gossip.StatusAlive))
	sf := newSerfState("node1")
	s.startSerf(sf, fm, 0, time.Hour)

	// Gaining leadership (here: starting as leader) reconciles the pool.
	waitState(t, s, "c1 registered and passing", func(ws watch.Set) bool {
		c := serfCheck(ws, s, "c1")
		return c != nil && c.Status == state.HealthPassing
	})
	if n := nodeOf(nil, s, "c1"); n.Address != "10.0.0.7" || n.Datacenter != "dc1" {
		t.Fatalf("c1 registered as %+v", n)
	}
	if c := s.State().Check("c1", state.SerfCheckID); c.Output != "Agent alive and reachable" || c.Name != "Serf Health Status" {
		t.Fatalf("c1's check: %+v", c)
	}

	// A session on c1 with the default check holds a lock.
	id := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}, LockDelay: 15 * time.Second})
	if ok, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "leader", Value: []byte("c1"), Session: id}}); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	// A session on this server's node is not touched by c1's fate.
	own := mustSession(t, s, state.Session{NodeChecks: []string{state.SerfCheckID}})

	// c1 fails: its check goes critical, its session is invalidated and the
	// lock released, all in the same raft step.
	fm.set(member("node1", "127.0.0.1", gossip.StatusAlive), member("c1", "10.0.0.7", gossip.StatusFailed))
	sf.memberEvent(gossip.Event{Type: gossip.EventFailed, Member: member("c1", "10.0.0.7", gossip.StatusFailed)})
	waitSessionGone(t, s, id)
	c := s.State().Check("c1", state.SerfCheckID)
	if c.Status != state.HealthCritical || c.Output != "Agent not live or unreachable" {
		t.Fatalf("c1's check after failing: %+v", c)
	}
	_, e := s.State().KVGet(nil, "leader")
	if e == nil || e.Session != "" || string(e.Value) != "c1" {
		t.Fatalf("lock after failure: %+v", e)
	}
	if e.ModifyIndex != c.ModifyIndex {
		t.Fatalf("release at index %d, check critical at %d: not one step", e.ModifyIndex, c.ModifyIndex)
	}
	if until := s.State().KVLockDelay("leader"); !until.Equal(clk.Now().Add(15 * time.Second)) {
		t.Fatalf("lock-delay until %v, want stamped time + 15s", until)
	}
	if n := nodeOf(nil, s, "c1"); n == nil {
		t.Fatal("a failed member's node must stay registered")
	}
	if _, sess := s.State().SessionGet(nil, own); sess == nil {
		t.Fatal("the server's own session was invalidated")
	}
	// A new session on a failed node is refused.
	if _, err := s.SessionCreate(ctx, &state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}}); err == nil {
		t.Fatal("session created on a failed node")
	}

	// c1 comes back at a new address.
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("c1", "10.0.0.8", gossip.StatusAlive)})
	waitState(t, s, "c1 passing again", func(ws watch.Set) bool {
		c := serfCheck(ws, s, "c1")
		return c != nil && c.Status == state.HealthPassing && nodeOf(ws, s, "c1").Address == "10.0.0.8"
	})
	id2 := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}})

	// Leaving changes nothing until it has left; then the node goes, and
	// its sessions with it.
	sf.memberEvent(gossip.Event{Type: gossip.EventUpdate, Member: member("c1", "10.0.0.8", gossip.StatusLeaving)})
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("c2", "10.0.0.9", gossip.StatusAlive)})
	waitState(t, s, "c2 registered", func(ws watch.Set) bool { return serfCheck(ws, s, "c2") != nil })
	if _, sess := s.State().SessionGet(nil, id2); sess == nil {
		t.Fatal("leaving invalidated a session")
	}
	sf.memberEvent(gossip.Event{Type: gossip.EventLeave, Member: member("c1", "10.0.0.8", gossip.StatusLeft)})
	waitState(t, s, "c1 deregistered", func(ws watch.Set) bool { return nodeOf(ws, s, "c1") == nil })
	waitSessionGone(t, s, id2)

	// A reaped member's node goes too.
	sf.memberEvent(gossip.Event{Type: gossip.EventReap, Member: member("c2", "10.0.0.9", gossip.StatusFailed)})
	waitState(t, s, "c2 deregistered", func(ws watch.Set) bool { return nodeOf(ws, s, "c2") == nil })

	// Events about this server itself are ignored: registerSelf owns it.
	sf.memberEvent(gossip.Event{Type: gossip.EventFailed, Member: member("node1", "127.0.0.1", gossip.StatusFailed)})
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("c3", "10.0.0.10", gossip.StatusAlive)})
	waitState(t, s, "c3 registered", func(ws watch.Set) bool { return serfCheck(ws, s, "c3") != nil })
	if c := s.State().Check("node1", state.SerfCheckID); c.Status != state.HealthPassing {
		t.Fatalf("own check: %+v", c)
	}
	if _, sess := s.State().SessionGet(nil, own); sess == nil {
		t.Fatal("the server's own session was invalidated")
	}
}

func TestSerfFullReconcile(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	// The catalog as an earlier term left it: a gossip node the pool no
	// longer knows, a node registered by hand without serfHealth, a node
	// whose member has since failed, one whose member left.
	for _, req := range []*state.RegisterRequest{
		{Node: "ghost", Address: "10.0.0.1", Check: &state.HealthCheck{CheckID: state.SerfCheckID, Status: state.HealthPassing}},
		{Node: "external", Address: "10.0.0.2"},
		{Node: "c1", Address: "10.0.0.3", NodeMeta: map[string]string{"rack": "r1"},
			Check: &state.HealthCheck{CheckID: state.SerfCheckID, Status: state.HealthPassing}},
		{Node: "c3", Address: "10.0.0.5", Check: &state.HealthCheck{CheckID: state.SerfCheckID, Status: state.HealthPassing}},
	} {
		if err := s.Register(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	ghostSess := mustSession(t, s, state.Session{Node: "ghost", NodeChecks: []string{state.SerfCheckID}})
	c1Sess := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}})

	fm := &fakeMembers{}
	fm.set(
		member("node1", "127.0.0.1", gossip.StatusAlive),
		member("c1", "10.0.0.3", gossip.StatusFailed),
		member("c2", "10.0.0.4", gossip.StatusAlive),
		member("c3", "10.0.0.5", gossip.StatusLeft),
		member("c4", "10.0.0.6", gossip.StatusLeaving),
	)
	sf := newSerfState("node1")
	sf.members = fm
	sf.started = clk.Now()
	sf.grace = time.Minute

	// Within the grace period after the pool started, a node the pool does
	// not know is left alone: its agent may simply not have reconnected.
	if err := s.reconcileAll(sf); err != nil {
		t.Fatal(err)
	}
	st := s.State()
	if c := st.Check("c1", state.SerfCheckID); c == nil || c.Status != state.HealthCritical {
		t.Fatalf("c1: %+v", c)
	}
	if n := nodeOf(nil, s, "c1"); n.Meta["rack"] != "r1" {
		t.Fatalf("marking c1 failed rewrote its node: %+v", n)
	}
	if _, sess := st.SessionGet(nil, c1Sess); sess != nil {
		t.Fatal("c1's session survived its failure")
	}
	if c := st.Check("c2", state.SerfCheckID); c == nil || c.Status != state.HealthPassing || nodeOf(nil, s, "c2").Address != "10.0.0.4" {
		t.Fatalf("c2: %+v", c)
	}
	if nodeOf(nil, s, "c3") != nil {
		t.Fatal("c3 left but is still registered")
	}
	if nodeOf(nil, s, "c4") != nil {
		t.Fatal("c4 is only leaving and was never alive to us: nothing to register")
	}
	if nodeOf(nil, s, "ghost") == nil {
		t.Fatal("ghost deregistered within the grace period")
	}
	if nodeOf(nil, s, "external") == nil || nodeOf(nil, s, "node1") == nil {
		t.Fatal("a node gossip does not own was deregistered")
	}

	// A pass that changes nothing writes nothing.
	before := s.raft.AppliedIndex()
	if err := s.reconcileAll(sf); err != nil {
		t.Fatal(err)
	}
	if after := s.raft.AppliedIndex(); after != before {
		t.Fatalf("an idle reconcile wrote %d entries", after-before)
	}

	// After the grace period, the ghost goes, and its session with it.
	clk.Advance(time.Minute)
	if err := s.reconcileAll(sf); err != nil {
		t.Fatal(err)
	}
	if nodeOf(nil, s, "ghost") != nil {
		t.Fatal("ghost still registered after the grace period")
	}
	if _, sess := s.State().SessionGet(nil, ghostSess); sess != nil {
		t.Fatal("ghost's session survived")
	}
	if nodeOf(nil, s, "external") == nil || nodeOf(nil, s, "node1") == nil || nodeOf(nil, s, "c1") == nil {
		t.Fatal("reaping took more than the ghost")
	}
}

func TestSerfPendingCoalescesAndRetries(t *testing.T) {
	sf := newSerfState("self")
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("b", "10.0.0.2", gossip.StatusAlive)})
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("a", "10.0.0.1", gossip.StatusAlive)})
	sf.memberEvent(gossip.Event{Type: gossip.EventFailed, Member: member("b", "10.0.0.2", gossip.StatusFailed)})
	sf.memberEvent(gossip.Event{Type: gossip.EventFailed, Member: member("self", "10.0.0.3", gossip.StatusFailed)})
	evs := sf.takePending()
	if len(evs) != 2 || evs[0].Member.Name != "a" || evs[1].Type != gossip.EventFailed {
		t.Fatalf("pending: %+v", evs)
	}
	// A failed batch goes back under newer news, but a loss is kept
	// ahead of a newer event that is not one: b failed, then came back,
	// and its sessions must still go with the process that failed.
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("b", "10.0.0.2", gossip.StatusAlive)})
	sf.putBack(evs)
	evs = sf.takePending()
	if len(evs) != 3 || evs[0].Member.Name != "a" || evs[1].Type != gossip.EventFailed || evs[2].Type != gossip.EventJoin {
		t.Fatalf("after put back: %+v", evs)
	}
	// The same without a put back: failed then joined before the loop
	// looked gives both, in order; joined then failed gives the failure.
	sf.memberEvent(gossip.Event{Type: gossip.EventFailed, Member: member("c", "10.0.0.4", gossip.StatusFailed)})
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("c", "10.0.0.4", gossip.StatusAlive)})
	sf.memberEvent(gossip.Event{Type: gossip.EventUpdate, Member: member("c", "10.0.0.4", gossip.StatusAlive)})
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("d", "10.0.0.5", gossip.StatusAlive)})
	sf.memberEvent(gossip.Event{Type: gossip.EventFailed, Member: member("d", "10.0.0.5", gossip.StatusFailed)})
	evs = sf.takePending()
	if len(evs) != 3 || evs[0].Type != gossip.EventFailed || evs[1].Type != gossip.EventUpdate || evs[1].Member.Name != "c" ||
		evs[2].Type != gossip.EventFailed || evs[2].Member.Name != "d" {
		t.Fatalf("pending: %+v", evs)
	}
}

// TestSerfWithRealGossip runs a server with a real pool and an agent's
// pool joining it, on loopback with the fast profile: the agent's node is
// registered, and when it stops without leaving its session is invalidated.
func TestSerfWithRealGossip(t *testing.T) {
	_, trans := raft.NewInmemTransport("node1")
	logger := hclog.New(&hclog.LoggerOptions{Output: io.Discard})
	s, err := New(Config{
		NodeName: "node1", Transport: trans, Clock: clock.Real(), Logger: logger,
		HTTPAddr: "127.0.0.1:8500",
		RaftTuning: func(c *raft.Config) {
			c.HeartbeatTimeout = 50 * time.Millisecond
			c.ElectionTimeout = 50 * time.Millisecond
			c.LeaderLeaseTimeout = 50 * time.Millisecond
		},
		Gossip: &gossip.Config{BindAddr: "127.0.0.1", Profile: gossip.ProfileFast, Tags: map[string]string{"extra": "x"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	pool := s.Gossip()
	self, ok := pool.Member("node1")
	if !ok || self.Tags["role"] != "server" || self.Tags["http"] != "127.0.0.1:8500" || self.Tags["raft"] != "node1" || self.Tags["dc"] != "dc1" || self.Tags["extra"] != "x" {
		t.Fatalf("server's own member: %+v", self)
	}

	agent, err := gossip.New(gossip.Config{Name: "c1", BindAddr: "127.0.0.1", Profile: gossip.ProfileFast,
		Tags: map[string]string{"role": "client"}})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Shutdown()
	if _, err := agent.Join([]string{pool.Addr()}); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, "c1 registered", func(ws watch.Set) bool {
		c := serfCheck(ws, s, "c1")
		return c != nil && c.Status == state.HealthPassing
	})
	id := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}})
	start := time.Now()
	agent.Shutdown()
	waitSessionGone(t, s, id)
	t.Logf("session invalidated %v after the agent stopped gossiping", time.Since(start).Round(time.Millisecond))

	// A second server on the same gossip address cannot start, and says why.
	_, trans2 := raft.NewInmemTransport("node2")
	_, err = New(Config{NodeName: "node2", Transport: trans2, Logger: logger,
		Gossip: &gossip.Config{BindAddr: "127.0.0.1", BindPort: int(self.Port), Profile: gossip.ProfileFast}})
	if err == nil {
		t.Fatal("two servers on one gossip port")
	}
	t.Logf("second server: %v", err)
}

// Finding: a full reconcile dropped the events pending when it began, the
// losses among them. A member that failed and came back while no term was
// reconciling (here between two terms) is alive in the pool, and only the
// pending failure said that its sessions had been held by a process that
// died: they survived. The full pass now replays pending losses first.
func TestSerfFullPassKeepsPendingLosses(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	fm := &fakeMembers{}
	fm.set(member("node1", "127.0.0.1", gossip.StatusAlive), member("c1", "10.0.0.7", gossip.StatusAlive))
	sf := newSerfState("node1")
	s.serf = sf // so that a new term wakes the loop, as startGossip wires it
	s.startSerf(sf, fm, 0, time.Minute)
	waitState(t, s, "c1 passing", func(ws watch.Set) bool {
		c := serfCheck(ws, s, "c1")
		return c != nil && c.Status == state.HealthPassing
	})
	id := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}})
	gaLock(t, s, "svc/leader", id)

	s.stopLeading()
	sf.memberEvent(gossip.Event{Type: gossip.EventFailed, Member: member("c1", "10.0.0.7", gossip.StatusFailed)})
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("c1", "10.0.0.7", gossip.StatusAlive)})
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("c9", "10.0.0.9", gossip.StatusAlive)})
	fm.set(member("node1", "127.0.0.1", gossip.StatusAlive), member("c1", "10.0.0.7", gossip.StatusAlive),
		member("c9", "10.0.0.9", gossip.StatusAlive))
	s.startLeading()
	// The new term's full pass registers c9 after replaying c1's loss.
	waitState(t, s, "c9 registered", func(ws watch.Set) bool { return serfCheck(ws, s, "c9") != nil })
	if gaSessionAlive(s, id) {
		t.Fatalf("c1 failed while no term was reconciling, and its session survived (serfHealth %q)", gaSerf(s, "c1"))
	}
	waitState(t, s, "c1 passing again", func(ws watch.Set) bool {
		c := serfCheck(ws, s, "c1")
		return c != nil && c.Status == state.HealthPassing
	})
}

// An agent of another datacenter in the pool (a wrong -join or
// -datacenter) is not registered in this datacenter's catalog, as Consul's
// leader skips it; its neighbour of this datacenter is.
func TestSerfSkipsOtherDatacenter(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	other := member("far", "10.0.0.8", gossip.StatusAlive)
	other.Tags["dc"] = "dc2"
	near := member("near", "10.0.0.9", gossip.StatusAlive)
	near.Tags["dc"] = "dc1"
	fm := &fakeMembers{}
	fm.set(member("node1", "127.0.0.1", gossip.StatusAlive), other, near)
	sf := newSerfState("node1")
	s.serf = sf
	s.startSerf(sf, fm, 0, time.Minute)
	waitState(t, s, "near registered", func(ws watch.Set) bool { return serfCheck(ws, s, "near") != nil })
	if nodeOf(nil, s, "far") != nil {
		t.Fatal("an agent of dc2 was registered in dc1's catalog")
	}
}
