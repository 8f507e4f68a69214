package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/api/recipe"
	"github.com/holdfast/holdfast/clock"
	"golang.org/x/term"
)

// `holdfast lock` replays `consul lock`: the same flags and messages, lock
// on PREFIX/.lock for -n 1 and semaphore on PREFIX for -n > 1, so the two
// exclude each other on one prefix. It differs where consul lock lets two
// children run at once:
//
//   - It judges loss by the session keeper's safe deadline, not by the
//     first failed request: a renew that fails during a leader election
//     does not kill the child, a server that stays unreachable does.
//   - It kills the child before the server could give the lock to anyone
//     else. The keeper's margin includes the kill grace period, so that
//     SIGTERM goes out a grace period before the safe deadline and SIGKILL
//     at it, still before the session's TTL can have run out on the server.
//   - The child runs in its own process group, and signals go to the
//     group, so that a shell's children die with it (unless -pass-stdin
//     gives it a terminal to read: then it stays in the terminal's
//     foreground group, ours, and is signalled alone).
//   - A lost lock is reported on stderr even without -verbose, and the
//     command exits 1: the child did not run to its end under the lock.
//   - A hang-up (SIGHUP) stops the child and releases the lock, as
//     SIGINT and SIGTERM do.
//   - The child learns its hold's sequencer from the environment.

const lockUsage = `
Usage: holdfast lock [options] PREFIX CHILD...

  Acquires a lock or semaphore at PREFIX and runs CHILD while it is held.
  If the lock is lost, or the server stays unreachable so long that the
  server could give the lock to someone else, the child is sent SIGTERM
  and, a grace period later (a fifth of the session TTL) but still before
  that could happen, SIGKILL; "Lock lost, killing child" goes to stderr
  and the command exits 1. It exits 2 if the child fails and
  -child-exit-code is given, 1 on other errors, 0 otherwise.

  With -n 1 (the default) the lock is the key PREFIX/.lock; with -n > 1 it
  is a semaphore of that many holders on PREFIX. Either interoperates with
  consul lock and with Consul's Go client on the same prefix.

  The child's environment has HOLDFAST_LOCK_HELD=true and
  CONSUL_LOCK_HELD=true, and the hold's sequencer: HOLDFAST_LOCK_KEY,
  HOLDFAST_LOCK_INDEX and HOLDFAST_LOCK_SESSION. Pass them to what the
  child writes to, so that it can refuse a stale holder (GET
  /v1/fence/<key>?session=S&lock-index=N). With -n > 1 they name the
  semaphore's .lock key and the index of the write that granted the slot;
  the server checks those as it checks a lock's.
`

// Environment variables the child gets.
const (
	envLockHeld       = "HOLDFAST_LOCK_HELD"
	envConsulLockHeld = "CONSUL_LOCK_HELD"
	envLockKey        = "HOLDFAST_LOCK_KEY"
	envLockIndex      = "HOLDFAST_LOCK_INDEX"
	envLockSession    = "HOLDFAST_LOCK_SESSION"
)

func runLock(ctx context.Context, stdio Stdio, args []string) error {
	return (&lockCmd{clk: clock.Real()}).run(ctx, stdio, args)
}

// lockCmd is one run of `holdfast lock`. Tests give it a fake clock and
// hooks.
type lockCmd struct {
	clk clock.Clock
	// sessionHook, if set, is called with the session once it exists.
	sessionHook func(*recipe.Session)
}

// held is what lock and semaphore holds have in common here.
type held interface {
	Sequencer() recipe.Sequencer
	Lost() <-chan struct{}
}

