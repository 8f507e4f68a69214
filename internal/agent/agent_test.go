package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/agent"
	"github.com/holdfast/holdfast/internal/state"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const node = "node1"

// fakeCatalog is a CatalogWriter that applies every write to a real
// state.Store at the next index, stamped with the fake clock's time, and
// reports each write on a channel ("register ttl=critical",
// "deregister check ttl", …), so tests can wait for the write a timer
// caused instead of sleeping.
type fakeCatalog struct {
	clk *clocktest.Fake
	st  *state.Store

	mu     sync.Mutex
	idx    uint64
	fail   error
	failID string // if set, fail refuses only writes of this check
	writes chan string
}

func newFakeCatalog(t *testing.T, clk *clocktest.Fake) *fakeCatalog {
	f := &fakeCatalog{clk: clk, st: state.New(), writes: make(chan string, 100)}
	f.idx++
	err := f.st.Register(f.idx, clk.Now(), &state.RegisterRequest{Node: node, Address: "127.0.0.1",
		Check: &state.HealthCheck{CheckID: state.SerfCheckID, Status: state.HealthPassing}})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeCatalog) setFail(err error) {
	f.mu.Lock()
	f.fail, f.failID = err, ""
	f.mu.Unlock()
}

// failOnly refuses the registrations of one check ID with err, and lets
// every other write through.
func (f *fakeCatalog) failOnly(id string, err error) {
	f.mu.Lock()
	f.fail, f.failID = err, id
	f.mu.Unlock()
}

// refuses says whether the writes of a registration touching these check
// IDs fail now.
func (f *fakeCatalog) refuses(ids []string) bool {
	if f.fail == nil {
		return false
	}
	if f.failID == "" {
		return true
	}
	for _, id := range ids {
		if id == f.failID {
			return true
		}
	}
	return false
}

func (f *fakeCatalog) Register(ctx context.Context, req *state.RegisterRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	if req.Service != nil {
		parts = append(parts, "service "+req.Service.ID)
	}
	checks := req.Checks
	if req.Check != nil {
		checks = append([]*state.HealthCheck{req.Check}, checks...)
	}
	var ids []string
	for _, c := range checks {
		parts = append(parts, c.CheckID+"="+c.Status)
		ids = append(ids, c.CheckID)
	}
	if f.refuses(ids) {
		f.writes <- "failed register " + strings.Join(parts, " ")
		return f.fail
	}
	f.idx++
	if err := f.st.Register(f.idx, f.clk.Now(), req); err != nil {
		return err
	}
	f.writes <- "register " + strings.Join(parts, " ")
	return nil
}

func (f *fakeCatalog) Deregister(ctx context.Context, req *state.DeregisterRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	what := "check " + req.CheckID
	if req.ServiceID != "" {
		what = "service " + req.ServiceID
	}
	if f.refuses([]string{req.CheckID}) {
		f.writes <- "failed deregister " + what
		return f.fail
	}
	f.idx++
	if err := f.st.Deregister(f.idx, f.clk.Now(), req); err != nil {
		return err
	}
	f.writes <- "deregister " + what
	return nil
}

// session creates a session bound to serfHealth and checks.
func (f *fakeCatalog) session(t *testing.T, id string, checks ...string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.idx++
	err := f.st.SessionCreate(f.idx, &state.Session{ID: id, Node: node, Behavior: state.BehaviorRelease,
		NodeChecks: append([]string{state.SerfCheckID}, checks...)})
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fakeCatalog) sessionAlive(id string) bool {
	_, s := f.st.SessionGet(nil, id)
	return s != nil
}

func (f *fakeCatalog) status(id string) string {
	c := f.st.Check(node, id)
	if c == nil {
		return "absent"
	}
	return c.Status
}

// next waits (a bounded real time) for the next catalog write and returns
// it.
func (f *fakeCatalog) next(t *testing.T) string {
	t.Helper()
	select {
	case w := <-f.writes:
		return w
	case <-time.After(5 * time.Second):
		t.Fatal("no catalog write within 5s")
		return ""
	}
}

