package recipe

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/api"
)

// The keeper tests run a keeper against a stub agent whose renew answers
// the test gives, on a fake clock moved step by step: a nanosecond before
// each deadline nothing happens, at the deadline exactly one thing does.
//
// TTL 10s throughout: renews at 5s after the last good one, a failed renew
// is retried after 1s, an unanswered one is abandoned after 2s (TTL/5),
// and the safe deadline's margin is 10s/100 + 50ms = 150ms.

const ms = time.Millisecond

func TestKeeperRenewsAtHalfTTL(t *testing.T) {
	kt := newKeeperTest(t, SessionOptions{TTL: 10 * time.Second})
	if got := kt.s.Deadline().Sub(epoch); got != 9850*ms {
		t.Fatalf("first deadline at +%v, want +9.85s", got)
	}
	for i, at := range []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second} {
		kt.advance(5*time.Second - 1)
		kt.quiet()
		kt.advance(1)
		kt.expect(trace(at, "renew %d sent", i+1))
		kt.stub.next().ok("10s")
		kt.expect(trace(at, "renew %d ok", i+1))
		if got := kt.s.Deadline().Sub(epoch); got != at+9850*ms {
			t.Fatalf("deadline after renew at +%v is +%v", at, got)
		}
	}
	if kt.s.State() != Connected {
		t.Fatalf("state %v", kt.s.State())
	}
}

// TestKeeperSafeDeadline: the session is Lost at the send time of the last
// good renew + TTL - margin, whatever happens in between.
func TestKeeperSafeDeadline(t *testing.T) {
	kt := newKeeperTest(t, SessionOptions{TTL: 10 * time.Second, Policy: LoseOnLost})
	untrusted := kt.s.Untrusted()

	kt.advance(5 * time.Second)
	kt.expect("+5s renew 1 sent")
	kt.stub.next().fail(500, "No cluster leader")
	kt.expect("+5s renew 1 failed: Unexpected response code: 500 (No cluster leader)", "+5s state Suspended")
	kt.expectEvent(Suspended, nil)
	if isClosed(untrusted) {
		t.Fatal("LoseOnLost: Untrusted closed at Suspended")
	}
	// Suspended does not move the deadline: it still counts from the
	// creation, the last time the server surely heard from us.
	if got := kt.s.Deadline().Sub(epoch); got != 9850*ms {
		t.Fatalf("deadline at +%v, want +9.85s", got)
	}

	kt.advance(time.Second - 1)
	kt.quiet()
	kt.advance(1)
	kt.expect("+6s renew 2 sent")
	hung := kt.stub.next() // the server is stopped: no answer

	kt.advance(2*time.Second - 1)
	kt.quiet()
	kt.advance(1)
	kt.expect("+8s renew 2 failed: recipe: renew unanswered within the renew timeout", "+8s renew 3 sent")
	hung.waitGone(t)
	kt.stub.next() // unanswered too

	kt.advance(1850*ms - 1)
	kt.quiet()
	if kt.s.State() != Suspended || isClosed(kt.s.Done()) {
		t.Fatalf("a nanosecond before the deadline: %v", kt.s.State())
	}
	kt.advance(1)
	kt.expect("+9.85s deadline", "+9.85s state Lost")
	ev := kt.expectEvent(Lost, ErrDeadlinePassed)
	if !errors.Is(ev.Err, ErrDeadlinePassed) || kt.s.Err() != ErrDeadlinePassed {
		t.Fatalf("Lost because %v", ev.Err)
	}
	if !isClosed(kt.s.Done()) || !isClosed(untrusted) {
		t.Fatal("Done or Untrusted still open after Lost")
	}
	if _, ok := <-kt.events; ok {
		t.Fatal("listener still open after Lost")
	}
	// Close destroys the session: the server may still have it.
	if err := kt.s.Close(testCtx(t)); err != nil || kt.stub.destroy.Load() != 1 {
		t.Fatalf("close: %v, %d destroys", err, kt.stub.destroy.Load())
	}
}

