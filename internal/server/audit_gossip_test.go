package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/gossip"
	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// Audit of membership, failure detection and how they drive session
// invalidation (internal/gossip, internal/server/serf.go). Pools run on
// 127.0.0.1 with the fast profile; memberlist runs on real time, so waits
// on it are bounded polling loops.

// gaWait polls cond every 20ms until it holds or d (real time) passes.
func gaWait(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gaFreePort returns a port free on 127.0.0.1 for both TCP and UDP at the
// time of the call.
func gaFreePort(t *testing.T) int {
	t.Helper()
	for i := 0; i < 20; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		return port
	}
	t.Fatal("no free port")
	return 0
}

// gaGossipServer starts a server (fake clock clk, data in dir if set) that
// gossips with the fast profile on 127.0.0.1:port (0: any).
func gaGossipServer(t *testing.T, dir string, clk *clocktest.Fake, port int) *Server {
	t.Helper()
	cfg := testConfig(dir, clk, nil)
	cfg.Gossip = &gossip.Config{BindAddr: "127.0.0.1", BindPort: port, Profile: gossip.ProfileFast}
	return startServer(t, cfg)
}

// gaAgent starts a client agent's pool (fast profile) named name; clk may
// be nil for the real clock.
func gaAgent(t *testing.T, name string, clk *clocktest.Fake) *gossip.Pool {
	t.Helper()
	cfg := gossip.Config{Name: name, BindAddr: "127.0.0.1", Profile: gossip.ProfileFast,
		Tags: map[string]string{"role": "client", "dc": "dc1"}, Logger: hclog.NewNullLogger()}
	if clk != nil {
		cfg.Clock = clk
	}
	p, err := gossip.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Shutdown() })
	return p
}

func gaStatus(p *gossip.Pool, name string) gossip.Status {
	m, ok := p.Member(name)
	if !ok {
		return gossip.StatusNone
	}
	return m.Status
}

func gaSerf(s *Server, node string) string {
	if c := s.State().Check(node, state.SerfCheckID); c != nil {
		return c.Status
	}
	return ""
}

func gaSessionAlive(s *Server, id string) bool {
	_, sess := s.State().SessionGet(nil, id)
	return sess != nil
}

func gaLock(t *testing.T, s *Server, key, id string) {
	t.Helper()
	ok, _, err := s.KVS(context.Background(), &state.KVRequest{Op: state.OpLock,
		Entry: state.DirEntry{Key: key, Value: []byte("v"), Session: id}})
	if err != nil || !ok {
		t.Fatalf("acquire %s: %v %v", key, ok, err)
	}
}

