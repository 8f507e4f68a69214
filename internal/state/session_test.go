package state_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

func TestSessionCreate(t *testing.T) {
	f := newFx(t)
	f.register(&state.RegisterRequest{Node: "n1", SkipNodeUpdate: true,
		Service: &state.Service{ID: "web1", Service: "web"},
		Checks: []*state.HealthCheck{
			{CheckID: "svc", ServiceID: "web1", Status: state.HealthPassing},
			{CheckID: "warn", Status: state.HealthWarning},
			{CheckID: "crit", Status: state.HealthCritical},
			{CheckID: "nostatus"},
		}})

	bad := []struct {
		name string
		sess state.Session
		is   error
		text string
	}{
		{"no ID", state.Session{Node: "n1"}, state.ErrInvalidRequest, ""},
		{"unknown node", state.Session{ID: "x", Node: "n9"}, state.ErrMissingNode, "Missing node registration"},
		{"missing node check", state.Session{ID: "x", Node: "n1", NodeChecks: []string{state.SerfCheckID, "c9"}},
			state.ErrMissingCheck, "Missing check 'c9' registration"},
		{"check on another node", state.Session{ID: "x", Node: "n2", NodeChecks: []string{"c1"}},
			state.ErrMissingCheck, "Missing check 'c1' registration"},
		{"missing service check", state.Session{ID: "x", Node: "n1", ServiceChecks: []state.ServiceCheck{{ID: "svc9"}}},
			state.ErrMissingCheck, "Missing check 'svc9' registration"},
		{"critical check", state.Session{ID: "x", Node: "n1", NodeChecks: []string{"crit"}},
			state.ErrCriticalCheck, "Check 'crit' is in critical state"},
		{"check registered without a status is critical", state.Session{ID: "x", Node: "n1", NodeChecks: []string{"nostatus"}},
			state.ErrCriticalCheck, "Check 'nostatus' is in critical state"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			before := f.indexes()
			sess := c.sess
			err := f.s.SessionCreate(f.next(), &sess)
			if !errors.Is(err, c.is) {
				t.Fatalf("err = %v, want %v", err, c.is)
			}
			if c.text != "" && err.Error() != c.text {
				t.Fatalf("err text = %q, want %q", err.Error(), c.text)
			}
			f.assertNoWrite(before)
		})
	}

	// Warning is fine, and service checks are looked up on the node.
	in := &state.Session{ID: "s1", Name: "n", Node: "n1", LockDelay: 3 * time.Second, TTL: "30s",
		NodeChecks: []string{state.SerfCheckID, "warn"}, ServiceChecks: []state.ServiceCheck{{ID: "svc"}}}
	idx := f.next()
	if err := f.s.SessionCreate(idx, in); err != nil {
		t.Fatal(err)
	}
	sidx, got := f.s.SessionGet(nil, "s1")
	want := *in
	want.Behavior = state.BehaviorRelease
	want.CreateIndex, want.ModifyIndex = idx, idx
	if sidx != idx || !reflect.DeepEqual(got, &want) {
		t.Fatalf("SessionGet = %d %+v, want %d %+v", sidx, got, idx, want)
	}
	if in.CreateIndex != 0 || in.Behavior != "" {
		t.Fatalf("SessionCreate modified its argument: %+v", in)
	}
	// Same ID twice is refused.
	before := f.indexes()
	if err := f.s.SessionCreate(f.next(), &state.Session{ID: "s1", Node: "n1"}); !errors.Is(err, state.ErrInvalidRequest) {
		t.Fatalf("duplicate ID: err = %v", err)
	}
	f.assertNoWrite(before)

	f.session("s2", func(s *state.Session) { s.Node = "n2"; s.Behavior = state.BehaviorDelete })
	if idx, l := f.s.SessionList(nil); idx != f.idx || len(l) != 2 || l[0].ID != "s1" || l[1].ID != "s2" {
		t.Fatalf("SessionList = %d %v", idx, l)
	}
	if _, l := f.s.NodeSessions(nil, "n2"); len(l) != 1 || l[0].ID != "s2" || l[0].Behavior != state.BehaviorDelete {
		t.Fatalf("NodeSessions n2 = %v", l)
	}
	if _, l := f.s.NodeSessions(nil, "n9"); l == nil || len(l) != 0 {
		t.Fatalf("NodeSessions of unknown node = %#v, want empty non-nil", l)
	}
}

