package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/state"
)

// ---- fake clock ----

// fakeClock is a clock.Clock whose time moves only when a test calls
// Advance. Timers fire, in deadline order, from inside Advance.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	added  chan struct{} // closed and replaced whenever a timer is armed
}

type fakeTimer struct {
	c      *fakeClock
	when   time.Time
	ch     chan time.Time
	f      func()
	active bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), added: make(chan struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) clock.Timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := &fakeTimer{c: c, f: f}
	t.Reset(d)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	t.c.remove(t)
	if t.ch != nil {
		select {
		case <-t.ch:
		default:
		}
	}
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	was := t.active
	c.remove(t)
	if t.ch != nil {
		select {
		case <-t.ch:
		default:
		}
	}
	t.when = c.now.Add(d)
	t.active = true
	c.timers = append(c.timers, t)
	close(c.added)
	c.added = make(chan struct{})
	return was
}

func (c *fakeClock) remove(t *fakeTimer) {
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return
		}
	}
}

// Advance moves time forward by d, firing every timer that comes due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		sort.Slice(c.timers, func(i, j int) bool { return c.timers[i].when.Before(c.timers[j].when) })
		if len(c.timers) == 0 || c.timers[0].when.After(end) {
			break
		}
		t := c.timers[0]
		c.timers = c.timers[1:]
		t.active = false
		if t.when.After(c.now) {
			c.now = t.when
		}
		if t.f != nil {
			go t.f()
		} else {
			select {
			case t.ch <- c.now:
			default:
			}
		}
	}
	c.now = end
	c.mu.Unlock()
}

// Timers is the number of armed timers.
func (c *fakeClock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitTimers blocks until at least n timers are armed (a blocking query
// arms one when it parks), failing the test after a few seconds.
func (c *fakeClock) WaitTimers(t testing.TB, n int) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		c.mu.Lock()
		got, ch := len(c.timers), c.added
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("waited for %d armed timers, have %d", n, got)
		}
	}
}

// ---- fake backend ----

// tempErr is a transient server error such as losing the leader.
type tempErr struct{ msg string }

func (e tempErr) Error() string   { return e.msg }
func (e tempErr) Temporary() bool { return true }

// fakeBackend applies every write with fsm.Dispatch to one state.Store,
// under a mutex, at the next index, stamped with the fake clock's time.
// Sessions never expire (renew only checks existence).
type fakeBackend struct {
	clk *fakeClock

	mu    sync.Mutex
	store *state.Store
	idx   uint64
	ids   int

	known       atomic.Bool
	notReplayed atomic.Bool // Replayed() is its negation
	lastContact time.Duration
	failWrites  error // returned by every write when set
	failRead    error // returned by ConsistentRead when set
	consistent  atomic.Int64
	reads       atomic.Int64 // calls of State(): one per evaluation of a read
	lastKV      *state.KVRequest
	lastSession *state.Session
	lastTxn     []*state.TxnOp
}

const testNode, testDC = "node1", "dc1"

func newFakeBackend(clk *fakeClock) *fakeBackend {
	f := &fakeBackend{clk: clk, store: state.New(), idx: 1}
	f.known.Store(true)
	res := f.apply(fsm.TypeRegister, &state.RegisterRequest{Node: testNode, Address: "127.0.0.1",
		Check: &state.HealthCheck{CheckID: state.SerfCheckID, Name: "Serf Health Status",
			Status: state.HealthPassing, Output: "Agent alive and reachable"}})
	if res.Err != nil {
		panic(res.Err)
	}
	return f
}

func (f *fakeBackend) apply(t fsm.Type, body interface{}) *fsm.Result {
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.idx++
	return fsm.Dispatch(f.store, f.idx, f.clk.Now(), t, b)
}

// index is the last index applied.
func (f *fakeBackend) index() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.idx
}

