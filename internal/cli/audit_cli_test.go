//go:build linux

package cli

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/api/recipe"
	"github.com/holdfast/holdfast/internal/servertest"
)

// Audit of the command line (kv, session, lock, members). Tests named
// TestAuditCLI... that carry a "Finding:" comment fail on the code as it
// stands; the others confirm behaviour that is right.

// caRun runs the CLI in process with env as its environment and a bounded
// context, and returns stdout, stderr and the exit code.
func caRun(t *testing.T, env map[string]string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stdio := Stdio{In: strings.NewReader(stdin), Out: &out, Err: &errb, Getenv: func(k string) string { return env[k] }}
	err := Run(ctx, args, stdio)
	if ee, ok := err.(*ExitError); err != nil && (!ok || !ee.Silent) {
		errb.WriteString(err.Error() + "\n")
	}
	return out.String(), errb.String(), ExitCode(err)
}

// caBinary builds the real cmd/holdfast (its main, with its signal
// handling) into a temporary directory.
func caBinary(t *testing.T) string {
	t.Helper()
	caBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "holdfast-cli-audit-")
		if err != nil {
			caBuild.err = err
			return
		}
		bin := filepath.Join(dir, "holdfast")
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		cmd := exec.Command(goTool, "build", "-o", bin, "github.com/holdfast/holdfast/cmd/holdfast")
		cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local")
		if out, err := cmd.CombinedOutput(); err != nil {
			caBuild.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		caBuild.bin = bin
	})
	if caBuild.err != nil {
		t.Fatal(caBuild.err)
	}
	return caBuild.bin
}

// caBuild is the binary the tests that need main's signal handling share,
// built once per test process and removed by TestMain.
var caBuild struct {
	once sync.Once
	bin  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if caBuild.bin != "" {
		os.RemoveAll(filepath.Dir(caBuild.bin))
	}
	os.Exit(code)
}

// caGone reports whether pid no longer runs (absent, or a zombie).
func caGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) != nil
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}

// caReadPid waits (bounded) for the child to have written its pid.
func caReadPid(t *testing.T, lines *lockLines, file string) int {
	t.Helper()
	lines.waitLine(t, "started", func(l string) bool { return strings.Contains(l, "started") })
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The child is ours to end whatever happens below.
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL); syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// caOutput gives cmd an os.Pipe for stdout and stderr (so that Wait does
// not wait for whoever else holds its write end) and collects its lines.
// The caller closes the write end after Start.
func caOutput(t *testing.T, cmd *exec.Cmd) *lockLines {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	lines := newLockLines()
	go io.Copy(lines, r)
	cmd.Stdout, cmd.Stderr = w, w
	return lines
}

// caWaitExit waits (bounded) for cmd to exit.
func caWaitExit(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(lockBound):
		t.Fatalf("%s did not exit", what)
		return nil
	}
}

// Finding: `kv put` with -acquire and -release together, or -cas together
// with -acquire/-release, silently runs only one of them (cas > acquire >
// release) and reports success: `-cas -release -session=S k v` overwrites k
// and prints "Success! Data written to: k" while the lock stays held, and
// `-acquire -release` acquires. The HTTP API refuses such a combination with
// 400 "Conflicting flags" (spec section 1) and `kv delete` refuses -cas with
// -recurse; a contradictory command line must be refused (exit 1, nothing
// sent), not half-executed.
func TestAuditCLIKVPutConflictingModes(t *testing.T) {
	for _, args := range [][]string{
		{"kv", "put", "-acquire", "-release", "-session=" + sid, "k", "v"},
		{"kv", "put", "-cas", "-modify-index=7", "-release", "-session=" + sid, "k", "v"},
		{"kv", "put", "-cas", "-modify-index=7", "-acquire", "-session=" + sid, "k", "v"},
	} {
		a := newAgentStub(t, answer{body: "true"})
		out, errs, code := runCLI(t, a, args, "")
		if code != 1 || out != "" || !strings.HasPrefix(errs, "Error! ") || len(a.seen()) != 0 {
			t.Errorf("holdfast %s\nexit %d, stdout %q, stderr %q, sent %q\nwant exit 1, an \"Error! ...\" line and no request",
				strings.Join(args, " "), code, out, errs, a.seen())
		}
	}
}

