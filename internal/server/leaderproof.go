package server

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Why raft.VerifyLeader alone is not proof enough.
//
// VerifyLeader counts, as a vote for this leader, every successful
// AppendEntries answer that the leader reads after the verification was
// registered, whenever the request it answers was sent. A leader paused
// (SIGSTOP, a long GC or VM stall) while a heartbeat was on the wire reads,
// on waking, that heartbeat's answer: written by the follower before the
// pause, so before the others elected a new leader. With the others having
// since committed writes under a newer term, a consistent read (or the
// quorum check before an early refusal) that the woken leader verifies
// against that old answer sees a state that is behind. The end-to-end test
// TestClusterResumedLeaderRefusesNothingStale caught this as a lock
// acquire refused on a key released through the new leader.
//
// The proof used here instead: a quorum of voters (this leader counting
// for itself) answered success to an AppendEntries of this leader's term
// that was *sent after* the verification began. A follower that accepts
// term T after that moment had no newer term then; since terms never go
// back and any two quorums share a voter, no leader of a newer term can
// have committed anything before the verification began. VerifyLeader is
// still called: it makes raft send heartbeats to every follower at once
// (the fresh requests that bring the proof), and its failure is final.

// ackTracker numbers the AppendEntries requests this server sends and
// keeps, for each peer, the newest one it answered with success and with
// a newer term.
type ackTracker struct {
	seq atomic.Uint64 // send order of requests and verification marks

	mu      sync.Mutex
	peers   map[raft.ServerID]peerAcks
	changed chan struct{} // closed at the next answer; nil if nobody waits
}

type peerAcks struct {
	ack     uint64 // the newest request answered with success...
	ackTerm uint64 // ...and the term it carried
	newer   uint64 // the newest request answered with a newer term
}

// next gives a request, or a verification, its place in the send order.
func (t *ackTracker) next() uint64 { return t.seq.Add(1) }

// answered records the answer to request seq sent to id.
func (t *ackTracker) answered(id raft.ServerID, seq uint64, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) {
	t.mu.Lock()
	if t.peers == nil {
		t.peers = map[raft.ServerID]peerAcks{}
	}
	p := t.peers[id]
	switch {
	case resp.Term > args.Term:
		p.newer = max(p.newer, seq)
	case resp.Success && seq > p.ack:
		p.ack, p.ackTerm = seq, args.Term
	}
	t.peers[id] = p
	if t.changed != nil {
		close(t.changed)
		t.changed = nil
	}
	t.mu.Unlock()
}

// verdict judges leadership in term since the verification numbered mark:
// confirmed once a quorum of voters (self counting for itself) answered
// success to requests of that term sent after mark; refuted once so many
// voters answered with a newer term that a quorum can no longer confirm.
// Otherwise it gives a channel closed at the next answer.
func (t *ackTracker) verdict(mark, term uint64, self raft.ServerID, voters []raft.ServerID) (confirmed, refuted bool, changed <-chan struct{}) {
	quorum := len(voters)/2 + 1
	yes, no := 0, 0
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range voters {
		p := t.peers[id]
		switch {
		case id == self:
			yes++
		case p.ack > mark && p.ackTerm == term:
			yes++
		case p.newer > mark:
			no++
		}
	}
	if yes >= quorum {
		return true, false, nil
	}
	if len(voters)-no < quorum {
		return false, true, nil
	}
	if t.changed == nil {
		t.changed = make(chan struct{})
	}
	return false, false, t.changed
}

// ackTransport is the raft transport with the answers to AppendEntries
// recorded in acks. Pipelined appends are not recorded: the heartbeats
// that VerifyLeader sends go through AppendEntries, and they suffice.
type ackTransport struct {
	raft.Transport
	acks *ackTracker
}

func (a *ackTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	seq := a.acks.next()
	err := a.Transport.AppendEntries(id, target, args, resp)
	if err == nil {
		a.acks.answered(id, seq, args, resp)
	}
	return err
}

// Close passes raft's shutdown on to the transport, as raft does for a
// transport that can close (raft.WithClose).
func (a *ackTransport) Close() error {
	if c, ok := a.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

// ackTransportPreVote keeps pre-voting on for a transport that offers it:
// raft looks for raft.WithPreVote on the transport it is given.
type ackTransportPreVote struct {
	*ackTransport
	pv raft.WithPreVote
}

func (a ackTransportPreVote) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return a.pv.RequestPreVote(id, target, args, resp)
}

// withAcks wraps trans so that its AppendEntries answers land in acks.
func withAcks(trans raft.Transport, acks *ackTracker) raft.Transport {
	a := &ackTransport{Transport: trans, acks: acks}
	if pv, ok := trans.(raft.WithPreVote); ok {
		return ackTransportPreVote{ackTransport: a, pv: pv}
	}
	return a
}

// errVerifyTimeout ends a verification that raft confirmed but no fresh
// answers did, within verifyBound.
var errVerifyTimeout = errors.New("no quorum answered a heartbeat sent after the check began")

// verifyBound caps the wait for fresh answers once raft's own verification
// has returned: twice the heartbeat timeout, well past the leader lease.
const verifyBound = time.Second

// proveLeadership waits until acks prove that this server leads in term
// (see the comment at the top of this file), raft's VerifyLeader fails,
// or verifyBound passes after VerifyLeader returned without a proof.
// verify starts raft's verification (and its heartbeats); voters gives the
// voters of the latest configuration.
func (s *Server) proveLeadership(verify func() raft.Future, term uint64, voters []raft.ServerID) error {
	mark := s.acks.next()
	f := verify()
	raftDone := make(chan error, 1)
	go func() { raftDone <- f.Error() }()
	var bound <-chan time.Time
	for {
		confirmed, refuted, changed := s.acks.verdict(mark, term, raft.ServerID(s.cfg.NodeName), voters)
		if confirmed {
			return nil
		}
		if refuted {
			return ErrNoLeader
		}
		select {
		case <-changed:
		case err := <-raftDone:
			if err != nil {
				if errors.Is(err, raft.ErrRaftShutdown) {
					return ErrShuttingDown
				}
				return ErrNoLeader
			}
			// raft is satisfied, perhaps by an old answer: wait for
			// the heartbeats it sent, within the bound.
			t := s.clk.NewTimer(verifyBound)
			defer t.Stop()
			bound = t.C()
			raftDone = nil
		case <-bound:
			s.log.Warn("a leadership check found no quorum answering after it began", "error", errVerifyTimeout)
			return ErrNoLeader
		}
	}
}