func (f *fakeBackend) State() *state.Store { f.reads.Add(1); return f.store }
func (f *fakeBackend) NodeName() string    { return testNode }
func (f *fakeBackend) Datacenter() string  { return testDC }

func (f *fakeBackend) Self() map[string]interface{} {
	return map[string]interface{}{
		"Config": map[string]interface{}{"NodeName": testNode, "Datacenter": testDC},
		"Member": map[string]interface{}{"Name": testNode, "Addr": "127.0.0.1"},
		"Stats":  map[string]interface{}{"raft": map[string]string{"state": "Leader"}, "holdfast": map[string]string{"leader": "true"}},
	}
}

func (f *fakeBackend) KVS(ctx context.Context, req *state.KVRequest) (bool, time.Duration, error) {
	if f.failWrites != nil {
		return false, 0, f.failWrites
	}
	f.mu.Lock()
	c := *req
	f.lastKV = &c
	f.mu.Unlock()
	if req.Op == state.OpLock {
		if until := f.store.KVLockDelay(req.Entry.Key); f.clk.Now().Before(until) {
			return false, until.Sub(f.clk.Now()), nil
		}
	}
	res := f.apply(fsm.TypeKVS, req)
	return res.OK, 0, res.Err
}

func (f *fakeBackend) SessionCreate(ctx context.Context, s *state.Session) (string, error) {
	if f.failWrites != nil {
		return "", f.failWrites
	}
	if s.TTL != "" {
		d, err := time.ParseDuration(s.TTL)
		if err != nil {
			return "", fmt.Errorf("%w: Session TTL '%s' invalid: %v", state.ErrInvalidRequest, s.TTL, err)
		}
		if d != 0 && (d < 10*time.Second || d > 24*time.Hour) {
			return "", fmt.Errorf("%w: Invalid Session TTL '%d', must be between [10s=24h0m0s]", state.ErrInvalidRequest, d)
		}
	}
	c := *s
	f.mu.Lock()
	f.ids++
	c.ID = fmt.Sprintf("%08x-0000-4000-8000-%012x", f.ids, f.ids)
	f.lastSession = &c
	f.mu.Unlock()
	if c.Node == "" {
		c.Node = testNode
	}
	res := f.apply(fsm.TypeSessionCreate, &c)
	if res.Err != nil {
		return "", res.Err
	}
	return c.ID, nil
}

func (f *fakeBackend) SessionDestroy(ctx context.Context, id string) error {
	if f.failWrites != nil {
		return f.failWrites
	}
	return f.apply(fsm.TypeSessionDestroy, &fsm.SessionDestroy{ID: id}).Err
}

func (f *fakeBackend) SessionRenew(ctx context.Context, id string) (*state.Session, error) {
	if f.failWrites != nil {
		return nil, f.failWrites
	}
	_, s := f.store.SessionGet(nil, id)
	if s == nil {
		return nil, state.ErrSessionNotFound
	}
	c := *s
	return &c, nil
}

func (f *fakeBackend) Register(ctx context.Context, req *state.RegisterRequest) error {
	if f.failWrites != nil {
		return f.failWrites
	}
	return f.apply(fsm.TypeRegister, req).Err
}

func (f *fakeBackend) Deregister(ctx context.Context, req *state.DeregisterRequest) error {
	if f.failWrites != nil {
		return f.failWrites
	}
	return f.apply(fsm.TypeDeregister, req).Err
}

func (f *fakeBackend) Txn(ctx context.Context, ops []*state.TxnOp) ([]*state.TxnResult, []*state.TxnError, error) {
	if f.failWrites != nil {
		return nil, nil, f.failWrites
	}
	f.mu.Lock()
	f.lastTxn = ops
	f.mu.Unlock()
	res := f.apply(fsm.TypeTxn, ops)
	return res.TxnResult, res.TxnErrors, nil
}