// expect waits for the next write and checks it.
func (f *fakeCatalog) expect(t *testing.T, want string) {
	t.Helper()
	if got := f.next(t); got != want {
		t.Fatalf("catalog write %q, want %q", got, want)
	}
}

// quiet checks that no write is pending.
func (f *fakeCatalog) quiet(t *testing.T) {
	t.Helper()
	select {
	case w := <-f.writes:
		t.Fatalf("unexpected catalog write %q", w)
	default:
	}
}

type env struct {
	clk *clocktest.Fake
	cat *fakeCatalog
	ag  *agent.Agent
}

func newEnv(t *testing.T) *env {
	clk := clocktest.NewFake(epoch)
	cat := newFakeCatalog(t, clk)
	ag := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat})
	t.Cleanup(func() { ag.Close() })
	return &env{clk: clk, cat: cat, ag: ag}
}

// waiters blocks until n timers are pending on the fake clock.
func (e *env) waiters(t *testing.T, n int) {
	t.Helper()
	e.timersUntil(t, fmt.Sprintf("waiting for %d timers", n), func(_ time.Time, due []time.Time) bool { return len(due) >= n })
}

// timersUntil blocks until cond holds of the fake clock's pending
// deadlines (clocktest's BlockUntil), failing the test after 5 s.
func (e *env) timersUntil(t *testing.T, what string, cond func(now time.Time, due []time.Time) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.clk.BlockUntil(ctx, cond); err != nil {
		t.Fatalf("%s (have %d): %v", what, e.clk.Waiters(), err)
	}
}

func ctx() context.Context { return context.Background() }

func ttlCheck(id string, ttl time.Duration, status string) *state.CheckDefinition {
	return &state.CheckDefinition{ID: id, Name: id, TTL: ttl, Status: status}
}

// A TTL check not updated within its TTL goes critical exactly at the
// deadline, and the session bound to it is invalidated in the same write.
func TestTTLExpiresAtTheDeadline(t *testing.T) {
	e := newEnv(t)
	const ttl = 10 * time.Second
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", ttl, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")
	e.cat.session(t, "s1", "app")

	e.clk.Advance(ttl - time.Nanosecond)
	e.cat.quiet(t)
	if !e.cat.sessionAlive("s1") || e.cat.status("app") != state.HealthPassing {
		t.Fatal("at TTL-1ns the check is no longer passing or the session is gone")
	}
	e.clk.Advance(time.Nanosecond)
	e.cat.expect(t, "register app=critical")
	if e.cat.sessionAlive("s1") {
		t.Fatal("session bound to the expired check is still alive")
	}
	c := e.cat.st.Check(node, "app")
	if c.Output != "TTL expired" || c.Type != "ttl" || c.Definition.TTL != "10s" {
		t.Fatalf("expired check %+v", c)
	}
	if got := e.ag.Checks(); len(got) != 1 || got[0].Status != state.HealthCritical {
		t.Fatalf("agent view %+v", got)
	}
}

