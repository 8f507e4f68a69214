package recipe

import (
	"context"
	"errors"
	"testing"
	"time"
)

func mustElection(t testing.TB, s *Session, key string) *Election {
	t.Helper()
	e, err := NewElection(s, key)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// observer reads an Observe channel and checks what it reports.
type observer struct {
	t  testing.TB
	ch <-chan Leader
}

func (o observer) expect(vacant bool, session string, value string) Leader {
	o.t.Helper()
	select {
	case ld, ok := <-o.ch:
		if !ok {
			o.t.Fatal("observer closed")
		}
		if ld.Vacant != vacant || ld.Sequencer.Session != session || (!vacant && string(ld.Value) != value) {
			o.t.Fatalf("observed %+v, want vacant=%v session=%s value=%q", ld, vacant, session, value)
		}
		return ld
	case <-time.After(bound):
		o.t.Fatalf("observed nothing, want vacant=%v session=%s", vacant, session)
		return Leader{}
	}
}

// TestElection: the leader is killed and another is elected; every
// observer sees the vacancy and then the new leader; a resignation hands
// over in queue order; Leader reads the current one.
func TestElection(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	const key = "service/api/leader"
	a, b, c := lockSession(t, srv, nil), lockSession(t, srv, nil), lockSession(t, srv, nil)
	watcher := lockSession(t, srv, nil)
	we := mustElection(t, watcher, key)
	obs := []observer{{t, we.Observe(ctx)}, {t, we.Observe(ctx)}}
	for _, o := range obs {
		o.expect(true, "", "")
	}
	if _, err := we.Leader(ctx); err != ErrNoLeader {
		t.Fatalf("Leader of a vacant office: %v", err)
	}

	ea := mustElection(t, a, key)
	la, err := ea.Campaign(ctx, []byte("a:8080"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ea.Campaign(ctx, []byte("again")); err != ErrAlreadyLeader {
		t.Fatalf("second Campaign: %v", err)
	}
	for _, o := range obs {
		o.expect(false, a.ID(), "a:8080")
	}
	ld, err := we.Leader(ctx)
	if err != nil || ld.Sequencer != la.Sequencer() || string(ld.Value) != "a:8080" {
		t.Fatalf("Leader: %+v %v", ld, err)
	}

	// b and c campaign, in that order.
	terms := make(chan *Leadership, 2)
	for _, s := range []*Session{b, c} {
		lines := make(chan string, 8)
		e := mustElection(t, s, key)
		go func() {
			l, err := e.campaignHook(ctx, []byte(s.ID()[:8]), func(l string) { lines <- l })
			if err != nil {
				t.Error(err)
			}
			terms <- l
		}()
		<-lines // queued
	}

	// The leader is killed: its session is invalidated.
	if _, err := srv.c.Session().Destroy(ctx, a.ID(), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-la.Lost():
	case <-time.After(bound):
		t.Fatal("the killed leader's term did not end")
	}
	var lb *Leadership
	select {
	case lb = <-terms:
	case <-time.After(bound):
		t.Fatal("nobody was elected after the leader died")
	}
	if lb.Sequencer().Session != b.ID() {
		t.Fatalf("elected %v, want b (first in line)", lb.Sequencer())
	}
	for _, o := range obs {
		o.expect(true, "", "")
		o.expect(false, b.ID(), b.ID()[:8])
	}

	// b resigns: c takes over.
	if err := lb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lb.Resign(ctx); err != ErrNotLeader {
		t.Fatalf("second Resign: %v", err)
	}
	lc := <-terms
	if lc.Sequencer().Session != c.ID() || lc.Sequencer().LockIndex != 3 {
		t.Fatalf("elected %v, want c's third term", lc.Sequencer())
	}
	for _, o := range obs {
		o.expect(true, "", "")
		o.expect(false, c.ID(), c.ID()[:8])
	}
	la.Resign(ctx)
}

// TestCampaignFailsWhenSessionLost: a waiting campaign ends with
// ErrSessionLost as soon as its session is lost.
func TestCampaignFailsWhenSessionLost(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	if _, err := mustElection(t, lockSession(t, srv, nil), "l").Campaign(ctx, nil); err != nil {
		t.Fatal(err)
	}
	s := lockSession(t, srv, &SessionOptions{TTL: 10 * time.Second})
	e := mustElection(t, s, "l")
	lines := make(chan string, 8)
	errc := make(chan error, 1)
	go func() {
		_, err := e.campaignHook(ctx, nil, func(l string) { lines <- l })
		errc <- err
	}()
	<-lines
	if _, err := srv.c.Session().Destroy(ctx, s.ID(), nil); err != nil {
		t.Fatal(err)
	}
	srv.Clock.Advance(5 * time.Second)
	select {
	case err := <-errc:
		if !errors.Is(err, ErrSessionLost) {
			t.Fatalf("Campaign returned %v", err)
		}
	case <-time.After(bound):
		t.Fatal("Campaign still waiting after its session was lost")
	}
	if err := e.Resign(ctx); err != ErrNotLeader {
		t.Fatalf("Resign without a term: %v", err)
	}
}

// TestObserveStops: the observer's channel closes with its context.
func TestObserveStops(t *testing.T) {
	srv := newServer(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	ch := mustElection(t, lockSession(t, srv, nil), "x").Observe(ctx)
	<-ch
	cancel()
	for range ch {
	}
}

// Finding: a second Campaign while the first still waited answered
// ErrAlreadyLeader, though the Election did not lead; it is ErrCampaigning.
func TestElectionCampaignWhileCampaigning(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	const key = "svc/leader"
	if _, err := mustElection(t, lockSession(t, srv, nil), key).Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	e := mustElection(t, lockSession(t, srv, nil), key)
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	hooked := make(chan struct{})
	var once bool
	go func() {
		_, err := e.campaignHook(wctx, []byte("b"), func(string) {
			if !once {
				once = true
				close(hooked)
			}
		})
		waited <- err
	}()
	<-hooked
	if _, err := e.Campaign(ctx, []byte("c")); err != ErrCampaigning {
		t.Fatalf("second Campaign: %v; want ErrCampaigning", err)
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("first Campaign: %v", err)
	}
}
