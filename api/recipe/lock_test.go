package recipe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	capi "github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/api"
)

// The lock tests run against an in-process server on a fake clock. Their
// sessions have a TTL of an hour and no lock-delay unless a test says
// otherwise, so that moving the clock for one purpose does not expire
// them by accident.
func lockSession(t testing.TB, srv *server, o *SessionOptions) *Session {
	t.Helper()
	opts := SessionOptions{TTL: time.Hour}
	if o != nil {
		opts = *o
		if opts.TTL == 0 {
			opts.TTL = time.Hour
		}
	}
	return srv.session(t, &opts)
}

func mustLock(t testing.TB, s *Session, key string, hook func(string)) *Lock {
	t.Helper()
	l, err := NewLock(s, key, &LockOptions{Value: []byte("held by " + s.ID()[:8])})
	if err != nil {
		t.Fatal(err)
	}
	l.hook = hook
	return l
}

func TestLockAndUnlock(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	s := lockSession(t, srv, nil)
	l := mustLock(t, s, "svc/db/lock", nil)

	h, err := l.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seq := h.Sequencer()
	if seq.Key != "svc/db/lock" || seq.Session != s.ID() || seq.LockIndex != 1 {
		t.Fatalf("sequencer %v", seq)
	}
	if _, err := l.Lock(ctx); err != ErrLockHeld {
		t.Fatalf("second Lock: %v", err)
	}
	p, _, err := srv.c.KV().Get(ctx, "svc/db/lock", nil)
	if err != nil || p.Session != s.ID() || p.Flags != LockFlagValue || string(p.Value) != "held by "+s.ID()[:8] {
		t.Fatalf("key while held: %+v %v", p, err)
	}
	if st, _, err := srv.c.KV().Fence(ctx, seq, nil); err != nil || !st.Valid {
		t.Fatalf("fence: %+v %v", st, err)
	}

	other := lockSession(t, srv, nil)
	if _, err := mustLock(t, other, "svc/db/lock", nil).TryLock(ctx); err != ErrLocked {
		t.Fatalf("TryLock of a held lock: %v", err)
	}

	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !isClosed(h.Lost()) || h.Err() != ErrReleased {
		t.Fatalf("after Unlock: lost=%v err=%v", isClosed(h.Lost()), h.Err())
	}
	if err := h.Unlock(ctx); err != ErrLockNotHeld {
		t.Fatalf("second Unlock: %v", err)
	}
	if err := l.Unlock(ctx); err != ErrLockNotHeld {
		t.Fatalf("Lock.Unlock with no hold: %v", err)
	}
	p, _, err = srv.c.KV().Get(ctx, "svc/db/lock", nil)
	if err != nil || p.Session != "" || p.Flags != LockFlagValue || p.LockIndex != 1 {
		t.Fatalf("key after Unlock: %+v %v", p, err)
	}
	if keys, _, _ := srv.c.KV().Keys(ctx, "svc/db/lock/", "", nil); len(keys) != 0 {
		t.Fatalf("queue left behind: %v", keys)
	}

	// TryLock on a free key; then the same Lock again with a new index.
	h2, err := mustLock(t, other, "svc/db/lock", nil).TryLock(ctx)
	if err != nil || h2.Sequencer().LockIndex != 2 {
		t.Fatalf("TryLock of a free lock: %v %v", h2, err)
	}
	if err := h2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	h3, err := l.Lock(ctx)
	if err != nil || h3.Sequencer().LockIndex != 3 {
		t.Fatalf("Lock again: %v %v", h3, err)
	}
	if err := l.Destroy(ctx); err != ErrLockHeld {
		t.Fatalf("Destroy while held: %v", err)
	}
	if err := mustLock(t, other, "svc/db/lock", nil).Destroy(ctx); err != ErrLockInUse {
		t.Fatalf("Destroy while held by another: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if p, _, _ := srv.c.KV().Get(ctx, "svc/db/lock", nil); p != nil {
		t.Fatalf("key after Destroy: %+v", p)
	}
}

func TestLockConflict(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	s := lockSession(t, srv, nil)
	if _, err := srv.c.KV().Put(ctx, &api.KVPair{Key: "plain", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := mustLock(t, s, "plain", nil).Lock(ctx); err != ErrLockConflict {
		t.Fatalf("Lock on a plain key: %v", err)
	}
	if _, err := mustLock(t, s, "plain", nil).TryLock(ctx); err != ErrLockConflict {
		t.Fatalf("TryLock on a plain key: %v", err)
	}
	if keys, _, _ := srv.c.KV().Keys(ctx, "plain/", "", nil); len(keys) != 0 {
		t.Fatalf("queue left behind: %v", keys)
	}
	for _, key := range []string{"", "/abs"} {
		if _, err := NewLock(s, key, nil); err == nil {
			t.Errorf("NewLock(%q) accepted", key)
		}
	}
}

// meter is an http.RoundTripper that counts one client's requests and
// knows how many of its blocking reads are in flight.
type meter struct {
	base http.RoundTripper

	mu      sync.Mutex
	total   int
	parked  int
	changed chan struct{}
}

func newMeter() *meter {
	return &meter{base: http.DefaultTransport.(*http.Transport).Clone(), changed: make(chan struct{})}
}

func (m *meter) RoundTrip(r *http.Request) (*http.Response, error) {
	blocking := r.URL.Query().Get("index") != "" && r.URL.Query().Get("index") != "0"
	m.update(func() {
		m.total++
		if blocking {
			m.parked++
		}
	})
	resp, err := m.base.RoundTrip(r)
	if blocking {
		m.update(func() { m.parked-- })
	}
	return resp, err
}

func (m *meter) update(f func()) {
	m.mu.Lock()
	f()
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

func (m *meter) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.total
}

// waitParked waits until the client has exactly one blocking read in
// flight and nothing else: it is waiting.
func (m *meter) waitParked(t testing.TB, who string) {
	t.Helper()
	timeout := time.After(bound)
	for {
		m.mu.Lock()
		parked, ch := m.parked, m.changed
		m.mu.Unlock()
		if parked == 1 {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%s never parked on a blocking read (%d in flight)", who, parked)
		}
	}
}

// waitCount waits until the client has sent at least n requests.
func (m *meter) waitCount(t testing.TB, who string, n int) {
	t.Helper()
	timeout := time.After(bound)
	for {
		m.mu.Lock()
		total, ch := m.total, m.changed
		m.mu.Unlock()
		if total >= n {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%s sent %d requests, never %d", who, total, n)
		}
	}
}

// meteredSession is a session whose client (and so its locks' requests)
// goes through a meter.
func meteredSession(t testing.TB, srv *server) (*Session, *meter) {
	t.Helper()
	m := newMeter()
	c, err := api.NewClient(&api.Config{Address: srv.Addr, HTTPClient: &http.Client{Transport: m}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSession(testCtx(t), c, &SessionOptions{TTL: time.Hour, LockDelay: -1, Clock: srv.Clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s, m
}

// TestLockFairQueue: waiters get the lock in the order they arrived, a
// hand-off wakes only the next waiter (every other waiter sends no request
// at all while the lock passes on), and the next waiter wakes up holding
// the lock.
func TestLockFairQueue(t *testing.T) {
	const waiters = 8
	ctx := testCtx(t)
	srv := newServer(t)
	const key = "jobs/nightly"

	type contender struct {
		s     *Session
		m     *meter
		l     *Lock
		holds chan *Hold
		mu    sync.Mutex
		trace []string
	}
	cs := make([]*contender, waiters+1)
	for i := range cs {
		s, m := meteredSession(t, srv)
		c := &contender{s: s, m: m, holds: make(chan *Hold, 1)}
		c.l = mustLock(t, s, key, func(l string) {
			c.mu.Lock()
			c.trace = append(c.trace, l)
			c.mu.Unlock()
		})
		cs[i] = c
	}
	first, err := cs[0].l.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cs[0].m.waitParked(t, "the holder's monitor")
	for i := 1; i <= waiters; i++ {
		c := cs[i]
		go func() {
			h, err := c.l.Lock(ctx)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			c.holds <- h
		}()
		// Wait until it is parked before the next one arrives, so that
		// arrival order is well defined.
		c.m.waitParked(t, fmt.Sprintf("waiter %d", i))
	}

	cur := first
	for i := 1; i <= waiters; i++ {
		before := make([]int, len(cs))
		for j, c := range cs {
			before[j] = c.m.count()
		}
		if err := cur.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		var h *Hold
		select {
		case h = <-cs[i].holds:
		case <-time.After(bound):
			t.Fatalf("waiter %d never got the lock", i)
		}
		if h.Sequencer().LockIndex != uint64(i+1) {
			t.Fatalf("waiter %d holds %v", i, h.Sequencer())
		}
		// The waiter behind the new holder is woken by the mark on the
		// new holder's entry and goes to sleep on the key.
		if i < waiters {
			cs[i+1].m.waitCount(t, fmt.Sprintf("waiter %d", i+1), before[i+1]+1)
		}
		// Everyone still waiting is (still) parked; the new holder's
		// monitor is parked too.
		for j := i; j <= waiters; j++ {
			cs[j].m.waitParked(t, fmt.Sprintf("contender %d", j))
		}
		// The key was handed to the new holder by the Unlock: it did not
		// have to acquire it.
		cs[i].mu.Lock()
		l := fmt.Sprint(cs[i].trace)
		cs[i].mu.Unlock()
		if !strings.Contains(l, fmt.Sprintf("handed %d", i+1)) || strings.Contains(l, "released at") {
			t.Errorf("hand-off %d: the new holder did %s", i, l)
		}
		// The waiter behind the new holder was woken once, by the
		// holder marking its queue entry, and went back to sleep on it
		// with one new request. Nobody else moved.
		if i < waiters {
			if n := cs[i+1].m.count() - before[i+1]; n > 1 {
				t.Errorf("hand-off %d: the waiter behind sent %d requests", i, n)
			}
		}
		for j := i + 2; j <= waiters; j++ {
			if n := cs[j].m.count() - before[j]; n != 0 {
				t.Errorf("hand-off %d: waiter %d sent %d requests", i, j, n)
			}
		}
		cur = h
	}
	if err := cur.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if keys, _, _ := srv.c.KV().Keys(ctx, key+"/", "", nil); len(keys) != 0 {
		t.Fatalf("queue left behind: %v", keys)
	}
}

// TestLockWaitsOutLockDelayExactly: when the holder's session is
// invalidated, the next waiter is refused for the lock-delay and waits
// exactly the remaining delay the server reported, on its clock.
func TestLockWaitsOutLockDelayExactly(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	holder := lockSession(t, srv, &SessionOptions{LockDelay: 2 * time.Second})
	h, err := mustLock(t, holder, "svc/leader", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	lines := make(chan string, 16)
	waiter := lockSession(t, srv, &SessionOptions{LockDelay: 3 * time.Second})
	wl := mustLock(t, waiter, "svc/leader", func(l string) { lines <- l })
	got := make(chan *Hold, 1)
	go func() {
		h, err := wl.Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	expectLine := func(want string) {
		t.Helper()
		select {
		case l := <-lines:
			if l != want {
				t.Fatalf("waiter did %q, want %q", l, want)
			}
		case <-time.After(bound):
			t.Fatalf("waiter did nothing, want %q", want)
		}
	}
	expectLine("next after " + holder.ID())

	// The holder's session is invalidated (destroyed here; a TTL or a
	// failed check does the same).
	if _, err := srv.c.Session().Destroy(ctx, holder.ID(), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Lost():
	case <-time.After(bound):
		t.Fatal("the old hold was not reported lost")
	}
	if l := <-lines; !strings.HasPrefix(l, "released at ") {
		t.Fatalf("waiter did %q", l)
	}
	expectLine("lock-delay 2s")
	srv.Clock.Advance(2*time.Second - 1)
	select {
	case l := <-lines:
		t.Fatalf("a nanosecond early the waiter did %q", l)
	case <-got:
		t.Fatal("a nanosecond early the waiter got the lock")
	default:
	}
	srv.Clock.Advance(1)
	expectLine("head") // the dead holder's entry is gone
	expectLine("acquired 2")
	wh := <-got
	if wh.Sequencer().LockIndex != 2 {
		t.Fatalf("hold %v", wh.Sequencer())
	}

	// The stale holder's fenced write is refused, the new one's accepted.
	kv := srv.c.KV()
	if ok, _, err := kv.PutFenced(ctx, &api.KVPair{Key: "svc/config", Value: []byte("old")}, h.Sequencer(), nil); err != nil || ok {
		t.Fatalf("stale holder's fenced write: %v %v", ok, err)
	}
	if ok, _, err := kv.PutFenced(ctx, &api.KVPair{Key: "svc/config", Value: []byte("new")}, wh.Sequencer(), nil); err != nil || !ok {
		t.Fatalf("new holder's fenced write: %v %v", ok, err)
	}
	// The old hold's Unlock cannot free the new one.
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := kv.Fence(ctx, wh.Sequencer(), nil); !st.Valid {
		t.Fatal("the stale Unlock freed the new hold")
	}

	// TryLock reports a lock-delay with how long it has to run.
	waiter2 := lockSession(t, srv, nil)
	if _, err := srv.c.Session().Destroy(ctx, waiter.ID(), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wh.Lost():
	case <-time.After(bound):
		t.Fatal("hold not lost")
	}
	_, err = mustLock(t, waiter2, "svc/leader", nil).TryLock(ctx)
	var lde *LockDelayError
	if !errors.As(err, &lde) || !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock in lock-delay: %v", err)
	}
	if lde.Remaining != 3*time.Second || lde.Key != "svc/leader" {
		t.Fatalf("lock-delay error %+v", lde)
	}
}

// TestHoldLostWhenKeyChangesHands: an operator's release (or anything that
// moves the key away from the session) closes Lost at once, and the queue
// moves on without waiting for Unlock.
func TestHoldLostWhenKeyChangesHands(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	s := lockSession(t, srv, nil)
	h, err := mustLock(t, s, "k", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := lockSession(t, srv, nil)
	got := make(chan *Hold, 1)
	go func() {
		h, err := mustLock(t, next, "k", nil).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	if ok, _, err := srv.c.KV().Release(ctx, &api.KVPair{Key: "k", Session: s.ID(), Flags: LockFlagValue}, nil); err != nil || !ok {
		t.Fatalf("operator release: %v %v", ok, err)
	}
	select {
	case <-h.Lost():
	case <-time.After(bound):
		t.Fatal("hold not lost after the key was released")
	}
	if h.Err() != ErrKeyChanged {
		t.Fatalf("lost because %v", h.Err())
	}
	select {
	case nh := <-got:
		if nh.Sequencer().LockIndex != 2 {
			t.Fatalf("next hold %v", nh.Sequencer())
		}
	case <-time.After(bound):
		t.Fatal("the next waiter did not get the lock")
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHoldPolicy: under LoseOnSuspended a hold (a lock's or a semaphore
// permit) is lost at the first failed renew; under LoseOnLost only at the
// safe deadline, while the server still has the session.
func TestHoldPolicy(t *testing.T) {
	type lossy interface {
		Lost() <-chan struct{}
		Err() error
	}
	kinds := map[string]func(context.Context, *testing.T, *Session) (lossy, error){
		"lock": func(ctx context.Context, t *testing.T, s *Session) (lossy, error) {
			return mustLock(t, s, "k", nil).Lock(ctx)
		},
		"permit": func(ctx context.Context, t *testing.T, s *Session) (lossy, error) {
			return mustSemaphore(t, s, "p", 1).Acquire(ctx)
		},
	}
	for kind, take := range kinds {
		for _, policy := range []Policy{LoseOnSuspended, LoseOnLost} {
			t.Run(kind+"/"+policy.String(), func(t *testing.T) {
				ctx := testCtx(t)
				srv := newServer(t)
				proxy := newCutProxy(t, srv.URL)
				s, err := NewSession(ctx, newClient(t, proxy.srv.Listener.Addr().String()), &SessionOptions{
					TTL: 10 * time.Second, LockDelay: -1, Policy: policy, Clock: srv.Clock,
					Behavior: api.SessionBehaviorDelete,
				})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close(ctx)
				events := s.Listen(ctx)
				<-events
				h, err := take(ctx, t, s)
				if err != nil {
					t.Fatal(err)
				}
				proxy.set("fail")
				srv.Clock.Advance(5 * time.Second)
				if ev := <-events; ev.State != Suspended {
					t.Fatalf("event %v", ev.State)
				}
				if policy == LoseOnSuspended {
					select {
					case <-h.Lost():
					case <-time.After(bound):
						t.Fatal("not lost at Suspended")
					}
					if h.Err() != ErrUntrusted {
						t.Fatalf("lost because %v", h.Err())
					}
					return
				}
				if isClosed(h.Lost()) {
					t.Fatalf("LoseOnLost: lost at Suspended (%v)", h.Err())
				}
				dl := s.Deadline()
				srv.Clock.Set(dl.Add(-1))
				s.sync()
				if isClosed(h.Lost()) {
					t.Fatal("lost before the deadline")
				}
				srv.Clock.Set(dl)
				if ev := <-events; ev.State != Lost {
					t.Fatalf("event %v", ev.State)
				}
				select {
				case <-h.Lost():
				case <-time.After(bound):
					t.Fatal("not lost at Lost")
				}
				// The server still has the session: nobody else can have
				// the key or the slot yet.
				if se, _, err := srv.c.Session().Info(ctx, s.ID(), nil); err != nil || se == nil {
					t.Fatalf("the server freed the session before Lost: %v", err)
				}
			})
		}
	}
}

// TestLockFailsWhenSessionLost: a waiting Lock returns ErrSessionLost as
// soon as its session is Lost.
func TestLockFailsWhenSessionLost(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	holder := lockSession(t, srv, nil)
	if _, err := mustLock(t, holder, "k", nil).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := lockSession(t, srv, &SessionOptions{TTL: 10 * time.Second})
	lines := make(chan string, 4)
	errc := make(chan error, 1)
	go func() {
		_, err := mustLock(t, waiter, "k", func(l string) { lines <- l }).Lock(ctx)
		errc <- err
	}()
	<-lines // waiting
	if _, err := srv.c.Session().Destroy(ctx, waiter.ID(), nil); err != nil {
		t.Fatal(err)
	}
	srv.Clock.Advance(5 * time.Second) // the keeper's renew learns it is gone
	select {
	case err := <-errc:
		if !errors.Is(err, ErrSessionLost) || !errors.Is(err, ErrSessionExpired) {
			t.Fatalf("Lock returned %v", err)
		}
	case <-time.After(bound):
		t.Fatal("Lock still waiting after its session was lost")
	}
	if _, err := mustLock(t, waiter, "k", nil).Lock(ctx); !errors.Is(err, ErrSessionLost) {
		t.Fatalf("Lock on a lost session: %v", err)
	}
}

// TestLockCancel: a cancelled Lock leaves the queue.
func TestLockCancel(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	holder := lockSession(t, srv, nil)
	if _, err := mustLock(t, holder, "k", nil).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := lockSession(t, srv, nil)
	lines := make(chan string, 4)
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := mustLock(t, waiter, "k", func(l string) { lines <- l }).Lock(wctx)
		errc <- err
	}()
	<-lines
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("cancelled Lock: %v", err)
	}
	keys, _, err := srv.c.KV().Keys(ctx, "k/"+QueueDir+"/", "", nil)
	if err != nil || len(keys) != 1 || !strings.HasSuffix(keys[0], holder.ID()) {
		t.Fatalf("queue after cancel: %v %v", keys, err)
	}
}

func consulClient(t testing.TB, srv *server) *capi.Client {
	t.Helper()
	cfg := capi.DefaultConfig()
	cfg.Address = srv.Addr
	cfg.Scheme = "http"
	cfg.Token = ""
	cfg.Datacenter = ""
	c, err := capi.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLockInteropConsul: a holdfast Lock and Consul's api.Lock on the same
// key exclude each other and hand over to each other, both ways.
func TestLockInteropConsul(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	cc := consulClient(t, srv)
	const key = "interop/lock"

	// Consul holds; holdfast waits and gets it on Unlock.
	cl, err := cc.LockOpts(&capi.LockOptions{Key: key, Value: []byte("consul")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Lock(nil); err != nil {
		t.Fatal(err)
	}
	s := lockSession(t, srv, nil)
	lines := make(chan string, 8)
	hl := mustLock(t, s, key, func(l string) { lines <- l })
	got := make(chan *Hold, 1)
	go func() {
		h, err := hl.Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	if l := <-lines; l != "head" {
		t.Fatalf("waiter: %q", l)
	}
	if l := <-lines; !strings.HasPrefix(l, "held by ") {
		t.Fatalf("waiter: %q", l)
	}
	if _, err := hl.TryLock(ctx); err != ErrLockBusy {
		t.Fatalf("TryLock during Lock: %v", err)
	}
	if _, err := mustLock(t, lockSession(t, srv, nil), key, nil).TryLock(ctx); err != ErrLocked {
		t.Fatalf("TryLock while Consul holds the key: %v", err)
	}
	if err := cl.Unlock(); err != nil {
		t.Fatal(err)
	}
	var h *Hold
	select {
	case h = <-got:
	case <-time.After(bound):
		t.Fatal("holdfast did not get the lock after Consul's Unlock")
	}

	// holdfast holds; Consul waits and gets it on Unlock.
	cl2, err := cc.LockOpts(&capi.LockOptions{Key: key, Value: []byte("consul 2")})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	consulGot := acquireAsync(cl2.Lock, stop)
	// Consul's Lock must be waiting, not holding.
	if st, _, err := srv.c.KV().Fence(ctx, h.Sequencer(), nil); err != nil || !st.Valid {
		t.Fatalf("holdfast's hold while Consul waits: %+v %v", st, err)
	}
	select {
	case err := <-consulGot:
		t.Fatalf("Consul's Lock returned while holdfast holds: %v", err)
	default:
	}
	start := time.Now()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-consulGot:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(bound):
		t.Fatal("Consul did not get the lock after holdfast's Unlock")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("Consul took %v to take over", d)
	}
	p, _, err := srv.c.KV().Get(ctx, key, nil)
	if err != nil || p.Session == "" || p.Session == s.ID() || string(p.Value) != "consul 2" {
		t.Fatalf("key after hand-over to Consul: %+v %v", p, err)
	}
	if err := cl2.Unlock(); err != nil {
		t.Fatal(err)
	}
}

// TestStaleUnlockOfTheSameSession: a hold lost to an operator's release,
// then taken again by the same session, is not freed by the old hold's
// Unlock: the release names the old LockIndex.
func TestStaleUnlockOfTheSameSession(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	s := lockSession(t, srv, nil)
	old, err := mustLock(t, s, "k", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := srv.c.KV().Release(ctx, &api.KVPair{Key: "k", Session: s.ID(), Flags: LockFlagValue}, nil); err != nil || !ok {
		t.Fatalf("operator release: %v %v", ok, err)
	}
	<-old.Lost()
	cur, err := mustLock(t, s, "k", nil).TryLock(ctx)
	if err != nil || cur.Sequencer().LockIndex != 2 {
		t.Fatalf("again: %v %v", cur, err)
	}
	if err := old.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _, err := srv.c.KV().Fence(ctx, cur.Sequencer(), nil); err != nil || !st.Valid {
		t.Fatalf("the stale Unlock freed the current hold: %+v %v", st, err)
	}
	if keys, _, _ := srv.c.KV().Keys(ctx, "k/", "", nil); len(keys) != 0 {
		t.Fatalf("queue left behind: %v", keys)
	}
	if err := cur.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := srv.c.KV().Get(ctx, "k", nil); p == nil || p.Session != "" {
		t.Fatalf("after the current Unlock: %+v", p)
	}
}

// lineCollector records a Lock's trace lines and lets a test wait for one.
type lineCollector struct {
	t     testing.TB
	lines chan string
	seen  []string
}

func collectLines(t testing.TB) *lineCollector {
	return &lineCollector{t: t, lines: make(chan string, 64)}
}

func (c *lineCollector) hook(l string) { c.lines <- l }

// expect waits for the next line and fails unless it is want (or, when
// want ends in "*", starts with what precedes the "*").
func (c *lineCollector) expect(want string) {
	c.t.Helper()
	select {
	case l := <-c.lines:
		c.seen = append(c.seen, l)
		if l != want && !(strings.HasSuffix(want, "*") && strings.HasPrefix(l, strings.TrimSuffix(want, "*"))) {
			c.t.Fatalf("did %q, want %q (so far %q)", l, want, c.seen)
		}
	case <-time.After(bound):
		c.t.Fatalf("did nothing, want %q (so far %q)", want, c.seen)
	}
}

// TestLockHandOff: Unlock hands the key to the next waiter in the same
// transaction that releases it; the waiter wakes holding it, with the
// next LockIndex and its own value, and the waiter behind moves up.
func TestLockHandOff(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	const key = "svc/leader"
	a, b, c := lockSession(t, srv, nil), lockSession(t, srv, nil), lockSession(t, srv, nil)
	la, lb, lc := collectLines(t), collectLines(t), collectLines(t)
	ha, err := mustLock(t, a, key, la.hook).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	la.expect("head")
	la.expect("acquired 1")
	holds := make(chan *Hold, 2)
	wait := func(s *Session, lc *lineCollector) {
		go func() {
			h, err := mustLock(t, s, key, lc.hook).Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			holds <- h
		}()
	}
	wait(b, lb)
	lb.expect("next after " + a.ID())
	wait(c, lc)
	lc.expect("wait for " + b.ID())

	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	la.expect("successor " + b.ID())
	la.expect("handed to " + b.ID())
	lb.expect("handed 2")
	hb := <-holds
	if seq := hb.Sequencer(); seq.Session != b.ID() || seq.LockIndex != 2 {
		t.Fatalf("b holds %v", seq)
	}
	p, _, err := srv.c.KV().Get(ctx, key, nil)
	if err != nil || p.Session != b.ID() || p.LockIndex != 2 || p.Flags != LockFlagValue || string(p.Value) != "held by "+b.ID()[:8] {
		t.Fatalf("key after the hand-off: %+v %v", p, err)
	}
	if st, _, err := srv.c.KV().Fence(ctx, hb.Sequencer(), nil); err != nil || !st.Valid {
		t.Fatalf("b's sequencer: %+v %v", st, err)
	}
	if st, _, err := srv.c.KV().Fence(ctx, ha.Sequencer(), nil); err != nil || st.Valid {
		t.Fatalf("a's old sequencer: %+v %v", st, err)
	}
	// c was woken by b's entry being marked, and now sleeps on the key.
	lc.expect("next after " + b.ID())

	if err := hb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lc.expect("handed 3")
	hc := <-holds
	if hc.Sequencer().LockIndex != 3 {
		t.Fatalf("c holds %v", hc.Sequencer())
	}
	if err := hc.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	p, _, err = srv.c.KV().Get(ctx, key, nil)
	if err != nil || p.Session != "" || p.LockIndex != 3 {
		t.Fatalf("key after the last Unlock: %+v %v", p, err)
	}
	if keys, _, _ := srv.c.KV().Keys(ctx, key+"/", "", nil); len(keys) != 0 {
		t.Fatalf("queue left behind: %v", keys)
	}
}

// TestLockHandOffRefused: a hand-off whose waiter left between the
// holder's read of the queue and its transaction is refused by the
// server; the key is then released plainly and the waiter, back in the
// queue, takes it the ordinary way.
func TestLockHandOffRefused(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	const key = "svc/leader"
	a, b := lockSession(t, srv, nil), lockSession(t, srv, nil)
	lb := collectLines(t)
	var lines []string
	var la *Lock
	la = mustLock(t, a, key, func(l string) {
		lines = append(lines, l)
		if strings.HasPrefix(l, "successor ") {
			// b's entry goes away after the holder chose b.
			if _, err := srv.c.KV().Delete(ctx, la.queuePrefix()+b.ID(), nil); err != nil {
				t.Error(err)
			}
		}
	})
	ha, err := la.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	holds := make(chan *Hold, 1)
	go func() {
		h, err := mustLock(t, b, key, lb.hook).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		holds <- h
	}()
	lb.expect("next after " + a.ID())
	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{"head", "acquired 1", "successor " + b.ID()}; fmt.Sprint(lines) != fmt.Sprint(want) {
		t.Fatalf("holder did %q, want %q (no hand-off)", lines, want)
	}
	lb.expect("released at *")
	lb.expect("acquired 2")
	hb := <-holds
	if hb.Sequencer().LockIndex != 2 {
		t.Fatalf("b holds %v", hb.Sequencer())
	}
	if p, _, err := srv.c.KV().Get(ctx, la.queuePrefix()+b.ID(), nil); err != nil || p == nil || p.Session != b.ID() {
		t.Fatalf("b's queue entry while it holds: %+v %v", p, err)
	}
	if err := hb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLockAbandonAfterHandOff: a waiter that gives up after the key was
// handed to it (its Lock returned an error before it saw the hand-off)
// releases the key when it leaves, so the lock is not stuck with a
// session that no longer wants it.
func TestLockAbandonAfterHandOff(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	const key = "svc/leader"
	a, b := lockSession(t, srv, nil), lockSession(t, srv, nil)
	ha, err := mustLock(t, a, key, nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// b joins the queue but nobody waits in its Lock call: it stands for
	// a Lock whose context ends just as the key is handed to it.
	lb := mustLock(t, b, key, nil)
	if _, err := lb.joinQueue(ctx, lb.queueKey()); err != nil {
		t.Fatal(err)
	}
	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _, err := srv.c.KV().Get(ctx, key, nil); err != nil || p.Session != b.ID() {
		t.Fatalf("key not handed to b: %+v %v", p, err)
	}
	lb.abandon(ctx, lb.queueKey())
	p, _, err := srv.c.KV().Get(ctx, key, nil)
	if err != nil || p.Session != "" || p.LockIndex != 2 {
		t.Fatalf("key after b abandoned: %+v %v", p, err)
	}
	if keys, _, _ := srv.c.KV().Keys(ctx, key+"/", "", nil); len(keys) != 0 {
		t.Fatalf("queue left behind: %v", keys)
	}
	h, err := mustLock(t, lockSession(t, srv, nil), key, nil).TryLock(ctx)
	if err != nil || h.Sequencer().LockIndex != 3 {
		t.Fatalf("TryLock after the abandoned hand-off: %v %v", h, err)
	}
}

// TestLockHandOffToWhoeverIsNext: the new holder learns who waits behind
// it from the answer that handed it the lock; when that waiter has left
// by the time of Unlock, the hand-off to it is refused and Unlock hands
// the lock to whoever is next now.
func TestLockHandOffToWhoeverIsNext(t *testing.T) {
	ctx := testCtx(t)
	srv := newServer(t)
	const key = "svc/leader"
	a, b, c, d := lockSession(t, srv, nil), lockSession(t, srv, nil), lockSession(t, srv, nil), lockSession(t, srv, nil)
	lb, lc, ld := collectLines(t), collectLines(t), collectLines(t)
	ha, err := mustLock(t, a, key, nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bl := mustLock(t, b, key, lb.hook)
	holds := make(chan *Hold, 1)
	go func() {
		h, err := bl.Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		holds <- h
	}()
	lb.expect("next after " + a.ID())
	cctx, cancel := context.WithCancel(ctx)
	cerr := make(chan error, 1)
	go func() {
		_, err := mustLock(t, c, key, lc.hook).Lock(cctx)
		cerr <- err
	}()
	lc.expect("wait for " + b.ID())

	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lb.expect("handed 2")
	lb.expect("acquired 2")
	hb := <-holds
	if hb.next == nil || hb.next.Session != c.ID() {
		t.Fatalf("b's hint of who is next: %+v", hb.next)
	}
	lc.expect("next after " + b.ID())
	cancel()
	if err := <-cerr; err != context.Canceled {
		t.Fatalf("c's Lock: %v", err)
	}
	dl := mustLock(t, d, key, ld.hook)
	go func() {
		h, err := dl.Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		holds <- h
	}()
	ld.expect("next after " + b.ID())

	if err := hb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lb.expect("successor " + c.ID())
	lb.expect("successor " + d.ID())
	lb.expect("handed to " + d.ID())
	ld.expect("handed 3")
	hd := <-holds
	if err := hd.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if keys, _, _ := srv.c.KV().Keys(ctx, key+"/", "", nil); len(keys) != 0 {
		t.Fatalf("queue left behind: %v", keys)
	}
}

// acquireAsync runs acquire (a Consul Lock's Lock, a Semaphore's Acquire)
// in a goroutine and sends its outcome: nil once it holds, or its error.
func acquireAsync(acquire func(<-chan struct{}) (<-chan struct{}, error), stop <-chan struct{}) <-chan error {
	got := make(chan error, 1)
	go func() {
		ch, err := acquire(stop)
		if err == nil && ch == nil {
			err = errors.New("acquired without a channel")
		}
		got <- err
	}()
	return got
}
