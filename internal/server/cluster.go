package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/gossip"
)

// Clusters of servers.
//
// A server with no raft state starts in one of three ways (Config.Bootstrap):
//
//   - alone (the default): it bootstraps a configuration of itself, a
//     single voter that elects itself at once;
//   - expecting N servers (BootstrapExpect N >= 2): it waits until its gossip
//     pool holds exactly N live servers of its datacenter, none of which is
//     already in a cluster, and then bootstraps a configuration of those N.
//     Each of the N does the same with the same members, so they write the
//     same first entry, and raft elects one of them;
//   - joining (BootstrapNone): it never bootstraps, and waits for the leader
//     of the pool it joined to add it.
//
// While a server leads, the servers of its gossip pool are kept in its raft
// configuration, as Consul's leader does: a live server that is not in it
// is added without a vote and promoted to voter once its log has caught
// up (promoteLoop, a small part of what Consul's autopilot does), and one
// that left the pool gracefully or was reaped from it is removed. A server
// that failed stays a voter: it may be restarting, and taking it out would
// change the quorum under the survivors' feet. An operator removes a
// server that is gone for good with `holdfast operator raft remove-peer`.

// BootstrapMode says how a server with no raft state forms its cluster.
type BootstrapMode int

const (
	// BootstrapAlone bootstraps a cluster of this server alone.
	BootstrapAlone BootstrapMode = iota
	// BootstrapExpect waits for Config.BootstrapExpect servers in the gossip
	// pool and bootstraps a cluster of them.
	BootstrapExpect
	// BootstrapNone never bootstraps: the server waits to be added by the
	// leader of the cluster it joins.
	BootstrapNone
)

// bootstrapPoll is how often a server expecting others looks at its pool.
const bootstrapPoll = 500 * time.Millisecond

// addVoterTimeout bounds a configuration change's wait to be enqueued.
const addVoterTimeout = 10 * time.Second

// IsLeader reports whether this server is the raft leader and has applied
// everything committed before its term: writes and reads of the leader's
// kind are for it to answer.
func (s *Server) IsLeader() bool {
	return s.raft.State() == raft.Leader && s.readyForReads.Load()
}

// RaftAddr is the address raft listens on (the port chosen, if
// Config.RaftAddr asked for any).
func (s *Server) RaftAddr() string { return string(s.trans.LocalAddr()) }

// LeaderID is the leader's node name (its raft ID) and raft address, or
// empty strings while no leader is known.
func (s *Server) LeaderID() (id, addr string) {
	a, i := s.raft.LeaderWithID()
	return string(i), string(a)
}

// RaftServer is one server of the raft configuration, as Consul's
// /v1/operator/raft/configuration gives it.
type RaftServer struct {
	ID, Node, Address string
	Leader, Voter     bool
}

// RaftConfiguration is the latest raft configuration this server knows,
// and the log index it was written at as raft gives it (hashicorp/raft
// v1.7 gives 0).
func (s *Server) RaftConfiguration() ([]RaftServer, uint64, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, 0, fmt.Errorf("server: reading the raft configuration: %w", err)
	}
	_, leader := s.raft.LeaderWithID()
	var out []RaftServer
	for _, srv := range f.Configuration().Servers {
		out = append(out, RaftServer{
			ID: string(srv.ID), Node: string(srv.ID), Address: string(srv.Address),
			Leader: srv.ID == leader, Voter: srv.Suffrage == raft.Voter,
		})
	}
	return out, f.Index(), nil
}

// ErrNoSuchPeer is returned by RemovePeer for a server the configuration
// does not hold.
var ErrNoSuchPeer = errors.New("server: no such raft peer")

// ErrRemoveLeader is returned by RemovePeer for the leader itself.
var ErrRemoveLeader = errors.New("server: the server to remove is the leader")

