package recipe

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/api"
)

// Audit of the client recipes: each test marked "Finding:" fails on the
// current code and names the expectation it breaks.

// raNet is a transport between one client and the server that the test can
// take down: while down every request is answered 500 ("No cluster
// leader") without reaching the server, as during an outage or a leader
// election.
type raNet struct {
	base http.RoundTripper
	down atomic.Bool
}

func raNewNet() *raNet {
	return &raNet{base: http.DefaultTransport.(*http.Transport).Clone()}
}

func (n *raNet) RoundTrip(r *http.Request) (*http.Response, error) {
	if n.down.Load() {
		if r.Body != nil {
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		return &http.Response{
			StatusCode: http.StatusInternalServerError, Status: "500 Internal Server Error",
			Header: http.Header{}, Body: io.NopCloser(strings.NewReader("No cluster leader")),
			Request: r, ProtoMajor: 1, ProtoMinor: 1,
		}, nil
	}
	return n.base.RoundTrip(r)
}

// raLines is a test hook that never blocks the Lock it traces.
type raLines chan string

func (c raLines) hook(l string) {
	select {
	case c <- l:
	default:
	}
}

func (c raLines) waitPrefix(t testing.TB, prefix string) {
	t.Helper()
	timeout := time.After(bound)
	for {
		select {
		case l := <-c:
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-timeout:
			t.Fatalf("the lock never traced %q", prefix)
		}
	}
}

// Finding: Hold.Unlock marks the hold given up (giveUp) before it talks to
// the server, so an Unlock that fails (server unreachable, ctx expired)
// can never be retried: the second call says ErrLockNotHeld, and the key
// and the queue entry stay held by the live session. The next waiter waits
// until that session ends, possibly forever. This is the normal path under
// LoseOnSuspended (the hold is lost because the server cannot be reached,
// and the Unlock that docs/sessions.md says "every hold must still" make
// then fails for the same reason). Breaks docs/sessions.md "Which policy"
// (holds must be given up with Unlock after they were lost) and the
// expectation that no waiter is stuck forever.
func TestAuditRecipeUnlockFailureCannotBeRetried(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	n := raNewNet()
	a := faultSession(t, srv, n, SessionOptions{})
	la := mustLock(t, a, "k", nil)
	h, err := la.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := lockSession(t, srv, nil)
	lines := make(raLines, 64)
	got := make(chan error, 1)
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	go func() {
		lb, err := NewLock(b, "k", nil)
		if err != nil {
			got <- err
			return
		}
		lb.hook = lines.hook
		_, err = lb.Lock(bctx)
		got <- err
	}()
	lines.waitPrefix(t, "next after")

	n.down.Store(true)
	if err := h.Unlock(ctx); err == nil {
		t.Fatal("Unlock succeeded with the server unreachable")
	}
	n.down.Store(false)
	// The server is back: giving the hold up again must work.
	err1 := h.Unlock(ctx)
	err2 := la.Unlock(ctx)
	p, _, err := srv.c.KV().Get(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p != nil && p.Session == a.ID() {
		t.Fatalf("after a failed Unlock the hold cannot be given up: Hold.Unlock=%v, Lock.Unlock=%v; "+
			"the key stays locked by the live session %s and the waiter behind it is stuck", err1, err2, a.ID()[:8])
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(bound):
		t.Fatal("the waiter never got the lock")
	}
}

// Finding: Permit.Release has the same flaw as Hold.Unlock: it gives the
// permit up locally first, and a Release whose request fails (server
// unreachable, the very situation in which LoseOnSuspended loses permits)
// cannot be repeated (ErrSemaphoreNotHeld), while .lock still lists the
// session and its contender entry stays. The slot is gone for as long as
// the session lives. Breaks "permits released on Release" and docs/
// sessions.md (every hold must be given up with Release after loss).
func TestAuditRecipeReleaseFailureCannotBeRetried(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	n := raNewNet()
	a := faultSession(t, srv, n, SessionOptions{Behavior: api.SessionBehaviorDelete})
	sa := mustSemaphore(t, a, "p", 1)
	p, err := sa.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n.down.Store(true)
	if err := p.Release(ctx); err == nil {
		t.Fatal("Release succeeded with the server unreachable")
	}
	n.down.Store(false)
	err1 := p.Release(ctx)
	err2 := sa.Release(ctx)
	b := semSession(t, srv)
	pb, err := mustSemaphore(t, b, "p", 1).TryAcquire(ctx)
	if err != nil {
		t.Fatalf("after a failed Release the permit cannot be given up: Permit.Release=%v, Semaphore.Release=%v; "+
			".lock holders %v; another contender gets %v", err1, err2, holders(t, srv, "p"), err)
	}
	pb.Release(ctx)
}

// Finding: Permit.watch treats every error of its read as transient and
// retries forever. A .lock whose Limit differs from the local one (a
// contender with another limit, an operator's edit), whose Flags changed,
// or whose value does not decode, makes read fail before the Holders are
// looked at, so a permit whose holder entry was removed from .lock is
// never reported lost. Here .lock is rewritten with Limit 3 and no
// holders; three contenders that use Limit 3 get permits, and the
// Limit-2 holder still believes it holds: four holders. Breaks the Permit
// doc ("Lost ... closed the moment ... the session's holder entry left
// .lock (... removed by someone)") and "never more than Limit holders,
// including when contenders disagree on Limit".
func TestAuditRecipePermitLostWhenLockRewrittenWithOtherLimit(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	a := semSession(t, srv)
	pa, err := mustSemaphore(t, a, "p", 2).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.c.KV().Put(ctx, &api.KVPair{
		Key: "p/.lock", Flags: SemaphoreFlagValue, Value: []byte(`{"Limit":3,"Holders":{}}`),
	}, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		s := semSession(t, srv)
		if _, err := mustSemaphore(t, s, "p", 3).TryAcquire(ctx); err != nil {
			t.Fatalf("contender %d with Limit 3: %v", i, err)
		}
	}
	if h := holders(t, srv, "p"); h[a.ID()] || len(h) != 3 {
		t.Fatalf("holders %v", h)
	}
	// Give the watcher every chance: move the clock past its backoffs.
	for i := 0; i < 20; i++ {
		select {
		case <-pa.Lost():
			return
		case <-time.After(50 * time.Millisecond):
		}
		srv.Clock.Advance(time.Second)
	}
	t.Fatalf("the permit is no longer in .lock but Lost never closed (Err %v): 4 holders of a semaphore", pa.Err())
}

// TestAuditRecipeFairQueueUnderChurn (confirms): five waiters queue in
// order behind a holder; one cancels, one's session is destroyed while it
// waits, the holder's session is destroyed. The live waiters get the lock
// in arrival order, nobody is skipped, and nobody is stuck.
func TestAuditRecipeFairQueueUnderChurn(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	h := lockSession(t, srv, nil)
	if _, err := mustLock(t, h, "k", nil).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	type res struct {
		i    int
		hold *Hold
		err  error
	}
	results := make(chan res, 8)
	var sess [5]*Session
	var cancels [5]context.CancelFunc
	for i := range sess {
		sess[i] = lockSession(t, srv, nil)
		lines := make(raLines, 64)
		wctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		defer cancel()
		l := mustLock(t, sess[i], "k", lines.hook)
		go func(i int) {
			hd, err := l.Lock(wctx)
			results <- res{i, hd, err}
		}(i)
		// Wait until it has joined and sleeps (its first wait step).
		timeout := time.After(bound)
	joined:
		for {
			select {
			case ln := <-lines:
				if strings.HasPrefix(ln, "next after") || strings.HasPrefix(ln, "wait for") {
					break joined
				}
			case <-timeout:
				t.Fatalf("waiter %d never queued", i)
			}
		}
	}
	cancels[1]()
	if r := <-results; r.i != 1 || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter: %d %v", r.i, r.err)
	}
	if _, err := srv.c.Session().Destroy(ctx, sess[3].ID(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.c.Session().Destroy(ctx, h.ID(), nil); err != nil {
		t.Fatal(err)
	}
	next := func() res {
		t.Helper()
		for {
			select {
			case r := <-results:
				if r.i == 3 {
					continue // its session is gone; whatever it says
				}
				return r
			case <-time.After(bound):
				t.Fatal("nobody got the lock")
				return res{}
			}
		}
	}
	for _, want := range []int{0, 2, 4} {
		r := next()
		if r.err != nil || r.i != want {
			t.Fatalf("got waiter %d (%v), want waiter %d", r.i, r.err, want)
		}
		if err := r.hold.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Finding: a consequence of the unretryable Unlock: the key stays locked
// by the session, so the next Lock of the same Lock "adopts" it and hands
// out a new Hold with the very sequencer of the hold that was lost and
// given up. A writer still acting under the old hold passes the fence
// (api.KV.Fence says Valid), against docs/sessions.md ("Holds taken after
// Reconnected are new holds"; fence with the sequencer so a stale holder's
// writes are refused) and the sequencer being current only while its hold
// is held. Fix with the retryable Unlock above, or have Lock re-acquire
// (release with the old LockIndex first) instead of adopting a key the
// Lock no longer tracks.
func TestAuditRecipeRelockAfterFailedUnlockReusesSequencer(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	n := raNewNet()
	a := faultSession(t, srv, n, SessionOptions{})
	la := mustLock(t, a, "k", nil)
	h1, err := la.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n.down.Store(true)
	if err := h1.Unlock(ctx); err == nil {
		t.Fatal("Unlock succeeded with the server unreachable")
	}
	n.down.Store(false)
	if !isClosed(h1.Lost()) {
		t.Fatal("the given-up hold is not Lost")
	}
	// Fixed: until the Unlock has reached the server the hold stays the
	// Lock's current one, so Lock cannot adopt its key under the same
	// sequencer; the retried Unlock frees it, and the next hold is new.
	if _, err := la.Lock(ctx); !errors.Is(err, ErrLockHeld) {
		t.Fatalf("Lock after a failed Unlock: %v, want ErrLockHeld", err)
	}
	if err := h1.Unlock(ctx); err != nil {
		t.Fatalf("retried Unlock: %v", err)
	}
	h2, err := la.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Unlock(ctx)
	fs, _, err := srv.c.KV().Fence(ctx, h1.Sequencer(), &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if h2.Sequencer() == h1.Sequencer() || fs.Valid {
		t.Fatalf("new hold %v, old (given up) hold %v; the old sequencer still fences valid: %v",
			h2.Sequencer(), h1.Sequencer(), fs.Valid)
	}
}