// TestKeeperReconnect: a good renew after Suspended reports Reconnected and
// moves the deadline to that renew's send time + TTL - margin.
func TestKeeperReconnect(t *testing.T) {
	kt := newKeeperTest(t, SessionOptions{TTL: 10 * time.Second})
	first := kt.s.Untrusted()

	kt.advance(5 * time.Second)
	kt.expect("+5s renew 1 sent")
	kt.stub.next().fail(500, "No cluster leader")
	kt.expect("+5s renew 1 failed: Unexpected response code: 500 (No cluster leader)", "+5s state Suspended")
	kt.expectEvent(Suspended, nil)
	if !isClosed(first) || !isClosed(kt.s.Untrusted()) {
		t.Fatal("LoseOnSuspended: Untrusted not closed at Suspended")
	}

	kt.advance(time.Second)
	kt.expect("+6s renew 2 sent")
	kt.stub.next().ok("10s")
	kt.expect("+6s renew 2 ok", "+6s state Reconnected")
	kt.expectEvent(Reconnected, nil)
	if got := kt.s.Deadline().Sub(epoch); got != 15850*ms {
		t.Fatalf("deadline at +%v, want +15.85s", got)
	}
	if isClosed(kt.s.Untrusted()) {
		t.Fatal("Untrusted after Reconnected is closed")
	}

	// Back to the rhythm: the next renew is 5s after the good one.
	kt.advance(5*time.Second - 1)
	kt.quiet()
	kt.advance(1)
	kt.expect("+11s renew 3 sent")
	kt.stub.next().ok("10s")
	kt.expect("+11s renew 3 ok")
	if kt.s.State() != Reconnected {
		t.Fatalf("state %v", kt.s.State())
	}
}

// TestKeeperCuratorDeadline: Curator's rule starts a timer of 33% or 100%
// of the TTL at Suspended. The renew timeout is 3s here, so that no two
// timers fall due at the same instant.
func TestKeeperCuratorDeadline(t *testing.T) {
	for _, percent := range []int{33, 100} {
		t.Run(CuratorDeadline(percent).String(), func(t *testing.T) {
			kt := newKeeperTest(t, SessionOptions{
				TTL: 10 * time.Second, RenewTimeout: 3 * time.Second, Deadline: CuratorDeadline(percent),
			})
			if !kt.s.Deadline().IsZero() {
				t.Fatalf("deadline armed while Connected: %v", kt.s.Deadline())
			}
			kt.advance(5 * time.Second)
			kt.expect("+5s renew 1 sent")
			kt.stub.next() // the server is stopped
			kt.advance(3*time.Second - 1)
			kt.quiet()
			kt.advance(1)
			// The keeper notices only now, and Curator's timer starts now.
			kt.expect("+8s renew 1 failed: recipe: renew unanswered within the renew timeout",
				"+8s state Suspended", "+8s renew 2 sent")
			kt.expectEvent(Suspended, nil)
			lostAt := 8*time.Second + time.Duration(percent)*100*ms
			if got := kt.s.Deadline().Sub(epoch); got != lostAt {
				t.Fatalf("deadline at +%v, want +%v", got, lostAt)
			}
			// Unanswered renews every 3s until the timer fires.
			now, n := 8*time.Second, 2
			for now+3*time.Second < lostAt {
				kt.stub.next()
				kt.advance(3 * time.Second)
				now += 3 * time.Second
				kt.expect(trace(now, "renew %d failed: recipe: renew unanswered within the renew timeout", n),
					trace(now, "renew %d sent", n+1))
				n++
			}
			kt.advance(lostAt - now - 1)
			kt.quiet()
			kt.advance(1)
			kt.expect(trace(lostAt, "deadline"), trace(lostAt, "state Lost"))
			kt.expectEvent(Lost, ErrDeadlinePassed)
		})
	}
}

func trace(at time.Duration, format string, args ...any) string {
	return "+" + at.String() + " " + fmt.Sprintf(format, args...)
}

