package agent_test

// Audit of the agent's checks and registry: TTL, HTTP and TCP checks on the
// fake clock, re-registration, persistence across restarts, goroutines.
// Helpers from agent_test.go and persist_test.go (newEnv, newFakeCatalog,
// persistedAgent, ttlCheck, checksOf) are reused as they are.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/agent"
	"github.com/holdfast/holdfast/internal/state"
)

// aaNextWrite waits up to d (real time) for the next catalog write.
func aaNextWrite(cat *fakeCatalog, d time.Duration) (string, bool) {
	select {
	case w := <-cat.writes:
		return w, true
	case <-time.After(d):
		return "", false
	}
}

// aaServiceSession creates a session bound to a service check.
func aaServiceSession(t *testing.T, cat *fakeCatalog, id, check string) {
	t.Helper()
	cat.mu.Lock()
	defer cat.mu.Unlock()
	cat.idx++
	err := cat.st.SessionCreate(cat.idx, &state.Session{ID: id, Node: node, Behavior: state.BehaviorRelease,
		ServiceChecks: []state.ServiceCheck{{ID: check}}})
	if err != nil {
		t.Fatal(err)
	}
}

// Finding: re-registering a check that already runs (same ID, same
// definition, no Status) resets it to critical, and the write invalidates
// every session bound to it. Consul keeps the status and output of a check
// that is already registered (agent.addCheckLocked: "snapshot the current
// state of the health check to avoid potential flapping";
// addServiceInternal: "Restore the fields from the snapshot"), so an
// application that re-registers its service at every start, or
// periodically, as most registrators do, does not lose its locks. Seed:
// sessions are invalidated when a bound check *goes critical*; here it goes
// critical only because it was registered again.
func TestAuditAgentReregisterKeepsStatus(t *testing.T) {
	t.Run("service", func(t *testing.T) {
		e := newEnv(t)
		svc := &state.Service{ID: "web", Service: "web", Port: 80}
		defs := func() []*state.CheckDefinition {
			return []*state.CheckDefinition{{ID: "web-alive", TTL: 30 * time.Second}}
		}
		if err := e.ag.RegisterService(ctx(), svc, defs(), false); err != nil {
			t.Fatal(err)
		}
		e.cat.expect(t, "register service web web-alive=critical")
		if err := e.ag.UpdateCheck(ctx(), "web-alive", state.HealthPassing, "up"); err != nil {
			t.Fatal(err)
		}
		e.cat.expect(t, "register web-alive=passing")
		aaServiceSession(t, e.cat, "s1", "web-alive")

		e.clk.Advance(5 * time.Second)
		// The application restarts and registers the very same service.
		if err := e.ag.RegisterService(ctx(), svc, defs(), false); err != nil {
			t.Fatal(err)
		}
		w := e.cat.next(t)
		if st := e.cat.status("web-alive"); st != state.HealthPassing || !e.cat.sessionAlive("s1") {
			t.Fatalf("re-registering an unchanged service wrote %q: its passing check is now %s and the session bound to it alive=%v",
				w, st, e.cat.sessionAlive("s1"))
		}
	})
	t.Run("check", func(t *testing.T) {
		e := newEnv(t)
		if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", 30*time.Second, "")); err != nil {
			t.Fatal(err)
		}
		e.cat.expect(t, "register app=critical")
		if err := e.ag.UpdateCheck(ctx(), "app", state.HealthPassing, "up"); err != nil {
			t.Fatal(err)
		}
		e.cat.expect(t, "register app=passing")
		e.cat.session(t, "s1", "app")
		if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", 30*time.Second, "")); err != nil {
			t.Fatal(err)
		}
		w := e.cat.next(t)
		if st := e.cat.status("app"); st != state.HealthPassing || !e.cat.sessionAlive("s1") {
			t.Fatalf("re-registering an unchanged check wrote %q: the check is now %s and the session bound to it alive=%v",
				w, st, e.cat.sessionAlive("s1"))
		}
	})
}