// Finding: when the lock is lost while the child runs (here: the session
// is destroyed by an operator), `holdfast lock -child-exit-code` kills the
// child and then exits 0 and, without -verbose, prints nothing at all: a
// wrapper (`holdfast lock -child-exit-code job/x ./job || alert`) cannot
// tell a job killed half-way from one that completed. Spec section 6: "2 if
// child failed and -child-exit-code"; a child terminated by SIGTERM failed.
// (consul lock has the same gap; holdfast's lock is advertised as the safer
// one.) Fix in lockCmd.supervise/kill (lock.go): return 2 when the child was
// killed, and print "Lock lost, killing child" on stderr regardless of
// -verbose.
func TestAuditCLILockLostIsNotSuccess(t *testing.T) {
	ctx := lockCtx(t)
	srv := servertest.New(t, servertest.Options{})
	sessions := make(chan *recipe.Session, 1)
	c := &lockCmd{clk: srv.Clock, sessionHook: func(s *recipe.Session) { sessions <- s }}
	out, errOut := newLockLines(), newLockLines()
	pidFile := filepath.Join(t.TempDir(), "pid")
	done := make(chan int, 1)
	go func() {
		stdio := Stdio{Out: out, Err: errOut}
		err := c.run(ctx, stdio, []string{"-http-addr", srv.Addr, "-child-exit-code", "job/x",
			"echo $$ > " + pidFile + "; echo started; exec sleep 1000"})
		done <- ExitCode(err)
	}()
	var s *recipe.Session
	select {
	case s = <-sessions:
	case <-time.After(lockBound):
		t.Fatal("no session")
	}
	pid := caReadPid(t, out, pidFile)
	if _, err := lockClient(t, srv.Addr).Session().Destroy(ctx, s.ID(), nil); err != nil {
		t.Fatal(err)
	}
	var code int
	select {
	case code = <-done:
	case <-time.After(lockBound):
		t.Fatal("lock did not return after losing the lock")
	}
	if !caGone(pid) {
		t.Fatal("child still running after the lock was lost")
	}
	if code == 0 || errOut.String() == "" {
		t.Errorf("lock lost and child killed: exit %d, stderr %q; want a non-zero exit and a message on stderr", code, errOut)
	}
}

// Finding: `holdfast lock` puts the child in a process group of its own
// (lock_unix.go ownProcessGroup) but main (cmd/holdfast/main.go) turns
// only SIGINT and SIGTERM into a shutdown. When the terminal hangs up (ssh
// session closed) the kernel sends SIGHUP to the job's process group, which
// no longer contains the child: holdfast dies of the default SIGHUP action
// without killing the child or destroying its session, and the child runs
// on, unlocked once the session's TTL lapses, next to the next holder's
// child. With consul lock the child shares the group and gets the SIGHUP
// (and consul forwards signals). Fix: in main, also catch SIGHUP (and
// SIGQUIT) as a shutdown, or forward such signals to the child's group in
// lockCmd.supervise.
func TestAuditCLILockHangupOrphansChild(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	cmd, lines, done, child := caStartLock(t, srv.Addr, "job/hup", true)

	// The terminal hangs up: SIGHUP to the job's process group.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	caWaitExit(t, done, "holdfast lock")
	if !caGone(child) {
		p, _, _ := lockClient(t, srv.Addr).KV().Get(context.Background(), "job/hup/.lock", nil)
		holder := "nobody"
		if p != nil && p.Session != "" {
			holder = "session " + p.Session + ", which nobody renews any more"
		}
		t.Errorf("holdfast lock exited on SIGHUP (%v) and left its child %d running; job/hup/.lock is held by %s; output:\n%s",
			cmd.ProcessState, child, holder, lines)
	}
}

// For contrast, SIGTERM to the real binary does what it should: the child
// is terminated, the lock released and the session destroyed.
func TestAuditCLILockSIGTERMEndsChildAndReleases(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	cmd, _, done, child := caStartLock(t, srv.Addr, "job/term", false)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	caWaitExit(t, done, "holdfast lock")
	if !caGone(child) {
		t.Fatalf("child %d survives SIGTERM of holdfast lock", child)
	}
	ctx := lockCtx(t)
	cl := lockClient(t, srv.Addr)
	if p, _, err := cl.KV().Get(ctx, "job/term/.lock", nil); err != nil || p != nil {
		t.Fatalf("lock key after SIGTERM: %+v %v", p, err)
	}
	if ss, _, err := cl.Session().List(ctx, nil); err != nil || len(ss) != 0 {
		t.Fatalf("sessions after SIGTERM: %d %v", len(ss), err)
	}
}