// TestKeeperSessionGone: a 404 on renew is Lost at once, without Suspended.
func TestKeeperSessionGone(t *testing.T) {
	kt := newKeeperTest(t, SessionOptions{TTL: 10 * time.Second})
	kt.advance(5 * time.Second)
	kt.expect("+5s renew 1 sent")
	kt.stub.next().fail(404, "Session id '5e55104e' not found")
	kt.expect("+5s renew 1: session not found", "+5s state Lost")
	kt.expectEvent(Lost, ErrSessionExpired)
	if !isClosed(kt.s.Done()) || kt.s.Err() != ErrSessionExpired {
		t.Fatal("not done")
	}
	// Nothing to destroy.
	if err := kt.s.Close(testCtx(t)); err != nil || kt.stub.destroy.Load() != 0 {
		t.Fatalf("close: %v, %d destroys", err, kt.stub.destroy.Load())
	}
}

// TestKeeperServerLongerTTL: a server that answers a renew with a longer TTL
// is renewed at half of it, and the deadline follows.
func TestKeeperServerLongerTTL(t *testing.T) {
	kt := newKeeperTest(t, SessionOptions{TTL: 10 * time.Second})
	kt.advance(5 * time.Second)
	kt.expect("+5s renew 1 sent")
	kt.stub.next().ok("20s")
	kt.expect("+5s renew 1 ok")
	if kt.s.TTL() != 20*time.Second || kt.s.Deadline().Sub(epoch) != 5*time.Second+20*time.Second-150*ms {
		t.Fatalf("TTL %v deadline +%v", kt.s.TTL(), kt.s.Deadline().Sub(epoch))
	}
	kt.advance(10*time.Second - 1)
	kt.quiet()
	kt.advance(1)
	kt.expect("+15s renew 2 sent")
}

// TestKeeperListeners: a listener that never reads does not hold up the
// keeper or other listeners, and a late listener starts with the current
// state.
func TestKeeperListeners(t *testing.T) {
	kt := newKeeperTest(t, SessionOptions{TTL: 10 * time.Second})
	_ = kt.s.Listen(context.Background()) // never read
	kt.advance(5 * time.Second)
	kt.expect("+5s renew 1 sent")
	kt.stub.next().fail(500, "x")
	kt.expect("+5s renew 1 failed: Unexpected response code: 500 (x)", "+5s state Suspended")
	kt.expectEvent(Suspended, nil)

	late := kt.s.Listen(testCtx(t))
	if ev := <-late; ev.State != Suspended {
		t.Fatalf("late listener starts with %v", ev.State)
	}
	kt.advance(time.Second)
	kt.expect("+6s renew 2 sent")
	kt.stub.next().ok("10s")
	kt.expect("+6s renew 2 ok", "+6s state Reconnected")
	kt.expectEvent(Reconnected, nil)
	if ev := <-late; ev.State != Reconnected {
		t.Fatalf("late listener got %v", ev.State)
	}

	// A listener whose context ends is closed, and forgotten. Finding:
	// it stayed in the session's list, queueing every later event, for
	// as long as the session lived (200,000 cancelled Listens: 67 MB).
	kt.s.mu.Lock()
	before := len(kt.s.listeners)
	kt.s.mu.Unlock()
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		l := kt.s.Listen(ctx)
		<-l
		cancel()
		for range l {
		}
	}
	kt.s.mu.Lock()
	after := len(kt.s.listeners)
	kt.s.mu.Unlock()
	if after != before {
		t.Fatalf("%d listeners before three cancelled Listens, %d after", before, after)
	}

	// Close ends every listener, and destroys the session.
	if err := kt.s.Close(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	kt.expect("+6s closed")
	for range late {
	}
	if kt.stub.destroy.Load() != 1 || kt.s.Err() != ErrSessionClosed || !isClosed(kt.s.Done()) {
		t.Fatalf("after Close: %d destroys, err %v", kt.stub.destroy.Load(), kt.s.Err())
	}
}

