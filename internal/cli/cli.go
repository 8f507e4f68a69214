// Package cli is holdfast's command line as a library: Run takes the
// arguments and the standard streams, and returns an error instead of
// exiting, so tests drive it with buffers against an in-process server.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Stdio is the set of streams and environment a command sees.
type Stdio struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
	// Getenv reads an environment variable; nil means none are set.
	Getenv func(string) string
}

func (s Stdio) getenv(k string) string {
	if s.Getenv == nil {
		return ""
	}
	return s.Getenv(k)
}

// ExitError carries a process exit code. Its message has already been
// printed to Err when Silent is true.
type ExitError struct {
	Code   int
	Msg    string
	Silent bool
}

func (e *ExitError) Error() string { return e.Msg }

// ExitCode maps an error returned by Run to a process exit status.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return 1
}

type command struct {
	synopsis string
	run      func(ctx context.Context, io Stdio, args []string) error
}

// commands is the dispatch table; each command group lives in its own file.
var commands = map[string]command{
	"agent":    {"Run a holdfast agent (a server, or with -server=false a client)", runAgent},
	"info":     {"Show what the agent says of itself: raft, the state, gossip, runtime", runInfo},
	"keygen":   {"Make a key for the agents' gossip encryption (-encrypt)", runKeygen},
	"kv":       {"Interact with the key/value store", runKV},
	"leave":    {"Make the agent leave its pool gracefully and stop (retires a server)", runLeave},
	"lock":     {"Execute a command holding a lock", runLock},
	"members":  {"List the agents of the gossip pool and their status", runMembers},
	"operator": {"Operate the servers' cluster: its raft configuration and autopilot", runOperator},
	"session":  {"Create, inspect, renew and destroy sessions", runSession},
	"snapshot": {"Save, restore and inspect snapshots of the server's state", runSnapshot},
}

// Run executes the command named by args[0] (args excludes the program name).
//
// As in Consul's CLI, -h, -help or --help anywhere before a "--" asks for
// the help of the command named (exit 0, nothing run, the usage printed),
// -v or --version before the command for the version, and no command or
// an unknown one prints the usage and exits 127. The child command of
// holdfast lock keeps its own -h (consul would print its help and run
// nothing, exit 0: a job that silently never ran).
func Run(ctx context.Context, args []string, stdio Stdio) error {
	n := cliWords(args)
	if len(args) > 0 && (args[0] == "version" || args[0] == "-version" || args[0] == "-v" || args[0] == "--version") {
		fmt.Fprintf(stdio.Out, "holdfast %s\n", Version)
		return nil
	}
	rest, help := splitHelp(args[:n])
	rest = append(rest, args[n:]...)
	if len(rest) > 0 && rest[0] == "help" {
		rest, help = rest[1:], true
	}
	if len(rest) == 0 {
		usage(stdio.Err)
		if help {
			return nil
		}
		return &ExitError{Code: 127, Msg: "no command given", Silent: true}
	}
	c, ok := commands[rest[0]]
	if !ok {
		usage(stdio.Err)
		return &ExitError{Code: 127, Msg: fmt.Sprintf("unknown command %q", rest[0])}
	}
	if help {
		// A command's flag set answers a leading -h with its usage; a
		// group (dispatch) finds its subcommand among the rest first.
		return c.run(ctx, stdio, append([]string{"-h"}, rest[1:]...))
	}
	return c.run(ctx, stdio, args[1:])
}

// cliWords is how many leading words of args are the command line's own,
// where -h and -v count: all of them, except that for lock they end at its
// first word that is not a flag (the prefix), after which come the child
// command's words. (A flag's value, as in "-n 2", ends them early; the
// lock command's own flag parsing still sees a -h among its flags.)
func cliWords(args []string) int {
	if len(args) == 0 || args[0] != "lock" {
		return len(args)
	}
	for i := 1; i < len(args); i++ {
		if !strings.HasPrefix(args[i], "-") || args[i] == "--" {
			return i
		}
	}
	return len(args)
}

// isHelpFlag reports whether a is one of the words that ask for help.
func isHelpFlag(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

// splitHelp returns args without the help flags that come before a "--",
// and whether there were any.
func splitHelp(args []string) (rest []string, help bool) {
	rest = make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		if isHelpFlag(a) {
			help = true
			continue
		}
		rest = append(rest, a)
	}
	return rest, help
}

// Version is the build's version string.
var Version = "0.1.0-dev"

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("Usage: holdfast <command> [args]\n\nCommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "    %-10s %s\n", n, commands[n].synopsis)
	}
	io.WriteString(w, b.String())
}