// Each update restarts the TTL from the time it arrived.
func TestTTLUpdatesRestartTheTTL(t *testing.T) {
	e := newEnv(t)
	const ttl = 10 * time.Second
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", ttl, "")); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=critical") // the default initial status
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthPassing, "fine"); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")
	e.cat.session(t, "s1", "app")

	for i := 0; i < 5; i++ {
		e.clk.Advance(ttl - time.Second)
		if err := e.ag.UpdateCheck(ctx(), "app", state.HealthPassing, fmt.Sprintf("fine %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Same status, new notes: not written (outputs are written at most
	// every OutputUpdateInterval), and the session lives.
	e.cat.quiet(t)
	if !e.cat.sessionAlive("s1") {
		t.Fatal("session died while the check was kept passing")
	}
	// A warning resets the TTL too and does not invalidate.
	e.clk.Advance(ttl - time.Second)
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthWarning, "slow"); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=warning")
	e.clk.Advance(ttl - time.Nanosecond)
	e.cat.quiet(t)
	e.clk.Advance(time.Nanosecond)
	e.cat.expect(t, "register app=critical")
	if e.cat.sessionAlive("s1") {
		t.Fatal("session outlived its check")
	}
	if c := e.cat.st.Check(node, "app"); c.Output != "TTL expired (last output before timeout follows): slow" {
		t.Fatalf("output %q", c.Output)
	}
}

// An update that arrives after the deadline (the timer has fired but the
// runner has not handled it yet, or has) cannot save the check: it goes
// critical first, then takes the update.
func TestTTLLateUpdateStillExpires(t *testing.T) {
	e := newEnv(t)
	const ttl = 10 * time.Second
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", ttl, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")
	e.cat.session(t, "s1", "app")
	e.clk.Advance(ttl)
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthPassing, ""); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=critical")
	e.cat.expect(t, "register app=passing")
	if e.cat.sessionAlive("s1") {
		t.Fatal("a late update saved the session")
	}
}

func TestUpdateErrors(t *testing.T) {
	e := newEnv(t)
	err := e.ag.UpdateCheck(ctx(), "nope", state.HealthPassing, "")
	var nf interface{ NotFound() bool }
	if !errors.Is(err, agent.ErrNotFound) || !errors.As(err, &nf) || !nf.NotFound() {
		t.Fatalf("unknown check: %v", err)
	}
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, "")); err != nil {
		t.Fatal(err)
	}
	if err := e.ag.UpdateCheck(ctx(), "app", "fine", ""); !errors.Is(err, state.ErrInvalidRequest) {
		t.Fatalf("bad status: %v", err)
	}
}

func TestRegisterCheckRefusesBadDefinitions(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		def  state.CheckDefinition
		want string
	}{
		{state.CheckDefinition{Name: "x"}, `Check "x" has no type: give one of TTL, HTTP (with Interval) or TCP (with Interval)`},
		{state.CheckDefinition{Name: "x", TTL: time.Second, TCP: "127.0.0.1:1"}, `Check "x" has more than one type (TTL, TCP)`},
		{state.CheckDefinition{Name: "x", HTTP: "http://127.0.0.1/", Interval: 500 * time.Millisecond}, `Interval 500ms of check "x" is below the minimum of 1s`},
		{state.CheckDefinition{Name: "x", TCP: "127.0.0.1:1", Interval: time.Millisecond}, `Interval 1ms of check "x" is below the minimum of 1s`},
		{state.CheckDefinition{Name: "x", TCP: "127.0.0.1:1"}, `Check "x" needs an Interval`},
		{state.CheckDefinition{Name: "x", TTL: 100 * time.Millisecond}, `TTL 100ms of check "x" is below the minimum of 1s`},
		{state.CheckDefinition{Name: "x", HTTP: "ftp://h/", Interval: time.Second}, `HTTP "ftp://h/" of check "x" is not an http:// or https:// URL`},
		{state.CheckDefinition{Name: "x", TCP: "nohost", Interval: time.Second}, `TCP "nohost" of check "x" is not host:port`},
		{state.CheckDefinition{TTL: time.Second}, `Missing check name`},
		{state.CheckDefinition{Name: "x", TTL: time.Second, Status: "ok"}, `Invalid initial status "ok" of check "x"`},
		{state.CheckDefinition{Name: "x", TTL: time.Second, ServiceID: "web"}, `ServiceID "web" of check "x" is not a service registered on this agent`},
		{state.CheckDefinition{Name: state.SerfCheckID, TTL: time.Second}, `reserved`},
		{state.CheckDefinition{Name: "x", HTTP: "http://127.0.0.1/", Interval: time.Second, Method: "GET X"},
			`Method "GET X" of check "x" is not an HTTP method`},
		{state.CheckDefinition{Name: "x", HTTP: "http://127.0.0.1/", Interval: time.Second,
			Header: map[string][]string{"Bad Name": {"v"}}}, `Header "Bad Name" of check "x" is not a valid header name`},
		{state.CheckDefinition{Name: "x", HTTP: "http://127.0.0.1/", Interval: time.Second,
			Header: map[string][]string{"X-A": {"a\r\nX-B: b"}}}, `Header "X-A" of check "x" has a value with a line break or NUL in it`},
	}
	for _, c := range cases {
		err := e.ag.RegisterCheck(ctx(), &c.def)
		if !errors.Is(err, state.ErrInvalidRequest) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an invalid-request error containing %q", c.def, err, c.want)
		}
	}
	e.cat.quiet(t)
	if n := len(e.ag.Checks()); n != 0 {
		t.Fatalf("%d checks registered by refused definitions", n)
	}
}