// RemovePeer takes the server with raft ID id, or else the one at address,
// out of the raft configuration. Only the leader can; others return
// ErrNoLeader. The leader itself is not removed (ErrRemoveLeader): raft
// would stop on it while its process ran on, answering nothing, and the
// next leader would add it back as a member that never catches up; it is
// retired with a leave, which hands its leadership over first.
func (s *Server) RemovePeer(id, address string) error {
	if err := s.ready(); err != nil {
		return err
	}
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("server: reading the raft configuration: %w", err)
	}
	for _, srv := range f.Configuration().Servers {
		if (id != "" && string(srv.ID) == id) || (id == "" && string(srv.Address) == address) {
			if string(srv.ID) == s.cfg.NodeName {
				return fmt.Errorf("%w (%s): retire it with `holdfast leave -http-addr %s`, which hands its leadership over first, and the next leader takes it out",
					ErrRemoveLeader, srv.ID, s.cfg.HTTPAddr)
			}
			s.log.Info("removing a server from the raft configuration", "id", srv.ID, "address", srv.Address)
			return s.configChange(s.raft.RemoveServer(srv.ID, f.Index(), addVoterTimeout))
		}
	}
	if id != "" {
		return fmt.Errorf("%w: no server with ID %q", ErrNoSuchPeer, id)
	}
	return fmt.Errorf("%w: no server at address %q", ErrNoSuchPeer, address)
}

// configChange waits for a configuration change and maps raft's errors.
func (s *Server) configChange(f raft.IndexFuture) error {
	if err := f.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return ErrNoLeader // refused before it reached the log
		case errors.Is(err, raft.ErrLeadershipLost):
			// In the log, perhaps committed: not "No cluster leader",
			// which says nothing was done (and has it sent again).
			return &OutcomeUnknownError{Cause: err}
		case errors.Is(err, raft.ErrRaftShutdown):
			return ErrShuttingDown
		}
		return fmt.Errorf("server: changing the raft configuration: %w", err)
	}
	return nil
}

// serverMember reports whether m is a server of this datacenter, and the
// raft address it gives (its raft tag, an unspecified host replaced by its
// gossip address).
func (s *Server) serverMember(m gossip.Member) (string, bool) {
	if m.Tags["role"] != "server" || m.Tags["raft"] == "" {
		return "", false
	}
	if dc := m.Tags["dc"]; dc != "" && dc != s.cfg.Datacenter {
		return "", false
	}
	return m.TagAddr("raft"), true
}

// reconcileRaft keeps the raft configuration in step with what gossip says
// of m (called by the leader's reconcile): a live server is in it (without
// a vote until promoteLoop promotes it), one that left or was reaped is
// not. gone is true for a member the pool no longer knows.
func (s *Server) reconcileRaft(m gossip.Member, gone bool) error {
	if m.Name == s.cfg.NodeName {
		return nil
	}
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("server: reading the raft configuration: %w", err)
	}
	var cur *raft.Server
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == m.Name {
			srv := srv
			cur = &srv
		}
	}
	if gone || m.Status == gossip.StatusLeft {
		if cur == nil {
			return nil
		}
		s.log.Info("server left the pool: removing it from the raft configuration", "server", m.Name)
		return s.configChange(s.raft.RemoveServer(cur.ID, f.Index(), addVoterTimeout))
	}
	addr, ok := s.serverMember(m)
	if !ok || m.Status != gossip.StatusAlive {
		return nil
	}
	if cur != nil && string(cur.Address) == addr {
		return nil // a voter, or a non-voter promoteLoop looks after
	}
	if cur != nil && cur.Suffrage == raft.Voter {
		s.log.Info("server moved: changing its raft address", "server", m.Name, "raft", addr)
		return s.configChange(s.raft.AddVoter(raft.ServerID(m.Name), raft.ServerAddress(addr), 0, addVoterTimeout))
	}
	// A new server joins without a vote, and promoteLoop makes it a voter
	// once raft has brought its log up to the leader's: a server whose
	// raft port cannot be reached, or that is still receiving a large
	// snapshot, would otherwise count towards every write's quorum at
	// once (a cluster of one growing to two would stop taking writes).
	s.log.Info("server joined the pool: adding it to the raft configuration, without a vote until it has caught up", "server", m.Name, "raft", addr)
	return s.configChange(s.raft.AddNonvoter(raft.ServerID(m.Name), raft.ServerAddress(addr), 0, addVoterTimeout))
}

// promotePoll is how often the leader looks at its non-voters.
const promotePoll = time.Second

// caughtUpEntries is how far behind the leader's last log index a
// non-voter may be and still be promoted: a couple of raft batches.
const caughtUpEntries = 2 * maxAppendEntries

// promoteLoop runs while this server leads: every promotePoll it promotes
// to voter each non-voter that is alive in the gossip pool and whose log
// has caught up with the leader's (its own report, PeerProgress: the same
// term, and at most caughtUpEntries behind).
func (s *Server) promoteLoop(ctx context.Context) {
	for clock.Sleep(ctx, s.clk, promotePoll) == nil {
		s.promoteCaughtUp(ctx)
	}
}

