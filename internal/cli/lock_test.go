package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	capi "github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/api/recipe"
	"github.com/holdfast/holdfast/internal/servertest"
)

// lockBound bounds every wait of these tests in real time; waits end as
// soon as what they wait for happens.
const lockBound = 20 * time.Second

// lockLines is a concurrency-safe writer that keeps what was written and
// hands out complete lines as they arrive.
type lockLines struct {
	mu    sync.Mutex
	all   strings.Builder
	part  string
	lines chan string
}

func newLockLines() *lockLines { return &lockLines{lines: make(chan string, 256)} }

func (w *lockLines) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all.Write(p)
	w.part += string(p)
	for {
		i := strings.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		w.lines <- w.part[:i]
		w.part = w.part[i+1:]
	}
	return len(p), nil
}

func (w *lockLines) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

// waitLine waits for a line for which match is true, skipping others.
func (w *lockLines) waitLine(t *testing.T, what string, match func(string) bool) string {
	t.Helper()
	timeout := time.After(lockBound)
	for {
		select {
		case l := <-w.lines:
			if match(l) {
				return l
			}
		case <-timeout:
			t.Fatalf("no line %s in:\n%s", what, w.String())
			return ""
		}
	}
}

func (w *lockLines) waitFor(t *testing.T, line string) {
	t.Helper()
	w.waitLine(t, strconv.Quote(line), func(l string) bool { return l == line })
}

// lockRun runs `holdfast lock` with args; env is its environment.
func lockRun(ctx context.Context, c *lockCmd, env map[string]string, args ...string) (out, errOut *lockLines, code int) {
	out, errOut = newLockLines(), newLockLines()
	stdio := Stdio{Out: out, Err: errOut, Getenv: func(k string) string { return env[k] }}
	err := c.run(ctx, stdio, args)
	return out, errOut, ExitCode(err)
}

func lockCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*lockBound)
	t.Cleanup(cancel)
	return ctx
}

func TestLockCommandUsageErrors(t *testing.T) {
	ctx := lockCtx(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "0", "p", "true"}, "Lock holder limit must be positive"},
		{[]string{"p"}, "Key prefix and child command must be specified"},
		{[]string{}, "Key prefix and child command must be specified"},
		{[]string{"-timeout", "-1s", "p", "true"}, "Timeout must be positive"},
		{[]string{"-monitor-retry", "-1", "p", "true"}, "Number for 'monitor-retry' must be >= 0"},
	} {
		_, errOut, code := lockRun(ctx, &lockCmd{clk: nil}, nil, tc.args...)
		if code != 1 || strings.TrimSpace(errOut.String()) != tc.want {
			t.Errorf("lock %v: exit %d, stderr %q, want %q", tc.args, code, errOut.String(), tc.want)
		}
	}
	// Nobody listening: the agent query fails first.
	_, errOut, code := lockRun(ctx, &lockCmd{}, nil, "-http-addr", "127.0.0.1:1", "p", "true")
	if code != 1 || !strings.HasPrefix(errOut.String(), "Error querying Consul agent: ") {
		t.Errorf("unreachable agent: exit %d, stderr %q", code, errOut.String())
	}
}

func TestLockCommandRunsChildWithSequencer(t *testing.T) {
	ctx := lockCtx(t)
	srv := servertest.New(t, servertest.Options{})
	env := map[string]string{"HOLDFAST_HTTP_ADDR": srv.Addr}
	var sid string
	c := &lockCmd{clk: srv.Clock, sessionHook: func(s *recipe.Session) { sid = s.ID() }}
	out, errOut, code := lockRun(ctx, c, env, "-verbose", "svc/job",
		`echo "$HOLDFAST_LOCK_HELD $CONSUL_LOCK_HELD $HOLDFAST_LOCK_KEY $HOLDFAST_LOCK_INDEX $HOLDFAST_LOCK_SESSION"`)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	want := strings.Join([]string{
		"Setting up lock at path: svc/job/.lock",
		"Attempting lock acquisition",
		"Starting handler",
		"true true svc/job/.lock 1 " + sid,
		"Child terminated, releasing lock",
		"Cleanup succeeded",
	}, "\n") + "\n"
	if out.String() != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s", out, want)
	}
	client := lockClient(t, srv.Addr)
	if p, _, _ := client.KV().Get(ctx, "svc/job/.lock", nil); p != nil {
		t.Fatalf("lock key left behind: %+v", p)
	}
	if se, _, _ := client.Session().Info(ctx, sid, nil); se != nil {
		t.Fatal("session left behind")
	}
}

