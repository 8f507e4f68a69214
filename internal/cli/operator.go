package cli

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/holdfast/holdfast/api"
)

var operatorCommands = map[string]subcommand{
	"raft":      {"Inspect and change the servers' raft configuration", runOperatorRaft},
	"autopilot": {"Read autopilot's settings and the servers' health", runOperatorAutopilot},
}

var operatorAutopilotCommands = map[string]subcommand{
	"get-config": {"Display the autopilot settings", runAutopilotGetConfig},
	"health":     {"Display the servers' health, as the leader judges it", runAutopilotHealth},
}

var operatorRaftCommands = map[string]subcommand{
	"list-peers":      {"List the servers of the raft configuration", runRaftListPeers},
	"remove-peer":     {"Remove a server that is gone for good from the raft configuration", runRaftRemovePeer},
	"transfer-leader": {"Hand the leadership to another server", runRaftTransferLeader},
}

func runOperator(ctx context.Context, stdio Stdio, args []string) error {
	return dispatch(ctx, stdio, "operator", operatorCommands, args)
}

func runOperatorAutopilot(ctx context.Context, stdio Stdio, args []string) error {
	return dispatch(ctx, stdio, "operator autopilot", operatorAutopilotCommands, args)
}

func runOperatorRaft(ctx context.Context, stdio Stdio, args []string) error {
	return dispatch(ctx, stdio, "operator raft", operatorRaftCommands, args)
}

const raftListPeersUsage = `
Usage: holdfast operator raft list-peers [options]

  Lists the servers of the raft configuration, as the leader knows it
  (with -stale, as the agent's server knows it), and which of them leads:

      $ holdfast operator raft list-peers
      Node  ID    Address          State     Voter  RaftProtocol
      n1    n1    127.0.0.1:8300   leader    true   3
      n2    n2    127.0.0.1:8310   follower  true   3
`

// operatorRun is an operator command without arguments under way: its
// flags parsed, its client, and its context, bounded to 30 s.
type operatorRun struct {
	hf     httpFlags
	cl     *api.Client
	ctx    context.Context
	cancel context.CancelFunc
}

// startOperator parses args for the operator command name (the HTTP
// flags, and those flags adds) and builds its client. It returns nil when
// the command ends here: its help was shown (error nil), or a flag, an
// argument or the client was wrong (the error, already printed). The
// caller defers run.cancel.
func startOperator(ctx context.Context, stdio Stdio, name, usage string, args []string, flags ...func(*flag.FlagSet)) (*operatorRun, error) {
	run := &operatorRun{}
	fs := newFlagSet(stdio, name, usage)
	run.hf.register(fs)
	for _, f := range flags {
		f(fs)
	}
	if done, err := parseNoArgs(stdio, fs, args); done {
		return nil, err
	}
	cl, err := run.hf.client(stdio)
	if err != nil {
		return nil, connectError(stdio, err)
	}
	run.cl = cl
	run.ctx, run.cancel = context.WithTimeout(ctx, 30*time.Second)
	return run, nil
}