// caStartLock runs the real binary's `holdfast lock` on prefix at addr with
// a child that writes its pid and sleeps, in a process group of its own
// when job (as a shell runs a job), and waits for the child to start. It
// returns the command, its output, a channel that gets its Wait, and the
// child's pid.
func caStartLock(t *testing.T, addr, prefix string, job bool) (*exec.Cmd, *lockLines, <-chan error, int) {
	t.Helper()
	bin := caBinary(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := exec.Command(bin, "lock", "-http-addr", addr, prefix,
		"echo $$ > "+pidFile+"; echo started; exec sleep 1000")
	if job {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	lines := caOutput(t, cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd.Stdout.(*os.File).Close()
	t.Cleanup(func() { cmd.Process.Kill() })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, lines, done, caReadPid(t, lines, pidFile)
}

// caPty opens a pseudo-terminal pair.
func caPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		m.Close()
		t.Skipf("no pty: %v", e)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		m.Close()
		t.Skipf("no pty: %v", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("no pty: %v", err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// Finding: `holdfast lock -pass-stdin` run from a terminal never gets its
// input to the child. The child runs in a process group of its own
// (ownProcessGroup in lock_unix.go), which is a background group of the
// terminal, so its first read of the terminal stops it with SIGTTIN;
// holdfast then waits forever, holding the lock. The flag's help says "Pass
// stdin to the child"; with consul lock the child is in the foreground
// group and reads the terminal. Fix in supervise (lock.go): when stdin is a
// terminal and -pass-stdin is given, make the child's group the terminal's
// foreground group (tcsetpgrp) for its lifetime, or do not move it to a
// group of its own.
func TestAuditCLILockPassStdinFromTerminal(t *testing.T) {
	bin := caBinary(t)
	srv := servertest.New(t, servertest.Options{})
	master, slave := caPty(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := exec.Command(bin, "lock", "-pass-stdin", "-http-addr", srv.Addr, "job/tty",
		"echo $$ > "+pidFile+"; echo started; read x; echo \"got $x\"")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// holdfast runs as a shell would run it: session leader of the
	// terminal, in its foreground process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			caWaitExit(t, done, "holdfast lock")
		}
	})
	lines := newLockLines()
	go io.Copy(lines, bufio.NewReader(master))
	child := caReadPid(t, lines, pidFile)
	if _, err := master.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waitLineCh(lines, "got hello"):
	case <-time.After(10 * time.Second):
		state := "?"
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child)); err == nil {
			if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
				state = string(b[i+2])
			}
		}
		t.Fatalf("the child never read its stdin from the terminal (child state %s, T = stopped); terminal:\n%s", state, lines)
	}
	caWaitExit(t, done, "holdfast lock")
	exited = true
}

// waitLineCh delivers once a line containing s arrives.
func waitLineCh(w *lockLines, s string) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for l := range w.lines {
			if strings.Contains(l, s) {
				close(ch)
				return
			}
		}
	}()
	return ch
}