// promoteCaughtUp is one look of promoteLoop.
func (s *Server) promoteCaughtUp(ctx context.Context) {
	if s.serf == nil {
		return
	}
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	var members map[string]gossip.Member
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			continue
		}
		if members == nil {
			members = make(map[string]gossip.Member)
			for _, m := range s.serf.members.Members() {
				members[m.Name] = m
			}
		}
		m, ok := members[string(srv.ID)]
		if !ok || m.Status != gossip.StatusAlive {
			continue
		}
		p, err := s.peerProgress(ctx, m)
		term, last := p.Term, p.LastIndex
		if err != nil {
			s.log.Debug("cannot ask a non-voter how far its log is", "server", srv.ID, "error", err)
			continue
		}
		myTerm, lead := s.raft.CurrentTerm(), s.raft.LastIndex()
		if term != myTerm || last+caughtUpEntries < lead {
			s.log.Debug("non-voter still catching up", "server", srv.ID, "its_last_index", last, "leader_last_index", lead)
			continue
		}
		s.log.Info("server caught up: promoting it to voter", "server", srv.ID, "its_last_index", last, "leader_last_index", lead)
		if err := s.configChange(s.raft.AddVoter(srv.ID, srv.Address, 0, addVoterTimeout)); err != nil {
			s.log.Warn("promoting a server to voter failed; will retry", "server", srv.ID, "error", err)
			continue
		}
		s.removeReplaced(srv.ID, members)
	}
}

// removeReplaced takes out of the raft configuration one voter that the
// gossip pool holds failed, now that server promoted has become a voter:
// a dead server replaced by a new one would otherwise stay a voter, and
// three servers with one replaced would be four voters of which three
// must answer every write, so a second failure would stop the cluster.
// (Consul's autopilot, with its default CleanupDeadServers, also removes
// dead servers when a new one joins.) One for each server promoted, so
// the number of voters stays as it was. A failed server is not removed
// otherwise until the pool reaps it or an operator runs remove-peer: it
// may be restarting. members is the pool by name, as promoteCaughtUp
// read it.
func (s *Server) removeReplaced(promoted raft.ServerID, members map[string]gossip.Member) {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage != raft.Voter || srv.ID == promoted || string(srv.ID) == s.cfg.NodeName ||
			members[string(srv.ID)].Status != gossip.StatusFailed {
			continue
		}
		s.log.Info("a new voter replaces a failed server: removing the failed server from the raft configuration",
			"failed", srv.ID, "new", promoted)
		if err := s.configChange(s.raft.RemoveServer(srv.ID, f.Index(), addVoterTimeout)); err != nil {
			s.log.Warn("removing a failed server failed; it stays until the pool reaps it or remove-peer", "server", srv.ID, "error", err)
		}
		return
	}
}

// peerProgress asks server m for its raft term and last log index through
// Config.PeerProgress; with none set it cannot.
func (s *Server) peerProgress(ctx context.Context, m gossip.Member) (Progress, error) {
	if s.cfg.PeerProgress == nil {
		return Progress{}, errors.New("no Config.PeerProgress to ask it with")
	}
	return s.cfg.PeerProgress(ctx, m)
}

// bootstrapLoop runs, for a server expecting Config.BootstrapExpect
// servers and with no raft state, until the cluster is formed (by it or by
// another) or the server shuts down.
func (s *Server) bootstrapLoop() {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.shutdownCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	said := ""
	for {
		done, why := s.tryBootstrap(ctx)
		if done {
			return
		}
		if why != said { // say each new reason once
			s.log.Info("waiting to bootstrap the cluster", "why", why)
			said = why
		}
		if !s.sleep(ctx, bootstrapPoll) {
			return
		}
	}
}