func TestLockCommandSemaphore(t *testing.T) {
	ctx := lockCtx(t)
	srv := servertest.New(t, servertest.Options{})
	out, errOut, code := lockRun(ctx, &lockCmd{clk: srv.Clock}, nil, "-http-addr", srv.Addr, "-verbose", "-n", "2",
		"svc/pool", `echo "$HOLDFAST_LOCK_KEY $HOLDFAST_LOCK_INDEX"`)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 6 || lines[0] != "Setting up semaphore (limit 2) at prefix: svc/pool" ||
		!strings.HasPrefix(lines[3], "svc/pool/.lock ") || lines[5] != "Cleanup succeeded" {
		t.Fatalf("stdout:\n%s", out)
	}
	if n, err := strconv.Atoi(strings.Fields(lines[3])[1]); err != nil || n == 0 {
		t.Fatalf("sequencer index %q", lines[3])
	}
}

func TestLockCommandChildExitCode(t *testing.T) {
	ctx := lockCtx(t)
	srv := servertest.New(t, servertest.Options{})
	_, errOut, code := lockRun(ctx, &lockCmd{clk: srv.Clock}, nil, "-http-addr", srv.Addr, "-child-exit-code", "p", "exit 3")
	if code != 2 || !strings.Contains(errOut.String(), "Error running handler: exit status 3") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	_, _, code = lockRun(ctx, &lockCmd{clk: srv.Clock}, nil, "-http-addr", srv.Addr, "p", "exit 3")
	if code != 0 {
		t.Fatalf("without -child-exit-code: exit %d", code)
	}
	// -shell=false runs the command itself.
	out, _, code := lockRun(ctx, &lockCmd{clk: srv.Clock}, nil, "-http-addr", srv.Addr, "-shell=false", "p", "echo", "a  b")
	if code != 0 || out.String() != "a  b\n" {
		t.Fatalf("-shell=false: exit %d, stdout %q", code, out)
	}
}

// TestLockCommandTimeoutAgainstConsul: Consul's Lock holds PREFIX/.lock, so
// holdfast lock times out.
func TestLockCommandTimeoutAgainstConsul(t *testing.T) {
	ctx := lockCtx(t)
	srv := servertest.New(t, servertest.Options{})
	holdWithConsul(t, srv.Addr, "shared/.lock")
	_, errOut, code := lockRun(ctx, &lockCmd{clk: srv.Clock}, nil, "-http-addr", srv.Addr, "-timeout", "300ms", "shared", "true")
	if code != 1 || strings.TrimSpace(errOut.String()) != "Shutdown triggered or timeout during lock acquisition" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// holdWithConsul takes key with Consul's own api.Lock through the agent at
// addr, until the test ends.
func holdWithConsul(t *testing.T, addr, key string) {
	t.Helper()
	cfg := capi.DefaultConfig()
	cfg.Address, cfg.Scheme, cfg.Token, cfg.Datacenter = addr, "http", "", ""
	cc, err := capi.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := cc.LockKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Lock(nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Unlock() })
}

