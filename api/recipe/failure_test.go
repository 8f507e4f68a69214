package recipe

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	capi "github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/api"
)

// Unhappy paths of the recipes: a caller that gives up just as its write
// is applied, a server that stops answering renews, holders that die, late
// requests. Each test names the path it covers. These failed before the
// fixes in lock.go and semaphore.go that came with them:
// LockCancelledWhileJoining, TryLockCancelledWhileTaking,
// SemaphoreCancelledWhileContending, HandOffAfterReconnected and
// LateQueueCleanupOfALostHold (and SemaphoreDeadHolderPruned/release in
// semaphore_test.go). The others cover paths no other test covered.

// faultTransport sits between a client and the server. It can
//   - let one chosen request through to the server and then throw its
//     answer away, cancelling the caller's context: a caller that gives up
//     just as its write is applied (arm);
//   - answer session renews with a 500 without passing them on (failRenews);
//   - count the blocking reads in flight (parked), so that a test knows
//     when the client is asleep on one.
type faultTransport struct {
	base http.RoundTripper

	mu      sync.Mutex
	match   func(*http.Request) bool
	cancel  context.CancelFunc
	failing bool
	down    bool // every request fails (500), not only renewals
	parked  int
	changed chan struct{}

	holdMatch func(*http.Request) bool
	held      *http.Request // a request kept "on the wire" (holdNext)
	heldCh    chan struct{} // closed once it is kept
}

func newFaultTransport() *faultTransport {
	return &faultTransport{base: http.DefaultTransport.(*http.Transport).Clone(), changed: make(chan struct{})}
}

// arm makes the next request that match accepts be applied and its answer
// lost; cancel is called before the loss is reported.
func (a *faultTransport) arm(match func(*http.Request) bool, cancel context.CancelFunc) {
	a.mu.Lock()
	a.match, a.cancel = match, cancel
	a.mu.Unlock()
}

// holdNext keeps the next request that match accepts on the wire: the
// client, once it gives up, is told so, and the server gets the request
// only when the test calls deliver. That is a request the client
// cancelled but could not take back.
func (a *faultTransport) holdNext(match func(*http.Request) bool) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.holdMatch, a.heldCh = match, make(chan struct{})
	return a.heldCh
}

