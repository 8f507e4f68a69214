// Package e2e tests the holdfast binary as users run it: TestMain builds
// cmd/holdfast once, and each test starts real `holdfast agent` processes
// on loopback ports and drives them through HTTP and Consul's own Go
// client (github.com/hashicorp/consul/api). Every process a test starts is
// killed when the test ends. Waits are real here, so each one is a poll or
// a blocking query with a deadline.
//
// go test -short skips the package.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// binPath is the holdfast binary built by TestMain; "" under -short.
var binPath string

// startTimeout bounds how long an agent may take to print its address and
// to become a leader with its node registered.
const startTimeout = 30 * time.Second

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "holdfast-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "holdfast")
	goBin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	build := exec.Command(goBin, "build", "-o", binPath, "../cmd/holdfast")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building holdfast:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// Agents that gossip must do it on a port of their own: ask for a
	// free one if this build has the flag.
	usage, _ := exec.Command(binPath, "agent", "-h").CombinedOutput()
	hasSerfAddr = bytes.Contains(usage, []byte("-serf-addr"))
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// hasSerfAddr is set when the agent takes -serf-addr (its gossip address).
var hasSerfAddr bool

// agent is a running `holdfast agent` process.
type agent struct {
	t        *testing.T
	cmd      *exec.Cmd
	node     string
	httpAddr string // host:port the agent reported
	raftAddr string
	dataDir  string // "" for -dev
	stdout   *syncBuffer
	stderr   *syncBuffer
	done     chan struct{} // closed when the process has exited
	waitErr  error         // set before done is closed
}

// agentOpts say how to start an agent.
type agentOpts struct {
	dev      bool
	dataDir  string
	node     string
	raftAddr string   // default: a free loopback port
	extra    []string // more flags
}

// startAgent starts an agent and waits until it reports its address, leads
// and has registered its node (so sessions with defaults work). The process
// is killed when the test ends, if it is still running.
func startAgent(t *testing.T, o agentOpts) *agent {
	t.Helper()
	a := launchAgent(t, o)
	a.waitReady()
	return a
}

// launchAgent starts an agent and returns as soon as it has said where it
// listens, which it does before it has elected itself or replayed its log.
func launchAgent(t *testing.T, o agentOpts) *agent {
	t.Helper()
	if binPath == "" {
		t.Skip("e2e tests do not run under -short")
	}
	if o.node == "" {
		o.node = "e2e"
	}
	for attempt := 1; ; attempt++ {
		raftAddr := o.raftAddr
		if raftAddr == "" {
			raftAddr = freeAddr(t)
		}
		args := []string{"-server-addr", raftAddr}
		if hasSerfAddr {
			args = append(args, "-serf-addr", "127.0.0.1:0")
		}
		if o.dev {
			args = append(args, "-dev")
		} else {
			args = append(args, "-data-dir", o.dataDir)
		}
		a, err := tryLaunch(t, nil, o.node, append(args, o.extra...)...)
		if err != nil {
			// A raft port freeAddr picked can be taken by another process
			// before the agent binds it (an outgoing connection's port on
			// a busy machine): pick another.
			if o.raftAddr == "" && attempt < 4 && strings.Contains(err.Error(), "address already in use") {
				t.Logf("raft port %s was taken before the agent bound it; trying another", raftAddr)
				continue
			}
			t.Fatal(err)
		}
		a.raftAddr, a.dataDir = raftAddr, o.dataDir
		return a
	}
}

// launchWith starts `holdfast agent` with args after the flags every test
// agent gets (a free HTTP port, its node name, debug logs), and returns as
// soon as it says where it listens. launchAgent uses it; tests
// of gossip and client agents call it with their own flags.
func launchWith(t *testing.T, node string, args ...string) *agent {
	t.Helper()
	return launchUnder(t, nil, node, args...)
}

