package recipe

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/servertest"
)

// bound is how long a test waits (in real time) for something it knows
// must happen. It is a safety net against hangs, not a sleep: every wait
// returns as soon as the thing happens.
const bound = 20 * time.Second

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bound)
	t.Cleanup(cancel)
	return ctx
}

func newClient(t testing.TB, addr string) *api.Client {
	t.Helper()
	c, err := api.NewClient(&api.Config{Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// renewStub is an agent whose answers to session renews the test gives one
// by one. It also answers session create and destroy.
type renewStub struct {
	t       testing.TB
	srv     *httptest.Server
	renews  chan *pendingRenew
	destroy atomic.Int32
}

// pendingRenew is a renew request waiting for the test's answer.
type pendingRenew struct {
	reply chan stubReply
	gone  <-chan struct{} // the client gave up on it
}

type stubReply struct {
	code int
	body string
}

func newRenewStub(t testing.TB) *renewStub {
	st := &renewStub{t: t, renews: make(chan *pendingRenew, 16)}
	st.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch {
		case r.URL.Path == "/v1/session/create":
			io.WriteString(w, `{"ID":"5e55104e-0000-0000-0000-000000000001"}`)
		case strings.HasPrefix(r.URL.Path, "/v1/session/destroy/"):
			st.destroy.Add(1)
			io.WriteString(w, "true")
		case strings.HasPrefix(r.URL.Path, "/v1/session/renew/"):
			p := &pendingRenew{reply: make(chan stubReply, 1), gone: r.Context().Done()}
			st.renews <- p
			select {
			case rp := <-p.reply:
				w.WriteHeader(rp.code)
				io.WriteString(w, rp.body)
			case <-r.Context().Done():
			}
		default:
			http.Error(w, "not in this stub", http.StatusNotImplemented)
		}
	}))
	t.Cleanup(st.srv.Close)
	return st
}

// next waits for the next renew to reach the stub.
func (st *renewStub) next() *pendingRenew {
	st.t.Helper()
	select {
	case p := <-st.renews:
		return p
	case <-time.After(bound):
		st.t.Fatal("no renew reached the server")
		return nil
	}
}

func (p *pendingRenew) ok(ttl string) {
	p.reply <- stubReply{200, `[{"ID":"5e55104e-0000-0000-0000-000000000001","TTL":"` + ttl + `"}]`}
}
func (p *pendingRenew) fail(code int, body string) { p.reply <- stubReply{code, body} }

// waitGone waits until the client abandoned the request.
func (p *pendingRenew) waitGone(t testing.TB) {
	t.Helper()
	select {
	case <-p.gone:
	case <-time.After(bound):
		t.Fatal("the abandoned renew was not cancelled")
	}
}

// keeperTest drives a keeper step by step on a fake clock.
type keeperTest struct {
	t      testing.TB
	clk    *clocktest.Fake
	stub   *renewStub
	s      *Session
	lines  chan string
	events <-chan Event
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newKeeperTest(t testing.TB, o SessionOptions) *keeperTest {
	t.Helper()
	kt := &keeperTest{t: t, clk: clocktest.NewFake(epoch), stub: newRenewStub(t), lines: make(chan string, 256)}
	o.Clock = kt.clk
	s, err := newSession(testCtx(t), newClient(t, kt.stub.srv.URL), &o, func(l string) { kt.lines <- l })
	if err != nil {
		t.Fatal(err)
	}
	kt.s = s
	t.Cleanup(func() { s.Close(context.Background()) })
	kt.events = s.Listen(testCtx(t))
	kt.expectEvent(Connected, nil)
	return kt
}

// advance moves the clock by d and waits until the keeper has handled
// every timer that came due.
func (kt *keeperTest) advance(d time.Duration) {
	kt.clk.Advance(d)
	kt.s.sync()
}

// expect reads the keeper's next trace lines, which must be want.
func (kt *keeperTest) expect(want ...string) {
	kt.t.Helper()
	for _, w := range want {
		select {
		case got := <-kt.lines:
			if got != w {
				kt.t.Fatalf("keeper did %q, want %q", got, w)
			}
		case <-time.After(bound):
			kt.t.Fatalf("keeper did nothing, want %q", w)
		}
	}
}

// quiet checks that the keeper did nothing (after advance's sync).
func (kt *keeperTest) quiet() {
	kt.t.Helper()
	kt.s.sync()
	select {
	case got := <-kt.lines:
		kt.t.Fatalf("keeper did %q, want nothing", got)
	default:
	}
}

func (kt *keeperTest) expectEvent(st State, err error) Event {
	kt.t.Helper()
	select {
	case ev, ok := <-kt.events:
		if !ok {
			kt.t.Fatalf("listener closed, want %v", st)
		}
		if ev.State != st || (err != nil && ev.Err != err) {
			kt.t.Fatalf("event %v (%v), want %v (%v)", ev.State, ev.Err, st, err)
		}
		if !ev.At.Equal(kt.clk.Now()) {
			kt.t.Fatalf("event %v at %v, want now (%v)", ev.State, ev.At.Sub(epoch), kt.clk.Now().Sub(epoch))
		}
		return ev
	case <-time.After(bound):
		kt.t.Fatalf("no event, want %v", st)
		return Event{}
	}
}

// cutProxy forwards to a server until cut: then it answers 500 (mode
// "fail") or holds requests until they are abandoned (mode "hang").
type cutProxy struct {
	srv  *httptest.Server
	mode atomic.Value // "", "fail", "hang"
}

func newCutProxy(t testing.TB, target string) *cutProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &cutProxy{}
	p.mode.Store("")
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p.mode.Load().(string) {
		case "fail":
			http.Error(w, "No cluster leader", http.StatusInternalServerError)
		case "hang":
			<-r.Context().Done()
		default:
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *cutProxy) set(mode string) { p.mode.Store(mode) }

// server is an in-process holdfast server on a fake clock, with a client
// straight to it.
type server struct {
	*servertest.Server
	c *api.Client
}

func newServer(t testing.TB) *server {
	srv := servertest.New(t, servertest.Options{})
	return &server{Server: srv, c: newClient(t, srv.Addr)}
}

// session makes a keeper on the server's clock with no lock-delay unless
// o says otherwise.
func (srv *server) session(t testing.TB, o *SessionOptions) *Session {
	t.Helper()
	var opts SessionOptions
	if o != nil {
		opts = *o
	}
	if opts.Clock == nil {
		opts.Clock = srv.Clock
	}
	if opts.TTL == 0 {
		opts.TTL = 10 * time.Second
	}
	if opts.LockDelay == 0 {
		opts.LockDelay = -1
	}
	c := srv.c
	s, err := NewSession(testCtx(t), c, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}
