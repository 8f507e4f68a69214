package server

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newTestServer(t *testing.T, dir string, clk *clocktest.Fake) *Server {
	t.Helper()
	return newTunedServer(t, dir, clk, nil)
}

// testConfig is the configuration of the test servers: in-memory
// transport, short raft timeouts, then tune (if not nil) on raft's config.
func testConfig(dir string, clk *clocktest.Fake, tune func(*raft.Config)) Config {
	_, trans := raft.NewInmemTransport("node1")
	return Config{
		NodeName: "node1", DataDir: dir, Transport: trans, Clock: clk,
		Logger: hclog.New(&hclog.LoggerOptions{Output: io.Discard}),
		RaftTuning: func(c *raft.Config) {
			c.HeartbeatTimeout = 50 * time.Millisecond
			c.ElectionTimeout = 50 * time.Millisecond
			c.LeaderLeaseTimeout = 50 * time.Millisecond
			if tune != nil {
				tune(c)
			}
		},
	}
}

// newTunedServer is newTestServer with tune applied to raft's config.
func newTunedServer(t *testing.T, dir string, clk *clocktest.Fake, tune func(*raft.Config)) *Server {
	t.Helper()
	return startServer(t, testConfig(dir, clk, tune))
}

// startServer starts a server on cfg and waits until it leads with its
// node registered; it is shut down when the test ends.
func startServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitForSelfRegistration(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown() })
	return s
}

// waitSessionGone parks on the session's watch channel until it is gone.
// The expiry is proposed asynchronously, so the test waits for the state
// change itself rather than for time to pass.
func waitSessionGone(t *testing.T, s *Server, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ws := watch.NewSet()
		if _, sess := s.State().SessionGet(ws, id); sess == nil {
			return
		}
		if err := ws.WatchCtx(ctx); err != nil {
			t.Fatalf("session %s was not invalidated", id)
		}
	}
}

func mustSession(t *testing.T, s *Server, in state.Session) string {
	t.Helper()
	id, err := s.SessionCreate(context.Background(), &in)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestSessionTTLExpiresAtTTL(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	id := mustSession(t, s, state.Session{TTL: "10s", NodeChecks: []string{"serfHealth"}})
	ok, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: id}})
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}

	clk.Advance(10*time.Second - time.Nanosecond)
	if _, sess := s.State().SessionGet(nil, id); sess == nil {
		t.Fatal("session invalidated before its TTL")
	}
	if n := s.timers.Len(); n != 1 {
		t.Fatalf("timers pending = %d, want 1", n)
	}

	clk.Advance(time.Nanosecond)
	waitSessionGone(t, s, id)
	_, e := s.State().KVGet(nil, "k")
	if e == nil || e.Session != "" || e.LockIndex != 1 {
		t.Fatalf("key after expiry = %+v, want released with LockIndex 1", e)
	}
}

func TestSessionRenewPushesExpiry(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	id := mustSession(t, s, state.Session{TTL: "10s"})
	clk.Advance(9 * time.Second)
	if _, err := s.SessionRenew(ctx, id); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10*time.Second - time.Nanosecond)
	if _, sess := s.State().SessionGet(nil, id); sess == nil {
		t.Fatal("renewed session invalidated early")
	}
	clk.Advance(time.Nanosecond)
	waitSessionGone(t, s, id)
	if _, err := s.SessionRenew(ctx, id); err == nil {
		t.Fatal("renew of an invalidated session succeeded")
	}
}

func TestSessionTTLMultiplier(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	_, trans := raft.NewInmemTransport("node1")
	s, err := New(Config{NodeName: "node1", Transport: trans, Clock: clk, SessionTTLMultiplier: 2,
		Logger: hclog.New(&hclog.LoggerOptions{Output: io.Discard})})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitForSelfRegistration(ctx); err != nil {
		t.Fatal(err)
	}
	id := mustSession(t, s, state.Session{TTL: "10s"})
	clk.Advance(20*time.Second - time.Nanosecond)
	if _, sess := s.State().SessionGet(nil, id); sess == nil {
		t.Fatal("session invalidated before 2xTTL with multiplier 2")
	}
	clk.Advance(time.Nanosecond)
	waitSessionGone(t, s, id)
}