// TestAuditGossipFailRejoinLeave checks the whole life of a client agent
// with real gossip: it fails (serfHealth critical within the detector's
// bound, every bound session invalidated in that one raft step, release or
// delete by behaviour, lock-delay stamped; a session bound to no check
// survives), comes back under its name at a new port (passing again, new
// sessions work, old ones stay gone), then leaves gracefully (node
// deregistered, every session on it invalidated).
func TestAuditGossipFailRejoinLeave(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := gaGossipServer(t, "", clk, 0)
	srvAddr := s.Gossip().Addr()

	a := gaAgent(t, "c1", nil)
	if _, err := a.Join([]string{srvAddr}); err != nil {
		t.Fatal(err)
	}
	gaWait(t, 5*time.Second, "c1 passing", func() bool { return gaSerf(s, "c1") == state.HealthPassing })

	rel := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}, LockDelay: 10 * time.Second})
	del := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}, Behavior: state.BehaviorDelete})
	free := mustSession(t, s, state.Session{Node: "c1"}) // bound to no check
	gaLock(t, s, "k/rel", rel)
	gaLock(t, s, "k/del", del)
	gaLock(t, s, "k/free", free)

	start := time.Now()
	a.Shutdown() // stops answering, no goodbye
	gaWait(t, 5*time.Second, "c1's sessions invalidated", func() bool {
		return !gaSessionAlive(s, rel) && !gaSessionAlive(s, del)
	})
	t.Logf("failure -> sessions invalidated in %v", time.Since(start).Round(time.Millisecond))
	chk := s.State().Check("c1", state.SerfCheckID)
	if chk == nil || chk.Status != state.HealthCritical {
		t.Fatalf("c1's serfHealth after failure: %+v", chk)
	}
	_, er := s.State().KVGet(nil, "k/rel")
	if er == nil || er.Session != "" || er.ModifyIndex != chk.ModifyIndex {
		t.Fatalf("k/rel after failure: %+v (check critical at %d)", er, chk.ModifyIndex)
	}
	if _, ed := s.State().KVGet(nil, "k/del"); ed != nil {
		t.Fatalf("k/del survived a delete-behaviour invalidation: %+v", ed)
	}
	if until := s.State().KVLockDelay("k/rel"); !until.Equal(clk.Now().Add(10 * time.Second)) {
		t.Fatalf("lock-delay until %v, want %v", until, clk.Now().Add(10*time.Second))
	}
	if !gaSessionAlive(s, free) {
		t.Fatal("a session bound to no check was invalidated by a gossip failure")
	}
	if gaSerf(s, "node1") != state.HealthPassing {
		t.Fatal("the server's own serfHealth moved")
	}

	// Back under the same name at a new port.
	a2 := gaAgent(t, "c1", nil)
	if a2.Addr() == a.Addr() {
		t.Fatalf("the new agent reused the port %s", a2.Addr())
	}
	gaWait(t, 10*time.Second, "c1 passing again after rejoining at a new port", func() bool {
		a2.Join([]string{srvAddr})
		return gaSerf(s, "c1") == state.HealthPassing
	})
	if gaSessionAlive(s, rel) || gaSessionAlive(s, del) {
		t.Fatal("an invalidated session came back")
	}
	again := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}})
	if ok, _, err := s.KVS(context.Background(), &state.KVRequest{Op: state.OpLock,
		Entry: state.DirEntry{Key: "k/again", Session: again}}); err != nil || !ok {
		t.Fatalf("acquire after rejoin: %v %v", ok, err)
	}

	// Graceful leave: deregistered, sessions (even the check-free one) go.
	if err := a2.Leave(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	a2.Shutdown()
	gaWait(t, 5*time.Second, "c1 deregistered after leaving", func() bool {
		_, n, _ := s.State().NodeInfo(nil, "c1")
		return n == nil
	})
	if gaSessionAlive(s, again) || gaSessionAlive(s, free) {
		t.Fatal("a session on a deregistered node survived")
	}
}

// TestAuditGossipRestartedServerDropsLiveAgent: a server restarts (same
// data, same gossip port) while a client agent stays alive. The restarted
// server's pool knows nobody and contacts nobody; it waits Timing.Settle
// for the agents to find it, then deregisters every gossip node it has not
// heard of. The agent only finds it through its reconnect round robin,
// which tries one failed member per ReconnectInterval: with more failed
// members in its view than Settle has reconnect rounds (here 16 agents
// that died earlier and are not yet reaped, ReapAfter being 1m in fast and
// 24h in lan), the live agent is deregistered and its sessions are
// invalidated although it never stopped answering.
//
// All pools share the fake clock, so reconnects, the grace period and the
// full reconcile advance together; memberlist's own real-time work adds
// nothing here (the agent sees no other live member to push-pull with).
//
// Finding: a server restart invalidates the sessions of a client agent that
// is alive and reachable the whole time (brief: "after a restart it
// reconciles members it knew ... one still alive stays passing"; seeds:
// sessions are invalidated when the node "has failed", and this one did
// not). Settle() assumes one reconnect round reaches the server, but
// reconnectOne visits failed members one at a time, and the restarted
// server never rejoins the members it knew.
func TestAuditGossipRestartedServerDropsLiveAgent(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	dir := t.TempDir()
	port := gaFreePort(t)
	s := gaGossipServer(t, dir, clk, port)
	srvAddr := s.Gossip().Addr()

	a := gaAgent(t, "c1", clk)
	if _, err := a.Join([]string{srvAddr}); err != nil {
		t.Fatal(err)
	}
	// Agents that come and go: 16 of them joined and died (not reaped yet).
	const dead = 16
	var others []*gossip.Pool
	for i := 0; i < dead; i++ {
		p := gaAgent(t, fmt.Sprintf("a%02d", i), clk)
		if _, err := p.Join([]string{a.Addr()}); err != nil {
			t.Fatal(err)
		}
		others = append(others, p)
	}
	gaWait(t, 10*time.Second, "the agents known to c1", func() bool {
		for i := 0; i < dead; i++ {
			if gaStatus(a, fmt.Sprintf("a%02d", i)) == gossip.StatusNone {
				return false
			}
		}
		return gaSerf(s, "c1") == state.HealthPassing
	})
	for _, p := range others {
		p.Shutdown()
	}
	gaWait(t, 15*time.Second, "the dead agents seen failed by c1", func() bool {
		for i := 0; i < dead; i++ {
			if gaStatus(a, fmt.Sprintf("a%02d", i)) != gossip.StatusFailed {
				return false
			}
		}
		return true
	})

	// Under a loaded machine the fast profile can suspect c1 for a moment
	// while it processes the deaths; wait for it to be passing again.
	gaWait(t, 15*time.Second, "c1 passing", func() bool { return gaSerf(s, "c1") == state.HealthPassing })
	id := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}})
	gaLock(t, s, "svc/leader", id)

	// The server stops (crash or upgrade) long enough to be declared failed.
	s.Shutdown()
	gaWait(t, 5*time.Second, "c1 sees the server failed", func() bool {
		return gaStatus(a, "node1") == gossip.StatusFailed
	})
	s2 := gaGossipServer(t, dir, clk, port)
	if !gaSessionAlive(s2, id) || gaSerf(s2, "c1") != state.HealthPassing {
		t.Fatal("the restarted server lost c1's state")
	}

	// Time passes, one second at a time, for everyone: 25s covers Settle
	// (11s in fast) plus a full reconcile interval (5s) with room to spare.
	settle := s2.Gossip().Timing().Settle()
	for i := 0; i < 25; i++ {
		clk.Advance(time.Second)
		time.Sleep(120 * time.Millisecond) // let reconnect dials and reconciles land
		if !gaSessionAlive(s2, id) {
			_, n, _ := s2.State().NodeInfo(nil, "c1")
			t.Errorf("c1's session was invalidated %ds after the restart (Settle %v) although c1 never stopped; "+
				"c1 sees the server as %v, the server sees c1 as %v, c1's node now %+v",
				i+1, settle, gaStatus(a, "node1"), gaStatus(s2.Gossip(), "c1"), n)
			return
		}
	}
	if gaSerf(s2, "c1") != state.HealthPassing {
		t.Errorf("c1 is %q after the restart", gaSerf(s2, "c1"))
	}
}

