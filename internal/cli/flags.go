package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/holdfast/holdfast/api"
)

// subcommand is one verb of a command group such as "kv put".
type subcommand struct {
	synopsis string
	run      func(ctx context.Context, stdio Stdio, args []string) error
}

// dispatch runs the verb named by args[0] from subs. With no verb, or an
// unknown one, it prints the group's usage and fails; -h prints it and
// succeeds.
func dispatch(ctx context.Context, stdio Stdio, group string, subs map[string]subcommand, args []string) error {
	rest, help := splitHelp(args)
	if len(rest) > 0 && rest[0] == "help" {
		rest, help = rest[1:], true
	}
	if len(rest) == 0 {
		groupUsage(stdio.Err, group, subs)
		if help {
			return nil
		}
		return &ExitError{Code: 1, Msg: fmt.Sprintf("%s: missing subcommand", group), Silent: true}
	}
	sub, ok := subs[rest[0]]
	if !ok {
		groupUsage(stdio.Err, group, subs)
		return &ExitError{Code: 1, Msg: fmt.Sprintf("unknown command %q", group+" "+rest[0])}
	}
	if help {
		// As in Consul's CLI, a help flag anywhere before "--" shows the
		// subcommand's help and runs nothing. The words after the
		// subcommand follow the flag, so that a group's help reaches its
		// own subcommand (operator raft list-peers -h), and a command's
		// flag parsing stops at the -h before any argument.
		return sub.run(ctx, stdio, append([]string{"-h"}, rest[1:]...))
	}
	return sub.run(ctx, stdio, args[1:])
}

func groupUsage(w io.Writer, group string, subs map[string]subcommand) {
	names := make([]string, 0, len(subs))
	for n := range subs {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 10
	for _, n := range names {
		width = max(width, len(n))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: holdfast %s <subcommand> [options] [args]\n\nSubcommands:\n", group)
	for _, n := range names {
		fmt.Fprintf(&b, "    %-*s %s\n", width, n, subs[n].synopsis)
	}
	io.WriteString(w, b.String())
}

// newFlagSet returns a single-dash flag set whose errors and usage go to
// stdio.Err. usage is printed before the flag list.
func newFlagSet(stdio Stdio, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdio.Err)
	fs.Usage = func() {
		io.WriteString(stdio.Err, strings.TrimLeft(usage, "\n"))
		io.WriteString(stdio.Err, "\nOptions:\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs. done is true when the command should
// stop: after -h (err nil, exit 0) or on a bad flag (err set, exit 1; the
// flag package has already printed the problem and the usage).
func parseFlags(fs *flag.FlagSet, args []string) (done bool, err error) {
	err = fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return true, nil
	}
	if err != nil {
		return true, &ExitError{Code: 1, Msg: err.Error(), Silent: true}
	}
	return false, nil
}

// httpFlags are the flags that say how to reach the agent.
type httpFlags struct {
	addr       string
	token      string
	tokenFile  string
	datacenter string
	// stale lets any server answer a read; every command takes it, as
	// every consul command does, and the ones that only write ignore it.
	stale bool
}

func (h *httpFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.addr, "http-addr", "",
		"Address of the holdfast agent's HTTP API, as host:port or an http:// or https:// URL. "+
			"Defaults to $HOLDFAST_HTTP_ADDR, then $CONSUL_HTTP_ADDR, then "+api.DefaultAddress+".")
	fs.StringVar(&h.token, "token", "", "ACL token to send with requests (X-Consul-Token).")
	fs.StringVar(&h.tokenFile, "token-file", "", "File whose contents are the ACL token to send (as -token).")
	fs.StringVar(&h.datacenter, "datacenter", "", "Datacenter to query. Defaults to the agent's.")
	fs.BoolVar(&h.stale, "stale", false, "Let any server answer a read, possibly with stale data.")
}

// client builds an API client from the flags and stdio's environment
// (never the process environment directly).
func (h *httpFlags) client(stdio Stdio) (*api.Client, error) {
	cfg := api.ConfigFromEnv(stdio.getenv)
	if h.addr != "" {
		cfg.Address = h.addr
	}
	cfg.Token = h.token
	if h.tokenFile != "" && h.token == "" {
		b, err := os.ReadFile(h.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("reading -token-file: %w", err)
		}
		cfg.Token = strings.TrimSpace(string(b))
	}
	cfg.Datacenter = h.datacenter
	return api.NewClient(cfg)
}

// connectError is what a command prints when the client cannot be built.
func connectError(stdio Stdio, err error) error {
	return fail(stdio, fmt.Sprintf("Error connecting to Consul agent: %s", err))
}

// say prints one line to stdout, like the "Info" output of Consul's CLI.
func say(stdio Stdio, line string) {
	io.WriteString(stdio.Out, line+"\n")
}

// parseNoArgs parses args into fs for a command that takes no arguments.
// done is true when the command ends here: its help was shown (err nil),
// or a flag or an argument was wrong (err says so, already printed).
func parseNoArgs(stdio Stdio, fs *flag.FlagSet, args []string) (done bool, err error) {
	if done, err := parseFlags(fs, args); done {
		return true, err
	}
	if n := fs.NArg(); n > 0 {
		return true, fail(stdio, fmt.Sprintf("Error! Too many arguments (expected 0, got %d)", n))
	}
	return false, nil
}

// fail prints one line to stderr and returns the exit error for it: code 1,
// already printed.
func fail(stdio Stdio, line string) error {
	io.WriteString(stdio.Err, line+"\n")
	return &ExitError{Code: 1, Msg: line, Silent: true}
}

// optDuration is a duration flag that remembers whether it was given, so
// that an explicit 0 can be told from the default.
type optDuration struct {
	d   time.Duration
	set bool
}

func (o *optDuration) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.d.String()
}

func (o *optDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("parse error")
	}
	o.d, o.set = d, true
	return nil
}

// stringList is a flag that may be repeated; each use appends.
type stringList []string

func (l *stringList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}