func (c *lockCmd) run(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "lock", lockUsage)
	var hf httpFlags
	hf.register(fs)
	limit := fs.Int("n", 1, "Number of holders at once. Above 1 the lock is a semaphore.")
	name := fs.String("name", "", "Name of the session. Default: one made from the child command and prefix.")
	timeout := fs.Duration("timeout", 0, `Maximum time to wait for the lock, such as "30s"; 0 waits forever.`)
	try := fs.Duration("try", 0, "Deprecated: the old name of -timeout, kept as consul lock keeps it.")
	monitorRetry := fs.Int("monitor-retry", 3, "Accepted for compatibility with consul lock. holdfast rides out "+
		"unavailability until the session's safe deadline instead of counting errors.")
	childExitCode := fs.Bool("child-exit-code", false, "Exit 2 if the child exits with an error.")
	passStdin := fs.Bool("pass-stdin", false, "Pass stdin to the child.")
	shell := fs.Bool("shell", true, "Run the child through a shell ($SHELL, else /bin/sh).")
	verbose := fs.Bool("verbose", false, "Say what is happening.")
	ttl := fs.Duration("ttl", recipe.DefaultSessionTTL, "TTL of the lock's session (holdfast only).")
	if done, err := parseFlags(fs, args); done {
		return err
	}
	info := func(line string) {
		if *verbose {
			say(stdio, line)
		}
	}

	if *limit <= 0 {
		return fail(stdio, "Lock holder limit must be positive")
	}
	extra := fs.Args()
	if len(extra) < 2 {
		return fail(stdio, "Key prefix and child command must be specified")
	}
	prefix := strings.TrimPrefix(extra[0], "/")
	child := extra[1:]
	if *timeout == 0 {
		*timeout = *try
	}
	if *timeout < 0 {
		return fail(stdio, "Timeout must be positive")
	}
	if *name == "" {
		*name = fmt.Sprintf("Consul lock for '%s' at '%s'", strings.Join(child, " "), prefix)
	}
	if *monitorRetry < 0 {
		return fail(stdio, "Number for 'monitor-retry' must be >= 0")
	}
	if *ttl <= 0 {
		return fail(stdio, "Session TTL must be positive")
	}

	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	if _, err := client.Agent().NodeName(ctx); err != nil {
		return fail(stdio, fmt.Sprintf("Error querying Consul agent: %s", err))
	}

	// The session: losses are judged by the safe deadline, with the kill
	// grace period folded into its margin (see the comment at the top).
	grace := *ttl / 5
	behavior := api.SessionBehaviorRelease
	if *limit > 1 {
		info(fmt.Sprintf("Setting up semaphore (limit %d) at prefix: %s", *limit, prefix))
		behavior = api.SessionBehaviorDelete
	} else {
		info(fmt.Sprintf("Setting up lock at path: %s", path.Join(prefix, recipe.DefaultSemaphoreKey)))
	}
	sess, err := recipe.NewSession(ctx, client, &recipe.SessionOptions{
		Name:     *name,
		Behavior: behavior,
		TTL:      *ttl,
		Deadline: recipe.SafeDeadline(recipe.DefaultDriftMargin(*ttl) + grace),
		Policy:   recipe.LoseOnLost,
		// Give up on an unanswered renew after a tenth of the TTL rather
		// than a fifth: the grace period shortens the time left to retry.
		RenewTimeout: *ttl / 10,
		Clock:        c.clk,
	})
	if err != nil {
		// Consul's api.Lock creates its session inside Lock, so this is an
		// acquisition failure there, and the CLI says so too.
		return fail(stdio, fmt.Sprintf("Lock acquisition failed: %s", err))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), *ttl)
		sess.Close(cctx)
		cancel()
	}()
	if c.sessionHook != nil {
		c.sessionHook(sess)
	}

	var (
		acquire func(context.Context) (held, error)
		release func(context.Context) error
		cleanup func(context.Context) error
		inUse   error
	)
	if *limit == 1 {
		l, err := recipe.NewLock(sess, path.Join(prefix, recipe.DefaultSemaphoreKey), nil)
		if err != nil {
			return fail(stdio, fmt.Sprintf("Lock setup failed: %s", err))
		}
		acquire = func(ctx context.Context) (held, error) { return l.Lock(ctx) }
		release, cleanup, inUse = l.Unlock, l.Destroy, recipe.ErrLockInUse
	} else {
		sem, err := recipe.NewSemaphore(sess, prefix, *limit, nil)
		if err != nil {
			return fail(stdio, fmt.Sprintf("Lock setup failed: %s", err))
		}
		acquire = func(ctx context.Context) (held, error) { return sem.Acquire(ctx) }
		release, cleanup, inUse = sem.Release, sem.Destroy, recipe.ErrSemaphoreInUse
	}

	info("Attempting lock acquisition")
	actx, cancel := ctx, context.CancelFunc(func() {})
	if *timeout > 0 {
		actx, cancel = context.WithTimeout(ctx, *timeout)
	}
	h, err := acquire(actx)
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return fail(stdio, "Shutdown triggered or timeout during lock acquisition")
		}
		return fail(stdio, fmt.Sprintf("Lock acquisition failed: %s", consulText(err)))
	}

	childCode, lost := 0, false
	if ctx.Err() != nil {
		errorLine(stdio, "Shutdown triggered during lock acquisition")
	} else {
		childCode, lost = c.supervise(ctx, stdio, h, child, *shell, *passStdin, *verbose, grace, info)
	}

	// Release, in a context of its own: ctx may be over (a signal).
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), *ttl)
	defer rcancel()
	if err := release(rctx); err != nil {
		return fail(stdio, fmt.Sprintf("Lock release failed: %s", err))
	}
	if err := cleanup(rctx); err != nil {
		if !errors.Is(err, inUse) {
			return fail(stdio, fmt.Sprintf("Lock cleanup failed: %s", err))
		}
		info("Cleanup aborted, lock in use")
	} else {
		info("Cleanup succeeded")
	}
	if lost {
		// Not a success whatever the child would have said: it was
		// stopped part-way, and a wrapper (holdfast lock ... || alert)
		// must be able to tell.
		return &ExitError{Code: 1, Msg: "lock lost", Silent: true}
	}
	if *childExitCode && childCode != 0 {
		return &ExitError{Code: childCode, Msg: "child failed", Silent: true}
	}
	return nil
}