// gaBlockingMembers is a membership whose Members blocks, once armed,
// until released: it holds the reconcile loop inside a full pass, as a
// long full pass (one raft write per changed member) does.
type gaBlockingMembers struct {
	mu      sync.Mutex
	ms      []gossip.Member
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (f *gaBlockingMembers) Members() []gossip.Member {
	f.mu.Lock()
	armed := f.armed
	f.armed = false
	ms := append([]gossip.Member(nil), f.ms...)
	f.mu.Unlock()
	if armed {
		close(f.entered)
		<-f.release
	}
	return ms
}

// advanceUntil moves clk by step until cond holds. The reconcile loop arms
// its interval timer after the writes of its pass are visible, so one
// Advance made as soon as a test sees them may come before the timer is
// re-armed and then never fire it.
func advanceUntil(t *testing.T, clk *clocktest.Fake, step time.Duration, what string, cond func() bool) {
	t.Helper()
	waitFor(t, what, func() bool {
		if cond() {
			return true
		}
		clk.Advance(step)
		return false
	})
}

// TestAuditGossipFailureLostWhenRejoinFollows: the failure detector
// declares c1 failed and c1 then comes back (a machine that rebooted and
// whose agent rejoined under the same name), both while the reconcile loop
// is busy. The pending set keeps only the latest event per member, so the
// failure is overwritten by the join: serfHealth never goes critical and
// the sessions of the process that died hold their locks for ever.
//
// Finding: an EventFailed followed by an EventJoin before the loop takes
// them is reconciled as the join alone; the sessions bound to the failed
// node are never invalidated (seeds: "Any of the health checks go to the
// critical state" / the gossip failure detector "detect[s] when a node that
// is holding a lock has failed and ... automatically release[s] the lock").
// Consul's leader queues every member event in order (reconcileCh).
func TestAuditGossipFailureLostWhenRejoinFollows(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	fm := &gaBlockingMembers{entered: make(chan struct{}), release: make(chan struct{})}
	fm.ms = []gossip.Member{member("node1", "127.0.0.1", gossip.StatusAlive), member("c1", "10.0.0.7", gossip.StatusAlive)}
	sf := newSerfState("node1")
	s.startSerf(sf, fm, 0, time.Minute)
	waitState(t, s, "c1 passing", func(ws watch.Set) bool {
		c := serfCheck(ws, s, "c1")
		return c != nil && c.Status == state.HealthPassing
	})
	id := mustSession(t, s, state.Session{Node: "c1", NodeChecks: []string{state.SerfCheckID}})
	gaLock(t, s, "svc/leader", id)

	// The periodic full pass starts and is slow.
	fm.mu.Lock()
	fm.armed = true
	fm.mu.Unlock()
	advanceUntil(t, clk, time.Minute, "the full reconcile started", func() bool {
		select {
		case <-fm.entered:
			return true
		default:
			return false
		}
	})
	// Meanwhile: c1 is declared failed, then rejoins; c9 joins (a marker).
	sf.memberEvent(gossip.Event{Type: gossip.EventFailed, Member: member("c1", "10.0.0.7", gossip.StatusFailed)})
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("c1", "10.0.0.7", gossip.StatusAlive)})
	sf.memberEvent(gossip.Event{Type: gossip.EventJoin, Member: member("c9", "10.0.0.9", gossip.StatusAlive)})
	close(fm.release)
	waitState(t, s, "c9 registered", func(ws watch.Set) bool { return serfCheck(ws, s, "c9") != nil })

	if gaSessionAlive(s, id) {
		_, e := s.State().KVGet(nil, "svc/leader")
		t.Errorf("c1 was declared failed but its session survived (serfHealth %q, lock held by %q)", gaSerf(s, "c1"), e.Session)
	}
}