// TestSessionInvalidation covers every invalidation trigger with both
// behaviours: in the one index of the trigger the session goes, its keys
// are released or deleted with a lock-delay from the stamped time, and its
// prepared queries are deleted; nothing else is touched.
func TestSessionInvalidation(t *testing.T) {
	triggers := []struct {
		name  string
		apply func(f *fx)
		// sessions that go with it besides "s"
		alsoGone []string
	}{
		{name: "destroy", apply: func(f *fx) {
			if err := f.s.SessionDestroy(f.next(), f.now, "s"); err != nil {
				f.t.Fatal(err)
			}
		}},
		{name: "node check critical", apply: func(f *fx) { f.check("n1", "c1", state.HealthCritical) }},
		{name: "node check re-registered without status", apply: func(f *fx) { f.check("n1", "c1", "") }},
		{name: "service check critical", apply: func(f *fx) {
			f.register(&state.RegisterRequest{Node: "n1", SkipNodeUpdate: true,
				Check: &state.HealthCheck{CheckID: "svc", ServiceID: "web1", Status: state.HealthCritical}})
		}},
		{name: "node check deregistered", apply: func(f *fx) {
			f.deregister(&state.DeregisterRequest{Node: "n1", CheckID: "c1"})
		}},
		{name: "service check deregistered", apply: func(f *fx) {
			f.deregister(&state.DeregisterRequest{Node: "n1", CheckID: "svc"})
		}},
		{name: "service deregistered", apply: func(f *fx) {
			f.deregister(&state.DeregisterRequest{Node: "n1", ServiceID: "web1"})
		}},
		{name: "node deregistered", apply: func(f *fx) {
			f.deregister(&state.DeregisterRequest{Node: "n1"})
		}, alsoGone: []string{"bystander"}},
	}
	for _, tr := range triggers {
		for _, behavior := range []string{state.BehaviorRelease, state.BehaviorDelete} {
			t.Run(tr.name+"/"+behavior, func(t *testing.T) {
				f := newFx(t)
				f.register(&state.RegisterRequest{Node: "n1", SkipNodeUpdate: true,
					Service: &state.Service{ID: "web1", Service: "web"},
					Check:   &state.HealthCheck{CheckID: "svc", ServiceID: "web1", Status: state.HealthPassing}})
				f.session("s", func(s *state.Session) {
					s.Behavior = behavior
					s.NodeChecks = []string{state.SerfCheckID, "c1"}
					s.ServiceChecks = []state.ServiceCheck{{ID: "svc"}}
				})
				f.session("other", func(s *state.Session) { s.Node = "n2"; s.NodeChecks = []string{state.SerfCheckID} })
				f.session("bystander", func(s *state.Session) { s.NodeChecks = []string{"c2"} })
				for i, q := range []struct{ id, sess string }{{"q1", "s"}, {"q2", "other"}, {"q3", ""}, {"q4", "s"}} {
					err := f.s.QuerySet(f.next(), &state.PreparedQuery{ID: q.id, Name: "query" + string(rune('a'+i)),
						Session: q.sess, Service: state.ServiceQuery{Service: "web"}})
					if err != nil {
						t.Fatal(err)
					}
				}
				f.lock("k1", "s", "one")
				f.mustKVS(state.OpUnlock, state.DirEntry{Key: "k1", Session: "s", Value: []byte("one"), Flags: 5}, true)
				f.mustKVS(state.OpLock, state.DirEntry{Key: "k1", Session: "s", Value: []byte("one"), Flags: 5}, true)
				f.lock("k2", "s", "")
				f.lock("k3", "other", "three")
				f.lock("k4", "bystander", "four")
				f.set("k5", "five")
				before := map[string]*state.DirEntry{}
				for _, k := range []string{"k1", "k2", "k3", "k4", "k5"} {
					before[k] = f.get(k)
				}
				if before["k1"].LockIndex != 2 {
					t.Fatalf("setup: k1 LockIndex %d", before["k1"].LockIndex)
				}

				f.now = f.now.Add(time.Hour + 123*time.Nanosecond)
				idx := f.idx + 1
				tr.apply(f)
				if f.idx != idx {
					t.Fatalf("trigger used %d commands", f.idx-idx+1)
				}

				gone := map[string]bool{"s": true}
				for _, id := range tr.alsoGone {
					gone[id] = true
				}
				for _, id := range []string{"s", "other", "bystander"} {
					if _, sess := f.s.SessionGet(nil, id); (sess == nil) != gone[id] {
						t.Fatalf("session %s present=%v, want gone=%v", id, sess != nil, gone[id])
					}
				}
				if got := f.s.TableIndex("sessions"); got != idx {
					t.Fatalf("sessions index %d, want %d", got, idx)
				}
				if got := f.s.TableIndex("kvs"); got != idx {
					t.Fatalf("kvs index %d, want %d", got, idx)
				}
				if got := f.s.TableIndex("prepared_queries"); got != idx {
					t.Fatalf("prepared_queries index %d, want %d", got, idx)
				}

				heldBy := map[string]string{"k1": "s", "k2": "s", "k3": "other", "k4": "bystander"}
				wantTombs := map[string]uint64{}
				for _, k := range []string{"k1", "k2", "k3", "k4", "k5"} {
					b := before[k]
					want := b
					wantDelay := time.Time{}
					if gone[heldBy[k]] {
						wantDelay = f.now.Add(15 * time.Second)
						if heldBy[k] == "s" && behavior == state.BehaviorDelete {
							want = nil
							wantTombs[k] = idx
						} else {
							c := *b
							c.Session, c.ModifyIndex = "", idx
							want = &c
						}
					}
					assertEntry(t, k, f.get(k), want)
					if got := f.s.KVLockDelay(k); !got.Equal(wantDelay) {
						t.Fatalf("%s: lock-delay until %v, want %v", k, got, wantDelay)
					}
				}
				if got := tombstones(t, f.s); !reflect.DeepEqual(got, wantTombs) {
					t.Fatalf("tombstones %v, want %v", got, wantTombs)
				}

				_, qs := f.s.QueryList(nil)
				var ids []string
				for _, q := range qs {
					ids = append(ids, q.ID)
				}
				if want := []string{"q2", "q3"}; !reflect.DeepEqual(ids, want) {
					t.Fatalf("queries left %v, want %v", ids, want)
				}
			})
		}
	}
}