// launchUnder is launchWith with the agent started through a wrapper
// command (wrap[0], with wrap[1:] before the agent's own command line),
// e.g. taskset; nil starts it directly.
func launchUnder(t *testing.T, wrap []string, node string, args ...string) *agent {
	t.Helper()
	a, err := tryLaunch(t, wrap, node, args...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// tryLaunch is launchUnder, with an agent that exits before it says where
// it listens, or stays silent, an error rather than the test's end.
func tryLaunch(t *testing.T, wrap []string, node string, args ...string) (*agent, error) {
	t.Helper()
	if binPath == "" {
		t.Skip("e2e tests do not run under -short")
	}
	all := append([]string{"agent", "-http-addr", "127.0.0.1:0", "-node", node, "-log-level", "debug"}, args...)
	a := &agent{t: t, node: node, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	argv := append([]string{binPath}, all...)
	if len(wrap) > 0 {
		argv = append(append([]string(nil), wrap...), argv...)
	}
	a.cmd = exec.Command(argv[0], argv[1:]...)
	a.cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	a.cmd.SysProcAttr = procAttr()
	a.cmd.Stderr = a.stderr
	pipe, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("starting holdfast: %v", err)
	}
	t.Cleanup(func() {
		a.kill()
		if t.Failed() {
			t.Logf("agent %s stdout:\n%s\nstderr (last 4 KiB):\n%s", a.node, a.stdout.String(), tail(a.stderr.String(), 4096))
		}
	})
	addrCh := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			a.stdout.Write([]byte(line + "\n"))
			if m := httpLine.FindStringSubmatch(line); m != nil && !sent {
				addrCh <- m[1]
				sent = true
			}
		}
		io.Copy(io.Discard, pipe)
		a.waitErr = a.cmd.Wait()
		close(a.done)
	}()
	select {
	case a.httpAddr = <-addrCh:
	case <-a.done:
		return nil, fmt.Errorf("holdfast agent exited before saying where it listens: %v\nstdout:\n%s\nstderr:\n%s",
			a.waitErr, a.stdout.String(), a.stderr.String())
	case <-time.After(startTimeout):
		return nil, fmt.Errorf("holdfast agent did not say where it listens within %v; stdout:\n%s", startTimeout, a.stdout.String())
	}
	return a, nil
}

var httpLine = regexp.MustCompile(`^\s*http:\s+http://(\S+)`)

// waitReady polls the agent's health endpoint until its node's serfHealth
// check is passing in a consistent read: then it leads, has applied its
// whole log (a default-mode read may be answered by a new leader before
// that) and sessions with default checks can be created.
func (a *agent) waitReady() {
	a.t.Helper()
	deadline := time.Now().Add(startTimeout)
	url := "http://" + a.httpAddr + "/v1/health/node/" + a.node + "?consistent"
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last string
	for attempt := 0; time.Now().Before(deadline) && attempt < 5000; attempt++ {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
			if resp.StatusCode == 200 && bytes.Contains(b, []byte(`"serfHealth"`)) && bytes.Contains(b, []byte(`"passing"`)) {
				return
			}
		} else {
			last = err.Error()
		}
		select {
		case <-a.done:
			a.t.Fatalf("holdfast agent exited while starting: %v\nstderr:\n%s", a.waitErr, tail(a.stderr.String(), 4096))
		case <-tick.C:
		}
	}
	a.t.Fatalf("holdfast agent not ready within %v; last answer: %s", startTimeout, last)
}

// client returns a Consul API client for the agent, with its own
// connection pool.
func (a *agent) client() *api.Client {
	a.t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address = a.httpAddr
	cfg.Scheme = "http"
	cfg.Token = ""
	cfg.Datacenter = ""
	c, err := api.NewClient(cfg)
	if err != nil {
		a.t.Fatal(err)
	}
	return c
}

// url is the agent's base URL.
func (a *agent) url() string { return "http://" + a.httpAddr }

// kill sends SIGKILL and waits for the process to be gone.
func (a *agent) kill() {
	select {
	case <-a.done:
		return
	default:
	}
	a.cmd.Process.Kill()
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		a.t.Errorf("holdfast agent pid %d did not die of SIGKILL within 10s", a.cmd.Process.Pid)
	}
}

// terminate sends SIGTERM and returns the exit code, failing the test if
// the agent does not exit within the timeout.
func (a *agent) terminate(timeout time.Duration) int {
	a.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		a.t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-a.done:
	case <-time.After(timeout):
		a.t.Fatalf("holdfast agent did not exit within %v of SIGTERM", timeout)
	}
	return a.cmd.ProcessState.ExitCode()
}

// freeAddr returns a loopback address whose port was free a moment ago
// (raft needs a port it can advertise, so :0 will not do).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// eventually polls cond every 20ms until it is true, failing the test after
// timeout.
// waitStdout waits until the agent's stdout holds every one of want. The
// banner is read a line at a time, so when tryLaunch returns on its http
// line the lines after it may not have been read yet.
func (a *agent) waitStdout(want ...string) {
	a.t.Helper()
	eventually(a.t, startTimeout, fmt.Sprintf("agent %s prints %q", a.node, want), func() bool {
		out := a.stdout.String()
		for _, w := range want {
			if !strings.Contains(out, w) {
				return false
			}
		}
		return true
	})
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for attempt := 0; attempt < 10000; attempt++ {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	t.Fatalf("%s: not within %v", what, timeout)
}

// ctxTimeout is a context for one bounded step of a test.
func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// rawPut PUTs body to the agent and returns the status, the trimmed body
// and the headers.
func rawPut(ctx context.Context, base, path, body string) (int, string, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, "PUT", base+path, strings.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), resp.Header, err
}
