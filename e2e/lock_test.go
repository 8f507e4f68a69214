package e2e

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	hapi "github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/api/recipe"
)

// These tests stop a real agent with SIGSTOP, the way a partition or a
// stalled server looks to a client: connections are accepted by the kernel
// and never answered. A proxy in the test process stands between the
// client and the agent and notes when each session renew is forwarded, so
// that the test knows the latest moment the agent can have restarted the
// session's TTL: the agent frees the session no earlier than a TTL after
// it received the last renew, which was after the proxy forwarded it.

// renewProxy forwards everything to an agent and reports, for each renew
// the agent answered with 200, when it was forwarded.
type renewProxy struct {
	srv      *httptest.Server
	answered chan time.Time
}

func newRenewProxy(t *testing.T, target string) *renewProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p := &renewProxy{answered: make(chan time.Time, 64)}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/session/renew/") {
			rp.ServeHTTP(w, r)
			return
		}
		fwd := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		rp.ServeHTTP(sw, r)
		if sw.code == http.StatusOK && r.Context().Err() == nil {
			select {
			case p.answered <- fwd:
			default:
			}
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *renewProxy) addr() string { return p.srv.Listener.Addr().String() }

// next waits for the next answered renew and returns when it was
// forwarded, discarding older ones.
func (p *renewProxy) next(t *testing.T) time.Time {
	t.Helper()
	for {
		select {
		case at := <-p.answered:
			if time.Since(at) < time.Second {
				return at
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no renew answered within 30s")
			return time.Time{}
		}
	}
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// stop freezes the agent until the returned function (also run at the end
// of the test) resumes it.
func (a *agent) stop(t *testing.T) (resume func()) {
	t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			a.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// TestKeeperWhenServerStops: with the agent stopped right after a renew,
// the keeper reports Suspended once the next renew goes unanswered, then
// Lost at the safe deadline, before the agent could have freed the
// session; the lock held under LoseOnSuspended is lost at Suspended.
func TestKeeperWhenServerStops(t *testing.T) {
	t.Parallel()
	a := startAgent(t, agentOpts{dev: true})
	proxy := newRenewProxy(t, a.url())
	ctx := ctxTimeout(t, 60*time.Second)
	client, err := hapi.NewClient(&hapi.Config{Address: proxy.addr()})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 10 * time.Second
	s, err := recipe.NewSession(ctx, client, &recipe.SessionOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	events := s.Listen(ctx)
	<-events // Connected
	l, err := recipe.NewLock(s, "e2e/keeper", nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := l.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	renewed := proxy.next(t)
	resume := a.stop(t)
	stopped := time.Now()
	t.Logf("agent stopped %v after the renew was forwarded", stopped.Sub(renewed))

	next := func() (recipe.Event, time.Time) {
		t.Helper()
		select {
		case ev := <-events:
			return ev, time.Now()
		case <-time.After(30 * time.Second):
			t.Fatal("no event within 30s")
			return recipe.Event{}, time.Time{}
		}
	}
	ev, suspendedAt := next()
	if ev.State != recipe.Suspended {
		t.Fatalf("first event %v (%v), want Suspended", ev.State, ev.Err)
	}
	// The next renew goes out TTL/2 after the last one and is abandoned
	// after the renew timeout, TTL/5.
	if d := suspendedAt.Sub(renewed); d < ttl/2 || d > ttl/2+ttl/5+time.Second {
		t.Errorf("Suspended %v after the last renew, want about %v", d, ttl/2+ttl/5)
	}
	select {
	case <-h.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the hold was not lost at Suspended")
	}
	if !errors.Is(h.Err(), recipe.ErrUntrusted) {
		t.Errorf("hold lost because %v", h.Err())
	}

	ev, lostAt := next()
	if ev.State != recipe.Lost || !errors.Is(ev.Err, recipe.ErrDeadlinePassed) {
		t.Fatalf("second event %v (%v), want Lost by the deadline", ev.State, ev.Err)
	}
	margin := recipe.DefaultDriftMargin(ttl)
	d := lostAt.Sub(renewed)
	t.Logf("Suspended after %v, Lost after %v (server frees the session no earlier than %v)",
		suspendedAt.Sub(renewed), d, ttl)
	if d >= ttl {
		t.Fatalf("Lost %v after the last renew was forwarded: the server may already have freed the session", d)
	}
	if d < ttl-margin-500*time.Millisecond {
		t.Errorf("Lost %v after the last renew, want about %v", d, ttl-margin)
	}
	resume()
}

// TestLockCommandKillsChildBeforeServerTTL runs `holdfast lock` with a
// child that ignores SIGTERM. A short stop of the agent across one renew
// leaves the child alone; a stop that lasts gets it SIGTERM and then
// SIGKILL, and it is dead before the session's TTL has run out on the
// agent, counted from the last renew the agent can have received.
func TestLockCommandKillsChildBeforeServerTTL(t *testing.T) {
	t.Parallel()
	a := startAgent(t, agentOpts{dev: true})
	proxy := newRenewProxy(t, a.url())
	const ttl = 10 * time.Second
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := exec.Command(binPath, "lock", "-verbose", "-ttl", ttl.String(), "-http-addr", proxy.addr(), "e2e/job",
		`trap "" TERM; echo $$ > `+pidFile+`; echo started; exec sleep 1000`)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	cmd.SysProcAttr = procAttr()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var out syncBuffer
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			out.Write([]byte(sc.Text() + "\n"))
			lines <- sc.Text()
		}
		cmd.Wait()
		close(exited)
	}()
	var pid int
	t.Cleanup(func() {
		if pid > 0 {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("holdfast lock stdout:\n%s\nstderr:\n%s", out.String(), stderr.String())
		}
	})
	waitLine := func(want string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case l := <-lines:
				if l == want {
					return
				}
			case <-timeout:
				t.Fatalf("holdfast lock never printed %q", want)
			}
		}
	}
	waitLine("started")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		t.Fatal(err)
	}
	alive := func() bool { return syscall.Kill(pid, 0) == nil }

	// A blip: the agent stops just before a renew and comes back 1.7s
	// later. The renew is abandoned (Suspended) and its retry answered.
	r1 := proxy.next(t)
	sleepUntil(r1.Add(ttl/2 - 200*time.Millisecond))
	resume := a.stop(t)
	sleepUntil(r1.Add(ttl/2 + 1500*time.Millisecond))
	resume()
	proxy.next(t)
	if !alive() || strings.Contains(out.String(), "Lock lost") {
		t.Fatalf("a single failed renew touched the child:\n%s", out.String())
	}

	// A stop that lasts, right after a renew.
	renewed := proxy.next(t)
	a.stop(t)
	for i := 0; alive() && i < 10000; i++ {
		if time.Since(renewed) > 2*ttl {
			t.Fatalf("child still alive %v after the agent stopped", time.Since(renewed))
		}
		time.Sleep(5 * time.Millisecond)
	}
	died := time.Since(renewed)
	t.Logf("child dead %v after the last renew was forwarded (agent TTL %v)\n%s", died, ttl, out.String())
	if died >= ttl {
		t.Fatalf("child died %v after the last renew, not before the agent's TTL of %v", died, ttl)
	}
	if died < ttl/2 {
		t.Fatalf("child killed after only %v", died)
	}
	// The command prints each line before it acts on it, but the reader
	// goroutine may not have passed the last ones on by the time the child
	// is seen dead: wait for them, in order.
	for _, want := range []string{"Lock lost, killing child", "Terminating child pid " + strconv.Itoa(pid), "Killing child pid " + strconv.Itoa(pid)} {
		waitLine(want)
	}
	pid = 0
}