func TestSessionDestroyUnknownWritesNothing(t *testing.T) {
	f := newFx(t)
	f.session("s1", nil)
	f.lock("k", "s1", "v")
	before := f.indexes()
	if err := f.s.SessionDestroy(f.next(), f.now, "nope"); err != nil {
		t.Fatal(err)
	}
	f.assertNoWrite(before)
	if e := f.get("k"); e.Session != "s1" {
		t.Fatalf("k lost its holder: %s", fmtEntry(e))
	}
	// Destroying twice: the second is a no-op.
	if err := f.s.SessionDestroy(f.next(), f.now, "s1"); err != nil {
		t.Fatal(err)
	}
	before = f.indexes()
	if err := f.s.SessionDestroy(f.next(), f.now, "s1"); err != nil {
		t.Fatal(err)
	}
	f.assertNoWrite(before)
}

// TestCheckStatesThatDoNotInvalidate: only critical (or gone) invalidates.
func TestCheckStatesThatDoNotInvalidate(t *testing.T) {
	f := newFx(t)
	f.session("s", func(s *state.Session) { s.NodeChecks = []string{"c1", "c2"} })
	f.check("n1", "c1", state.HealthWarning)
	f.check("n1", "c1", state.HealthPassing)
	f.check("n1", "c1", state.HealthPassing) // identical: no write at all
	f.deregister(&state.DeregisterRequest{Node: "n1", CheckID: "c9"})
	f.deregister(&state.DeregisterRequest{Node: "n1", ServiceID: "nope"})
	f.deregister(&state.DeregisterRequest{Node: "n9"})
	f.register(&state.RegisterRequest{Node: "n1", Address: "10.0.0.9"}) // node update
	if _, s := f.s.SessionGet(nil, "s"); s == nil {
		t.Fatal("session invalidated by a non-critical change")
	}
	// Both bound checks going critical in one registration invalidate once.
	f.session("t", nil)
	f.lock("k", "s", "v")
	f.register(&state.RegisterRequest{Node: "n1", SkipNodeUpdate: true, Checks: []*state.HealthCheck{
		{CheckID: "c1", Status: state.HealthCritical}, {CheckID: "c2", Status: state.HealthCritical}}})
	if _, s := f.s.SessionGet(nil, "s"); s != nil {
		t.Fatal("session survived its checks going critical")
	}
	if _, s := f.s.SessionGet(nil, "t"); s == nil {
		t.Fatal("unbound session invalidated")
	}
	if e := f.get("k"); e.Session != "" || e.ModifyIndex != f.idx {
		t.Fatalf("k after invalidation: %s", fmtEntry(e))
	}
	// A new session may bind the same checks once they pass again, and
	// the old binding is gone: only the new session goes next time.
	f.register(&state.RegisterRequest{Node: "n1", SkipNodeUpdate: true, Checks: []*state.HealthCheck{
		{CheckID: "c1", Status: state.HealthPassing}, {CheckID: "c2", Status: state.HealthPassing}}})
	f.session("s", func(s *state.Session) { s.NodeChecks = []string{"c2"} })
	f.check("n1", "c1", state.HealthCritical)
	if _, s := f.s.SessionGet(nil, "s"); s == nil {
		t.Fatal("new session invalidated through its predecessor's binding")
	}
}