func TestLockDelayCheckedByLeader(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	a := mustSession(t, s, state.Session{LockDelay: 15 * time.Second})
	if ok, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: a}}); !ok || err != nil {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if err := s.SessionDestroy(ctx, a); err != nil {
		t.Fatal(err)
	}
	b := mustSession(t, s, state.Session{})
	before := s.raft.LastIndex()
	ok, left, err := s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: b}})
	if ok || err != nil || left != 15*time.Second {
		t.Fatalf("acquire in lock-delay = %v %v %v, want false, 15s", ok, left, err)
	}
	if s.raft.LastIndex() != before {
		t.Fatal("a refused acquire was written to raft")
	}
	clk.Advance(15*time.Second - time.Nanosecond)
	ok, left, _ = s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: b}})
	if ok || left != time.Nanosecond {
		t.Fatalf("acquire 1ns before the end = %v %v", ok, left)
	}
	clk.Advance(time.Nanosecond)
	ok, left, _ = s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: b}})
	if !ok || left != 0 {
		t.Fatalf("acquire at the end of lock-delay = %v %v", ok, left)
	}
}

func TestDurableRestartKeepsStateAndRearmsTimers(t *testing.T) {
	dir := t.TempDir()
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, dir, clk)
	ctx := context.Background()
	ttlSess := mustSession(t, s, state.Session{TTL: "30s"})
	holder := mustSession(t, s, state.Session{LockDelay: 20 * time.Second})
	for _, k := range []string{"a", "b", "c"} {
		if ok, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: k, Value: []byte(k)}}); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if ok, _, _ := s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "locked", Session: holder}}); !ok {
		t.Fatal("acquire failed")
	}
	if err := s.SessionDestroy(ctx, holder); err != nil {
		t.Fatal(err)
	}
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := s.KVS(ctx, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "after-snapshot", Value: []byte("x")}}); !ok {
		t.Fatal("put failed")
	}
	s.Shutdown()

	clk.Advance(10 * time.Second)
	s2 := newTestServer(t, dir, clk)
	for _, k := range []string{"a", "b", "c", "after-snapshot"} {
		if _, e := s2.State().KVGet(nil, k); e == nil {
			t.Fatalf("key %q lost across restart", k)
		}
	}
	if _, sess := s2.State().SessionGet(nil, ttlSess); sess == nil {
		t.Fatal("session lost across restart")
	}
	if s2.timers.Len() != 1 {
		t.Fatalf("timers after restart = %d, want the TTL session re-armed", s2.timers.Len())
	}
	// The lock-delay (20s from destroy) is replicated state: 10s remain.
	c := mustSession(t, s2, state.Session{})
	ok, left, _ := s2.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "locked", Session: c}})
	if ok || left != 10*time.Second {
		t.Fatalf("acquire after restart = %v, %v; want refused with 10s of lock-delay left", ok, left)
	}
	// A new leader gives every TTL session a full TTL again.
	clk.Advance(30*time.Second - time.Nanosecond)
	if _, sess := s2.State().SessionGet(nil, ttlSess); sess == nil {
		t.Fatal("session expired before a full TTL after failover")
	}
	clk.Advance(time.Nanosecond)
	waitSessionGone(t, s2, ttlSess)
}

