package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/holdfast/holdfast/api"
)

// The session commands have no consul counterpart (consul users reach for
// curl). Their messages follow the style of the kv commands: "Success! …"
// on stdout, "Error! …" on stderr with exit code 1.

var sessionCommands = map[string]subcommand{
	"create":  {"Create a session and print its ID", runSessionCreate},
	"destroy": {"Destroy a session, releasing its locks", runSessionDestroy},
	"info":    {"Show one session", runSessionInfo},
	"list":    {"List sessions", runSessionList},
	"renew":   {"Renew a session's TTL", runSessionRenew},
}

func runSession(ctx context.Context, stdio Stdio, args []string) error {
	return dispatch(ctx, stdio, "session", sessionCommands, args)
}

const sessionCreateUsage = `
Usage: holdfast session create [options]

  Creates a session and prints its ID on a line of its own, so that

      $ SID=$(holdfast session create -ttl 30s -lock-delay 0)
      $ holdfast kv put -acquire -session=$SID service/leader me

  works. Unset options take the server's defaults: the agent's node, bound
  to its serfHealth check, behaviour release, lock-delay 15s, no TTL.

  -check may be repeated; the checks given replace serfHealth (add
  -check serfHealth to keep it). -no-checks binds the session to no check:
  it then lives until destroyed, its TTL runs out, or its node leaves.
  -lock-delay 0 really turns lock-delay off.
`

func runSessionCreate(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "session create", sessionCreateUsage)
	var hf httpFlags
	hf.register(fs)
	name := fs.String("name", "", "Human-readable name of the session.")
	node := fs.String("node", "", "Node the session belongs to. Defaults to the agent's node.")
	ttl := fs.String("ttl", "", `TTL such as "30s" (between 10s and 24h); the session must be renewed within it. Default: none.`)
	behavior := fs.String("behavior", "", `What happens to held keys when the session is invalidated: "release" (default) or "delete".`)
	var lockDelay optDuration
	fs.Var(&lockDelay, "lock-delay", "How long (a `duration` such as 15s) held keys stay unlockable after invalidation; 0 disables. Default 15s.")
	var checks stringList
	fs.Var(&checks, "check", "`ID` of a health check on the node to bind the session to; may be repeated.")
	noChecks := fs.Bool("no-checks", false, "Bind the session to no health check.")
	if done, err := parseNoArgs(stdio, fs, args); done {
		return err
	}
	if *noChecks && len(checks) > 0 {
		return fail(stdio, "Error! Cannot specify both -check and -no-checks")
	}
	if lockDelay.set && lockDelay.d < 0 {
		// The API refuses a negative LockDelay; the client library would
		// send it as 0, silently turning lock-delay off.
		return fail(stdio, fmt.Sprintf("Error! Invalid -lock-delay %s: must not be negative (0 turns lock-delay off)", lockDelay.d))
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}

	se := &api.SessionEntry{Name: *name, Node: *node, TTL: *ttl, Behavior: *behavior}
	if lockDelay.set {
		se.LockDelay = lockDelay.d
		if se.LockDelay == 0 {
			// api leaves a zero LockDelay out (server default: 15s) and
			// sends a negative one as 0. The user asked for none.
			se.LockDelay = -1
		}
	}
	if len(checks) > 0 {
		se.NodeChecks = checks
	}
	if se.Name == "" && se.Node == "" && se.TTL == "" && se.Behavior == "" && se.LockDelay == 0 && se.NodeChecks == nil {
		se = nil // nothing asked for: send no body at all, like curl -X PUT
	}
	create := client.Session().Create
	if *noChecks {
		create = client.Session().CreateNoChecks
	}
	id, _, err := create(ctx, se, nil)
	if err != nil {
		return fail(stdio, fmt.Sprintf("Error! Failed to create session: %s", err))
	}
	say(stdio, id)
	return nil
}

const sessionListUsage = `
Usage: holdfast session list [options]

  Lists the sessions, or those of one node with -node, as a table.
`

func runSessionList(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "session list", sessionListUsage)
	var hf httpFlags
	hf.register(fs)
	node := fs.String("node", "", "List only the sessions of this node.")
	if done, err := parseNoArgs(stdio, fs, args); done {
		return err
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	q := &api.QueryOptions{AllowStale: hf.stale}
	var sessions []*api.SessionEntry
	if *node != "" {
		sessions, _, err = client.Session().Node(ctx, *node, q)
	} else {
		sessions, _, err = client.Session().List(ctx, q)
	}
	if err != nil {
		return fail(stdio, fmt.Sprintf("Error querying Consul agent: %s", err))
	}
	if len(sessions) == 0 {
		return nil
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tName\tNode\tBehavior\tTTL\tLockDelay\tChecks")
	for _, s := range sessions {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, orDash(s.Name), orDash(s.Node), orDash(s.Behavior),
			orDash(s.TTL), s.LockDelay, orDash(strings.Join(sessionChecks(s), ",")))
	}
	tw.Flush()
	stdio.Out.Write(b.Bytes())
	return nil
}