func TestQuerySession(t *testing.T) {
	f := newFx(t)
	err := f.s.QuerySet(f.next(), &state.PreparedQuery{ID: "q", Session: "nope", Service: state.ServiceQuery{Service: "web"}})
	if !errors.Is(err, state.ErrInvalidSession) || err.Error() != `invalid session "nope"` {
		t.Fatalf("query with unknown session: %v", err)
	}
	f.session("s", nil)
	if err := f.s.QuerySet(f.next(), &state.PreparedQuery{ID: "q", Session: "s", Service: state.ServiceQuery{Service: "web"}}); err != nil {
		t.Fatal(err)
	}
	sessIdx := f.s.TableIndex("sessions")
	if err := f.s.QueryDelete(f.next(), "q"); err != nil {
		t.Fatal(err)
	}
	if _, s := f.s.SessionGet(nil, "s"); s == nil || f.s.TableIndex("sessions") != sessIdx {
		t.Fatal("deleting a query touched its session")
	}
	if err := f.s.QueryDelete(f.next(), "q"); !errors.Is(err, state.ErrQueryNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

// A session that names the same check twice is one binding: it is created,
// invalidated by that check, and leaves nothing behind.
func TestSessionWithDuplicateCheck(t *testing.T) {
	s := state.New()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.Register(1, t0, &state.RegisterRequest{Node: "n1", Address: "127.0.0.1",
		Check: &state.HealthCheck{CheckID: "c", Status: state.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	if err := s.SessionCreate(2, &state.Session{ID: "s", Node: "n1", NodeChecks: []string{"c", "c"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Register(3, t0, &state.RegisterRequest{Node: "n1", Address: "127.0.0.1",
		Check: &state.HealthCheck{CheckID: "c", Status: state.HealthCritical}}); err != nil {
		t.Fatal(err)
	}
	if _, sess := s.SessionGet(nil, "s"); sess != nil {
		t.Fatal("session bound twice to a critical check survived")
	}
}