func lockClient(t *testing.T, addr string) *api.Client {
	t.Helper()
	c, err := api.NewClient(&api.Config{Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// lockProxy forwards to the server unless cut, when it answers 500.
type lockProxy struct {
	srv *httptest.Server
	cut atomic.Bool
}

func newLockProxy(t *testing.T, target string) *lockProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &lockProxy{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.cut.Load() {
			http.Error(w, "No cluster leader", http.StatusInternalServerError)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestLockCommandKillsChildBeforeServerCould drives `holdfast lock` on the
// server's fake clock through a proxy the test cuts. One failed renew does
// not touch the child; a server that stays unreachable gets it SIGTERM at
// the safe deadline and SIGKILL a grace period later, while the server
// still holds the session, so nobody else can have the lock yet.
func TestLockCommandKillsChildBeforeServerCould(t *testing.T) {
	ctx := lockCtx(t)
	srv := servertest.New(t, servertest.Options{})
	proxy := newLockProxy(t, srv.URL)
	direct := lockClient(t, srv.Addr)
	sessions := make(chan *recipe.Session, 1)
	c := &lockCmd{clk: srv.Clock, sessionHook: func(s *recipe.Session) { sessions <- s }}
	pidFile := filepath.Join(t.TempDir(), "pid")

	out, errOut := newLockLines(), newLockLines()
	done := make(chan int, 1)
	go func() {
		stdio := Stdio{Out: out, Err: errOut}
		err := c.run(ctx, stdio, []string{"-http-addr", proxy.srv.Listener.Addr().String(), "-verbose", "-ttl", "10s",
			"svc/singleton", `trap "" TERM; echo $$ > ` + pidFile + `; echo started; exec sleep 1000`})
		done <- ExitCode(err)
	}()
	var s *recipe.Session
	select {
	case s = <-sessions:
	case <-time.After(lockBound):
		t.Fatal("no session")
	}
	events := s.Listen(ctx)
	expectState := func(want recipe.State) {
		t.Helper()
		select {
		case ev := <-events:
			if ev.State != want {
				t.Fatalf("session %v, want %v", ev.State, want)
			}
		case <-time.After(lockBound):
			t.Fatalf("no %v", want)
		}
	}
	expectState(recipe.Connected)
	out.waitFor(t, "started")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t0 := s.Deadline().Add(-(10*time.Second - 150*time.Millisecond - 2*time.Second)) // the creation

	// A renew fails once (a leader election, say), then succeeds.
	proxy.cut.Store(true)
	srv.Clock.Set(t0.Add(5 * time.Second))
	expectState(recipe.Suspended)
	proxy.cut.Store(false)
	srv.Clock.Set(t0.Add(6 * time.Second))
	expectState(recipe.Reconnected)
	if !alive(pid) || strings.Contains(out.String(), "Lock lost") {
		t.Fatalf("a single failed renew touched the child:\n%s", out)
	}

	// Now the server stays unreachable. The last renew the server saw was
	// sent at +6s; it will expire the session at +16s.
	serverExpiry := t0.Add(16 * time.Second)
	dl := s.Deadline()
	if want := serverExpiry.Add(-150*time.Millisecond - 2*time.Second); !dl.Equal(want) {
		t.Fatalf("deadline +%v, want +%v", dl.Sub(t0), want.Sub(t0))
	}
	proxy.cut.Store(true)
	srv.Clock.Set(t0.Add(11 * time.Second))
	expectState(recipe.Suspended)
	srv.Clock.Set(dl.Add(-1))
	if !alive(pid) {
		t.Fatal("child killed before the deadline")
	}
	srv.Clock.Set(dl)
	expectState(recipe.Lost)
	out.waitFor(t, "Lock lost, killing child")
	out.waitFor(t, "Terminating child pid "+strconv.Itoa(pid))
	srv.Clock.Advance(2*time.Second - 1)
	if !alive(pid) {
		t.Fatal("child (ignoring SIGTERM) gone before the grace period ended")
	}
	srv.Clock.Advance(1)
	out.waitFor(t, "Killing child pid "+strconv.Itoa(pid))
	var code int
	select {
	case code = <-done:
	case <-time.After(lockBound):
		t.Fatalf("lock did not return after killing the child:\n%s", out)
	}
	if alive(pid) {
		t.Fatal("child alive after SIGKILL")
	}
	// The child died at the server's expiry minus the drift margin: the
	// session, and so the lock, was still the server's to keep.
	if now := srv.Clock.Now(); !now.Before(serverExpiry) {
		t.Fatalf("child killed at +%v, not before the server's expiry at +16s", now.Sub(t0))
	}
	se, _, err := direct.Session().Info(ctx, s.ID(), nil)
	if err != nil || se == nil {
		t.Fatalf("the server no longer has the session at the kill: %v %v", se, err)
	}
	// The server is unreachable, so the release fails.
	if code != 1 || !strings.HasPrefix(errOut.String(), "Lock release failed: ") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// Finding: holdfast lock printed the recipes' own error texts where consul
// lock prints its api package's ("recipe: existing key does not match lock
// use" for "Existing key does not match lock use"), called a session that
// could not be created a setup failure (Consul's api.Lock creates it inside
// Lock: "Lock acquisition failed: failed to create session: ..."), and did
// not know -try, consul lock's old name for -timeout.
func TestLockCommandErrorsInConsulWords(t *testing.T) {
	ctx := lockCtx(t)
	srv := servertest.New(t, servertest.Options{})
	c := lockClient(t, srv.Addr)
	if _, err := c.KV().Put(ctx, &api.KVPair{Key: "plain/.lock", Value: []byte("not a lock")}, nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string // stderr, or its prefix when it ends in ": "
	}{
		{[]string{"plain", "true"}, "Lock acquisition failed: Existing key does not match lock use"},
		{[]string{"-n", "2", "plain", "true"}, "Lock acquisition failed: Existing key does not match semaphore use"},
		{[]string{"-ttl", "5s", "p", "true"}, "Lock acquisition failed: failed to create session: "},
	} {
		_, errOut, code := lockRun(ctx, &lockCmd{clk: srv.Clock}, nil, append([]string{"-http-addr", srv.Addr}, tc.args...)...)
		got := strings.TrimSpace(errOut.String())
		if ok := got == tc.want || (strings.HasSuffix(tc.want, ": ") && strings.HasPrefix(got, tc.want)); code != 1 || !ok {
			t.Errorf("lock %v: exit %d, stderr %q; want exit 1 and %q", tc.args, code, got, tc.want)
		}
	}

	// -try is -timeout.
	holdWithConsul(t, srv.Addr, "shared/.lock")
	_, errOut, code := lockRun(ctx, &lockCmd{clk: srv.Clock}, nil, "-http-addr", srv.Addr, "-try", "300ms", "shared", "true")
	if code != 1 || strings.TrimSpace(errOut.String()) != "Shutdown triggered or timeout during lock acquisition" {
		t.Fatalf("-try 300ms on a held lock: exit %d, stderr %q", code, errOut)
	}
}

// The child of holdfast lock keeps its own -h and -v. consul treats them,
// anywhere before "--", as its own help and version flags: `consul lock
// job rsync -v a b` prints consul's version and runs nothing, exit 0, and
// a wrapper takes the job for done.
func TestLockChildKeepsItsFlags(t *testing.T) {
	ctx := lockCtx(t)
	srv := servertest.New(t, servertest.Options{})
	out, errOut := newLockLines(), newLockLines()
	err := Run(ctx, []string{"lock", "-http-addr", srv.Addr, "-shell=false", "p", "echo", "child:", "-v", "-h"},
		Stdio{Out: out, Err: errOut})
	if err != nil {
		t.Fatalf("lock: %v\nstderr: %s", err, errOut)
	}
	out.waitLine(t, "the child's output", func(l string) bool { return l == "child: -v -h" })
}