func TestSessionCreateValidation(t *testing.T) {
	s := newTestServer(t, "", clocktest.NewFake(epoch))
	ctx := context.Background()
	for _, tc := range []struct {
		in   state.Session
		want string
	}{
		{state.Session{Behavior: "explode"}, "Invalid Behavior setting 'explode'"},
		{state.Session{TTL: "ten"}, "Session TTL 'ten' invalid"},
		{state.Session{TTL: "5s"}, "Invalid Session TTL '5000000000'"},
		{state.Session{TTL: "25h"}, "Invalid Session TTL '90000000000000'"},
		{state.Session{Node: "nope"}, "Missing node registration"},
		{state.Session{NodeChecks: []string{"nope"}}, "Missing check 'nope' registration"},
	} {
		_, err := s.SessionCreate(ctx, &tc.in)
		if err == nil || !contains(err.Error(), tc.want) {
			t.Errorf("create %+v: err = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestRefusalsCostNoRaftWrite(t *testing.T) {
	s := newTestServer(t, "", clocktest.NewFake(epoch))
	ctx := context.Background()
	a := mustSession(t, s, state.Session{})
	b := mustSession(t, s, state.Session{})
	kvs := func(op state.KVOp, e state.DirEntry) (bool, error) {
		ok, _, err := s.KVS(ctx, &state.KVRequest{Op: op, Entry: e})
		return ok, err
	}
	if ok, err := kvs(state.OpLock, state.DirEntry{Key: "k", Session: a}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	_, held := s.State().KVGet(nil, "k")
	before := s.raft.LastIndex()
	for _, tc := range []struct {
		op state.KVOp
		e  state.DirEntry
	}{
		{state.OpLock, state.DirEntry{Key: "k", Session: b}},                       // held by a
		{state.OpUnlock, state.DirEntry{Key: "k", Session: b}},                     // b does not hold it
		{state.OpUnlock, state.DirEntry{Key: "k", Session: a, LockIndex: 7}},       // fenced: wrong LockIndex
		{state.OpCAS, state.DirEntry{Key: "k", ModifyIndex: held.ModifyIndex + 1}}, // stale index
		{state.OpCAS, state.DirEntry{Key: "k", ModifyIndex: 0}},                    // create, but exists
		{state.OpDeleteCAS, state.DirEntry{Key: "k", ModifyIndex: 1}},              // stale index
	} {
		if ok, err := kvs(tc.op, tc.e); ok || err != nil {
			t.Errorf("%s %+v = %v, %v; want false", tc.op, tc.e, ok, err)
		}
	}
	if _, err := kvs(state.OpLock, state.DirEntry{Key: "k", Session: "no-such-session"}); err == nil {
		t.Error("acquire with an unknown session succeeded")
	}
	if got := s.raft.LastIndex(); got != before {
		t.Fatalf("refusals wrote %d raft entries", got-before)
	}
	// Successes still go through raft.
	if ok, err := kvs(state.OpUnlock, state.DirEntry{Key: "k", Session: a, LockIndex: held.LockIndex}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if s.raft.LastIndex() == before {
		t.Fatal("a successful release was not written to raft")
	}
}

// A data directory written before KV writes were binary holds JSON
// (fsm.TypeKVS) entries: they must replay after a restart, interleaved with
// the binary entries (fsm.TypeKVSBinary) this version writes.
func TestRestartReplaysJSONAndBinaryKVEntries(t *testing.T) {
	dir := t.TempDir()
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, dir, clk)
	ctx := context.Background()
	set := func(k string) {
		if ok, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: k, Value: []byte(k), Flags: 5}}); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	old := func(req *state.KVRequest) { // what an older server wrote
		res, err := s.apply(fsm.TypeKVS, req)
		if err := resultErr(res, err); err != nil || !res.OK {
			t.Fatal(res, err)
		}
	}
	old(&state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "json1", Value: []byte("json1"), Flags: 5}})
	set("bin1")
	old(&state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "json2", Value: []byte("json2"), Flags: 5}})
	old(&state.KVRequest{Op: state.OpDelete, Entry: state.DirEntry{Key: "bin1"}})
	set("bin2")
	s.Shutdown()

	s2 := newTestServer(t, dir, clk)
	_, got := s2.State().KVList(nil, "")
	if len(got) != 3 {
		t.Fatalf("after replay: %d keys, want json1, json2, bin2", len(got))
	}
	for i, k := range []string{"bin2", "json1", "json2"} {
		if got[i].Key != k || string(got[i].Value) != k || got[i].Flags != 5 {
			t.Fatalf("after replay: entry %d = %+v, want key %q", i, got[i], k)
		}
	}
}