// TestAuditGossipDuplicateNameAccepted: a second agent joins under a name
// a live member already has, at another port. memberlist drops its alive
// message as a conflicting address and the pool installs no conflict
// delegate, so Join reports success and the second agent runs on, believing
// it is c1. Sessions made through it (a client agent gives them its node)
// are bound to the first agent's serfHealth, so when the second agent dies
// nothing is released.
//
// Finding: joining with a node name already held by a live member succeeds
// silently; the impostor's sessions outlive it (seeds: the failure detector
// releases the locks of a node that has failed; brief: name conflicts must
// be detected). Consul's serf resolves such conflicts (the minority side
// shuts down) and logs them.
func TestAuditGossipDuplicateNameAccepted(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := gaGossipServer(t, "", clk, 0)
	srvAddr := s.Gossip().Addr()
	a := gaAgent(t, "c1", nil)
	if _, err := a.Join([]string{srvAddr}); err != nil {
		t.Fatal(err)
	}
	gaWait(t, 5*time.Second, "c1 passing", func() bool { return gaSerf(s, "c1") == state.HealthPassing })

	b := gaAgent(t, "c1", nil)
	_, joinErr := b.Join([]string{srvAddr})
	// Fixed: the second c1 is told so (and its agent stops); it used to
	// join without error, its sessions bound to the first c1's health.
	var nc *gossip.NameConflictError
	if !errors.As(joinErr, &nc) || nc.Name != "c1" || nc.Other != a.Addr() {
		t.Fatalf("a second agent named c1 joined with %v; want a NameConflictError naming %s", joinErr, a.Addr())
	}
	if gaSerf(s, "c1") != state.HealthPassing {
		t.Fatalf("the first c1's serfHealth is %q", gaSerf(s, "c1"))
	}
}