// deliver hands the request kept by holdNext to the server, late.
func (a *faultTransport) deliver(t testing.TB) {
	t.Helper()
	a.mu.Lock()
	r := a.held
	a.held = nil
	a.mu.Unlock()
	if r == nil {
		t.Fatal("no request on the wire")
	}
	resp, err := a.base.RoundTrip(r)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

func (a *faultTransport) failRenews(on bool) {
	a.mu.Lock()
	a.failing = on
	a.mu.Unlock()
}

// setDown makes every request fail with a 500, or lets them through again.
func (a *faultTransport) setDown(on bool) {
	a.mu.Lock()
	a.down = on
	a.mu.Unlock()
}

func (a *faultTransport) update(f func()) {
	a.mu.Lock()
	f()
	close(a.changed)
	a.changed = make(chan struct{})
	a.mu.Unlock()
}

func (a *faultTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	a.mu.Lock()
	var cancel context.CancelFunc
	if a.match != nil && a.match(r) {
		cancel = a.cancel
		a.match, a.cancel = nil, nil
	}
	failing := (a.failing && strings.HasPrefix(r.URL.Path, "/v1/session/renew/")) || a.down
	if a.holdMatch != nil && a.holdMatch(r) {
		a.holdMatch = nil
		a.held = r.Clone(context.Background())
		close(a.heldCh)
		a.mu.Unlock()
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	a.mu.Unlock()
	if failing {
		return &http.Response{
			StatusCode: http.StatusInternalServerError, Status: "500 Internal Server Error",
			Header: http.Header{}, Body: io.NopCloser(strings.NewReader("No cluster leader")),
			Request: r, ProtoMajor: 1, ProtoMinor: 1,
		}, nil
	}
	blocking := r.URL.Query().Get("index") != "" && r.URL.Query().Get("index") != "0"
	if blocking {
		a.update(func() { a.parked++ })
		defer a.update(func() { a.parked-- })
	}
	resp, err := a.base.RoundTrip(r)
	if cancel == nil || err != nil {
		return resp, err
	}
	// The server has applied the request; its answer is lost.
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	cancel()
	return nil, context.Canceled
}

// waitParkedOrClosed waits until the client has a blocking read in flight,
// or ch is closed, whichever comes first.
func (a *faultTransport) waitParkedOrClosed(t testing.TB, ch <-chan struct{}) {
	t.Helper()
	timeout := time.After(bound)
	for {
		a.mu.Lock()
		parked, changed := a.parked, a.changed
		a.mu.Unlock()
		if parked > 0 {
			return
		}
		select {
		case <-changed:
		case <-ch:
			return
		case <-timeout:
			t.Fatal("the client never parked on a blocking read")
		}
	}
}

// faultSession is a session on srv's clock whose client goes through rt
// (a *faultTransport, or another transport a test controls).
func faultSession(t testing.TB, srv *server, rt http.RoundTripper, o SessionOptions) *Session {
	t.Helper()
	c, err := api.NewClient(&api.Config{Address: srv.Addr, HTTPClient: &http.Client{Transport: rt}})
	if err != nil {
		t.Fatal(err)
	}
	if o.TTL == 0 {
		o.TTL = time.Hour
	}
	if o.LockDelay == 0 {
		o.LockDelay = -1
	}
	o.Clock = srv.Clock
	s, err := NewSession(testCtx(t), c, &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func isTxn(r *http.Request) bool { return r.Method == http.MethodPut && r.URL.Path == "/v1/txn" }

// TestLockCancelledWhileJoining: a Lock whose context ends while its
// join of the queue is in flight, but after the server applied it, must
// not leave its entry behind. Otherwise the entry, owned by a live
// session, stays in the queue: the holder's Unlock hands the key to a
// session that no longer waits, and the lock is stuck until that session
// ends.
func TestLockCancelledWhileJoining(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	holder := lockSession(t, srv, nil)
	h, err := mustLock(t, holder, "k", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	tr := newFaultTransport()
	quitter := faultSession(t, srv, tr, SessionOptions{})
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tr.arm(isTxn, cancel)
	if _, err := mustLock(t, quitter, "k", nil).Lock(qctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock cancelled while joining: %v", err)
	}
	keys, _, err := srv.c.KV().Keys(ctx, "k/"+QueueDir+"/", "", nil)
	if err != nil || len(keys) != 1 || !strings.HasSuffix(keys[0], holder.ID()) {
		t.Errorf("queue after the cancelled Lock: %v %v (want only the holder's entry)", keys, err)
	}

	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	p, _, err := srv.c.KV().Get(ctx, "k", nil)
	if err != nil || p == nil || p.Session != "" {
		t.Fatalf("key after the holder's Unlock: %+v %v (want it free, not handed to the session that gave up)", p, err)
	}
}

// TestLockGivenUpWhileUnreachable: a waiter whose Lock gives up while it
// cannot reach the server cannot delete its queue entry then. Finding: the
// entry stayed, owned by a live session; once the server was reachable
// again the holder's Unlock handed the key to it, and the lock stayed with
// a session that no longer waited, holding up the waiter behind it for as
// long as that session lived. The entry is now taken back in the
// background as soon as the server answers.
func TestLockGivenUpWhileUnreachable(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	h, tr, quitter, _ := giveUpWhileDown(t, ctx, srv)
	qkey := "k/" + QueueDir + "/" + quitter.ID()
	if p, _, err := srv.c.KV().Get(ctx, qkey, nil); err != nil || p == nil {
		t.Fatalf("the quitter's entry is not left behind (%v %v): the test cut nothing", p, err)
	}

	// The server answers again; the cleanup's first retry is due 250ms
	// after it gave up.
	tr.setDown(false)
	advanceToRetry(t, ctx, srv)
	waitGone(t, ctx, srv, qkey)
	// The holder's Unlock frees the key instead of handing it to the
	// session that gave up, and the next waiter can take it.
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _, err := srv.c.KV().Get(ctx, "k", nil); err != nil || p == nil || p.Session != "" {
		t.Fatalf("key after the holder's Unlock: %+v %v (want it free)", p, err)
	}
	if _, err := mustLock(t, lockSession(t, srv, nil), "k", nil).TryLock(ctx); err != nil {
		t.Fatalf("TryLock by the next session: %v", err)
	}
}

// Review finding: a Lock call after one that gave up adopted the key a
// hand-off had given to the entry left behind, under that hand-off's
// LockIndex, and a cleanup request of the call that gave up, timed out but
// still on its way, would then free the new hold (its release names that
// LockIndex): another session could take the lock while this one still
// held it. The new call now takes the key back first, and holds it under
// a LockIndex of its own.
func TestLockAfterGivingUpDoesNotAdopt(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	h, tr, quitter, ql := giveUpWhileDown(t, ctx, srv)
	tr.setDown(false)
	// Before any retry of the cleanup, the holder hands the key to the
	// entry left behind.
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	p, _, err := srv.c.KV().Get(ctx, "k", nil)
	if err != nil || p == nil || p.Session != quitter.ID() {
		t.Fatalf("key after the holder's Unlock: %+v %v (want it handed to the entry left behind)", p, err)
	}
	handed := p.LockIndex
	nh, err := ql.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if seq := nh.Sequencer(); seq.LockIndex == handed {
		t.Fatalf("the new hold has the hand-off's LockIndex %d: a late release of the call that gave up would free it", handed)
	}
	if err := nh.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// giveUpWhileDown: a holder takes "k"; a second session, through a fault
// transport, waits for it with a Lock call, which gives up (its context
// cancelled) while every request fails. It returns the holder's hold, the
// transport (still down), the session that gave up and its Lock.
func giveUpWhileDown(t *testing.T, ctx context.Context, srv *server) (*Hold, *faultTransport, *Session, *Lock) {
	t.Helper()
	h, err := mustLock(t, lockSession(t, srv, nil), "k", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tr := newFaultTransport()
	quitter := faultSession(t, srv, tr, SessionOptions{})
	ql := mustLock(t, quitter, "k", nil)
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := ql.Lock(qctx)
		done <- err
	}()
	tr.waitParkedOrClosed(t, nil)
	tr.setDown(true)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock given up: %v", err)
	}
	return h, tr, quitter, ql
}

// advanceToRetry waits for a background cleanup's first retry to be due
// on srv's clock, and moves the clock to it.
func advanceToRetry(t *testing.T, ctx context.Context, srv *server) {
	t.Helper()
	due := func(now time.Time, due []time.Time) bool {
		return slices.Contains(due, now.Add(backoff(1)))
	}
	if err := srv.Clock.BlockUntil(ctx, due); err != nil {
		t.Fatal(err)
	}
	srv.Clock.Advance(backoff(1))
}

// waitGone waits (a blocking read, bounded by ctx) until key is gone.
func waitGone(t *testing.T, ctx context.Context, srv *server, key string) {
	t.Helper()
	var idx uint64
	for {
		p, qm, err := srv.c.KV().Get(ctx, key, &api.QueryOptions{WaitIndex: idx})
		if err != nil {
			t.Fatalf("waiting for %s to go: %v", key, err)
		}
		if p == nil {
			return
		}
		idx = qm.LastIndex
	}
}

// TestSemaphoreGivenUpWhileUnreachable: an Acquire whose slot was written
// but whose answer was lost, and which then cannot reach the server to
// delete its contender entry, must not keep the slot. Finding: the entry
// stayed, owned by a live session, so the session counted as a holder
// with no Permit to release, for as long as it lived.
func TestSemaphoreGivenUpWhileUnreachable(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	const prefix = "one/slot"
	tr := newFaultTransport()
	quitter := faultSession(t, srv, tr, SessionOptions{Behavior: api.SessionBehaviorDelete})
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tr.arm(isTxn, func() { tr.setDown(true); cancel() })
	if _, err := mustSemaphore(t, quitter, prefix, 1).Acquire(qctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire given up: %v", err)
	}
	if h := holders(t, srv, prefix); !h[quitter.ID()] {
		t.Fatalf("holders %v: the slot's write did not go through, the test cut nothing", h)
	}
	tr.setDown(false)
	advanceToRetry(t, ctx, srv)
	waitGone(t, ctx, srv, prefix+"/"+quitter.ID())
	if _, err := mustSemaphore(t, semSession(t, srv), prefix, 1).TryAcquire(ctx); err != nil {
		t.Fatalf("TryAcquire of the slot the quitter gave up: %v", err)
	}
}

// TestTryLockCancelledWhileTaking: a TryLock whose context ends while
// its acquire is in flight, but after the server applied it, must not leave
// the key held by its session with no Hold to Unlock.
func TestTryLockCancelledWhileTaking(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	tr := newFaultTransport()
	s := faultSession(t, srv, tr, SessionOptions{})
	l := mustLock(t, s, "k", nil)
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tr.arm(isTxn, cancel)
	if _, err := l.TryLock(tctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("TryLock cancelled while taking: %v", err)
	}
	p, _, err := srv.c.KV().Get(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p != nil && p.Session != "" {
		t.Fatalf("key after the cancelled TryLock: held by %s (ours: %s), and nobody will unlock it", p.Session, s.ID())
	}
	// Another session can take it at once.
	if _, err := mustLock(t, lockSession(t, srv, nil), "k", nil).TryLock(ctx); err != nil {
		t.Fatalf("TryLock by another session: %v", err)
	}
}

// TestSemaphoreCancelledWhileContending: an Acquire whose context ends
// while the write of its contender entry is in flight, but after the server
// applied it, must not leave the entry behind.
func TestSemaphoreCancelledWhileContending(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	tr := newFaultTransport()
	s := faultSession(t, srv, tr, SessionOptions{Behavior: api.SessionBehaviorDelete})
	sem := mustSemaphore(t, s, "p", 1)
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	tr.arm(func(r *http.Request) bool {
		return r.Method == http.MethodPut && r.URL.Path == "/v1/kv/p/"+s.ID()
	}, cancel)
	if _, err := sem.Acquire(actx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire cancelled while contending: %v", err)
	}
	if p, _, err := srv.c.KV().Get(ctx, "p/"+s.ID(), nil); err != nil || p != nil {
		t.Fatalf("contender entry after the cancelled Acquire: %+v %v", p, err)
	}
}

// TestHandOffAfterReconnected: under LoseOnSuspended a hold is lost at
// the first Suspended after it was taken, and "holds taken after
// Reconnected are new holds" (docs/sessions.md). A waiter whose session
// was Suspended and then Reconnected while it waited, and which is handed
// the lock only afterwards, must get a hold that is not lost already.
func TestHandOffAfterReconnected(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	holder := lockSession(t, srv, nil)
	ha, err := mustLock(t, holder, "k", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	tr := newFaultTransport()
	w := faultSession(t, srv, tr, SessionOptions{TTL: 10 * time.Second})
	events := w.Listen(ctx)
	if ev := <-events; ev.State != Connected {
		t.Fatalf("event %v", ev.State)
	}
	lines := collectLines(t)
	got := make(chan *Hold, 1)
	go func() {
		h, err := mustLock(t, w, "k", lines.hook).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	lines.expect("next after " + holder.ID())
	tr.waitParkedOrClosed(t, nil) // asleep on the key

	// One renew fails (a leader election, say), the retry succeeds.
	tr.failRenews(true)
	srv.Clock.Advance(5 * time.Second)
	if ev := <-events; ev.State != Suspended {
		t.Fatalf("event %v", ev.State)
	}
	tr.failRenews(false)
	srv.Clock.Advance(time.Second)
	if ev := <-events; ev.State != Reconnected {
		t.Fatalf("event %v", ev.State)
	}

	// Only now is the lock handed over.
	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var h *Hold
	select {
	case h = <-got:
	case <-time.After(bound):
		t.Fatal("the waiter was not handed the lock")
	}
	defer h.Unlock(ctx)
	lines.expect("handed 2")
	// Wait until the hold's monitor is asleep on the key (or the hold is
	// lost), then look.
	tr.waitParkedOrClosed(t, h.Lost())
	if isClosed(h.Lost()) {
		t.Fatalf("a hold handed over after Reconnected is lost at once (%v)", h.Err())
	}
}

// TestConsulLockHolderDies: Consul's api.Lock holds, a holdfast Lock
// waits at the head of the queue, and the Consul holder's session is
// invalidated. Consul's lock channel closes, and the holdfast waiter waits
// out exactly the lock-delay Consul's client asked for by default (15s),
// on the clock, then takes the lock.
func TestConsulLockHolderDies(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	cl, err := consulClient(t, srv).LockOpts(&capi.LockOptions{Key: "svc/leader", Value: []byte("consul")})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := cl.Lock(nil)
	if err != nil || lost == nil {
		t.Fatalf("Consul Lock: %v", err)
	}
	p, _, err := srv.c.KV().Get(ctx, "svc/leader", nil)
	if err != nil || p == nil || p.Session == "" {
		t.Fatalf("key held by Consul: %+v %v", p, err)
	}
	consulSession := p.Session

	lines := collectLines(t)
	got := make(chan *Hold, 1)
	go func() {
		h, err := mustLock(t, lockSession(t, srv, nil), "svc/leader", lines.hook).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	lines.expect("head")
	lines.expect("held by " + consulSession)

	if _, err := srv.c.Session().Destroy(ctx, consulSession, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(bound):
		t.Fatal("Consul's lock channel stayed open after its session was invalidated")
	}
	lines.expect("lock-delay 15s")
	srv.Clock.Advance(15*time.Second - 1)
	select {
	case <-got:
		t.Fatal("the waiter took the lock inside the lock-delay")
	default:
	}
	srv.Clock.Advance(1)
	lines.expect("head")
	lines.expect("acquired 2")
	h := <-got
	if st, _, err := srv.c.KV().Fence(ctx, h.Sequencer(), nil); err != nil || !st.Valid {
		t.Fatalf("the new hold's sequencer: %+v %v", st, err)
	}
	if err := cl.Unlock(); err != nil {
		t.Fatalf("Consul's Unlock after the loss: %v", err)
	}
	if st, _, _ := srv.c.KV().Fence(ctx, h.Sequencer(), nil); !st.Valid {
		t.Fatal("Consul's late Unlock freed the new hold")
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestConsulSemaphoreHolderVanishes: a Consul semaphore holder whose
// session is invalidated learns it (its channel closes), its contender
// entry goes (Behavior "delete"), and a waiting Consul contender takes the
// slot after pruning it, never exceeding the limit.
func TestConsulSemaphoreHolderVanishes(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	cc := consulClient(t, srv)
	const prefix = "svc/slots"
	newSem := func() *capi.Semaphore {
		s, err := cc.SemaphoreOpts(&capi.SemaphoreOptions{Prefix: prefix, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first, second := newSem(), newSem()
	lost, err := first.Acquire(nil)
	if err != nil || lost == nil {
		t.Fatalf("first: %v", err)
	}
	h := holders(t, srv, prefix)
	if len(h) != 1 {
		t.Fatalf("holders %v", h)
	}
	var dead string
	for s := range h {
		dead = s
	}

	stop := make(chan struct{})
	defer close(stop)
	got := acquireAsync(second.Acquire, stop)
	// A holdfast contender agrees that the semaphore is full.
	if _, err := mustSemaphore(t, semSession(t, srv), prefix, 1).TryAcquire(ctx); err != ErrSemaphoreFull {
		t.Fatalf("TryAcquire while Consul holds: %v", err)
	}

	if _, err := srv.c.Session().Destroy(ctx, dead, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(bound):
		t.Fatal("the vanished holder's channel stayed open")
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(bound):
		t.Fatal("the waiting contender never took the slot")
	}
	if h := holders(t, srv, prefix); len(h) != 1 || h[dead] {
		t.Fatalf("holders after the hand-over: %v (dead: %s)", h, dead)
	}
	if p, _, err := srv.c.KV().Get(ctx, prefix+"/"+dead, nil); err != nil || p != nil {
		t.Fatalf("the dead holder's contender entry: %+v %v", p, err)
	}
	if err := first.Release(); err != nil {
		t.Fatalf("Release after the loss: %v", err)
	}
	if err := second.Release(); err != nil {
		t.Fatal(err)
	}
}

// recipeGoroutines returns the goroutines, other than those in before,
// that run code of this package outside its tests.
func recipeGoroutines(before map[string]bool) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		head, _, _ := strings.Cut(string(g), " [")
		if before != nil && before[head] {
			continue
		}
		for _, line := range strings.Split(string(g), "\n") {
			if strings.Contains(line, "/api/recipe/") && strings.Contains(line, ".go:") && !strings.Contains(line, "_test.go:") {
				out = append(out, string(g))
				break
			}
		}
	}
	return out
}

func goroutineIDs() map[string]bool {
	ids := map[string]bool{}
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	for _, g := range bytes.Split(buf[:n], []byte("\n\n")) {
		head, _, _ := strings.Cut(string(g), " [")
		ids[head] = true
	}
	return ids
}

// TestNoGoroutinesLeft: after holds are given up (also holds that were
// lost first), observers cancelled and sessions closed, none of the
// recipes' goroutines is left running.
func TestNoGoroutinesLeft(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	before := goroutineIDs()

	a, b := lockSession(t, srv, nil), lockSession(t, srv, &SessionOptions{Behavior: api.SessionBehaviorDelete})
	lctx, cancelListen := context.WithCancel(ctx)
	for range a.Listen(lctx) {
		break
	}

	// A hold lost to an operator's release, then unlocked.
	h, err := mustLock(t, a, "k", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := srv.c.KV().Release(ctx, &api.KVPair{Key: "k", Session: a.ID(), Flags: LockFlagValue}, nil); err != nil {
		t.Fatal(err)
	}
	<-h.Lost()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// A waiter that gives up.
	h2, err := mustLock(t, a, "k", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancelWait := context.WithCancel(ctx)
	lines := collectLines(t)
	errc := make(chan error, 1)
	go func() {
		_, err := mustLock(t, b, "k", lines.hook).Lock(wctx)
		errc <- err
	}()
	lines.expect("next after " + a.ID())
	cancelWait()
	<-errc
	if err := h2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// A permit, released.
	p, err := mustSemaphore(t, b, "s", 1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A term observed, then resigned; a hold never given up before the
	// session closes.
	octx, cancelObserve := context.WithCancel(ctx)
	obs := mustElection(t, b, "e").Observe(octx)
	<-obs
	lead, err := mustElection(t, a, "e").Campaign(ctx, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	<-obs
	if err := lead.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	cancelObserve()
	for range obs {
	}
	if _, err := mustLock(t, b, "k2", nil).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	cancelListen()
	for _, s := range []*Session{a, b} {
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}

	deadline := time.Now().Add(bound)
	for {
		left := recipeGoroutines(before)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left, the first:\n%s", len(left), left[0])
		}
		runtime.Gosched()
	}
}

// TestSemaphoreCancelWhileWaiting: an Acquire cancelled while it
// waits for a slot returns the context's error and leaves no contender
// entry and no holder behind.
func TestSemaphoreCancelWhileWaiting(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	holder, waiter := semSession(t, srv), semSession(t, srv)
	p, err := mustSemaphore(t, holder, "p", 1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := mustSemaphore(t, waiter, "p", 1).Acquire(wctx)
		errc <- err
	}()
	// Wait until the waiter's contender entry is there: it is waiting.
	var idx uint64
	for {
		e, qm, err := srv.c.KV().Get(ctx, "p/"+waiter.ID(), &api.QueryOptions{WaitIndex: idx})
		if err != nil {
			t.Fatal(err)
		}
		if e != nil {
			break
		}
		idx = qm.LastIndex
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	if e, _, err := srv.c.KV().Get(ctx, "p/"+waiter.ID(), nil); err != nil || e != nil {
		t.Fatalf("contender entry after the cancelled Acquire: %+v %v", e, err)
	}
	if h := holders(t, srv, "p"); len(h) != 1 || !h[holder.ID()] {
		t.Fatalf("holders %v", h)
	}
	if isClosed(p.Lost()) {
		t.Fatal("the holder's permit was lost")
	}
	p.Release(ctx)
}

// TestLateQueueCleanupOfALostHold: a hold lost because its key
// changed hands deletes its queue entry from its monitor, and Unlock stops
// the monitor by cancelling that request. A cancelled request may still
// reach the server afterwards, and the entry's key is the same for every
// Lock of the session on that key: the late delete must not remove the
// entry of the session's next Lock, or the waiter behind it loses its
// place in the queue (and a hand-off misses it).
func TestLateQueueCleanupOfALostHold(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	tr := newFaultTransport()
	a := faultSession(t, srv, tr, SessionOptions{})
	qkey := "k/" + QueueDir + "/" + a.ID()
	h, err := mustLock(t, a, "k", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	onWire := tr.holdNext(func(r *http.Request) bool {
		return r.Method == http.MethodDelete && r.URL.Path == "/v1/kv/"+qkey
	})
	// An operator frees the key: the hold is lost, and its monitor sends
	// the delete of its queue entry, which stays on the wire.
	if ok, _, err := srv.c.KV().Release(ctx, &api.KVPair{Key: "k", Session: a.ID(), Flags: LockFlagValue}, nil); err != nil || !ok {
		t.Fatalf("operator release: %v %v", ok, err)
	}
	<-h.Lost()
	select {
	case <-onWire:
	case <-time.After(bound):
		t.Fatal("the lost hold's monitor did not clean up its queue entry")
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The session takes the lock again, and another waits behind it.
	h2, err := mustLock(t, a, "k", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Unlock(ctx)
	// Now the old delete lands.
	tr.deliver(t)
	if e, _, err := srv.c.KV().Get(ctx, qkey, nil); err != nil || e == nil || e.Session != a.ID() {
		t.Fatalf("the new hold's queue entry after the old hold's late clean-up: %+v %v", e, err)
	}
	lines := collectLines(t)
	bl := mustLock(t, lockSession(t, srv, nil), "k", lines.hook)
	bctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := bl.Lock(bctx)
		errc <- err
	}()
	lines.expect("next after " + a.ID())
	cancel()
	<-errc
}

// TestElectionResignFailedKeepsTerm: a Resign the server never got must
// not let the next Campaign begin under the old term's sequencer.
// Finding: the failed Resign cleared the Election's term, the next
// Campaign made a new Lock that adopted the key the session still held,
// and the "new" term had the old term's LockIndex: a fencing check could
// not tell the two apart, and a retried Resign of the old term ended the
// new one.
func TestElectionResignFailedKeepsTerm(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	tr := newFaultTransport()
	s := faultSession(t, srv, tr, SessionOptions{})
	e := mustElection(t, s, "svc/leader")
	first, err := e.Campaign(ctx, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	tr.setDown(true)
	if err := first.Resign(ctx); err == nil {
		t.Fatal("Resign succeeded with the server unreachable")
	}
	tr.setDown(false)
	if _, err := e.Campaign(ctx, []byte("b")); err != ErrAlreadyLeader {
		t.Fatalf("Campaign after a failed Resign: %v; want ErrAlreadyLeader until a Resign succeeds", err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatalf("Resign retried: %v", err)
	}
	second, err := e.Campaign(ctx, []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := first.Sequencer(), second.Sequencer(); a.LockIndex == b.LockIndex {
		t.Fatalf("two terms with one sequencer: %+v and %+v", a, b)
	}
	// The old term's Resign, retried late, does not end the new one.
	if err := first.Resign(ctx); err != ErrNotLeader {
		t.Fatalf("old term's Resign: %v; want ErrNotLeader", err)
	}
	select {
	case <-second.Lost():
		t.Fatalf("the new term was lost: %v", second.Err())
	default:
	}
	if ld, err := e.Leader(ctx); err != nil || ld.Sequencer != second.Sequencer() {
		t.Fatalf("leader after the old Resign: %+v %v; want the new term %+v", ld, err, second.Sequencer())
	}
}
