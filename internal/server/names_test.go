package server

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/state"
)

// Finding: a node named "a\x00b" was accepted, and the catalog's prefix
// lookups found it under node "a": deregistering "a" invalidated the
// sessions of "a\x00b" (and deleted their queries), and a query named
// "nq\x00x" blocked the name "nq" and answered for it. Names with a NUL
// byte are now refused before raft, and nothing is written.
func TestNamesWithNULAreRefused(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	if err := s.Register(ctx, &state.RegisterRequest{Node: "a", Address: "10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	before := s.raft.AppliedIndex()

	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, state.ErrInvalidRequest) || !strings.Contains(err.Error(), "contains a NUL byte") {
			t.Fatalf("%s: got %v, want a refusal for the NUL byte", what, err)
		}
	}
	refused("node", s.Register(ctx, &state.RegisterRequest{Node: "a\x00b", Address: "10.0.0.2"}))
	refused("service ID", s.Register(ctx, &state.RegisterRequest{Node: "a", Address: "10.0.0.1",
		Service: &state.Service{ID: "w\x00x", Service: "web"}}))
	refused("check ID", s.Register(ctx, &state.RegisterRequest{Node: "a", Address: "10.0.0.1",
		Checks: []*state.HealthCheck{nil, {CheckID: "c\x00d", Status: state.HealthPassing}}}))
	refused("deregister", s.Deregister(ctx, &state.DeregisterRequest{Node: "a", CheckID: "c\x00"}))
	_, err := s.SessionCreate(ctx, &state.Session{Node: "a\x00b"})
	refused("session node", err)
	_, err = s.SessionCreate(ctx, &state.Session{Node: "a", NodeChecks: []string{"serf\x00Health"}})
	refused("session check", err)
	_, err = s.SessionCreate(ctx, &state.Session{Node: "a", ServiceChecks: []state.ServiceCheck{{ID: "x\x00"}}})
	refused("session service check", err)
	_, err = s.QuerySet(ctx, &state.PreparedQuery{Name: "nq\x00x", Service: state.ServiceQuery{Service: "web"}})
	refused("query name", err)
	_, err = s.QuerySet(ctx, &state.PreparedQuery{Name: "nq", Service: state.ServiceQuery{Service: "w\x00"}})
	refused("query service", err)

	if after := s.raft.AppliedIndex(); after != before {
		t.Fatalf("refused requests reached raft: applied index %d -> %d", before, after)
	}
	_, nodes := s.State().Nodes(nil)
	for _, n := range nodes {
		if strings.IndexByte(n.Node, 0) >= 0 {
			t.Fatalf("node %q was registered", n.Node)
		}
	}
}

// Finding: an update of a prepared query that raced the invalidation of
// its session brought the query back (26 of 400 tries through the HTTP
// API): the leader found the query, the invalidation deleted it, and the
// update, applied after, created it again. An update now names the query
// it found (its CreateIndex), and the state machine refuses it if that
// query is gone.
func TestQueryUpdateAfterInvalidationDoesNotRecreate(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	sess, err := s.SessionCreate(ctx, &state.Session{})
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.QuerySet(ctx, &state.PreparedQuery{Name: "q", Session: sess, Service: state.ServiceQuery{Service: "web"}})
	if err != nil {
		t.Fatal(err)
	}
	_, q := s.State().QueryGet(nil, id)

	// The update as the leader builds it after its check, applied after
	// the session's invalidation.
	if err := s.SessionDestroy(ctx, sess); err != nil {
		t.Fatal(err)
	}
	upd := state.PreparedQuery{ID: id, Name: "q", Service: state.ServiceQuery{Service: "web"}, CreateIndex: q.CreateIndex}
	res, err := s.apply(fsm.TypeQuerySet, &upd)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res.Err, state.ErrQueryNotFound) {
		t.Fatalf("update of a deleted query: got %v, want ErrQueryNotFound", res.Err)
	}
	if _, got := s.State().QueryGet(nil, id); got != nil {
		t.Fatalf("the query came back: %+v", got)
	}

	// Through the backend, an update of a missing query is refused as before,
	// and an update of a live one still works.
	if _, err := s.QuerySet(ctx, &upd); !errors.Is(err, state.ErrQueryNotFound) {
		t.Fatalf("QuerySet of a deleted query: %v", err)
	}
	id2, err := s.QuerySet(ctx, &state.PreparedQuery{Name: "q2", Service: state.ServiceQuery{Service: "web"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.QuerySet(ctx, &state.PreparedQuery{ID: id2, Name: "q3", Service: state.ServiceQuery{Service: "db"}}); err != nil {
		t.Fatal(err)
	}
	if _, got := s.State().QueryGet(nil, id2); got == nil || got.Name != "q3" || got.Service.Service != "db" {
		t.Fatalf("update of a live query: %+v", got)
	}
}
