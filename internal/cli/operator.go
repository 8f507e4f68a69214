package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/holdfast/holdfast/api"
)

var operatorCommands = map[string]subcommand{
	"raft": {"Inspect and change the servers' raft configuration", runOperatorRaft},
}

var operatorRaftCommands = map[string]subcommand{
	"list-peers":  {"List the servers of the raft configuration", runRaftListPeers},
	"remove-peer": {"Remove a server that is gone for good from the raft configuration", runRaftRemovePeer},
}

func runOperator(ctx context.Context, stdio Stdio, args []string) error {
	return dispatch(ctx, stdio, "operator", operatorCommands, args)
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

func runRaftListPeers(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "operator raft list-peers", raftListPeersUsage)
	var hf httpFlags
	hf.register(fs)
	if done, err := parseNoArgs(stdio, fs, args); done {
		return err
	}
	cl, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conf, err := cl.Operator().RaftGetConfiguration(ctx, &api.QueryOptions{AllowStale: hf.stale})
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
	fs := newFlagSet(stdio, "operator raft remove-peer", raftRemovePeerUsage)
	var hf httpFlags
	hf.register(fs)
	id := fs.String("id", "", "Raft ID (the node name) of the server to remove.")
	addr := fs.String("address", "", "Raft address (host:port) of the server to remove.")
	if done, err := parseNoArgs(stdio, fs, args); done {
		return err
	}
	if (*id == "") == (*addr == "") {
		return fail(stdio, "Error! Give exactly one of -id and -address")
	}
	cl, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if *id != "" {
		if err := cl.Operator().RaftRemovePeerByID(ctx, *id, nil); err != nil {
			return fail(stdio, fmt.Sprintf("Error removing peer: %v", err))
		}
		say(stdio, fmt.Sprintf("Removed peer with id %q", *id))
		return nil
	}
	if err := cl.Operator().RaftRemovePeerByAddress(ctx, *addr, nil); err != nil {
		return fail(stdio, fmt.Sprintf("Error removing peer: %v", err))
	}
	say(stdio, fmt.Sprintf("Removed peer with address %q", *addr))
	return nil
}
