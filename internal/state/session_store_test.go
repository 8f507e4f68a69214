package state_test

import (
	"bytes"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// populateSessions adds to populate's store a session of each shape the
// session store keeps apart: bound to no check (on another node), naming
// a check twice, bound to serfHealth alone with a server-style ID, and
// bound to several checks, service check included.
func populateSessions(f *fx) {
	f.session("bare2", func(s *state.Session) { s.Node = "n2" })
	f.session("dup", func(s *state.Session) { s.NodeChecks, s.TTL = []string{"c1", "c1"}, "60s" })
	f.session("4f0c2e6a-5b1d-4c3e-9a7f-0d8e1b2c3a4f", func(s *state.Session) {
		s.NodeChecks, s.TTL = []string{state.SerfCheckID}, "60s"
	})
	f.session("multi", func(s *state.Session) {
		s.Node, s.TTL = "n3", "10m"
		s.NodeChecks = []string{state.SerfCheckID}
		s.ServiceChecks = []state.ServiceCheck{{ID: "http"}}
	})
}

const goldenV1 = "testdata/snapshot-v1.jsonl"

// TestRestoreSnapshotV1 restores a snapshot written by the store as it was
// before sessions left go-memdb rows (testdata, made with
// HOLDFAST_WRITE_GOLDEN=1 at that version): the store it gives must read
// and behave exactly as one built by the same commands now, and a snapshot
// of today's store must be the same bytes.
func TestRestoreSnapshotV1(t *testing.T) {
	f := populate(t)
	populateSessions(f)
	var now bytes.Buffer
	if err := f.s.Snapshot().Persist(&now); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("HOLDFAST_WRITE_GOLDEN") == "1" {
		if err := os.WriteFile(goldenV1, now.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile(goldenV1)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(now.Bytes(), golden) {
		t.Fatalf("the snapshot format changed:\n now    %s\n golden %s", now.Bytes(), golden)
	}
	restored, err := state.Restore(bytes.NewReader(golden))
	if err != nil {
		t.Fatal(err)
	}
	want := readAll(t, f.s)
	if len(want.Sessions) != 6 || len(want.NodeSess["n1"]) != 3 || len(want.NodeSess["n2"]) != 1 {
		t.Fatalf("populate did not build what the test expects: %d sessions, by node %v",
			len(want.Sessions), want.NodeSess)
	}
	if got := readAll(t, restored); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored store differs:\n got  %+v\n want %+v", got, want)
	}

	// A snapshot written before a delete-tree left a tombstone per key
	// restores to the same store apart from those tombstones.
	before, err := os.ReadFile("testdata/snapshot-v1-tree-tombstone.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	older, err := state.Restore(bytes.NewReader(before))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, older); !reflect.DeepEqual(got, withoutKeyGraves(readAll(t, f.s))) {
		t.Fatalf("restored store differs:\n got  %+v\n want %+v", got, want)
	}

	// Both invalidate the same sessions for the same commands.
	g := &fx{t: t, s: restored, idx: f.idx, now: f.now}
	for _, h := range []*fx{f, g} {
		h.now = h.now.Add(time.Second)
		h.check("n1", "c1", state.HealthCritical)                           // rel, dup
		h.deregister(&state.DeregisterRequest{Node: "n3", CheckID: "http"}) // del, multi
		h.deregister(&state.DeregisterRequest{Node: "n2"})                  // bare2
		h.session("new", nil)
	}
	a, b := readAll(t, f.s), readAll(t, g.s)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("original and restored diverged:\n orig     %+v\n restored %+v", a, b)
	}
	var ids []string
	for _, s := range a.Sessions {
		ids = append(ids, s.ID)
	}
	if want := []string{"4f0c2e6a-5b1d-4c3e-9a7f-0d8e1b2c3a4f", "new"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("sessions left %v, want %v", ids, want)
	}
}

// TestSessionGetWatchesOneSession: the watch of a present session fires
// when that session goes, and not when others come and go (a blocking read
// of one session must not return early); the watch of an absent one fires
// when it is created.
func TestSessionGetWatchesOneSession(t *testing.T) {
	f := newFx(t)
	f.session("s1", func(s *state.Session) { s.NodeChecks = []string{state.SerfCheckID} })
	ws := watch.NewSet()
	if _, s := f.s.SessionGet(ws, "s1"); s == nil {
		t.Fatal("s1 missing")
	}
	absent := watch.NewSet()
	if _, s := f.s.SessionGet(absent, "s3"); s != nil {
		t.Fatal("s3 present")
	}
	f.session("s2", func(s *state.Session) { s.NodeChecks = []string{state.SerfCheckID} })
	if err := f.s.SessionDestroy(f.next(), f.now, "s2"); err != nil {
		t.Fatal(err)
	}
	f.set("k", "v")
	if fired(ws) {
		t.Fatal("s1's watch fired on other sessions' changes")
	}
	// Reads without a watch set, and a second watcher, share the channel.
	f.s.SessionGet(nil, "s1")
	ws2 := watch.NewSet()
	f.s.SessionGet(ws2, "s1")
	f.session("s3", nil)
	if !fired(absent) {
		t.Fatal("the watch of an absent session did not fire when it was created")
	}
	if fired(ws) || fired(ws2) {
		t.Fatal("s1's watch fired on another session's create")
	}
	// A failed batch invalidates nothing.
	b := f.s.Batch()
	b.SessionDestroy(f.next(), f.now, "s1")
	b.Abort()
	if fired(ws) {
		t.Fatal("s1's watch fired on an aborted destroy")
	}
	f.check("n1", state.SerfCheckID, state.HealthCritical)
	if !fired(ws) || !fired(ws2) {
		t.Fatal("s1's watches did not fire when it was invalidated")
	}
}

// TestNodeSessions: a node's sessions, each once and ordered by ID, however
// many checks bind them, and a watch that fires for that node's sessions
// only.
func TestNodeSessions(t *testing.T) {
	f := newFx(t)
	f.session("z", func(s *state.Session) { s.NodeChecks = []string{"c1", state.SerfCheckID, "c2", "c1"} })
	f.session("m", nil)
	f.session("a", func(s *state.Session) { s.NodeChecks = []string{"c2"} })
	f.session("b", func(s *state.Session) { s.Node = "n2"; s.NodeChecks = []string{state.SerfCheckID} })
	ids := func(node string, ws watch.Set) []string {
		_, ss := f.s.NodeSessions(ws, node)
		out := []string{}
		for _, s := range ss {
			out = append(out, s.ID)
		}
		return out
	}
	if got, want := ids("n1", nil), []string{"a", "m", "z"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("n1 sessions %v, want %v", got, want)
	}
	if got, want := ids("n2", nil), []string{"b"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("n2 sessions %v, want %v", got, want)
	}
	if got := ids("n3", nil); len(got) != 0 {
		t.Fatalf("n3 sessions %v", got)
	}
	ws1, ws3 := watch.NewSet(), watch.NewSet()
	ids("n1", ws1)
	ids("n3", ws3)
	f.session("c", func(s *state.Session) { s.Node = "n2" })
	if fired(ws1) {
		t.Fatal("n1's watch fired on a session of n2")
	}
	f.check("n1", "c2", state.HealthCritical) // invalidates a and z
	if !fired(ws1) {
		t.Fatal("n1's watch did not fire")
	}
	if got, want := ids("n1", nil), []string{"m"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("n1 sessions %v, want %v", got, want)
	}
	// The check's bindings went with its sessions: one failing again, or
	// passing and failing, invalidates nothing more.
	f.check("n1", "c1", state.HealthCritical)
	if got, want := ids("n1", nil), []string{"m"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("n1 sessions %v after c1 failed, want %v", got, want)
	}
	f.register(&state.RegisterRequest{Node: "n3", Address: "10.0.0.3"})
	f.session("n3s", func(s *state.Session) { s.Node = "n3" })
	if !fired(ws3) {
		t.Fatal("the watch of a node with no sessions did not fire when it got one")
	}
	f.deregister(&state.DeregisterRequest{Node: "n2"})
	if got := ids("n2", nil); len(got) != 0 {
		t.Fatalf("n2 sessions %v after deregistration", got)
	}
	_, all := f.s.SessionList(nil)
	var left []string
	for _, s := range all {
		left = append(left, s.ID)
	}
	if want := []string{"m", "n3s"}; !reflect.DeepEqual(left, want) {
		t.Fatalf("sessions %v, want %v", left, want)
	}
}

// TestStoredSessionIsAsCreated: what is stored is what was asked for,
// whatever the store shares underneath, and the caller's session is not
// touched.
func TestStoredSessionIsAsCreated(t *testing.T) {
	f := newFx(t)
	in := []*state.Session{
		{ID: "a", Node: "n1", Behavior: state.BehaviorDelete, TTL: "60s", NodeChecks: []string{state.SerfCheckID}},
		{ID: "b", Node: "n1", Name: "x", TTL: "1h", NodeChecks: []string{"c1", state.SerfCheckID, "c1"}, LockDelay: 3},
		{ID: "c", Node: "n1", NodeChecks: []string{"c2"}, ServiceChecks: []state.ServiceCheck{}},
		{ID: "d", Node: "n1", NodeChecks: []string{}},
		{ID: "e", Node: "n1"},
	}
	for _, s := range in {
		orig := *s
		origChecks := append([]string(nil), s.NodeChecks...)
		if err := f.s.SessionCreate(f.next(), s); err != nil {
			t.Fatal(err)
		}
		want := orig
		if want.Behavior == "" {
			want.Behavior = state.BehaviorRelease
		}
		want.CreateIndex, want.ModifyIndex = f.idx, f.idx
		if _, got := f.s.SessionGet(nil, s.ID); !reflect.DeepEqual(got, &want) {
			t.Fatalf("stored %+v, want %+v", got, &want)
		}
		if !reflect.DeepEqual(*s, orig) || !slices.Equal(s.NodeChecks, origChecks) {
			t.Fatalf("SessionCreate changed its argument: %+v, was %+v", s, orig)
		}
	}
}