// Finding: a TTL check restored from the state file keeps the absolute
// deadline it was saved with, however far that is from now. If the wall
// clock was stepped back while the agent was down (NTP correction, a VM
// restored from a snapshot), or the file says so, the check stays passing
// without a single update for far longer than its TTL, and so do the
// sessions (locks) bound to it. Breaks the seed (a TTL check not updated
// within its TTL goes critical, which invalidates its sessions) and
// compatibility.md §2 "A TTL means the TTL". The rest of a TTL cannot be
// more than the TTL.
func TestAuditAgentRestoredTTLNeverExceedsTTL(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.json")
	clk1 := clocktest.NewFake(epoch)
	cat := newFakeCatalog(t, clk1)
	const ttl = 10 * time.Second
	first := agent.New(agent.Config{Node: node, Clock: clk1, Catalog: cat, StateFile: file})
	if err := first.RegisterCheck(ctx(), ttlCheck("app", ttl, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register app=passing")
	cat.session(t, "s1", "app")
	first.Close()

	// The machine's clock was an hour fast and is corrected while the
	// agent is down.
	clk2 := clocktest.NewFake(epoch.Add(-time.Hour))
	second := agent.New(agent.Config{Node: node, Clock: clk2, Catalog: cat, StateFile: file})
	defer second.Close()
	if err := second.Restore(ctx()); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register app=passing")
	clk2.Advance(ttl) // a full TTL with no update since the restart
	w, ok := aaNextWrite(cat, 2*time.Second)
	if st := cat.status("app"); st != state.HealthCritical || cat.sessionAlive("s1") {
		t.Fatalf("a full TTL (%v) after the restart with no update: check %s, session alive=%v (write seen: %v %q); "+
			"it stays passing until the saved deadline, an hour away", ttl, st, cat.sessionAlive("s1"), ok, w)
	}
}

// Finding: when a TTL check whose last note is long (here exactly
// MaxOutput bytes, which an update accepts untruncated) expires, the
// output written with the critical status no longer says "TTL expired":
// truncate keeps the tail of "TTL expired (last output ...): <note>", so
// the catalog shows the application's last "all fine" note beside a
// critical status, and nothing tells the operator why it is critical.
// Fix in runner.expireIfDue: truncate the last output, then prepend.
func TestAuditAgentExpiredOutputSaysTTLExpired(t *testing.T) {
	e := newEnv(t)
	const ttl = 10 * time.Second
	if err := e.ag.RegisterCheck(ctx(), ttlCheck("app", ttl, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing")
	note := "all fine " + strings.Repeat(".", agent.MaxOutput-len("all fine "))
	if err := e.ag.UpdateCheck(ctx(), "app", state.HealthPassing, note); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register app=passing") // the first output, at once
	e.clk.Advance(ttl)
	e.cat.expect(t, "register app=critical")
	c := e.cat.st.Check(node, "app")
	if !strings.Contains(c.Output, "TTL expired") {
		t.Fatalf("expired check's output does not say the TTL expired; it starts %q", c.Output[:60])
	}
}

// Finding: a saved check that this agent refuses to register again (a
// definition it no longer accepts: a hand-edited or damaged entry, or a
// rule a newer version added) stays pending for ever: Restore fails on it,
// ForgetStale spares it because it is pending, and nothing runs it. Its
// catalog entry keeps the last status of the previous run, so a passing
// TTL check is passing for ever and the sessions bound to it are never
// invalidated: exactly what ForgetStale exists to prevent ("a TTL check
// left passing would otherwise keep the sessions bound to it alive
// forever"). The seed's contract (a TTL check not updated goes critical and
// invalidates its sessions) is lost. An entry refused as invalid should be
// dropped from pending (moved aside with a warning) so ForgetStale removes
// it, or registered critical.
func TestAuditAgentUnrestorableCheckIsNotLeftPassing(t *testing.T) {
	file, clk, cat, first := persistedAgent(t)
	if err := first.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register app=passing")
	cat.session(t, "s1", "app")
	first.Close()

	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"TTL": 10000000000`) {
		t.Fatalf("state file format changed:\n%s", b)
	}
	// The saved TTL is now one the agent refuses (below its 1s minimum).
	b = []byte(strings.Replace(string(b), `"TTL": 10000000000`, `"TTL": 1000000`, 1))
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}

	second := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file})
	defer second.Close()
	rerr := second.Restore(ctx())
	if !errors.Is(rerr, state.ErrInvalidRequest) {
		t.Logf("Restore: %v", rerr)
	}
	if err := second.ForgetStale(ctx(), checksOf(cat)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	aaNextWrite(cat, 200*time.Millisecond)
	if st := cat.status("app"); st == state.HealthPassing && cat.sessionAlive("s1") {
		t.Fatalf("an hour after a restart that could not restore it (Restore: %v), the TTL check nobody runs is still %s "+
			"in the catalog and its session is alive; agent runs %d checks", rerr, st, len(second.Checks()))
	}
}

// Confirms: HTTP checks follow redirects to a 2xx (passing), a server that
// closes the connection without answering is critical, and a check whose
// target hangs does not hold back another check's probes.
func TestAuditAgentHTTPEdgesAndHangingCheck(t *testing.T) {
	e := newEnv(t)
	var newHits, dropHits atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/old", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/new", http.StatusFound) })
	mux.HandleFunc("/new", func(w http.ResponseWriter, r *http.Request) { newHits.Add(1); w.Write([]byte("ok")) })
	mux.HandleFunc("/drop", func(w http.ResponseWriter, r *http.Request) {
		dropHits.Add(1)
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
	})
	hang := make(chan struct{})
	mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-hang:
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer close(hang)

	if err := e.ag.RegisterCheck(ctx(), &state.CheckDefinition{Name: "hang", HTTP: srv.URL + "/hang", Interval: time.Minute,
		Timeout: time.Hour, Status: state.HealthPassing}); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register hang=passing")
	if err := e.ag.RegisterCheck(ctx(), &state.CheckDefinition{Name: "redir", HTTP: srv.URL + "/old", Interval: time.Minute}); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register redir=critical")
	e.cat.expect(t, "register redir=passing")
	if err := e.ag.RegisterCheck(ctx(), &state.CheckDefinition{Name: "drop", HTTP: srv.URL + "/drop", Interval: time.Minute,
		Status: state.HealthPassing}); err != nil {
		t.Fatal(err)
	}
	e.cat.expect(t, "register drop=passing")
	e.cat.expect(t, "register drop=critical")
	if c := e.cat.st.Check(node, "redir"); !strings.Contains(c.Output, "200 OK Output: ok") {
		t.Fatalf("redirected probe output %q", c.Output)
	}
	// hang waits on its timeout, redir and drop on their intervals. A
	// count of three timers is not enough: a probe still in flight holds
	// its own ten-second timeout instead of its interval, and an Advance of
	// a minute then fires that timeout and leaves the interval unarmed.
	idle := func(round int) {
		t.Helper()
		e.timersUntil(t, fmt.Sprintf("round %d: the checks did not settle on their timers", round),
			func(now time.Time, due []time.Time) bool {
				return len(due) == 3 && !due[0].Before(now.Add(time.Minute))
			})
	}
	idle(0)
	for round := 1; round <= 3; round++ {
		e.clk.Advance(time.Minute)
		deadline := time.Now().Add(5 * time.Second)
		for (newHits.Load() < int64(round+1) || dropHits.Load() < int64(round+1)) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if newHits.Load() < int64(round+1) || dropHits.Load() < int64(round+1) {
			t.Fatalf("round %d: probes held back by the hanging check (redir %d, drop %d)", round, newHits.Load(), dropHits.Load())
		}
		idle(round)
	}
	if st := e.cat.status("hang"); st != state.HealthPassing {
		t.Fatalf("hanging check is %s before its timeout", st)
	}
	e.cat.quiet(t)
}

// Confirms: after many register/deregister cycles of HTTP checks whose
// target hangs, and of TTL checks, no goroutine of the agent is left.
func TestAuditAgentNoGoroutineLeak(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	cat := newFakeCatalog(t, clk)
	go func() {
		for range cat.writes {
		}
	}()
	var hits atomic.Int64
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		select {
		case <-r.Context().Done():
		case <-hang:
		}
	}))
	ag := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat})
	runtime.GC()
	base := runtime.NumGoroutine()
	for i := 0; i < 50; i++ {
		if err := ag.RegisterCheck(ctx(), &state.CheckDefinition{Name: "h", HTTP: srv.URL, Interval: time.Second}); err != nil {
			t.Fatal(err)
		}
		// Replace it while its probe hangs, then remove it.
		if err := ag.RegisterCheck(ctx(), &state.CheckDefinition{Name: "h", HTTP: srv.URL + "/x", Interval: time.Second}); err != nil {
			t.Fatal(err)
		}
		if err := ag.RegisterService(ctx(), &state.Service{Service: "web"},
			[]*state.CheckDefinition{{TTL: time.Minute}, {TCP: "127.0.0.1:1", Interval: time.Second}}, false); err != nil {
			t.Fatal(err)
		}
		if err := ag.DeregisterCheck(ctx(), "h"); err != nil {
			t.Fatal(err)
		}
		if err := ag.DeregisterService(ctx(), "web"); err != nil {
			t.Fatal(err)
		}
	}
	if n := clk.Waiters(); n != 0 {
		t.Errorf("%d timers left on the clock", n)
	}
	close(hang)
	srv.Close()
	deadline := time.Now().Add(10 * time.Second)
	n := runtime.NumGoroutine()
	for n > base+2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > base+2 {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after 50 cycles, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
	ag.Close()
	close(cat.writes)
}

// Finding: a catalog write that hangs (a client agent's server that
// accepts the connection and never answers; HTTPCatalog's default client
// has no timeout and the runner writes with a context that is never
// cancelled) wedges the whole registry. The runner stays inside
// sync(), so runner.hold() (which takes no context) blocks for ever;
// DeregisterCheck, re-registration and DeregisterService of that check
// ignore their request's context and hang while holding regMu, so every
// later registration and Agent.Close hang too. One stuck check thus
// delays every other registration, and the ctx of DeregisterCheck (and of
// RegisterCheck/RegisterService replacing the check) is not honoured. Fix: bound each runner write (a timeout per
// sync, then retry with backoff), and let hold() give up when ctx is done.
func TestAuditAgentHungCatalogWriteHonoursContext(t *testing.T) {
	var hangWrites atomic.Bool
	var hung atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hangWrites.Load() {
			hung.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.Write([]byte("true"))
	}))
	defer srv.Close()
	var once atomic.Bool
	unblock := func() {
		hangWrites.Store(false)
		if once.CompareAndSwap(false, true) {
			close(release)
		}
	}
	defer unblock()

	clk := clocktest.NewFake(epoch)
	cat := &agent.HTTPCatalog{Base: func() (string, error) { return srv.URL, nil }, Client: srv.Client()}
	ag := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat})
	defer ag.Close()
	if err := ag.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	hangWrites.Store(true)
	clk.Advance(10 * time.Second) // the expiry's write hangs
	for deadline := time.Now().Add(5 * time.Second); hung.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if hung.Load() == 0 {
		t.Fatal("the runner's write never reached the server")
	}

	done := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx(), 300*time.Millisecond)
		defer cancel()
		done <- ag.DeregisterCheck(c, "app")
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		unblock()
		<-done
		t.Fatal("DeregisterCheck with a 300ms context was still blocked 5s later (runner.hold waits for a runner stuck in a catalog write; regMu held, so every registration and Close wait too)")
	}
}

// Finding (minor): a restart wipes every check's output. The state file
// keeps a check's status but not its output, and Restore registers the
// check again with Output "", overwriting in the catalog why a check is
// critical ("TTL expired ...", an HTTP error). Consul persists a TTL
// check's Output with its Status and Expires (persistedCheckState) and
// restores both. Fix in persist.go: save cur.Output in savedCheck and pass
// it to prepare on Restore.
func TestAuditAgentRestoreKeepsOutput(t *testing.T) {
	file, clk, cat, first := persistedAgent(t)
	if err := first.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register app=passing")
	if err := first.UpdateCheck(ctx(), "app", state.HealthPassing, "disk almost full"); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register app=passing")
	clk.Advance(10 * time.Second)
	cat.expect(t, "register app=critical")
	want := cat.st.Check(node, "app").Output
	first.Close()

	second := restoredAgent(t, file, clk, cat)
	defer second.Close()
	cat.expect(t, "register app=critical")
	if got := cat.st.Check(node, "app").Output; got != want {
		t.Fatalf("after the restart the critical check's output is %q, was %q", got, want)
	}
}
