package server

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/clock/clocktest"
)

// heldTransport answers each AppendEntries with what the test sends on
// answers, once the test allows it: a request on the wire for as long as
// the test likes.
type heldTransport struct {
	raft.Transport // nil: only AppendEntries is called
	answers        chan raft.AppendEntriesResponse
}

func (h *heldTransport) AppendEntries(_ raft.ServerID, _ raft.ServerAddress, _ *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	*resp = <-h.answers
	return nil
}

// raftVerify stands in for raft.VerifyLeader: the test decides when it
// returns and with what.
type raftVerify chan error

func (v raftVerify) Error() error { return <-v }

type proofRig struct {
	s   *Server
	clk *clocktest.Fake
}

func newProofRig() *proofRig {
	clk := clocktest.NewFake(time.Unix(1_700_000_000, 0))
	return &proofRig{clk: clk, s: &Server{cfg: Config{NodeName: "n1"}, clk: clk, log: hclog.NewNullLogger()}}
}

// send puts a heartbeat of term on the wire to id, through the recording
// transport, and returns once it has taken its number in the send order;
// the returned channel gives the answer to it.
func (r *proofRig) send(id raft.ServerID, term uint64) chan<- raft.AppendEntriesResponse {
	h := &heldTransport{answers: make(chan raft.AppendEntriesResponse)}
	trans := withAcks(h, &r.s.acks)
	n := r.s.acks.seq.Load()
	go func() {
		var resp raft.AppendEntriesResponse
		trans.AppendEntries(id, raft.ServerAddress(id), &raft.AppendEntriesRequest{Term: term}, &resp)
	}()
	r.waitSent(n + 1)
	return h.answers
}

// waitSent waits until n requests or checks have taken their number (a
// goroutine's first steps, no timer involved).
func (r *proofRig) waitSent(n uint64) {
	for r.s.acks.seq.Load() < n {
		runtime.Gosched()
	}
}

// prove starts a check in term among n1 (this server), n2 and n3, and
// returns once it has taken its mark; raft's verification, stood in for
// by the returned channel, returns what the test sends on it.
func (r *proofRig) prove(term uint64) (chan<- error, <-chan error) {
	v := make(raftVerify, 1)
	out := make(chan error, 1)
	n := r.s.acks.seq.Load()
	go func() {
		out <- r.s.proveLeadership(func() raft.Future { return v }, term, []raft.ServerID{"n1", "n2", "n3"})
	}()
	r.waitSent(n + 1)
	return v, out
}

func expectPending(t *testing.T, out <-chan error, what string) {
	t.Helper()
	select {
	case err := <-out:
		t.Fatalf("%s: the check returned %v; it should still wait", what, err)
	case <-time.After(20 * time.Millisecond):
	}
}

func expectResult(t *testing.T, out <-chan error, want error, what string) {
	t.Helper()
	select {
	case err := <-out:
		if !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Fatalf("%s: the check returned %v, want %v", what, err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the check did not return", what)
	}
}

// TestProveLeadershipIgnoresAnswersToOlderHeartbeats is the pause of the
// end-to-end test TestClusterResumedLeaderRefusesNothingStale, made
// deterministic: a heartbeat to n2 is on the wire when the check begins;
// its success answer (written before the others elected a new leader)
// satisfies raft's own verification, but it is no proof, so the check
// waits for the fresh heartbeat, which n2 answers with the newer term.
func TestProveLeadershipIgnoresAnswersToOlderHeartbeats(t *testing.T) {
	r := newProofRig()
	old := r.send("n2", 5)
	v, out := r.prove(5)
	old <- raft.AppendEntriesResponse{Term: 5, Success: true}
	v <- nil // raft counts that answer and calls itself satisfied
	expectPending(t, out, "after the answer to a heartbeat sent before the check")

	fresh := r.send("n2", 5)
	fresh <- raft.AppendEntriesResponse{Term: 6, Success: false}
	r.send("n3", 5) <- raft.AppendEntriesResponse{Term: 6, Success: false}
	expectResult(t, out, ErrNoLeader, "both followers answered the fresh heartbeats with a newer term")
}

// One fresh success answer makes a quorum of three with the leader's own
// vote, whether or not raft's verification has returned yet.
func TestProveLeadershipConfirmedByFreshAnswers(t *testing.T) {
	r := newProofRig()
	_, out := r.prove(5)
	r.send("n3", 4) <- raft.AppendEntriesResponse{Term: 4, Success: true}
	expectPending(t, out, "after a success answer of another term")
	r.send("n3", 5) <- raft.AppendEntriesResponse{Term: 5, Success: true}
	expectResult(t, out, nil, "n3 answered a heartbeat of the term sent after the check began")
}

// One follower with a newer term leaves a quorum possible; two do not.
func TestProveLeadershipRefutedOnlyWhenNoQuorumIsLeft(t *testing.T) {
	r := newProofRig()
	_, out := r.prove(5)
	r.send("n2", 5) <- raft.AppendEntriesResponse{Term: 7}
	expectPending(t, out, "after one follower answered with a newer term")
	r.send("n3", 5) <- raft.AppendEntriesResponse{Term: 5, Success: true}
	expectResult(t, out, nil, "n3 still confirms")
}

// raft satisfied and nobody answering: the check gives up at verifyBound,
// on the injected clock.
func TestProveLeadershipGivesUpAtTheBound(t *testing.T) {
	r := newProofRig()
	v, out := r.prove(5)
	v <- nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.clk.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r.clk.Advance(verifyBound - time.Nanosecond)
	expectPending(t, out, "just before the bound")
	r.clk.Advance(time.Nanosecond)
	expectResult(t, out, ErrNoLeader, "at the bound")
}

// raft's own failure is final.
func TestProveLeadershipRaftFailure(t *testing.T) {
	for _, c := range []struct {
		raftErr, want error
	}{{raft.ErrNotLeader, ErrNoLeader}, {raft.ErrLeadershipLost, ErrNoLeader}, {raft.ErrRaftShutdown, ErrShuttingDown}} {
		r := newProofRig()
		v, out := r.prove(5)
		v <- c.raftErr
		expectResult(t, out, c.want, c.raftErr.Error())
	}
}

// withAcks keeps what raft looks for on a transport (pre-voting, closing)
// and records answers through the real in-memory transport.
func TestWithAcksKeepsTheTransport(t *testing.T) {
	_, a := raft.NewInmemTransport("a")
	_, b := raft.NewInmemTransport("b")
	a.Connect("b", b)
	var acks ackTracker
	trans := withAcks(a, &acks)
	if _, ok := trans.(raft.WithPreVote); !ok {
		t.Error("the wrapped in-memory transport lost pre-voting")
	}
	if _, ok := trans.(raft.WithClose); !ok {
		t.Error("the wrapped in-memory transport cannot be closed")
	}
	if _, ok := withAcks(&heldTransport{}, &acks).(raft.WithPreVote); ok {
		t.Error("a transport without pre-voting gained it")
	}
	go func() {
		rpc := <-b.Consumer()
		rpc.Respond(&raft.AppendEntriesResponse{Term: 3, Success: true}, nil)
	}()
	mark := acks.next()
	var resp raft.AppendEntriesResponse
	if err := trans.AppendEntries("b", "b", &raft.AppendEntriesRequest{Term: 3}, &resp); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := acks.verdict(mark, 3, "a", []raft.ServerID{"a", "b", "c"}); !ok {
		t.Error("b's answer through the in-memory transport was not recorded")
	}
	if err := trans.(raft.WithClose).Close(); err != nil {
		t.Fatal(err)
	}
}