// errorLine prints one line to stderr.
func errorLine(stdio Stdio, line string) {
	fmt.Fprintln(stdio.Err, line)
}

// supervise runs the child while h is held. It returns 2 if the child
// failed on its own, 0 otherwise, and whether the lock was lost (the
// child was killed for it).
func (c *lockCmd) supervise(ctx context.Context, stdio Stdio, h held, child []string, shell, passStdin, verbose bool,
	grace time.Duration, info func(string)) (code int, lost bool) {
	seq := h.Sequencer()
	var cmd *exec.Cmd
	if shell {
		sh := stdio.getenv("SHELL")
		if sh == "" {
			sh = "/bin/sh"
		}
		cmd = exec.Command(sh, "-c", strings.Join(child, " "))
	} else {
		cmd = exec.Command(child[0], child[1:]...)
	}
	cmd.Env = append(os.Environ(),
		envLockHeld+"=true",
		envConsulLockHeld+"=true",
		envLockKey+"="+seq.Key,
		envLockIndex+"="+strconv.FormatUint(seq.LockIndex, 10),
		envLockSession+"="+seq.Session,
	)
	if passStdin {
		info("Stdin passed to handler process")
		cmd.Stdin = stdio.In
	}
	cmd.Stdout, cmd.Stderr = stdio.Out, stdio.Err
	// The child leads a process group of its own, so that everything it
	// starts is stopped with it; but a child that reads our terminal
	// must stay in our group, the terminal's foreground one: any other
	// group is stopped (SIGTTIN) when it reads, and would wait for ever.
	group := !(passStdin && isTerminal(stdio.In))
	if group {
		ownProcessGroup(cmd)
	}

	info("Starting handler")
	if err := cmd.Start(); err != nil {
		errorLine(stdio, fmt.Sprintf("Error starting handler: %s", err))
		return 2, false
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	select {
	case err := <-exited:
		code := 0
		if err != nil {
			errorLine(stdio, fmt.Sprintf("Error running handler: %s", err))
			code = 2
		}
		info("Child terminated, releasing lock")
		return code, false
	case <-ctx.Done():
		info("Shutdown triggered, killing child")
	case <-h.Lost():
		// Said with or without -verbose (on stderr then), and the exit
		// status says it too: the child did not run to its end under
		// the lock.
		if verbose {
			info("Lock lost, killing child")
		} else {
			errorLine(stdio, "Lock lost, killing child")
		}
		c.kill(stdio, cmd.Process.Pid, group, exited, grace, info)
		return 0, true
	}
	c.kill(stdio, cmd.Process.Pid, group, exited, grace, info)
	return 0, false
}

// isTerminal reports whether r is a terminal.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// kill sends SIGTERM to the child (its process group, if group) and, if
// the child has not exited after grace (on the command's clock), SIGKILL.
func (c *lockCmd) kill(stdio Stdio, pid int, group bool, exited <-chan error, grace time.Duration, info func(string)) {
	t := c.clk.NewTimer(grace)
	defer t.Stop()
	info(fmt.Sprintf("Terminating child pid %d", pid))
	if err := terminateChild(pid, group); err != nil {
		errorLine(stdio, fmt.Sprintf("Failed to terminate %d: %v", pid, err))
	}
	select {
	case <-exited:
		info("Child terminated")
		return
	case <-t.C():
		info(fmt.Sprintf("Child did not exit after grace period of %v", grace))
	}
	info(fmt.Sprintf("Killing child pid %d", pid))
	if err := killChild(pid, group); err != nil {
		errorLine(stdio, fmt.Sprintf("Failed to kill %d: %v", pid, err))
	}
	<-exited
}

// consulText words the recipes' conflict errors as Consul's api package
// does ("Existing key does not match lock use"), which is what consul lock
// prints; other errors are printed as they are.
func consulText(err error) string {
	switch {
	case errors.Is(err, recipe.ErrLockConflict):
		return "Existing key does not match lock use"
	case errors.Is(err, recipe.ErrSemaphoreConflict):
		return "Existing key does not match semaphore use"
	}
	return err.Error()
}