// Deregistering a check removes it from the catalog, which invalidates
// the sessions bound to it, and stops its timer.
func TestDeregisterCheck(t *testing.T) {
	e := newEnv(t)
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")
	e.cat.session(t, "s1", "app")
	if err := e.ag.DeregisterCheck(ctx(), "app"); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "deregister check app")
	if e.cat.sessionAlive("s1") || e.cat.status("app") != "absent" || len(e.ag.Checks()) != 0 {
		t.Fatal("check or session survived deregistration")
	}
	if n := e.clk.Waiters(); n != 0 {
		t.Fatalf("%d timers left after the only check was deregistered", n)
	}
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthPassing, ""); !errors.Is(err, agent.ErrNotFound) {
		t.Fatalf("update after deregister: %v", err)
	}
}

// A catalog write that fails changes nothing: a registration is not kept,
// a deregistration leaves the check running.
func TestFailedWritesChangeNothing(t *testing.T) {
	e := newEnv(t)
	boom := errors.New("no leader")
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")

	e.cat.setFail(boom)
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("other", 10*time.Second, "")); !errors.Is(err, boom) {
		t.Fatalf("register: %v", err)
	}
	e.cat.expect(t, "failed register other=critical")
	if err := e.ag.DeregisterCheck(ctx(), "app"); !errors.Is(err, boom) {
		t.Fatalf("deregister: %v", err)
	}
	e.cat.expect(t, "failed deregister check app")
	if got := e.ag.Checks(); len(got) != 1 || got[0].CheckID != "app" {
		t.Fatalf("checks after failed writes: %+v", got)
	}
	e.cat.setFail(nil)
	// The old runner carries on: its TTL still runs from registration.
	e.clk.Advance(10 * time.Second)
	e.cat.expect(t, "register app=critical")
}

// A status change whose write fails is retried on the clock, 1s later.
func TestFailedStatusWriteIsRetried(t *testing.T) {
	e := newEnv(t)
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")
	e.cat.session(t, "s1", "app")
	e.cat.setFail(errors.New("no leader"))
	e.clk.Advance(10 * time.Second)
	e.cat.expect(t, "failed register app=critical")
	e.waiters(t, 1) // the retry
	e.cat.setFail(nil)
	e.clk.Advance(time.Second - time.Nanosecond)
	e.cat.quiet(t)
	e.clk.Advance(time.Nanosecond)
	e.cat.expect(t, "register app=critical")
	if e.cat.sessionAlive("s1") {
		t.Fatal("session alive after the retried write")
	}
}

// Finding: while a failed write waited for its retry, every further report
// of the same status (a probed check reports at each interval) wrote, and
// logged, at once, whatever the backoff. The same status now waits for the
// retry; a new status is still written at once.
func TestFailedWriteRetryIsNotHurriedBySameStatus(t *testing.T) {
	e := newEnv(t)
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")
	e.cat.setFail(errors.New("no leader"))
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthCritical, "down"); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "failed register app=critical")
	e.waiters(t, 2) // the TTL and the retry
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthCritical, "still down"); err != nil {
		t.Fatal(err)
	}
	e.cat.quiet(t) // the same status: left to the retry
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthWarning, "better"); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "failed register app=warning") // a new status: at once
	e.cat.setFail(nil)
	e.clk.Advance(2 * time.Second) // the retry, backed off to 2s
	e.cat.expect(t, "register app=warning")
}