func runRaftListPeers(ctx context.Context, stdio Stdio, args []string) error {
	run, err := startOperator(ctx, stdio, "operator raft list-peers", raftListPeersUsage, args)
	if run == nil {
		return err
	}
	defer run.cancel()
	conf, err := run.cl.Operator().RaftGetConfiguration(run.ctx, &api.QueryOptions{AllowStale: run.hf.stale})
	if err != nil {
		return fail(stdio, "Error getting peers: "+err.Error())
	}
	tw := tabwriter.NewWriter(stdio.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "Node\tID\tAddress\tState\tVoter\tRaftProtocol")
	for _, s := range conf.Servers {
		st := "follower"
		if s.Leader {
			st = "leader"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\n", s.Node, s.ID, s.Address, st, s.Voter, s.ProtocolVersion)
	}
	return tw.Flush()
}

const raftRemovePeerUsage = `
Usage: holdfast operator raft remove-peer [options] -id=ID | -address=HOST:PORT

  Removes a server from the raft configuration. For a server that is gone
  for good: while a server is down it still counts towards the quorum, so
  a cluster of three with two gone takes no writes until one is back or is
  removed. A server that is still alive in the gossip pool is added back
  by the leader; stop it first.
`

func runRaftRemovePeer(ctx context.Context, stdio Stdio, args []string) error {
	var id, addr *string
	run, err := startOperator(ctx, stdio, "operator raft remove-peer", raftRemovePeerUsage, args, func(fs *flag.FlagSet) {
		id = fs.String("id", "", "Raft ID (the node name) of the server to remove.")
		addr = fs.String("address", "", "Raft address (host:port) of the server to remove.")
	})
	if run == nil {
		return err
	}
	defer run.cancel()
	if (*id == "") == (*addr == "") {
		return fail(stdio, "Error! Give exactly one of -id and -address")
	}
	if *id != "" {
		if err := run.cl.Operator().RaftRemovePeerByID(run.ctx, *id, nil); err != nil {
			return fail(stdio, fmt.Sprintf("Error removing peer: %v", err))
		}
		say(stdio, fmt.Sprintf("Removed peer with id %q", *id))
		return nil
	}
	if err := run.cl.Operator().RaftRemovePeerByAddress(run.ctx, *addr, nil); err != nil {
		return fail(stdio, fmt.Sprintf("Error removing peer: %v", err))
	}
	say(stdio, fmt.Sprintf("Removed peer with address %q", *addr))
	return nil
}

const autopilotGetConfigUsage = `
Usage: holdfast operator autopilot get-config [options]

  Displays the autopilot settings, as Consul's get-config does. holdfast's
  are fixed (there is no set-config): a dead server is removed when a new
  one is promoted, a new server is promoted once its log has caught up,
  and health is judged with these thresholds.

      $ holdfast operator autopilot get-config
      CleanupDeadServers = true
      LastContactThreshold = 200ms
      MaxTrailingLogs = 250
      MinQuorum = 0
      ServerStabilizationTime = 0s
      RedundancyZoneTag = ""
      DisableUpgradeMigration = false
      UpgradeVersionTag = ""
`

func runAutopilotGetConfig(ctx context.Context, stdio Stdio, args []string) error {
	run, err := startOperator(ctx, stdio, "operator autopilot get-config", autopilotGetConfigUsage, args)
	if run == nil {
		return err
	}
	defer run.cancel()
	c, err := run.cl.Operator().AutopilotGetConfiguration(run.ctx, nil)
	if err != nil {
		return fail(stdio, "Error querying Autopilot configuration: "+err.Error())
	}
	fmt.Fprintf(stdio.Out, "CleanupDeadServers = %v\nLastContactThreshold = %v\nMaxTrailingLogs = %d\nMinQuorum = %d\n"+
		"ServerStabilizationTime = %v\nRedundancyZoneTag = %q\nDisableUpgradeMigration = %v\nUpgradeVersionTag = %q\n",
		c.CleanupDeadServers, c.LastContactThreshold, c.MaxTrailingLogs, c.MinQuorum,
		c.ServerStabilizationTime, c.RedundancyZoneTag, c.DisableUpgradeMigration, c.UpgradeVersionTag)
	return nil
}

const autopilotHealthUsage = `
Usage: holdfast operator autopilot health [options]

  Displays the servers' health as the leader judges it: a server is
  healthy when the gossip pool holds it alive, it heard from the leader
  within 200ms, it is in the leader's term, and its log is at most 250
  entries behind. Exits 0 when every server is healthy, 2 when one is not
  (1 on an error), so that it can serve as a check:

      $ holdfast operator autopilot health
      Node  Address          Leader  Voter  Healthy  Serf    LastContact  Term  Index  StableSince
      n1    127.0.0.1:8300   true    true   true     alive   0s           2     187    2026-11-28T19:40:02Z
      n2    127.0.0.1:8310   false   true   true     alive   12ms         2     187    2026-11-28T19:40:02Z
      n3    127.0.0.1:8320   false   true   false    failed  -            2     171    2026-11-28T19:41:17Z
      Healthy: false; failure tolerance: 0
`

func runAutopilotHealth(ctx context.Context, stdio Stdio, args []string) error {
	run, err := startOperator(ctx, stdio, "operator autopilot health", autopilotHealthUsage, args)
	if run == nil {
		return err
	}
	defer run.cancel()
	h, err := run.cl.Operator().AutopilotServerHealth(run.ctx, nil)
	if err != nil {
		return fail(stdio, "Error querying the servers' health: "+err.Error())
	}
	tw := tabwriter.NewWriter(stdio.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "Node\tAddress\tLeader\tVoter\tHealthy\tSerf\tLastContact\tTerm\tIndex\tStableSince")
	for _, s := range h.Servers {
		lc := "-"
		if s.LastContact >= 0 {
			lc = s.LastContact.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%v\t%v\t%s\t%s\t%d\t%d\t%s\n", s.Name, s.Address, s.Leader, s.Voter, s.Healthy,
			s.SerfStatus, lc, s.LastTerm, s.LastIndex, s.StableSince.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "Healthy: %v; failure tolerance: %d\n", h.Healthy, h.FailureTolerance)
	if err := tw.Flush(); err != nil {
		return err
	}
	if !h.Healthy {
		return &ExitError{Code: 2, Msg: "not every server is healthy", Silent: true}
	}
	return nil
}

const raftTransferLeaderUsage = `
Usage: holdfast operator raft transfer-leader [options] [-id=ID]

  Hands the leadership to the server with raft ID ID (its node name), or,
  without -id, to the most up-to-date follower, as consul operator raft
  transfer-leader does: before maintenance on the leader's machine, writes
  then pause for the tens of milliseconds of a handover rather than the
  second of an election.

      $ holdfast operator raft transfer-leader -id server3
      Success! Leadership transferred to server3
`

func runRaftTransferLeader(ctx context.Context, stdio Stdio, args []string) error {
	var id *string
	run, err := startOperator(ctx, stdio, "operator raft transfer-leader", raftTransferLeaderUsage, args, func(fs *flag.FlagSet) {
		id = fs.String("id", "", "Raft ID (the node name) of the server to hand the leadership to; default: the most up-to-date follower.")
	})
	if run == nil {
		return err
	}
	defer run.cancel()
	if _, err := run.cl.Operator().RaftLeaderTransfer(run.ctx, *id, nil); err != nil {
		return fail(stdio, "Error transferring leadership: "+err.Error())
	}
	to := *id
	if to == "" {
		// Tell who leads now, as far as the servers know yet.
		if conf, err := run.cl.Operator().RaftGetConfiguration(run.ctx, nil); err == nil {
			for _, s := range conf.Servers {
				if s.Leader {
					to = s.Node
				}
			}
		}
	}
	if to == "" {
		say(stdio, "Success! Leadership transferred")
		return nil
	}
	say(stdio, "Success! Leadership transferred to "+to)
	return nil
}