// tryBootstrap bootstraps the cluster if the pool holds the expected
// servers and none is in a cluster yet. done is true once this server has
// a configuration or never will bootstrap one; otherwise why says what it
// waits for.
func (s *Server) tryBootstrap(ctx context.Context) (done bool, why string) {
	if s.hasConfiguration() {
		return true, ""
	}
	want := s.cfg.BootstrapExpect
	var (
		servers []raft.Server
		others  []gossip.Member
	)
	for _, m := range s.serf.members.Members() {
		addr, ok := s.serverMember(m)
		if !ok || m.Status != gossip.StatusAlive {
			continue
		}
		if e := m.Tags["expect"]; e != strconv.Itoa(want) {
			return false, fmt.Sprintf("server %s expects %q servers, this one %d: give every server the same -bootstrap-expect", m.Name, e, want)
		}
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(m.Name), Address: raft.ServerAddress(addr)})
		if m.Name != s.cfg.NodeName {
			others = append(others, m)
		}
	}
	if len(servers) < want {
		return false, fmt.Sprintf("%d of the %d expected servers are in the gossip pool", len(servers), want)
	}
	if len(servers) > want {
		return false, fmt.Sprintf("the gossip pool holds %d servers, more than the %d expected: not bootstrapping a cluster of some of them", len(servers), want)
	}
	// One of them in a cluster already means the cluster exists: its
	// leader adds this server. Bootstrapping beside it would write a
	// different first entry at the same index and term.
	for _, m := range others {
		in, err := s.peerInCluster(ctx, m)
		if err != nil {
			return false, fmt.Sprintf("cannot ask server %s whether it is in a cluster: %v", m.Name, err)
		}
		if in {
			s.log.Info("a server of the pool is in a cluster already: waiting for its leader to add this one", "server", m.Name)
			return true, ""
		}
	}
	sort.Slice(servers, func(i, j int) bool { return servers[i].ID < servers[j].ID })
	if err := s.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		if errors.Is(err, raft.ErrCantBootstrap) {
			return true, "" // a configuration arrived meanwhile
		}
		return false, "bootstrapping failed: " + err.Error()
	}
	var names []string
	for _, srv := range servers {
		names = append(names, string(srv.ID))
	}
	s.log.Info("bootstrapped a cluster of the expected servers", "servers", strings.Join(names, ","))
	return true, ""
}

// hasConfiguration reports whether raft knows any configuration (it was
// bootstrapped, or a leader sent it one).
func (s *Server) hasConfiguration() bool {
	f := s.raft.GetConfiguration()
	return f.Error() == nil && len(f.Configuration().Servers) > 0
}

// peerInCluster asks server m whether it has a raft configuration,
// through Config.PeerInCluster; with none set it cannot.
func (s *Server) peerInCluster(ctx context.Context, m gossip.Member) (bool, error) {
	if s.cfg.PeerInCluster == nil {
		return false, errors.New("no Config.PeerInCluster to ask it with")
	}
	return s.cfg.PeerInCluster(ctx, m)
}

// TransferLeadership, while this server leads a cluster of more than one
// voter, hands the leadership to the most up-to-date follower and waits
// until it has gone (at most timeout): an agent stopping on purpose calls
// it first, so that the cluster does not wait out an election timeout
// without a leader. Requests arriving meanwhile are held (see handOver).
// It returns nil when there was nothing to hand over.
func (s *Server) TransferLeadership(timeout time.Duration) error {
	if s.raft.State() != raft.Leader || s.soleVoter() {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- s.handOver(s.raft.LeadershipTransfer) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("server: handing over the leadership: %w", err)
		}
		s.log.Info("handed the leadership over before stopping")
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("server: handing over the leadership took more than %v", timeout)
	}
}

// handoverDrain bounds the wait, before a leadership transfer, for the
// writes already on their way into raft.
const handoverDrain = 100 * time.Millisecond

// beginHandover prepares a leadership transfer, and returns what ends it
// (to call once raft's transfer has finished). raft refuses every write
// that reaches it during a transfer, though the write was sent in time, so:
// the HTTP layer is told to hold new requests (HandingOver); the writes
// already past it are let into raft and applied (within handoverDrain);
// then the gate is held, so that a straggler waits there instead of being
// refused by raft, and goes in once the transfer is over (applied if the
// transfer failed, refused "No cluster leader" if it worked, which its
// sender may send again: nothing was applied).
func (s *Server) beginHandover() (end func()) {
	s.handingOver.Add(1)
	t := s.clk.NewTimer(handoverDrain)
	select {
	case <-s.gate.idle():
	case <-t.C():
	}
	t.Stop()
	held := s.gate.hold() == nil
	return func() {
		if held {
			s.gate.pass(s.raft)
		}
		s.handingOver.Add(-1)
	}
}

// handOver runs the leadership transfer that start begins, between
// beginHandover and its end, and returns raft's answer.
func (s *Server) handOver(start func() raft.Future) error {
	defer s.beginHandover()()
	return start().Error()
}