// An HTTP check really probes: 2xx passing, 429 warning, anything else
// critical, no answer critical. The first probe runs at registration, the
// next ones every Interval of the fake clock.
func TestHTTPCheckProbes(t *testing.T) {
	e := newEnv(t)
	var code atomic.Int32
	code.Store(200)
	var gotUA, gotHdr atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotUA.Store(r.UserAgent())
		gotHdr.Store(r.Header.Get("X-Probe"))
		w.WriteHeader(int(code.Load()))
		fmt.Fprint(w, "body text")
	}))
	defer srv.Close()
	const every = 10 * time.Second
	def := &state.CheckDefinition{Name: "web", HTTP: srv.URL + "/health", Interval: every,
		Header: map[string][]string{"X-Probe": {"yes"}}}
	if err := e.ag.RegisterCheck(ctx(), def); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register web=critical")
	e.cat.expect(t, "register web=passing")
	c := e.cat.st.Check(node, "web")
	if want := "HTTP GET " + srv.URL + "/health: 200 OK Output: body text"; c.Output != want {
		t.Fatalf("output %q, want %q", c.Output, want)
	}
	if c.Type != "http" || c.Definition.Interval != "10s" || c.Definition.Timeout != "10s" || c.Definition.Method != "GET" {
		t.Fatalf("catalog check %+v", c)
	}
	if gotUA.Load() != "holdfast health check" || gotHdr.Load() != "yes" {
		t.Fatalf("probe sent User-Agent %q, X-Probe %q", gotUA.Load(), gotHdr.Load())
	}
	e.cat.session(t, "s1", "web")

	step := func(status int, want string) {
		t.Helper()
		code.Store(int32(status))
		e.waiters(t, 1) // the next probe's timer
		e.clk.Advance(every - time.Nanosecond)
		e.cat.quiet(t)
		e.clk.Advance(time.Nanosecond)
		e.cat.expect(t, "register web="+want)
	}
	step(429, state.HealthWarning)
	if !e.cat.sessionAlive("s1") {
		t.Fatal("a warning invalidated the session")
	}
	step(503, state.HealthCritical)
	if e.cat.sessionAlive("s1") {
		t.Fatal("session alive after its HTTP check went critical")
	}
	step(204, state.HealthPassing)
	srv.Close()
	e.waiters(t, 1)
	e.clk.Advance(every)
	e.cat.expect(t, "register web=critical")
	if c := e.cat.st.Check(node, "web"); !strings.HasPrefix(c.Output, "HTTP GET "+srv.URL+"/health: ") {
		t.Fatalf("output after the server went away: %q", c.Output)
	}
}

// A probe that gets no answer within Timeout (on the clock) is critical.
func TestHTTPCheckTimeout(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	def := &state.CheckDefinition{Name: "slow", HTTP: srv.URL, Interval: time.Minute, Timeout: 2 * time.Second,
		Status: state.HealthPassing}
	if err := e.ag.RegisterCheck(ctx(), def); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register slow=passing")
	e.waiters(t, 1) // the probe's timeout
	e.clk.Advance(2*time.Second - time.Nanosecond)
	e.cat.quiet(t)
	e.clk.Advance(time.Nanosecond)
	e.cat.expect(t, "register slow=critical")
	if c := e.cat.st.Check(node, "slow"); c.Output != "HTTP GET "+srv.URL+": timed out after 2s" {
		t.Fatalf("output %q", c.Output)
	}
}

// closingListener listens on a free port of 127.0.0.1 and closes every
// connection it accepts: a service a TCP check finds up. It is closed when
// the test ends, or earlier by the test.
func closingListener(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln, ln.Addr().String()
}