// TestAuditGossipSelfAndCaseNames: the server never marks its own node
// critical nor deregisters it whatever the pool says of it, and members
// whose names differ only in case are distinct nodes: one failing leaves
// the other's sessions alone.
func TestAuditGossipSelfAndCaseNames(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	fm := &fakeMembers{}
	fm.set(member("node1", "127.0.0.1", gossip.StatusFailed),
		member("web1", "10.0.0.1", gossip.StatusAlive), member("Web1", "10.0.0.2", gossip.StatusAlive))
	sf := newSerfState("node1")
	s.startSerf(sf, fm, 0, time.Minute)
	waitState(t, s, "both web1s passing", func(ws watch.Set) bool {
		a, b := serfCheck(ws, s, "web1"), serfCheck(ws, s, "Web1")
		return a != nil && b != nil && a.Status == state.HealthPassing && b.Status == state.HealthPassing
	})
	own := mustSession(t, s, state.Session{NodeChecks: []string{state.SerfCheckID}})
	lower := mustSession(t, s, state.Session{Node: "web1", NodeChecks: []string{state.SerfCheckID}})
	upper := mustSession(t, s, state.Session{Node: "Web1", NodeChecks: []string{state.SerfCheckID}})

	sf.memberEvent(gossip.Event{Type: gossip.EventFailed, Member: member("Web1", "10.0.0.2", gossip.StatusFailed)})
	sf.memberEvent(gossip.Event{Type: gossip.EventLeave, Member: member("node1", "127.0.0.1", gossip.StatusLeft)})
	sf.memberEvent(gossip.Event{Type: gossip.EventReap, Member: member("node1", "127.0.0.1", gossip.StatusLeft)})
	waitSessionGone(t, s, upper)
	if !gaSessionAlive(s, lower) {
		t.Fatal("web1's session went with Web1's failure")
	}
	// A full pass with the server missing from the pool, past the grace.
	fm.set(member("web1", "10.0.0.1", gossip.StatusAlive))
	advanceUntil(t, clk, time.Minute, "Web1 reaped by the full pass", func() bool { return nodeOf(nil, s, "Web1") == nil })
	if gaSerf(s, "node1") != state.HealthPassing || !gaSessionAlive(s, own) {
		t.Fatalf("the server's own node moved: serfHealth %q, own session alive %v", gaSerf(s, "node1"), gaSessionAlive(s, own))
	}
}

// TestAuditGossipClientAgentHangsOnDeadServer runs a real client agent
// (the holdfast binary, -server=false, fast profile) against a server that
// hangs: its gossip stops (the pool declares it failed within about a
// second) and its HTTP port accepts connections but never answers, as a
// stopped process (SIGSTOP, swap storm) does. Verified by hand with two
// holdfast processes and kill -STOP: same result.
//
// Finding: a non-blocking read through the client agent hangs without
// bound once its only server hangs, even after gossip declared that server
// failed: the reverse proxy (internal/cli/client.go, http.DefaultTransport)
// has no response timeout, and server() falls back to the failed server
// (brief: "what the client answers (clear errors, no hang beyond a bound)").
func TestAuditGossipClientAgentHangsOnDeadServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "holdfast")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	build := exec.Command(goBin, "build", "-o", bin, "github.com/holdfast/holdfast/cmd/holdfast")
	build.Env = append(os.Environ(), "GOTOOLCHAIN=local")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building holdfast: %v\n%s", err, out)
	}

	// The "server": an HTTP port that accepts and never answers, and a
	// gossip member advertising it.
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	var conns []net.Conn
	var cmu sync.Mutex
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			cmu.Lock()
			conns = append(conns, c)
			cmu.Unlock()
		}
	}()
	defer func() {
		cmu.Lock()
		for _, c := range conns {
			c.Close()
		}
		cmu.Unlock()
	}()
	srv, err := gossip.New(gossip.Config{Name: "srv1", BindAddr: "127.0.0.1", Profile: gossip.ProfileFast,
		Tags: map[string]string{"role": "server", "dc": "dc1", "http": hung.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	httpPort := gaFreePort(t)
	var out bytes.Buffer
	cmd := exec.Command(bin, "agent", "-server=false", "-node", "cl1",
		"-http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "-serf-addr", "127.0.0.1:0",
		"-gossip-profile", "fast", "-join", srv.Addr(), "-data-dir", t.TempDir())
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	gaWait(t, 10*time.Second, "cl1 in the server's pool", func() bool { return gaStatus(srv, "cl1") == gossip.StatusAlive })

	// The server stops gossiping; the client's pool declares it failed.
	srv.Shutdown()
	members := fmt.Sprintf("http://127.0.0.1:%d/v1/agent/members", httpPort)
	gaWait(t, 10*time.Second, "the client agent seeing srv1 failed", func() bool {
		resp, err := http.Get(members)
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return bytes.Contains(b, []byte(`"Name":"srv1"`)) && bytes.Contains(b, []byte(`"Status":4`))
	})

	const bound = 8 * time.Second
	cl := &http.Client{Timeout: bound}
	start := time.Now()
	resp, err := cl.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/kv/some/key", httpPort))
	if err != nil {
		t.Errorf("GET /v1/kv/some/key through the client agent, whose only server is failed and hung: no answer in %v (%v)",
			time.Since(start).Round(time.Millisecond), err)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("answered %d in %v: %s", resp.StatusCode, time.Since(start).Round(time.Millisecond), bytes.TrimSpace(b))
	if resp.StatusCode < 500 {
		t.Errorf("a dead server's answer: %d %s", resp.StatusCode, b)
	}
}