// HandingOver reports whether this server is handing its leadership over
// (TransferLeadership, TransferLeadershipTo): raft refuses writes until
// the transfer ends, so the HTTP layer holds the requests that need a
// leader until it has, then sends them to the new leader.
func (s *Server) HandingOver() bool { return s.handingOver.Load() > 0 }

// Errors of TransferLeadershipTo.
var (
	// ErrTransferToSelf: the server named already leads.
	ErrTransferToSelf = errors.New("server: the server named is the leader already")
	// ErrTransferNonVoter: the server named does not vote, so it cannot lead.
	ErrTransferNonVoter = errors.New("server: the server named is not a voter (it is still catching up), so it cannot lead")
	// ErrNoOtherVoter: this server is the only voter.
	ErrNoOtherVoter = errors.New("server: this server is the only voter: there is no other server to hand the leadership to")
	// ErrTransferInProgress: a leadership transfer is under way already.
	ErrTransferInProgress = errors.New("server: a leadership transfer is under way already")
)

// TransferLeadershipTo hands the leadership to the voter with raft ID id,
// or, with id empty, to the most up-to-date follower, and returns once
// the other server has been told to stand for election and this one has
// stepped down (raft gives up after an election timeout). Only the leader
// can; others return ErrNoLeader. Operators use it before maintenance
// (Consul's transfer-leader).
func (s *Server) TransferLeadershipTo(id string) error {
	if err := s.ready(); err != nil {
		return err
	}
	if s.soleVoter() {
		return ErrNoOtherVoter
	}
	start := s.raft.LeadershipTransfer
	if id != "" {
		cf := s.raft.GetConfiguration()
		if err := cf.Error(); err != nil {
			return fmt.Errorf("server: reading the raft configuration: %w", err)
		}
		var target *raft.Server
		for _, srv := range cf.Configuration().Servers {
			if string(srv.ID) == id {
				target = &srv
				break
			}
		}
		switch {
		case target == nil:
			return fmt.Errorf("%w: no server with ID %q", ErrNoSuchPeer, id)
		case id == s.cfg.NodeName:
			return fmt.Errorf("%w (%s)", ErrTransferToSelf, id)
		case target.Suffrage != raft.Voter:
			return fmt.Errorf("%w (%s)", ErrTransferNonVoter, id)
		}
		start = func() raft.Future { return s.raft.LeadershipTransferToServer(target.ID, target.Address) }
	}
	s.log.Info("handing the leadership over, as an operator asked", "to", id)
	if err := s.handOver(start); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader):
			return ErrNoLeader // it did not lead: nothing was done
		case errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return ErrTransferInProgress
		case errors.Is(err, raft.ErrRaftShutdown):
			return ErrShuttingDown
		}
		return fmt.Errorf("server: handing over the leadership: %w", err)
	}
	return nil
}

// peersFile, in the data directory's raft directory, asks a server to
// recover its cluster's configuration at start (Consul's peers.json).
const peersFile = "peers.json"

// recoverPeers applies <dir>/raft/peers.json if it exists: the cluster
// lost its majority for good, and an operator lists the servers that are
// left (the same file on each of them, all stopped), as Consul's
// peers.json: [{"id": "n1", "address": "10.0.0.1:8300", "non_voter": false}].
// raft rewrites the configuration under the log (RecoverCluster), the
// file is removed, and the servers elect a leader among themselves.
func recoverPeers(cfg *Config, rc *raft.Config, f raft.FSM, st *stores, trans raft.Transport) error {
	if cfg.DataDir == "" {
		return nil
	}
	path := filepath.Join(cfg.DataDir, raftDirName, peersFile)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	conf, err := raft.ReadConfigJSON(path)
	if err != nil {
		return fmt.Errorf("%s: %v (want [{\"id\": \"node\", \"address\": \"host:port\", \"non_voter\": false}, ...])", path, err)
	}
	found := false
	for _, srv := range conf.Servers {
		if srv.ID == rc.LocalID {
			found = true
		}
	}
	if !found {
		return fmt.Errorf("%s does not list this server (ID %q): it would never be elected; list every server that is left, this one included", path, rc.LocalID)
	}
	cfg.Logger.Warn("recovering the raft configuration from "+path+": the cluster is what the file lists", "servers", len(conf.Servers))
	if err := raft.RecoverCluster(rc, f, st.log, st.stable, st.snaps, trans, conf); err != nil {
		return fmt.Errorf("recovering the raft configuration from %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("recovered the raft configuration, but cannot remove %s (remove it before the next start): %w", path, err)
	}
	return nil
}