// A TCP check connects: a listener up is passing, gone is critical.
func TestTCPCheckProbes(t *testing.T) {
	e := newEnv(t)
	ln, addr := closingListener(t)
	if err := e.ag.RegisterCheck(ctx(), &state.CheckDefinition{Name: "db", TCP: addr, Interval: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register db=critical")
	e.cat.expect(t, "register db=passing")
	if c := e.cat.st.Check(node, "db"); c.Output != "TCP connect "+addr+": Success" || c.Type != "tcp" {
		t.Fatalf("check %+v", c)
	}
	ln.Close()
	e.waiters(t, 1)
	e.clk.Advance(5 * time.Second)
	e.cat.expect(t, "register db=critical")
	if c := e.cat.st.Check(node, "db"); !strings.HasPrefix(c.Output, "TCP connect "+addr+": ") || strings.HasSuffix(c.Output, "Success") {
		t.Fatalf("output %q", c.Output)
	}
}

// Services register with their checks in one write; deregistering the
// service removes both and invalidates sessions bound to its checks.
func TestServices(t *testing.T) {
	e := newEnv(t)
	svc := &state.Service{Service: "web", Tags: []string{"v1"}, Port: 8080}
	checks := []*state.CheckDefinition{
		{TTL: 10 * time.Second, Status: state.HealthPassing},
		{Name: "second", TTL: 30 * time.Second, Status: state.HealthPassing},
	}
	if err := e.ag.RegisterService(ctx(), svc, checks, false); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register service web service:web:1=passing service:web:2=passing")
	c := e.cat.st.Check(node, "service:web:1")
	if c.ServiceID != "web" || c.ServiceName != "web" || c.Name != "Service 'web' check" {
		t.Fatalf("service check %+v", c)
	}
	if got := e.ag.Services(); len(got) != 1 || got[0].ID != "web" || got[0].Port != 8080 {
		t.Fatalf("services %+v", got)
	}
	if got := e.ag.Checks(); len(got) != 2 || got[1].Name != "second" || got[0].ServiceName != "web" {
		t.Fatalf("checks %+v", got)
	}
	// A check of its own may be added to the service later.
	if err := e.ag.RegisterCheck(ctx(), &state.CheckDefinition{Name: "extra", ServiceID: "web", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register extra=critical")

	e.cat.mu.Lock()
	e.cat.idx++
	err := e.cat.st.SessionCreate(e.cat.idx, &state.Session{ID: "s1", Node: node, Behavior: state.BehaviorRelease,
		ServiceChecks: []state.ServiceCheck{{ID: "service:web:2"}}})
	e.cat.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ag.DeregisterService(ctx(), "web"); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "deregister service web")
	if e.cat.sessionAlive("s1") {
		t.Fatal("session bound to a service check outlived the service")
	}
	if len(e.ag.Services()) != 0 || len(e.ag.Checks()) != 0 || e.clk.Waiters() != 0 {
		t.Fatalf("left behind: %d services, %d checks, %d timers", len(e.ag.Services()), len(e.ag.Checks()), e.clk.Waiters())
	}
	if _, sn := e.cat.st.ServiceNodes(nil, "web"); len(sn) != 0 {
		t.Fatal("service still in the catalog")
	}
	if err := e.ag.DeregisterService(ctx(), "web"); !errors.Is(err, agent.ErrNotFound) {
		t.Fatalf("deregistering an unknown service: %v", err)
	}
	err = e.ag.RegisterService(ctx(), &state.Service{Service: "api"}, []*state.CheckDefinition{{HTTP: "http://127.0.0.1:1/", Interval: time.Millisecond}}, false)
	if !errors.Is(err, state.ErrInvalidRequest) || !strings.Contains(err.Error(), "below the minimum of 1s") {
		t.Fatalf("service with a too-frequent check: %v", err)
	}
	e.cat.quiet(t)
}

// Close stops every check: no timer is left and nothing is written after.
func TestClose(t *testing.T) {
	e := newEnv(t)
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")
	e.ag.Close()
	if n := e.clk.Waiters(); n != 0 {
		t.Fatalf("%d timers after Close", n)
	}
	e.clk.Advance(time.Hour)
	e.cat.quiet(t)
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("b", time.Minute, "")); !errors.Is(err, agent.ErrClosed) {
		t.Fatalf("register after Close: %v", err)
	}
}

// A new output with the same status is written at once the first time
// after registration, and after that at most once per OutputUpdateInterval
// (5m by default); a status change is always written at once.
func TestOutputOnlyChangesAreSpaced(t *testing.T) {
	e := newEnv(t)
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", time.Hour, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthPassing, "first"); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing") // the first output: at once
	e.clk.Advance(time.Minute)
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthPassing, "second"); err != nil {
		t.Fatal(err)
	}
	e.cat.quiet(t)
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthPassing, "third"); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(4*time.Minute - time.Nanosecond)
	e.cat.quiet(t)
	e.clk.Advance(time.Nanosecond) // 5m after the last write
	e.cat.expect(t, "register app=passing")
	if c := e.cat.st.Check(node, "app"); c.Output != "third" {
		t.Fatalf("deferred output %q, want the latest", c.Output)
	}
}

