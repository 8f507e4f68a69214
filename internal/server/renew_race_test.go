package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/state"
)

// Finding: a renewal that reached the leader after the session's deadline
// had fired, but before the destroy was applied, answered 200 with the
// session, and the destroy followed milliseconds later (4 of 5 tries with
// the agent stopped past the TTL and resumed). Renewals and expiries are
// now ordered: whichever comes first wins, and a 200 means the session
// lives on.
func TestRenewAndExpiryAreOrdered(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	newSession := func() string {
		t.Helper()
		id, err := s.SessionCreate(ctx, &state.Session{TTL: "10s"})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}

	// The renewal first: the timer is pending again when the expiry call
	// that was already under way arrives, and that call does nothing.
	won := newSession()
	if _, err := s.SessionRenew(ctx, won); err != nil {
		t.Fatal(err)
	}
	s.onSessionExpired(won)
	s.expMu.Lock()
	_, marked := s.expiring[won]
	s.expMu.Unlock()
	if marked {
		t.Fatal("an expiry that lost to a renewal marked the session expiring")
	}
	if _, sess := s.State().SessionGet(nil, won); sess == nil {
		t.Fatal("a session renewed before its expiry was handled was destroyed")
	}

	// The expiry first: while its destroy is in flight, a renewal is told
	// the session is gone and does not re-arm the timer.
	lost := newSession()
	s.timers.Remove(lost) // as the Timers goroutine does when the deadline fires
	s.expMu.Lock()
	s.expiring[lost] = struct{}{} // as onSessionExpired does before it proposes
	s.expMu.Unlock()
	if _, err := s.SessionRenew(ctx, lost); !errors.Is(err, state.ErrSessionNotFound) {
		t.Fatalf("renewal during the expiry: got %v, want ErrSessionNotFound", err)
	}
	if s.timers.Pending(lost) {
		t.Fatal("a renewal during the expiry re-armed the timer")
	}
	s.expMu.Lock()
	delete(s.expiring, lost)
	s.expMu.Unlock()

	// And the whole path on the clock: at the TTL the session goes, and a
	// renewal after that is refused.
	gone := newSession()
	clk.Advance(10 * time.Second)
	waitSessionGone(t, s, gone)
	if _, err := s.SessionRenew(ctx, gone); !errors.Is(err, state.ErrSessionNotFound) {
		t.Fatalf("renewal after the expiry: got %v", err)
	}
	waitFor(t, "the expiry to end", func() bool {
		s.expMu.Lock()
		defer s.expMu.Unlock()
		return len(s.expiring) == 0
	})
}

// Finding: a session created with TTL "0s" was shown with TTL "", where
// Consul shows the TTL as given. It is kept as given, and like "" it means
// no TTL: no timer, and a renewal is a no-op.
func TestZeroTTLKeptAsGiven(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	ctx := context.Background()
	before := s.timers.Len()
	id, err := s.SessionCreate(ctx, &state.Session{TTL: "0s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, sess := s.State().SessionGet(nil, id); sess == nil || sess.TTL != "0s" {
		t.Fatalf("session %+v, want TTL \"0s\"", sess)
	}
	if n := s.timers.Len(); n != before {
		t.Fatalf("a zero TTL armed a timer: %d -> %d", before, n)
	}
	if _, err := s.SessionRenew(ctx, id); err != nil {
		t.Fatal(err)
	}
	clk.Advance(48 * time.Hour)
	if _, sess := s.State().SessionGet(nil, id); sess == nil {
		t.Fatal("a session without a TTL expired")
	}
	if n := s.timers.Len(); n != before {
		t.Fatalf("a renewal of a zero-TTL session armed a timer: %d -> %d", before, n)
	}
}