func TestSessionOptionsChecked(t *testing.T) {
	c := newClient(t, "127.0.0.1:1")
	ctx := testCtx(t)
	for _, o := range []SessionOptions{
		{TTL: -time.Second},
		{TTL: 10 * time.Second, Deadline: SafeDeadline(5 * time.Second)},
		{TTL: 10 * time.Second, Deadline: SafeDeadline(-1)},
		{Deadline: CuratorDeadline(0)},
		{Policy: Policy(7)},
	} {
		if _, err := NewSession(ctx, c, &o); err == nil || errors.Is(err, context.Canceled) {
			t.Errorf("NewSession(%+v) = %v, want an error before any request", o, err)
		}
	}
	if _, err := NewSession(ctx, nil, nil); err == nil {
		t.Error("nil client accepted")
	}
	if _, err := NewSession(ctx, c, nil); err == nil {
		t.Error("create against nothing succeeded")
	}
}

// TestSafeDeadlineBeatsTheServer runs a keeper against a real server on the
// same fake clock, through a proxy that the test cuts: the safe deadline
// passes while the server still has the session, and the server frees it
// only later. Curator's 100% rule, by contrast, reports Lost after the
// server already let go.
func TestSafeDeadlineBeatsTheServer(t *testing.T) {
	srv := newServer(t)
	proxy := newCutProxy(t, srv.URL)
	for _, tc := range []struct {
		rule       Deadline
		lostBefore bool
	}{
		{Deadline{}, true},
		{CuratorDeadline(100), false},
	} {
		t.Run(tc.rule.String(), func(t *testing.T) {
			ctx := testCtx(t)
			proxy.set("")
			lines := make(chan string, 256)
			s, err := newSession(ctx, newClient(t, proxy.srv.Listener.Addr().String()), &SessionOptions{
				TTL: 10 * time.Second, Clock: srv.Clock, Deadline: tc.rule, LockDelay: -1,
			}, func(l string) { lines <- l })
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			events := s.Listen(ctx)
			<-events // Connected
			wait := func(want string) {
				t.Helper()
				for {
					select {
					case l := <-lines:
						if l == want {
							return
						}
					case <-time.After(bound):
						t.Fatalf("keeper never did %q", want)
					}
				}
			}
			sessionAlive := func() bool {
				se, _, err := srv.c.Session().Info(ctx, s.ID(), nil)
				if err != nil {
					t.Fatal(err)
				}
				return se != nil
			}

			t0 := srv.Clock.Now() // the session's creation
			srv.Clock.Advance(5 * time.Second)
			wait("+5s renew 1 ok")
			proxy.set("fail") // from now on the keeper cannot reach the server
			srv.Clock.Advance(5 * time.Second)
			s.sync()
			wait("+10s state Suspended")

			// The server expires the session at +15s (TTL after the renew it
			// received at +5s).
			serverExpiry := t0.Add(15 * time.Second)
			if tc.lostBefore {
				dl := s.Deadline()
				if !dl.Before(serverExpiry) {
					t.Fatalf("safe deadline +%v is not before the server's expiry", dl.Sub(t0))
				}
				srv.Clock.Set(dl.Add(-1))
				s.sync()
				if s.State() == Lost {
					t.Fatal("Lost before the deadline")
				}
				srv.Clock.Set(dl)
				s.sync()
				wait(trace(dl.Sub(t0), "state Lost"))
				if !sessionAlive() {
					t.Fatal("the server freed the session before the keeper reported Lost")
				}
				srv.Clock.Set(serverExpiry)
				waitSessionGone(t, srv, s.ID())
			} else {
				srv.Clock.Set(serverExpiry)
				waitSessionGone(t, srv, s.ID())
				if s.State() == Lost {
					t.Fatal("Curator 100% reported Lost no later than the server")
				}
				// ... and it reports it only at +10s + 10s.
				srv.Clock.Set(t0.Add(20 * time.Second))
				s.sync()
				wait("+20s state Lost")
			}
		})
	}
}

// waitSessionGone blocks (with blocking queries, not sleeps) until the
// server has invalidated the session.
func waitSessionGone(t testing.TB, srv *server, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var idx uint64
	for {
		se, qm, err := srv.c.Session().Info(ctx, id, &api.QueryOptions{WaitIndex: idx})
		if err != nil {
			t.Fatalf("waiting for session %s to go: %v", id, err)
		}
		if se == nil {
			return
		}
		idx = qm.LastIndex
	}
}