// The first probe of a check whose target is down keeps the initial
// critical status but still writes its output, so the catalog says why.
func TestFirstProbeOutputIsWritten(t *testing.T) {
	e := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	if err := e.ag.RegisterCheck(ctx(), &state.CheckDefinition{Name: "down", TCP: addr, Interval: time.Minute}); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register down=critical")
	e.cat.expect(t, "register down=critical")
	if c := e.cat.st.Check(node, "down"); !strings.HasPrefix(c.Output, "TCP connect "+addr+": ") {
		t.Fatalf("output %q", c.Output)
	}
}

// Updates, re-registrations, reads and deregistrations from many
// goroutines at once: no race, no deadlock, and the agent ends consistent.
func TestConcurrentUse(t *testing.T) {
	e := newEnv(t)
	go func() { // drain the writes; their order is not the point here
		for range e.cat.writes {
		}
	}()
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", time.Minute, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				switch g {
				case 0:
					if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", time.Minute, state.HealthPassing)); err != nil {
						t.Error(err)
					}
				case 1:
					e.ag.Checks()
					e.ag.Services()
				case 2:
					e.clk.Advance(time.Second)
				case 3:
					if err := e.ag.RegisterService(ctx(), &state.Service{Service: "web"}, []*state.CheckDefinition{ttlCheck("w", time.Minute, "")}, true); err != nil {
						t.Error(err)
					}
					if err := e.ag.DeregisterService(ctx(), "web"); err != nil {
						t.Error(err)
					}
				default:
					st := []string{state.HealthPassing, state.HealthWarning, state.HealthCritical}[i%3]
					if err := e.ag.UpdateCheck(ctx(), "app", st, fmt.Sprint(i)); err != nil {
						t.Error(err)
					}
				}
			}
		}(g)
	}
	wg.Wait()
	got := e.ag.Checks()
	if len(got) != 1 || got[0].CheckID != "app" || len(e.ag.Services()) != 0 {
		t.Fatalf("after the storm: %d checks, %d services", len(got), len(e.ag.Services()))
	}
	e.ag.Close()
	close(e.cat.writes)
}