// The server's own node is kept in the catalog with a passing serfHealth
// check whatever the catalog API does to it: without it every session
// created with defaults would be refused until the next leader change.
// The sessions bound to it are still invalidated by the change itself.
func TestOwnNodeComesBack(t *testing.T) {
	s := newTestServer(t, "", clocktest.NewFake(epoch))
	ctx := context.Background()
	waitSelf := func(what string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := s.WaitForSelfRegistration(wctx); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
		c := s.State().Check("node1", state.SerfCheckID)
		for c == nil || c.Status != state.HealthPassing {
			ws := watch.NewSet()
			s.State().NodeChecks(ws, "node1")
			if err := ws.WatchCtx(wctx); err != nil {
				t.Fatalf("after %s: serfHealth is %+v", what, c)
			}
			c = s.State().Check("node1", state.SerfCheckID)
		}
		if _, err := s.SessionCreate(ctx, &state.Session{NodeChecks: []string{state.SerfCheckID}}); err != nil {
			t.Fatalf("after %s: a session with defaults: %v", what, err)
		}
	}

	bound := state.Session{NodeChecks: []string{state.SerfCheckID}} // the HTTP API's default
	id := mustSession(t, s, bound)
	if err := s.Deregister(ctx, &state.DeregisterRequest{Node: "node1"}); err != nil {
		t.Fatal(err)
	}
	waitSessionGone(t, s, id)
	waitSelf("the node was deregistered")

	id = mustSession(t, s, bound)
	if err := s.Deregister(ctx, &state.DeregisterRequest{Node: "node1", CheckID: state.SerfCheckID}); err != nil {
		t.Fatal(err)
	}
	waitSessionGone(t, s, id)
	waitSelf("serfHealth was deregistered")

	id = mustSession(t, s, bound)
	if err := s.Register(ctx, &state.RegisterRequest{Node: "node1", Address: "127.0.0.1", SkipNodeUpdate: true,
		Check: &state.HealthCheck{CheckID: state.SerfCheckID, Name: "Serf Health Status", Status: state.HealthCritical}}); err != nil {
		t.Fatal(err)
	}
	waitSessionGone(t, s, id)
	waitSelf("serfHealth was set critical")
}

// When the leader puts its own node back after the catalog API removed
// it, OnSelfRegistered tells the agent of this node (which then writes its
// checks and services again); a node that was never gone, or a check
// merely set critical, does not.
func TestOnSelfRegisteredWhenTheNodeComesBack(t *testing.T) {
	called := make(chan struct{}, 4)
	cfg := testConfig("", clocktest.NewFake(epoch), nil)
	cfg.OnSelfRegistered = func() { called <- struct{}{} }
	s := startServer(t, cfg)
	ctx := context.Background()
	select {
	case <-called:
		// The first registration of a new server's node counts too: the
		// agent, if it already runs, has nothing written yet.
	case <-time.After(10 * time.Second):
		t.Fatal("no call for the first registration")
	}
	if err := s.Register(ctx, &state.RegisterRequest{Node: "node1", Address: "127.0.0.1", SkipNodeUpdate: true,
		Check: &state.HealthCheck{CheckID: state.SerfCheckID, Name: "Serf Health Status", Status: state.HealthCritical}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	serfPassing := func(checks []*state.HealthCheck) bool {
		for _, c := range checks {
			if c.CheckID == state.SerfCheckID {
				return c.Status == state.HealthPassing
			}
		}
		return false
	}
	for {
		// The checks and the watch on them from one read: a check read
		// before the watch was set could change unseen in between.
		ws := watch.NewSet()
		if _, checks := s.State().NodeChecks(ws, "node1"); serfPassing(checks) {
			break
		}
		if err := ws.WatchCtx(wctx); err != nil {
			t.Fatal("serfHealth not put back")
		}
	}
	if err := s.Deregister(ctx, &state.DeregisterRequest{Node: "node1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("no call after the node was put back")
	}
	select {
	case <-called:
		t.Fatal("called for the critical check as well")
	default:
	}
}

// A lock-delay deadline is wall-clock time in the replicated state. A
// server restarted with its clock set back an hour (an NTP step at boot)
// read each deadline as an hour away, and held the key that long. Its
// stamps now run on from the state's time: the delay left is at most
// MaxLockDelay, here the 15 s it had.
func TestLockDelayAfterClockSetBackWhileDown(t *testing.T) {
	dir := t.TempDir()
	clk := clocktest.NewFake(epoch.Add(time.Hour))
	s := newTestServer(t, dir, clk)
	ctx := context.Background()
	holder := mustSession(t, s, state.Session{LockDelay: 15 * time.Second})
	if ok, _, _ := s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: holder}}); !ok {
		t.Fatal("acquire failed")
	}
	if err := s.SessionDestroy(ctx, holder); err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}

	back := clocktest.NewFake(epoch) // an hour behind
	s2 := newTestServer(t, dir, back)
	c := mustSession(t, s2, state.Session{})
	ok, left, _ := s2.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: c}})
	if ok || left <= 0 || left > state.MaxLockDelay {
		t.Fatalf("acquire after the restart = %v, %v left; want refused with at most %v left", ok, left, state.MaxLockDelay)
	}
	back.Advance(left)
	ok, left, err := s2.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: c}})
	if !ok || err != nil {
		t.Fatalf("acquire once the delay left has passed = %v, %v left, %v; want the lock", ok, left, err)
	}
}
