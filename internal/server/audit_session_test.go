package server

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/state"
)

// saNode is the node the audit binds its sessions to: a node check, and a
// service with a check of its own.
const saNode = "n2"

func saRegisterNode(t *testing.T, s *Server) {
	t.Helper()
	err := s.Register(context.Background(), &state.RegisterRequest{
		Node: saNode, Address: "10.0.0.2",
		Service: &state.Service{ID: "svc1", Service: "svc", Port: 80},
		Checks: []*state.HealthCheck{
			{CheckID: "c1", Name: "node check", Status: state.HealthPassing},
			{CheckID: "svc-check", Name: "svc check", Status: state.HealthPassing, ServiceID: "svc1"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func saKV(t *testing.T, s *Server, op state.KVOp, e state.DirEntry) (bool, time.Duration) {
	t.Helper()
	ok, left, err := s.KVS(context.Background(), &state.KVRequest{Op: op, Entry: e})
	if err != nil {
		t.Fatalf("%s %q: %v", op, e.Key, err)
	}
	return ok, left
}

func saQuery(t *testing.T, s *Server, sess string) string {
	t.Helper()
	id, err := s.QuerySet(context.Background(), &state.PreparedQuery{Session: sess, Service: state.ServiceQuery{Service: "svc"}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// saDump is everything the audit expects to come back from a restart.
type saDump struct {
	Keys     []*state.DirEntry
	Sessions []*state.Session
	Queries  []*state.PreparedQuery
	Nodes    []*state.Node
	Checks   map[string][]*state.HealthCheck
	Services map[string][]*state.Service
	Delays   map[string]time.Time
	Index    map[string]uint64
}

func saSnapshotState(st *state.Store, delayKeys ...string) saDump {
	d := saDump{Checks: map[string][]*state.HealthCheck{}, Services: map[string][]*state.Service{},
		Delays: map[string]time.Time{}, Index: map[string]uint64{}}
	_, d.Keys = st.KVList(nil, "")
	_, d.Sessions = st.SessionList(nil)
	_, d.Queries = st.QueryList(nil)
	_, d.Nodes = st.Nodes(nil)
	for _, n := range d.Nodes {
		_, d.Checks[n.Node] = st.NodeChecks(nil, n.Node)
		_, _, d.Services[n.Node] = st.NodeInfo(nil, n.Node)
	}
	for _, k := range delayKeys {
		d.Delays[k] = st.KVLockDelay(k)
	}
	for _, tb := range []string{"kvs", "sessions", "nodes", "services", "checks", "prepared_queries"} {
		d.Index[tb] = st.TableIndex(tb)
	}
	return d
}

func saJSON(v any) string { b, _ := json.MarshalIndent(v, "", " "); return string(b) }

// TestAuditSessionInvalidationTriggers: every trigger invalidates the
// session, releases or deletes its keys, sets their lock-delay from the
// stamped time and deletes its prepared queries, all at one index.
func TestAuditSessionInvalidationTriggers(t *testing.T) {
	triggers := []struct {
		name string
		do   func(t *testing.T, s *Server, id string)
	}{
		{"destroy", func(t *testing.T, s *Server, id string) {
			if err := s.SessionDestroy(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}},
		{"ttl", func(t *testing.T, s *Server, id string) {
			s.clk.(*clocktest.Fake).Advance(10 * time.Second)
			waitSessionGone(t, s, id)
		}},
		{"node check critical", func(t *testing.T, s *Server, id string) {
			if err := s.Register(context.Background(), &state.RegisterRequest{Node: saNode, SkipNodeUpdate: true,
				Check: &state.HealthCheck{CheckID: "c1", Name: "node check", Status: state.HealthCritical}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"node check deregistered", func(t *testing.T, s *Server, id string) {
			if err := s.Deregister(context.Background(), &state.DeregisterRequest{Node: saNode, CheckID: "c1"}); err != nil {
				t.Fatal(err)
			}
		}},
		{"service check critical", func(t *testing.T, s *Server, id string) {
			if err := s.Register(context.Background(), &state.RegisterRequest{Node: saNode, SkipNodeUpdate: true,
				Check: &state.HealthCheck{CheckID: "svc-check", Name: "svc check", Status: state.HealthCritical, ServiceID: "svc1"}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"service check deregistered", func(t *testing.T, s *Server, id string) {
			if err := s.Deregister(context.Background(), &state.DeregisterRequest{Node: saNode, CheckID: "svc-check"}); err != nil {
				t.Fatal(err)
			}
		}},
		{"service deregistered", func(t *testing.T, s *Server, id string) {
			if err := s.Deregister(context.Background(), &state.DeregisterRequest{Node: saNode, ServiceID: "svc1"}); err != nil {
				t.Fatal(err)
			}
		}},
		{"node deregistered", func(t *testing.T, s *Server, id string) {
			if err := s.Deregister(context.Background(), &state.DeregisterRequest{Node: saNode}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, behavior := range []string{state.BehaviorRelease, state.BehaviorDelete} {
		for _, tr := range triggers {
			t.Run(behavior+"/"+tr.name, func(t *testing.T) {
				clk := clocktest.NewFake(epoch)
				s := newTestServer(t, "", clk)
				saRegisterNode(t, s)
				id := mustSession(t, s, state.Session{Node: saNode, Behavior: behavior, TTL: "10s", LockDelay: 7 * time.Second,
					NodeChecks: []string{"c1"}, ServiceChecks: []state.ServiceCheck{{ID: "svc-check"}}})
				other := mustSession(t, s, state.Session{}) // on node1: must survive
				if ok, _ := saKV(t, s, state.OpLock, state.DirEntry{Key: "held/a", Session: id, Value: []byte("a"), Flags: 3}); !ok {
					t.Fatal("acquire a")
				}
				if ok, _ := saKV(t, s, state.OpLock, state.DirEntry{Key: "held/b", Session: id, Value: []byte("b")}); !ok {
					t.Fatal("acquire b")
				}
				if ok, _ := saKV(t, s, state.OpLock, state.DirEntry{Key: "other", Session: other}); !ok {
					t.Fatal("acquire other")
				}
				q := saQuery(t, s, id)
				keep := saQuery(t, s, other)
				_, before := s.State().KVGet(nil, "held/a")
				stamp := clk.Now()
				if tr.name == "ttl" {
					stamp = stamp.Add(10 * time.Second)
				}

				tr.do(t, s, id)

				st := s.State()
				if _, sess := st.SessionGet(nil, id); sess != nil {
					t.Fatalf("session survived %s", tr.name)
				}
				if _, sess := st.SessionGet(nil, other); sess == nil {
					t.Fatalf("an unrelated session was invalidated by %s", tr.name)
				}
				idx := st.TableIndex("sessions")
				for _, k := range []string{"held/a", "held/b"} {
					_, e := st.KVGet(nil, k)
					switch behavior {
					case state.BehaviorRelease:
						if e == nil || e.Session != "" || e.LockIndex != 1 || e.ModifyIndex != idx {
							t.Errorf("%s after %s = %+v; want released at index %d with LockIndex 1", k, tr.name, e, idx)
						}
					case state.BehaviorDelete:
						if e != nil {
							t.Errorf("%s after %s = %+v; want deleted", k, tr.name, e)
						}
					}
					if got, want := st.KVLockDelay(k), stamp.Add(7*time.Second); !got.Equal(want) {
						t.Errorf("lock-delay of %s = %v, want %v", k, got, want)
					}
				}
				if behavior == state.BehaviorRelease {
					_, e := st.KVGet(nil, "held/a")
					if e != nil && (string(e.Value) != "a" || e.Flags != 3 || e.CreateIndex != before.CreateIndex) {
						t.Errorf("release changed Value/Flags/CreateIndex: %+v (before %+v)", e, before)
					}
				} else if got := st.TableIndex("kvs"); got != idx {
					t.Errorf("kvs index %d, sessions index %d: delete not in the invalidating step", got, idx)
				}
				if _, e := st.KVGet(nil, "other"); e == nil || e.Session != other {
					t.Errorf("other session's key = %+v", e)
				}
				if _, qq := st.QueryGet(nil, q); qq != nil {
					t.Errorf("prepared query bound to the session survived %s", tr.name)
				}
				if _, qq := st.QueryGet(nil, keep); qq == nil {
					t.Errorf("prepared query of another session deleted by %s", tr.name)
				}
				if got := st.TableIndex("prepared_queries"); got != idx {
					t.Errorf("prepared_queries index %d, sessions index %d", got, idx)
				}
				// A new holder is refused for the rest of the delay, told how long.
				n := mustSession(t, s, state.Session{})
				ok, left := saKV(t, s, state.OpLock, state.DirEntry{Key: "held/a", Session: n})
				if ok || left != stamp.Add(7*time.Second).Sub(clk.Now()) {
					t.Errorf("acquire in lock-delay = %v, %v", ok, left)
				}
			})
		}
	}
}

// TestAuditSessionCreateRefusals: a session on a missing node, with a
// missing check or a critical check (node or service) is refused with a
// clear error and changes nothing.
func TestAuditSessionCreateRefusals(t *testing.T) {
	s := newTestServer(t, "", clocktest.NewFake(epoch))
	saRegisterNode(t, s)
	ctx := context.Background()
	if err := s.Register(ctx, &state.RegisterRequest{Node: saNode, SkipNodeUpdate: true, Checks: []*state.HealthCheck{
		{CheckID: "crit", Status: state.HealthCritical},
		{CheckID: "svc-crit", Status: state.HealthCritical, ServiceID: "svc1"},
		{CheckID: "warn", Status: state.HealthWarning},
	}}); err != nil {
		t.Fatal(err)
	}
	before := saSnapshotState(s.State())
	for _, tc := range []struct {
		in   state.Session
		want string
	}{
		{state.Session{Node: "ghost"}, "Missing node registration"},
		{state.Session{Node: saNode, NodeChecks: []string{"nope"}}, "Missing check 'nope' registration"},
		{state.Session{Node: saNode, ServiceChecks: []state.ServiceCheck{{ID: "nope"}}}, "Missing check 'nope' registration"},
		{state.Session{Node: saNode, NodeChecks: []string{"c1", "crit"}}, "Check 'crit' is in critical state"},
		{state.Session{Node: saNode, ServiceChecks: []state.ServiceCheck{{ID: "svc-crit"}}}, "Check 'svc-crit' is in critical state"},
		{state.Session{Node: saNode, NodeChecks: []string{"serfHealth"}}, "Missing check 'serfHealth' registration"},
	} {
		_, err := s.SessionCreate(ctx, &tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create %+v: err = %v, want %q", tc.in, err, tc.want)
		}
	}
	if after := saSnapshotState(s.State()); !reflect.DeepEqual(before, after) {
		t.Errorf("refused creates changed the state:\nbefore %s\nafter %s", saJSON(before), saJSON(after))
	}
	if s.timers.Len() != 0 {
		t.Errorf("refused creates left %d timers", s.timers.Len())
	}
	// A warning check is fine.
	mustSession(t, s, state.Session{Node: saNode, NodeChecks: []string{"warn"}})
}

// TestAuditSessionTTLBounds: with several sessions, TTL minus 1 ns expires
// none and the bound expires exactly the one due.
func TestAuditSessionTTLBounds(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	a := mustSession(t, s, state.Session{TTL: "10s"})
	clk.Advance(time.Nanosecond)
	b := mustSession(t, s, state.Session{TTL: "10s"})
	clk.Advance(10*time.Second - 2*time.Nanosecond)
	for _, id := range []string{a, b} {
		if _, sess := s.State().SessionGet(nil, id); sess == nil {
			t.Fatal("a session expired before its TTL")
		}
	}
	clk.Advance(time.Nanosecond)
	waitSessionGone(t, s, a)
	if _, sess := s.State().SessionGet(nil, b); sess == nil {
		t.Fatal("b expired with a, 1ns before its TTL")
	}
	clk.Advance(time.Nanosecond)
	waitSessionGone(t, s, b)
	if _, err := s.SessionRenew(context.Background(), b); err == nil {
		t.Fatal("renew of an expired session succeeded")
	}
	if _, err := s.SessionRenew(context.Background(), "00000000-0000-0000-0000-000000000000"); err == nil {
		t.Fatal("renew of an unknown session succeeded")
	}
}

// TestAuditSessionLockDelayRules: 0 disables, the delay is clamped to
// 60s, and a voluntary release leaves no delay.
func TestAuditSessionLockDelayRules(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	for _, tc := range []struct {
		delay time.Duration
		want  time.Duration
	}{{0, 0}, {5 * time.Second, 5 * time.Second}, {time.Hour, 60 * time.Second}} {
		key := fmt.Sprintf("ld/%v", tc.delay)
		a := mustSession(t, s, state.Session{LockDelay: tc.delay})
		if ok, _ := saKV(t, s, state.OpLock, state.DirEntry{Key: key, Session: a}); !ok {
			t.Fatal("acquire")
		}
		if err := s.SessionDestroy(ctx, a); err != nil {
			t.Fatal(err)
		}
		b := mustSession(t, s, state.Session{})
		ok, left := saKV(t, s, state.OpLock, state.DirEntry{Key: key, Session: b})
		if (tc.want == 0) != ok || left != tc.want {
			t.Errorf("LockDelay %v: acquire after destroy = %v, %v; want refused for %v", tc.delay, ok, left, tc.want)
		}
	}
	// Voluntary release: no delay.
	a := mustSession(t, s, state.Session{LockDelay: 15 * time.Second})
	saKV(t, s, state.OpLock, state.DirEntry{Key: "vol", Session: a})
	if ok, _ := saKV(t, s, state.OpUnlock, state.DirEntry{Key: "vol", Session: a}); !ok {
		t.Fatal("release")
	}
	b := mustSession(t, s, state.Session{})
	if ok, left := saKV(t, s, state.OpLock, state.DirEntry{Key: "vol", Session: b}); !ok {
		t.Errorf("acquire after a voluntary release refused (%v left)", left)
	}
}

// saBuild writes a varied state through s and returns the keys that have a
// lock-delay and the IDs of the TTL sessions still alive.
func saBuild(t *testing.T, s *Server, clk *clocktest.Fake) (delayKeys, ttlSessions []string) {
	t.Helper()
	ctx := context.Background()
	saRegisterNode(t, s)
	rel := mustSession(t, s, state.Session{Name: "rel", Node: saNode, TTL: "30s", LockDelay: 20 * time.Second,
		NodeChecks: []string{"c1"}, ServiceChecks: []state.ServiceCheck{{ID: "svc-check", Namespace: "default"}}})
	del := mustSession(t, s, state.Session{Name: "del", Behavior: state.BehaviorDelete, TTL: "1m", LockDelay: 90 * time.Second})
	plain := mustSession(t, s, state.Session{Name: "plain", NodeChecks: []string{}})
	gone := mustSession(t, s, state.Session{Name: "gone", LockDelay: 25 * time.Second})
	goneDel := mustSession(t, s, state.Session{Name: "gone-del", Behavior: state.BehaviorDelete, LockDelay: 40 * time.Second})
	saKV(t, s, state.OpSet, state.DirEntry{Key: "plain", Value: []byte("v"), Flags: 42})
	saKV(t, s, state.OpLock, state.DirEntry{Key: "lock/rel", Session: rel, Value: []byte("r"), Flags: 1})
	saKV(t, s, state.OpLock, state.DirEntry{Key: "lock/del", Session: del, Value: []byte("d")})
	saKV(t, s, state.OpLock, state.DirEntry{Key: "lock/plain", Session: plain})
	saKV(t, s, state.OpUnlock, state.DirEntry{Key: "lock/plain", Session: plain, Value: []byte("x")})
	saKV(t, s, state.OpLock, state.DirEntry{Key: "lock/plain", Session: plain, Value: []byte("y")}) // LockIndex 2
	saKV(t, s, state.OpLock, state.DirEntry{Key: "lock/gone", Session: gone, Value: []byte("g")})
	saKV(t, s, state.OpLock, state.DirEntry{Key: "lock/gonedel", Session: goneDel})
	saKV(t, s, state.OpSet, state.DirEntry{Key: "tomb/x", Value: []byte("t")})
	saKV(t, s, state.OpDelete, state.DirEntry{Key: "tomb/x"})
	saQuery(t, s, rel)
	saQuery(t, s, "")
	gq := saQuery(t, s, gone)
	clk.Advance(3 * time.Second)
	if err := s.SessionDestroy(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := s.SessionDestroy(ctx, goneDel); err != nil {
		t.Fatal(err)
	}
	if _, q := s.State().QueryGet(nil, gq); q != nil {
		t.Fatal("query of a destroyed session survived")
	}
	return []string{"lock/gone", "lock/gonedel", "lock/rel", "lock/del"}, []string{rel, del}
}

// TestAuditSessionRestartFidelity: after a restart on the same data dir,
// from the log alone, from a snapshot plus the log after it, and from a
// snapshot whose log was compacted, everything comes back identical, and
// the lock-delays end at the stamped deadline.
func TestAuditSessionRestartFidelity(t *testing.T) {
	for _, mode := range []string{"log", "snapshot", "compacted"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			clk := clocktest.NewFake(epoch)
			s := newTunedServer(t, dir, clk, compactingTuning)
			delayKeys, ttlSess := saBuild(t, s, clk)
			switch mode {
			case "snapshot":
				if err := s.raft.Snapshot().Error(); err != nil {
					t.Fatal(err)
				}
				saKV(t, s, state.OpSet, state.DirEntry{Key: "after-snap", Value: []byte("a")})
			case "compacted":
				snapshotAndCompact(t, s, 5)
			}
			want := saSnapshotState(s.State(), delayKeys...)
			s.Shutdown()

			clk.Advance(5 * time.Second)
			s2 := newTunedServer(t, dir, clk, compactingTuning)
			got := saSnapshotState(s2.State(), delayKeys...)
			if !reflect.DeepEqual(want, got) {
				t.Fatalf("state after restart differs:\nbefore %s\nafter  %s", saJSON(want), saJSON(got))
			}
			// lock/gone: destroyed at epoch+3s with 25s: 20s left at epoch+8s.
			c := mustSession(t, s2, state.Session{})
			if ok, left := saKV(t, s2, state.OpLock, state.DirEntry{Key: "lock/gone", Session: c}); ok || left != 20*time.Second {
				t.Errorf("acquire lock/gone after restart = %v, %v; want refused, 20s left", ok, left)
			}
			if ok, left := saKV(t, s2, state.OpLock, state.DirEntry{Key: "lock/gonedel", Session: c}); ok || left != 35*time.Second {
				t.Errorf("acquire lock/gonedel after restart = %v, %v; want refused, 35s left", ok, left)
			}
			// The sequencer moves on: LockIndex continues from the old one.
			clk.Advance(20 * time.Second)
			if ok, _ := saKV(t, s2, state.OpLock, state.DirEntry{Key: "lock/gone", Session: c}); !ok {
				t.Fatal("acquire at the end of lock-delay refused")
			}
			if _, e := s2.State().KVGet(nil, "lock/gone"); e.LockIndex != 2 {
				t.Errorf("LockIndex after re-acquire across restart = %d, want 2", e.LockIndex)
			}
			// TTL sessions get a full TTL from the restart (at epoch+8s):
			// rel (30s) lives until epoch+38s exactly.
			clk.Advance(30*time.Second - 20*time.Second - time.Nanosecond) // epoch+38s-1ns
			if _, sess := s2.State().SessionGet(nil, ttlSess[0]); sess == nil {
				t.Fatal("TTL session expired before a full TTL after restart")
			}
			clk.Advance(time.Nanosecond)
			waitSessionGone(t, s2, ttlSess[0])
			if _, e := s2.State().KVGet(nil, "lock/rel"); e == nil || e.Session != "" {
				t.Errorf("lock/rel after its session expired: %+v", e)
			}
			clk.Advance(30 * time.Second) // epoch+68s: del (1m) is due
			waitSessionGone(t, s2, ttlSess[1])
			if _, e := s2.State().KVGet(nil, "lock/del"); e != nil {
				t.Errorf("lock/del after its delete-session expired: %+v", e)
			}
		})
	}
}

// saFence runs the check-lock fence (what a guarded write and GET
// /v1/fence ask) for the sequencer (key, lockIndex, session).
func saFence(s *Server, key string, lockIndex uint64, session string) bool {
	_, _, errs := s.State().TxnRead([]*state.TxnOp{{KV: &state.KVRequest{Op: state.OpCheckLock,
		Entry: state.DirEntry{Key: key, Session: session, LockIndex: lockIndex}}}})
	return len(errs) == 0
}

// Finding: the sequencer (Key, LockIndex, Session) repeats when a key is
// deleted (a plain DELETE, locks being advisory; or delete-tree) and the
// same session acquires it again: the new hold gets LockIndex 1 again, and
// the stale sequencer (k, 1, S) from before the delete passes the
// check-lock fence as current. Breaks the seed's "the tuple of (Key,
// LockIndex, Session) [acts] as a unique sequencer" and
// docs/compatibility.md section 1 ("a sequencer is never reused"); the
// CreateIndex that differs is not part of the sequencer anyone checks.
func TestAuditSessionSequencerRepeatsAfterDeleteRecreate(t *testing.T) {
	for _, del := range []struct {
		name string
		req  state.KVRequest
	}{
		{"delete", state.KVRequest{Op: state.OpDelete, Entry: state.DirEntry{Key: "seq/k"}}},
		{"delete-tree", state.KVRequest{Op: state.OpDeleteTree, Entry: state.DirEntry{Key: "seq/"}}},
	} {
		t.Run(del.name, func(t *testing.T) {
			s := newTestServer(t, "", clocktest.NewFake(epoch))
			id := mustSession(t, s, state.Session{})
			if ok, _ := saKV(t, s, state.OpLock, state.DirEntry{Key: "seq/k", Session: id}); !ok {
				t.Fatal("acquire")
			}
			_, first := s.State().KVGet(nil, "seq/k")
			old := [3]any{first.Key, first.LockIndex, first.Session}
			if ok, _, err := s.KVS(context.Background(), &del.req); !ok || err != nil {
				t.Fatal(ok, err)
			}
			if saFence(s, "seq/k", first.LockIndex, id) {
				t.Fatal("fence passes for a deleted key")
			}
			if ok, _ := saKV(t, s, state.OpLock, state.DirEntry{Key: "seq/k", Session: id}); !ok {
				t.Fatal("re-acquire")
			}
			_, second := s.State().KVGet(nil, "seq/k")
			if cur := [3]any{second.Key, second.LockIndex, second.Session}; cur == old {
				t.Errorf("sequencer %v issued twice (CreateIndex %d then %d)", cur, first.CreateIndex, second.CreateIndex)
			}
			if saFence(s, "seq/k", first.LockIndex, id) && second.CreateIndex != first.CreateIndex {
				t.Errorf("the stale sequencer from before the delete passes the fence for the new hold")
			}
		})
	}
}

// saSeqTaker acquires keys and fails the test if a sequencer repeats.
func saSeqTaker(t *testing.T) func(s *Server, key, id string) {
	seen := map[[3]any]bool{}
	return func(s *Server, key, id string) {
		t.Helper()
		if ok, left := saKV(t, s, state.OpLock, state.DirEntry{Key: key, Session: id}); !ok {
			t.Fatalf("acquire %s: refused (%v)", key, left)
		}
		_, e := s.State().KVGet(nil, key)
		seq := [3]any{e.Key, e.LockIndex, e.Session}
		if seen[seq] {
			t.Errorf("sequencer %v issued twice", seq)
		}
		seen[seq] = true
	}
}

// Finding: a behaviour=delete invalidation of another session deletes the
// key, and when an earlier holder re-creates it by acquiring, it gets
// LockIndex 1 again: its sequencer from its first hold, (k, 1, a), is
// issued a second time and passes the fence again. The brief's "(Key,
// LockIndex, Session) must never repeat ... behaviour=delete invalidation
// then re-create"; seed: "(Key, LockIndex, Session) ... unique sequencer".
func TestAuditSessionSequencerRepeatsAfterDeleteBehaviour(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	take := saSeqTaker(t)
	a := mustSession(t, s, state.Session{LockDelay: 0})
	take(s, "k", a) // (k, 1, a)
	saKV(t, s, state.OpUnlock, state.DirEntry{Key: "k", Session: a})
	d := mustSession(t, s, state.Session{Behavior: state.BehaviorDelete, LockDelay: time.Second})
	take(s, "k", d) // (k, 2, d)
	if err := s.SessionDestroy(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	take(s, "k", a) // (k, 1, a) again
}

// TestAuditSessionSequencerMovesOn: acquire/release cycles and a restart
// with a compacted log never hand out a sequencer twice.
func TestAuditSessionSequencerMovesOn(t *testing.T) {
	dir := t.TempDir()
	clk := clocktest.NewFake(epoch)
	s := newTunedServer(t, dir, clk, compactingTuning)
	take := saSeqTaker(t)
	a := mustSession(t, s, state.Session{LockDelay: 0})
	b := mustSession(t, s, state.Session{LockDelay: 0})
	for i := 0; i < 3; i++ {
		take(s, "k", a)
		saKV(t, s, state.OpUnlock, state.DirEntry{Key: "k", Session: a})
		take(s, "k", b)
		saKV(t, s, state.OpUnlock, state.DirEntry{Key: "k", Session: b})
	}
	snapshotAndCompact(t, s, 5)
	s.Shutdown()
	s2 := newTunedServer(t, dir, clk, compactingTuning)
	take(s2, "k", a)
	if _, e := s2.State().KVGet(nil, "k"); e.LockIndex != 7 {
		t.Errorf("LockIndex after restart = %d, want 7", e.LockIndex)
	}
}

// TestAuditSessionRestartKeepsBindings: after a restart (log replay, or a
// compacted snapshot) the check and node bindings of sessions still
// invalidate them, their prepared queries go with them, and all of it
// stays so after a further restart.
func TestAuditSessionRestartKeepsBindings(t *testing.T) {
	for _, mode := range []string{"log", "compacted"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			clk := clocktest.NewFake(epoch)
			s := newTunedServer(t, dir, clk, compactingTuning)
			saRegisterNode(t, s)
			chk := mustSession(t, s, state.Session{Node: saNode, NodeChecks: []string{"c1", "c1"}})
			svc := mustSession(t, s, state.Session{Node: saNode, NodeChecks: []string{}, ServiceChecks: []state.ServiceCheck{{ID: "svc-check"}}})
			bare := mustSession(t, s, state.Session{Node: saNode, NodeChecks: []string{}, Behavior: state.BehaviorDelete})
			ids := map[string]string{"chk": chk, "svc": svc, "bare": bare}
			queries := map[string]string{}
			for name, id := range ids {
				saKV(t, s, state.OpLock, state.DirEntry{Key: "b/" + name, Session: id})
				queries[name] = saQuery(t, s, id)
			}
			if mode == "compacted" {
				snapshotAndCompact(t, s, 5)
			}
			s.Shutdown()
			s = newTunedServer(t, dir, clk, compactingTuning)
			ctx := context.Background()
			gone := func(name string) {
				t.Helper()
				st := s.State()
				if _, sess := st.SessionGet(nil, ids[name]); sess != nil {
					t.Errorf("%s: session survived", name)
				}
				if _, q := st.QueryGet(nil, queries[name]); q != nil {
					t.Errorf("%s: its prepared query survived", name)
				}
				_, e := st.KVGet(nil, "b/"+name)
				if (name == "bare" && e != nil) || (name != "bare" && (e == nil || e.Session != "")) {
					t.Errorf("%s: key after invalidation = %+v", name, e)
				}
			}
			if err := s.Register(ctx, &state.RegisterRequest{Node: saNode, SkipNodeUpdate: true,
				Check: &state.HealthCheck{CheckID: "svc-check", Status: state.HealthCritical, ServiceID: "svc1"}}); err != nil {
				t.Fatal(err)
			}
			gone("svc")
			if _, sess := s.State().SessionGet(nil, chk); sess == nil {
				t.Error("chk invalidated by another check")
			}
			if err := s.Deregister(ctx, &state.DeregisterRequest{Node: saNode, CheckID: "c1"}); err != nil {
				t.Fatal(err)
			}
			gone("chk")
			if _, sess := s.State().SessionGet(nil, bare); sess == nil {
				t.Error("bare invalidated before its node went")
			}
			if err := s.Deregister(ctx, &state.DeregisterRequest{Node: saNode}); err != nil {
				t.Fatal(err)
			}
			gone("bare")
			if mode == "compacted" {
				snapshotAndCompact(t, s, 5)
			}
			s.Shutdown()
			s = newTunedServer(t, dir, clk, compactingTuning)
			for name := range ids {
				gone(name)
			}
		})
	}
}

// TestAuditSessionNodeReregistration: re-registering a session's node
// (new address, checks re-sent passing, or the node alone) does not
// invalidate it; a deregistration followed by a registration does, and the
// session does not come back.
func TestAuditSessionNodeReregistration(t *testing.T) {
	s := newTestServer(t, "", clocktest.NewFake(epoch))
	ctx := context.Background()
	saRegisterNode(t, s)
	id := mustSession(t, s, state.Session{Node: saNode, LockDelay: 10 * time.Second, NodeChecks: []string{"c1"}, ServiceChecks: []state.ServiceCheck{{ID: "svc-check"}}})
	saKV(t, s, state.OpLock, state.DirEntry{Key: "rr", Session: id})
	for _, req := range []*state.RegisterRequest{
		{Node: saNode, Address: "10.0.0.99"},
		{Node: saNode, Address: "10.0.0.99", Checks: []*state.HealthCheck{{CheckID: "c1", Status: state.HealthWarning, Output: "slow"}}},
	} {
		if err := s.Register(ctx, req); err != nil {
			t.Fatal(err)
		}
		if _, sess := s.State().SessionGet(nil, id); sess == nil {
			t.Fatalf("re-registration %+v invalidated the session", req)
		}
	}
	saRegisterNode(t, s)
	if _, sess := s.State().SessionGet(nil, id); sess == nil {
		t.Fatal("re-registration with passing checks invalidated the session")
	}
	if err := s.Deregister(ctx, &state.DeregisterRequest{Node: saNode}); err != nil {
		t.Fatal(err)
	}
	saRegisterNode(t, s)
	if _, sess := s.State().SessionGet(nil, id); sess != nil {
		t.Fatal("session back after its node was deregistered and registered again")
	}
	if _, e := s.State().KVGet(nil, "rr"); e == nil || e.Session != "" {
		t.Fatalf("key = %+v", e)
	}
	// The lock-delay also holds in a transaction, checked by the state
	// machine with the command's stamp.
	b := mustSession(t, s, state.Session{})
	_, errs, err := s.Txn(ctx, []*state.TxnOp{{KV: &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "rr", Session: b}}}})
	if err != nil || len(errs) == 0 || !strings.Contains(errs[0].What, "lock delay") {
		t.Fatalf("txn acquire in lock-delay: %v %+v", err, errs)
	}
}

// Finding: Shutdown panics ("sync: WaitGroup is reused before previous
// Wait has returned", and the race detector reports Add racing Wait) when
// session TTLs run out while the server shuts down: onSessionExpired,
// called from the ttl goroutine, does s.wg.Add(1) while Shutdown is in
// s.wg.Wait(); the timers are only cleared (stopLeading) and closed after
// that Wait. A server with TTL sessions can crash on a clean shutdown
// instead of stopping; an expiry goroutine may also outlive Shutdown.
func TestAuditSessionShutdownWhileSessionsExpire(t *testing.T) {
	shutdown := func(s *Server) (p any) {
		defer func() { p = recover() }()
		s.Shutdown()
		return nil
	}
	for i := 0; i < 30; i++ {
		clk := clocktest.NewFake(epoch)
		s := newTestServer(t, "", clk)
		for j := 0; j < 50; j++ {
			mustSession(t, s, state.Session{TTL: "10s"})
		}
		done := make(chan struct{})
		go func() { defer close(done); clk.Advance(10 * time.Second) }()
		p := shutdown(s)
		<-done
		if p != nil {
			t.Fatalf("Shutdown panicked while sessions expired (round %d): %v", i, p)
		}
	}
}