func (f *fakeBackend) QuerySet(ctx context.Context, q *state.PreparedQuery) (string, error) {
	if f.failWrites != nil {
		return "", f.failWrites
	}
	c := *q
	if c.ID == "" {
		f.mu.Lock()
		f.ids++
		c.ID = fmt.Sprintf("%08x-1111-4000-8000-%012x", f.ids, f.ids)
		f.mu.Unlock()
	}
	if err := f.apply(fsm.TypeQuerySet, &c).Err; err != nil {
		return "", err
	}
	return c.ID, nil
}

func (f *fakeBackend) QueryDelete(ctx context.Context, id string) error {
	if f.failWrites != nil {
		return f.failWrites
	}
	return f.apply(fsm.TypeQueryDelete, &fsm.QueryDelete{ID: id}).Err
}

func (f *fakeBackend) ConsistentRead(ctx context.Context) error {
	f.consistent.Add(1)
	return f.failRead
}

func (f *fakeBackend) LeaderStatus() (bool, time.Duration) { return f.known.Load(), f.lastContact }
func (f *fakeBackend) Replayed() bool                      { return !f.notReplayed.Load() }
func (f *fakeBackend) Leader() string                      { return "127.0.0.1:8300" }
func (f *fakeBackend) Peers() ([]string, error)            { return []string{"127.0.0.1:8300"}, nil }

var _ Backend = (*fakeBackend)(nil)

// ---- request helpers ----

type env struct {
	t   testing.TB
	clk *fakeClock
	b   *fakeBackend
	h   http.Handler
}

func newEnv(t testing.TB, mod ...func(*Options)) *env {
	clk := newFakeClock()
	b := newFakeBackend(clk)
	opts := Options{Clock: clk}
	for _, m := range mod {
		m(&opts)
	}
	return &env{t: t, clk: clk, b: b, h: New(b, opts)}
}

type resp struct {
	Code   int
	Header http.Header
	Body   string
}

// do sends one request straight to the handler.
func (e *env) do(method, target string, body string) *resp {
	e.t.Helper()
	return e.doCtx(context.Background(), method, target, body)
}

func (e *env) doCtx(ctx context.Context, method, target string, body string) *resp {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd).WithContext(ctx)
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return &resp{Code: rec.Code, Header: rec.Result().Header, Body: rec.Body.String()}
}

// async sends a request in a goroutine; the answer arrives on the channel.
func (e *env) async(method, target, body string) <-chan *resp {
	ch := make(chan *resp, 1)
	go func() { ch <- e.doCtx(context.Background(), method, target, body) }()
	return ch
}

// block starts a blocking read in a goroutine and returns once it has
// evaluated at least once and armed its timer: from then on any write it
// depends on wakes it (memdb's watch channels were taken at the read).
func (e *env) block(method, target string) <-chan *resp {
	e.t.Helper()
	before := e.b.reads.Load()
	timers := e.clk.Timers()
	ch := e.async(method, target, "")
	deadline := time.Now().Add(5 * time.Second)
	for e.b.reads.Load() == before {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s %s never evaluated", method, target)
		}
		time.Sleep(100 * time.Microsecond)
	}
	e.clk.WaitTimers(e.t, timers+1)
	return ch
}

// want checks status and (if body != "*") the exact body.
func (r *resp) want(t testing.TB, code int, body string) *resp {
	t.Helper()
	if r.Code != code || (body != "*" && r.Body != body) {
		t.Fatalf("got %d %q, want %d %q", r.Code, r.Body, code, body)
	}
	return r
}

// json decodes the body into v.
func (r *resp) json(t testing.TB, v interface{}) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.Body), v); err != nil {
		t.Fatalf("body %q: %v", r.Body, err)
	}
}

// createSession makes a session with the given body and returns its ID.
func (e *env) createSession(body string) string {
	e.t.Helper()
	r := e.do("PUT", "/v1/session/create", body).want(e.t, 200, "*")
	var out struct{ ID string }
	r.json(e.t, &out)
	if out.ID == "" {
		e.t.Fatalf("no ID in %q", r.Body)
	}
	return out.ID
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}