// A lock held by another holdfast lock blocks: the second command's child
// does not run until the first child exits and releases; then it runs and
// the lock is cleaned up. The child's failure is reported as exit 2 with
// -child-exit-code (spec section 6).
func TestAuditCLILockWaitsForHolder(t *testing.T) {
	ctx := lockCtx(t)
	srv := servertest.New(t, servertest.Options{})
	env := map[string]string{"HOLDFAST_HTTP_ADDR": srv.Addr}
	pr, pw := io.Pipe()
	out1, err1 := newLockLines(), newLockLines()
	done1 := make(chan int, 1)
	go func() {
		stdio := Stdio{In: pr, Out: out1, Err: err1, Getenv: func(k string) string { return env[k] }}
		done1 <- ExitCode((&lockCmd{clk: srv.Clock}).run(ctx, stdio, []string{"-pass-stdin", "job/w", "echo first; read x"}))
	}()
	out1.waitFor(t, "first")

	sessions := make(chan *recipe.Session, 1)
	out2, err2 := newLockLines(), newLockLines()
	done2 := make(chan int, 1)
	go func() {
		stdio := Stdio{Out: out2, Err: err2, Getenv: func(k string) string { return env[k] }}
		c := &lockCmd{clk: srv.Clock, sessionHook: func(s *recipe.Session) { sessions <- s }}
		done2 <- ExitCode(c.run(ctx, stdio, []string{"-child-exit-code", "job/w", "echo second; exit 7"}))
	}()
	var s2 *recipe.Session
	select {
	case s2 = <-sessions:
	case <-time.After(lockBound):
		t.Fatal("no session for the second lock")
	}
	// Wait until the second has queued behind the first (blocking reads).
	cl := lockClient(t, srv.Addr)
	qkey := "job/w/.lock/" + recipe.QueueDir + "/" + s2.ID()
	var idx uint64
	for i := 0; ; i++ {
		p, qm, err := cl.KV().Get(ctx, qkey, &api.QueryOptions{WaitIndex: idx, WaitTime: lockBound})
		if err != nil {
			t.Fatal(err)
		}
		if p != nil {
			break
		}
		if i > 50 {
			t.Fatal("the second lock never queued")
		}
		idx = qm.LastIndex
	}
	if strings.Contains(out2.String(), "second") {
		t.Fatal("second child ran while the first held the lock")
	}
	pw.Write([]byte("go\n"))
	pw.Close()
	if code := <-done1; code != 0 {
		t.Fatalf("first: exit %d, stderr %s", code, err1)
	}
	var code int
	select {
	case code = <-done2:
	case <-time.After(lockBound):
		t.Fatal("second lock never got the lock")
	}
	if code != 2 || out2.String() != "second\n" || !strings.Contains(err2.String(), "exit status 7") {
		t.Fatalf("second: exit %d, stdout %q, stderr %q", code, out2, err2)
	}
	if o, e, c := caRun(t, env, "", "kv", "get", "-recurse", "job/"); c != 0 || o != "" {
		t.Fatalf("keys left under job/: %q %q", o, e)
	}
}

// HOLDFAST_HTTP_ADDR wins over CONSUL_HTTP_ADDR, -http-addr over both, and
// the http:// form with a trailing slash works; values with newlines and
// binary bytes round-trip through a real server.
func TestAuditCLIAddressesAndValues(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	dead := "127.0.0.1:1"
	for _, env := range []map[string]string{
		{"HOLDFAST_HTTP_ADDR": srv.Addr, "CONSUL_HTTP_ADDR": dead},
		{"CONSUL_HTTP_ADDR": "http://" + srv.Addr + "/"},
	} {
		if o, e, c := caRun(t, env, "", "kv", "put", "k", "v"); c != 0 {
			t.Fatalf("env %v: %d %q %q", env, c, o, e)
		}
	}
	if o, e, c := caRun(t, map[string]string{"HOLDFAST_HTTP_ADDR": dead}, "", "kv", "get", "--http-addr="+srv.Addr, "k"); c != 0 || o != "v\n" {
		t.Fatalf("-http-addr: %d %q %q", c, o, e)
	}
	o, e, c := caRun(t, map[string]string{"HOLDFAST_HTTP_ADDR": dead}, "", "kv", "get", "k")
	if c != 1 || o != "" || !strings.HasPrefix(e, "Error querying Consul agent: ") || !strings.Contains(e, "connection refused") {
		t.Fatalf("unreachable: %d %q %q", c, o, e)
	}
	env := map[string]string{"HOLDFAST_HTTP_ADDR": srv.Addr}
	caRun(t, env, "", "kv", "put", "nl", "a\nb")
	if o, _, _ := caRun(t, env, "", "kv", "get", "-detailed", "nl"); !strings.HasSuffix(o, "Value            a\nb\n") {
		t.Fatalf("detailed newline value: %q", o)
	}
	caRun(t, env, "\x00\xff\n", "kv", "put", "bin", "-")
	if o, _, _ := caRun(t, env, "", "kv", "get", "-base64", "bin"); o != "AP8K\n" {
		t.Fatalf("binary value from stdin: %q", o)
	}
}