// After the node was deregistered through the catalog and registered
// again (the server puts its own node back at once), Resync writes the
// agent's services and checks again, with their current status and
// output, and the sessions can bind to them once more.
func TestResyncAfterNodeWasDeregistered(t *testing.T) {
	e := newEnv(t)
	if err := e.ag.RegisterService(ctx(), &state.Service{ID: "web", Service: "web", Port: 80},
		[]*state.CheckDefinition{{ID: "web-alive", Name: "web", TTL: time.Minute, Status: state.HealthPassing}}, false); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register service web web-alive=passing")
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("disk", time.Minute, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register disk=passing")
	if err := e.ag.UpdateCheck(ctx(), "disk", state.HealthWarning, "90% full"); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register disk=warning")

	// Someone deregisters the node; the server puts it back bare.
	e.cat.idx++
	if err := e.cat.st.Deregister(e.cat.idx, e.clk.Now(), &state.DeregisterRequest{Node: node}); err != nil {
		t.Fatal(err)
	}
	e.cat.idx++
	if err := e.cat.st.Register(e.cat.idx, e.clk.Now(), &state.RegisterRequest{Node: node, Address: "127.0.0.1",
		Check: &state.HealthCheck{CheckID: state.SerfCheckID, Status: state.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	if e.cat.st.Check(node, "disk") != nil {
		t.Fatal("the check survived the node's deregistration")
	}

	if err := e.ag.Resync(ctx()); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register service web web-alive=passing")
	e.cat.expect(t, "register disk=warning")
	if c := e.cat.st.Check(node, "disk"); c == nil || c.Status != state.HealthWarning || c.Output != "90% full" {
		t.Fatalf("disk after Resync: %+v", c)
	}
	if _, _, svcs := e.cat.st.NodeInfo(nil, node); len(svcs) != 1 || svcs[0].ID != "web" {
		t.Fatalf("services after Resync: %+v", svcs)
	}
	if err := e.cat.st.SessionCreate(e.cat.idx+1, &state.Session{ID: "s", Node: node, Behavior: state.BehaviorRelease,
		NodeChecks: []string{state.SerfCheckID, "disk"}}); err != nil {
		t.Fatalf("a session bound to the check again: %v", err)
	}
	// The runners carry on: the TTLs still run out on time.
	e.clk.Advance(time.Minute)
	got := map[string]bool{e.cat.next(t): true, e.cat.next(t): true}
	if !got["register disk=critical"] || !got["register web-alive=critical"] {
		t.Fatalf("writes at the TTL: %v", got)
	}
}

// switchDialer dials for real until out is set, then fails as a process
// out of file descriptors does.
type switchDialer struct{ out atomic.Bool }

func (d *switchDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.out.Load() {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("socket", syscall.EMFILE)}
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// Finding (many-clients audit): with the agent out of file descriptors its
// TCP check could not open a socket, went critical ("socket: too many
// open files") and took the session bound to it, and the lock that
// session held, while the checked service was up. A probe the agent
// cannot make keeps the check's status.
func TestCheckKeepsStatusWhenTheAgentIsOutOfDescriptors(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	cat := newFakeCatalog(t, clk)
	d := &switchDialer{}
	ag := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, Dialer: d})
	t.Cleanup(func() { ag.Close() })
	e := &env{clk: clk, cat: cat, ag: ag}
	ln, addr := closingListener(t)
	if err := ag.RegisterCheck(ctx(), &state.CheckDefinition{Name: "db", TCP: addr, Interval: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register db=critical")
	cat.expect(t, "register db=passing")
	d.out.Store(true)
	// The probe in flight holds a timer for its timeout too: wait until
	// it is through and the only timer is the next probe's.
	nextProbe := func() {
		e.timersUntil(t, "waiting for the next probe to be armed", func(now time.Time, due []time.Time) bool {
			return len(due) == 1 && due[0].Equal(now.Add(5*time.Second))
		})
	}
	for i := 0; i < 3; i++ {
		nextProbe()
		clk.Advance(5 * time.Second)
	}
	nextProbe() // the third failed probe is through
	cat.quiet(t)
	if c := cat.st.Check(node, "db"); c.Status != state.HealthPassing {
		t.Fatalf("check %s while the agent was out of descriptors, want it kept passing: %q", c.Status, c.Output)
	}
	// A real failure still counts.
	d.out.Store(false)
	ln.Close()
	clk.Advance(5 * time.Second)
	cat.expect(t, "register db=critical")
}