const sessionIDUsage = `
Usage: holdfast session %s [options] ID

  %s
`

// sessionIDArgs parses the flags of a verb that takes one session ID.
func sessionIDArgs(stdio Stdio, verb, what string, args []string) (id string, hf *httpFlags, done bool, err error) {
	fs := newFlagSet(stdio, "session "+verb, fmt.Sprintf(sessionIDUsage, verb, what))
	hf = &httpFlags{}
	hf.register(fs)
	if done, err := parseFlags(fs, args); done {
		return "", nil, true, err
	}
	switch fs.NArg() {
	case 0:
		return "", nil, true, fail(stdio, "Error! Missing session ID argument")
	case 1:
		return fs.Arg(0), hf, false, nil
	default:
		return "", nil, true, fail(stdio, fmt.Sprintf("Error! Too many arguments (expected 1, got %d)", fs.NArg()))
	}
}

func runSessionInfo(ctx context.Context, stdio Stdio, args []string) error {
	id, hf, done, err := sessionIDArgs(stdio, "info", "Shows the session with the given ID.", args)
	if done {
		return err
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	s, _, err := client.Session().Info(ctx, id, &api.QueryOptions{AllowStale: hf.stale})
	if err != nil {
		return fail(stdio, fmt.Sprintf("Error querying Consul agent: %s", err))
	}
	if s == nil {
		return fail(stdio, fmt.Sprintf("Error! Session %s not found", id))
	}
	say(stdio, detailedSession(s))
	return nil
}

// detailedSession renders s like kv get -detailed renders a key: fields in
// alphabetical order, "-" for empty ones, no final newline.
func detailedSession(s *api.SessionEntry) string {
	var service []string
	for _, c := range s.ServiceChecks {
		service = append(service, c.ID)
	}
	node := append(append([]string(nil), s.NodeChecks...), s.Checks...)
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 2, 6, ' ', 0)
	fmt.Fprintf(tw, "Behavior\t%s\n", orDash(s.Behavior))
	fmt.Fprintf(tw, "CreateIndex\t%d\n", s.CreateIndex)
	fmt.Fprintf(tw, "ID\t%s\n", s.ID)
	fmt.Fprintf(tw, "LockDelay\t%s\n", s.LockDelay)
	fmt.Fprintf(tw, "ModifyIndex\t%d\n", s.ModifyIndex)
	fmt.Fprintf(tw, "Name\t%s\n", orDash(s.Name))
	fmt.Fprintf(tw, "Node\t%s\n", orDash(s.Node))
	fmt.Fprintf(tw, "NodeChecks\t%s\n", orDash(strings.Join(node, ",")))
	fmt.Fprintf(tw, "ServiceChecks\t%s\n", orDash(strings.Join(service, ",")))
	fmt.Fprintf(tw, "TTL\t%s", orDash(s.TTL))
	tw.Flush()
	return b.String()
}

func runSessionRenew(ctx context.Context, stdio Stdio, args []string) error {
	id, hf, done, err := sessionIDArgs(stdio, "renew", "Restarts the TTL of the session with the given ID.", args)
	if done {
		return err
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	if _, _, err := client.Session().Renew(ctx, id, nil); err != nil {
		if errors.Is(err, api.ErrSessionNotFound) {
			return fail(stdio, fmt.Sprintf("Error! Session %s not found", id))
		}
		return fail(stdio, fmt.Sprintf("Error! Failed to renew session: %s", err))
	}
	say(stdio, "Success! Renewed session: "+id)
	return nil
}

func runSessionDestroy(ctx context.Context, stdio Stdio, args []string) error {
	id, hf, done, err := sessionIDArgs(stdio, "destroy",
		"Destroys the session with the given ID: its locks are released (or its keys\n  deleted) and its lock-delay starts. Destroying an unknown session succeeds.", args)
	if done {
		return err
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	if _, err := client.Session().Destroy(ctx, id, nil); err != nil {
		return fail(stdio, fmt.Sprintf("Error! Failed to destroy session: %s", err))
	}
	say(stdio, "Success! Destroyed session: "+id)
	return nil
}

// sessionChecks lists every check s is bound to.
func sessionChecks(s *api.SessionEntry) []string {
	out := append([]string(nil), s.NodeChecks...)
	out = append(out, s.Checks...)
	for _, c := range s.ServiceChecks {
		out = append(out, c.ID)
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