// Finding: Consul's CLI treats -h, -help and --help anywhere before "--"
// as a request for help (exit 0, nothing sent), -v anywhere as version, and
// answers no command or an unknown one with its usage and exit 127. holdfast
// wrote the value "-h" for `kv put k -h`, refused `kv put k v -h` as too
// many arguments, called -v an unknown command, and exited 1 for both.
// (-v counts only before the command: after it, it is a value.)
func TestAuditCLIHelpVersionAndUnknownAsConsul(t *testing.T) {
	for _, c := range []struct {
		args   []string
		code   int
		out    string // a prefix of stdout
		errHas string // in stderr
	}{
		{[]string{"kv", "put", "hk", "-h"}, 0, "", "Usage: holdfast kv put"},
		{[]string{"kv", "put", "k", "v", "-help"}, 0, "", "Usage: holdfast kv put"},
		{[]string{"kv", "-h", "get", "k"}, 0, "", "Usage: holdfast kv get"},
		{[]string{"-h", "kv"}, 0, "", "Usage: holdfast kv <subcommand>"},
		{[]string{"kv", "help"}, 0, "", "Usage: holdfast kv <subcommand>"},
		{[]string{"session", "info", "x", "--help"}, 0, "", "Usage: holdfast session info"},
		{[]string{"lock", "-h", "p", "ls"}, 0, "", "Usage: holdfast lock"},
		{[]string{"-h"}, 0, "", "Usage: holdfast <command>"},
		{[]string{"-v"}, 0, "holdfast ", ""},
		{[]string{"--version"}, 0, "holdfast ", ""},
		// After the command, -v is a word like any other (review
		// finding: `kv put k -v` printed the version and wrote nothing).
		{[]string{"kv", "put", "k", "-v"}, 0, "Success! Data written to: k", ""},
		{[]string{}, 127, "", "Usage: holdfast <command>"},
		{[]string{"bogus"}, 127, "", `unknown command "bogus"`},
		{[]string{"--bogus"}, 127, "", "Usage: holdfast <command>"},
		// After "--" the words are the child's, not the CLI's.
		{[]string{"kv", "put", "--", "k", "-h"}, 0, "Success! Data written to: k", ""},
	} {
		a := newAgentStub(t, answer{body: "true"})
		out, errs, code := runCLI(t, a, c.args, "")
		sent := a.seen()
		wantSent := strings.HasPrefix(c.out, "Success!")
		if code != c.code || !strings.HasPrefix(out, c.out) || !strings.Contains(errs, c.errHas) || (len(sent) != 0) != wantSent {
			t.Errorf("holdfast %s\nexit %d, stdout %q, stderr %q, sent %q\nwant exit %d, stdout from %q, stderr with %q, sent: %v",
				strings.Join(c.args, " "), code, out, errs, sent, c.code, c.out, c.errHas, wantSent)
		}
	}
}

// Finding: every consul command takes -stale and -token-file (its HTTP
// flags); holdfast's kv put and delete, lock and members refused -stale
// with "flag provided but not defined", and none knew -token-file.
func TestAuditCLICommonHTTPFlags(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var tokens []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		tokens = append(tokens, r.Header.Get("X-Consul-Token"))
		mu.Unlock()
		io.WriteString(w, "true")
	}))
	defer srv.Close()
	env := map[string]string{"HOLDFAST_HTTP_ADDR": srv.URL}
	for _, args := range [][]string{
		{"kv", "put", "-stale", "-token-file", tokenFile, "k", "v"},
		{"kv", "delete", "-stale", "-token-file", tokenFile, "k"},
	} {
		if out, errs, code := caRun(t, env, "", args...); code != 0 {
			t.Errorf("holdfast %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out, errs)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tokens) != 2 || tokens[0] != "s3cret" || tokens[1] != "s3cret" {
		t.Errorf("tokens sent %q; want the file's, twice", tokens)
	}
	if _, errs, code := caRun(t, env, "", "kv", "put", "-token-file", tokenFile+".missing", "k", "v"); code != 1 ||
		!strings.Contains(errs, "reading -token-file: ") {
		t.Errorf("missing token file: exit %d, stderr %q", code, errs)
	}
}
