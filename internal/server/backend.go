package server

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/state"
)

// The methods in this file implement httpapi.Backend.

// State returns the current state store.
func (s *Server) State() *state.Store { return s.fsm.State() }

// NodeName is this server's node.
func (s *Server) NodeName() string { return s.cfg.NodeName }

// Datacenter is this server's datacenter.
func (s *Server) Datacenter() string { return s.cfg.Datacenter }

// Self describes the agent for /v1/agent/self.
func (s *Server) Self() map[string]interface{} {
	return map[string]interface{}{
		"Config": map[string]interface{}{
			"NodeName":   s.cfg.NodeName,
			"Datacenter": s.cfg.Datacenter,
			"Server":     true,
			"Version":    "holdfast",
			"HTTPAddr":   s.cfg.HTTPAddr,
		},
		"Member": map[string]interface{}{
			"Name":   s.cfg.NodeName,
			"Addr":   s.cfg.AdvertiseAddr,
			"Status": 1,
			"Tags":   map[string]string{"role": "consul", "dc": s.cfg.Datacenter},
		},
		"Stats": s.stats(),
	}
}

// stats is this server's part of /v1/agent/self's "Stats", by section as
// Consul's agent gives it (all values strings; httpapi adds "runtime"):
// "raft" is raft's own Stats, "holdfast" stands where Consul has "consul"
// (its keys, and counts of the state), and "serf_lan" describes the
// gossip pool.
func (s *Server) stats() map[string]interface{} {
	u := s.State().Usage()
	out := map[string]interface{}{
		"raft": s.raft.Stats(),
		"holdfast": map[string]string{
			"server":             "true",
			"leader":             strconv.FormatBool(s.raft.State() == raft.Leader),
			"leader_addr":        s.Leader(),
			"known_datacenters":  "1",
			"acl":                "disabled",
			"sessions":           strconv.Itoa(u.Sessions),
			"session_ttl_active": strconv.Itoa(s.timersActive()),
			"kv_entries":         strconv.Itoa(u.KVEntries),
			"kv_locked":          strconv.Itoa(u.KVLocked),
			"nodes":              strconv.Itoa(u.Nodes),
		},
	}
	if p := s.Gossip(); p != nil {
		out["serf_lan"] = p.Stats()
	}
	return out
}

// ready reports whether this server leads and has applied everything
// committed before its term. Write paths that read the state before they
// propose (lock-delay, existence checks) must not run before that: right
// after a restart the state is still being replayed.
func (s *Server) ready() error {
	if s.raft.State() != raft.Leader || !s.readyForReads.Load() {
		return ErrNoLeader
	}
	return nil
}

func resultErr(res *fsm.Result, err error) error {
	if err != nil {
		return err
	}
	return res.Err
}

// KVS applies a KV write. Writes that are bound to fail are refused on the
// leader without a raft write (see refuseEarly); an acquire refused by
// lock-delay also reports how long the delay has left.
func (s *Server) KVS(ctx context.Context, req *state.KVRequest) (bool, time.Duration, error) {
	if err := s.ready(); err != nil {
		return false, 0, err
	}
	if refused, left, err := s.refuseEarly(req); refused || err != nil {
		if !s.soleVoter() {
			// Judged on this server's applied state, which in a cluster
			// may be a deposed leader's: answer only once a quorum
			// confirms that it leads, judging again on the state that
			// then holds every acknowledged write.
			if err := s.ConsistentRead(ctx); err != nil {
				return false, 0, err
			}
			refused, left, err = s.refuseEarly(req)
		}
		if refused || err != nil {
			if err == nil && req.Op == state.OpLock {
				s.lockStats.count(false, left > 0)
			}
			return false, left, err
		}
	}
	res, err := s.applyKVS(req)
	if err := resultErr(res, err); err != nil {
		return false, 0, err
	}
	if req.Op == state.OpLock {
		s.lockStats.count(res.OK, false)
	}
	return res.OK, 0, nil
}

// applyKVS commits a KV write in the binary encoding (fsm.EncodeKVS),
// which is several times cheaper to build and to apply than JSON.
func (s *Server) applyKVS(req *state.KVRequest) (*fsm.Result, error) {
	b, err := fsm.EncodeKVS(s.stamp(), req)
	if err != nil {
		return nil, err
	}
	return s.applyCommand(b)
}

// refuseEarly decides, from the leader's applied state, the KV writes that
// are bound to fail: an acquire of a key another session holds or that is in
// lock-delay, a CAS whose index does not match, a release by a non-holder.
// Answering those without a raft write is linearizable (the applied state
// includes every acknowledged write, and a refusal changes nothing), and it
// keeps a crowd of waiters racing for one lock from flooding the log.
// Only refusals short-circuit: a success is always committed through raft,
// so a deposed leader can never acknowledge a write that did not happen.
// A refusal is judged on this server's applied state, which holds every
// acknowledged write as long as it is the only voter; with several voters
// a leader cut off from the others (or paused, and not yet told) could
// refuse on a stale state, so in a cluster KVS confirms leadership with a
// quorum (ConsistentRead) and judges again before refusing.
func (s *Server) refuseEarly(req *state.KVRequest) (bool, time.Duration, error) {
	st := s.State()
	e := &req.Entry
	var cur *state.DirEntry
	switch req.Op {
	case state.OpLock, state.OpCAS, state.OpUnlock, state.OpDeleteCAS:
		// Only these ops decide on the current entry; a plain set or
		// delete is never refused here, so it skips the lookup.
		_, cur = st.KVGet(nil, e.Key)
	}
	switch req.Op {
	case state.OpLock:
		if e.Session == "" {
			return false, 0, nil // the state machine reports the missing session
		}
		if _, sess := st.SessionGet(nil, e.Session); sess == nil {
			return true, 0, fmt.Errorf("%w %q", state.ErrInvalidSession, e.Session)
		}
		if cur != nil && cur.Session == e.Session {
			return false, 0, nil // the holder updating its value: never refused
		}
		if cur != nil && cur.Session != "" {
			return true, 0, nil
		}
		if until := st.KVLockDelay(e.Key); !until.IsZero() {
			if left := until.Sub(s.stamp()); left > 0 {
				return true, left, nil
			}
		}
	case state.OpCAS:
		if (e.ModifyIndex == 0 && cur != nil) || (e.ModifyIndex != 0 && (cur == nil || cur.ModifyIndex != e.ModifyIndex)) {
			return true, 0, nil
		}
	case state.OpUnlock:
		if e.Session != "" && (cur == nil || cur.Session != e.Session || (e.LockIndex != 0 && e.LockIndex != cur.LockIndex)) {
			return true, 0, nil
		}
	case state.OpDeleteCAS:
		if cur != nil && cur.ModifyIndex != e.ModifyIndex {
			return true, 0, nil
		}
	}
	return false, 0, nil
}

// SessionCreate validates a session, gives it an ID and commits it; a
// session with a TTL gets its timer on this leader.
func (s *Server) SessionCreate(ctx context.Context, in *state.Session) (string, error) {
	if err := s.ready(); err != nil {
		return "", err
	}
	sess := *in
	if sess.Node == "" {
		sess.Node = s.cfg.NodeName
	}
	if err := checkSessionNames(&sess); err != nil {
		return "", err
	}
	switch sess.Behavior {
	case "":
		sess.Behavior = state.BehaviorRelease
	case state.BehaviorRelease, state.BehaviorDelete:
	default:
		return "", fmt.Errorf("%w: Invalid Behavior setting '%s': must be release or delete", state.ErrInvalidRequest, sess.Behavior)
	}
	if sess.TTL != "" {
		d, err := time.ParseDuration(sess.TTL)
		if err != nil {
			return "", fmt.Errorf("%w: Session TTL '%s' invalid: %v", state.ErrInvalidRequest, sess.TTL, err)
		}
		if d != 0 && (d < s.cfg.SessionTTLMin || d > s.cfg.SessionTTLMax) {
			// Consul prints the TTL in nanoseconds here (spec section 3).
			return "", fmt.Errorf("%w: Invalid Session TTL '%d', must be between [%v=%v]",
				state.ErrInvalidRequest, d, s.cfg.SessionTTLMin, s.cfg.SessionTTLMax)
		}
		// A zero TTL ("0s") means no TTL; it is kept as given, as Consul
		// keeps it, and arms no timer (timerFor).
	}
	if sess.LockDelay < 0 {
		return "", fmt.Errorf("%w: LockDelay %v is negative", state.ErrInvalidRequest, sess.LockDelay)
	}
	id, err := newID()
	if err != nil {
		return "", err
	}
	sess.ID = id
	if err := resultErr(s.apply(fsm.TypeSessionCreate, &sess)); err != nil {
		return "", err
	}
	if d := s.timerFor(&sess); d > 0 {
		s.timers.Reset(id, d)
	}
	return id, nil
}

// SessionDestroy invalidates a session. Destroying an unknown session
// writes nothing.
func (s *Server) SessionDestroy(ctx context.Context, id string) error {
	if err := s.ready(); err != nil {
		return err
	}
	if _, sess := s.State().SessionGet(nil, id); sess == nil {
		// Gone from this server's state; in a cluster, a deposed
		// leader's state may not have it yet: confirm, and look again.
		if err := s.confirmLeading(ctx); err != nil {
			return err
		}
		if _, sess := s.State().SessionGet(nil, id); sess == nil {
			return nil
		}
	}
	if err := resultErr(s.apply(fsm.TypeSessionDestroy, fsm.SessionDestroy{ID: id})); err != nil {
		return err
	}
	s.timers.Remove(id)
	return nil
}

// SessionRenew restarts a session's TTL timer. It writes nothing to raft:
// the timer is leader-local soft state. In a cluster it first confirms
// with a quorum that this server leads: a deposed leader that does not
// know it yet must not answer 200 for a timer no leader runs.
func (s *Server) SessionRenew(ctx context.Context, id string) (*state.Session, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	if err := s.confirmLeading(ctx); err != nil {
		return nil, err
	}
	_, sess := s.State().SessionGet(nil, id)
	if sess == nil {
		return nil, fmt.Errorf("%w: Session id '%s' not found", state.ErrSessionNotFound, id)
	}
	if d := s.timerFor(sess); d > 0 {
		// Under expMu: a session whose expiry has begun is as good as
		// gone (see onSessionExpired).
		s.expMu.Lock()
		_, expiring := s.expiring[id]
		if !expiring {
			s.timers.Reset(id, d)
		}
		s.expMu.Unlock()
		if expiring {
			// Consul's words for a session that is gone; its TTL ran
			// out before this renewal reached the leader.
			return nil, fmt.Errorf("%w: Session id '%s' not found", state.ErrSessionNotFound, id)
		}
	}
	return sess, nil
}

// Register applies a catalog registration.
func (s *Server) Register(ctx context.Context, req *state.RegisterRequest) error {
	if err := checkRegisterNames(req); err != nil {
		return err
	}
	return resultErr(s.apply(fsm.TypeRegister, req))
}

// Deregister applies a catalog deregistration.
func (s *Server) Deregister(ctx context.Context, req *state.DeregisterRequest) error {
	if err := checkDeregisterNames(req); err != nil {
		return err
	}
	return resultErr(s.apply(fsm.TypeDeregister, req))
}

// Txn applies a transaction. Locks in it honour lock-delay in the state
// machine, with the leader's stamped time.
func (s *Server) Txn(ctx context.Context, ops []*state.TxnOp) ([]*state.TxnResult, []*state.TxnError, error) {
	if len(ops) > state.MaxTxnOps {
		return nil, nil, fmt.Errorf("%w: Transaction contains too many operations (%d > %d)", state.ErrInvalidRequest, len(ops), state.MaxTxnOps)
	}
	b, err := fsm.EncodeTxn(s.stamp(), ops)
	if err != nil {
		return nil, nil, err
	}
	res, err := s.applyCommand(b)
	if err != nil {
		return nil, nil, err
	}
	return res.TxnResult, res.TxnErrors, nil
}

// QuerySet creates or updates a prepared query.
func (s *Server) QuerySet(ctx context.Context, q *state.PreparedQuery) (string, error) {
	if err := s.ready(); err != nil {
		return "", err
	}
	if err := checkQueryNames(q); err != nil {
		return "", err
	}
	nq := *q
	if nq.ID == "" {
		id, err := newID()
		if err != nil {
			return "", err
		}
		nq.ID = id
	} else if old, err := s.queryConfirmed(ctx, nq.ID); err != nil {
		return "", err
	} else if old == nil {
		return "", fmt.Errorf("%w: Cannot modify non-existent prepared query: '%s'", state.ErrQueryNotFound, nq.ID)
	} else {
		// The state machine refuses the update if this query is gone
		// by the time it applies (its session invalidated meanwhile).
		nq.CreateIndex = old.CreateIndex
	}
	if err := resultErr(s.apply(fsm.TypeQuerySet, &nq)); err != nil {
		return "", err
	}
	return nq.ID, nil
}

// queryConfirmed is the prepared query id from this server's state; when
// it is not there, in a cluster, it looks again once a quorum confirms
// that this server leads (a deposed leader's state may lack it).
func (s *Server) queryConfirmed(ctx context.Context, id string) (*state.PreparedQuery, error) {
	if _, q := s.State().QueryGet(nil, id); q != nil {
		return q, nil
	}
	if err := s.confirmLeading(ctx); err != nil {
		return nil, err
	}
	_, q := s.State().QueryGet(nil, id)
	return q, nil
}

// confirmLeading returns nil once an answer judged on this server's
// applied state may be given: at once while it is the only voter (its
// state holds every acknowledged write); in a cluster once a quorum
// confirms that it still leads (ConsistentRead). Callers judge on the
// state after it returns.
func (s *Server) confirmLeading(ctx context.Context) error {
	if s.soleVoter() {
		return nil
	}
	return s.ConsistentRead(ctx)
}

// QueryDelete deletes a prepared query.
func (s *Server) QueryDelete(ctx context.Context, id string) error {
	return resultErr(s.apply(fsm.TypeQueryDelete, fsm.QueryDelete{ID: id}))
}

// ConsistentRead confirms leadership with a quorum and that this term's
// barrier has been applied, so a read of State() that follows is
// linearizable.
//
// A leader that is the only server in the latest raft configuration (the
// single-node default) is its own quorum, and no other server can lead
// until a configuration with more servers has been appended to this
// leader's own log, which updates the latest configuration first. So while
// the latest configuration is this server alone, the leader state and the
// term's barrier are the whole proof, and the round trip through raft's
// main loop that VerifyLeader makes is skipped.
func (s *Server) ConsistentRead(ctx context.Context) error {
	if s.raft.State() != raft.Leader {
		return ErrNoLeader
	}
	if s.soleVoter() {
		if !s.readyForReads.Load() {
			return ErrNoLeader
		}
		return ctx.Err()
	}
	if err := s.reads.wait(ctx); err != nil {
		return err
	}
	if !s.readyForReads.Load() {
		return ErrNoLeader
	}
	return nil
}

// soleVoter reports whether the latest raft configuration, committed or
// not, has this server as its one and only member. raft keeps a copy of it
// that GetConfiguration reads without a trip through the main loop.
func (s *Server) soleVoter() bool {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	srv := f.Configuration().Servers
	return len(srv) == 1 && srv[0].Suffrage == raft.Voter && srv[0].ID == raft.ServerID(s.cfg.NodeName)
}

// verifyLeader is one round of the read barrier: a quorum confirms this
// server still leads, answering heartbeats sent after the round began
// (proveLeadership).
func (s *Server) verifyLeader() error {
	term := s.raft.CurrentTerm()
	if s.raft.State() != raft.Leader {
		return ErrNoLeader
	}
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return ErrNoLeader
	}
	var voters []raft.ServerID
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			voters = append(voters, srv.ID)
		}
	}
	return s.proveLeadership(func() raft.Future { return s.raft.VerifyLeader() }, term, voters)
}

// LeaderStatus reports whether a leader is known and the time since this
// server last heard from it.
func (s *Server) LeaderStatus() (bool, time.Duration) {
	addr, _ := s.raft.LeaderWithID()
	if s.raft.State() == raft.Leader {
		// Known only once the log is replayed: before that, reads would
		// answer from a state that is behind acknowledged writes.
		return s.readyForReads.Load(), 0
	}
	last := s.raft.LastContact()
	if last.IsZero() {
		// Never in touch with a leader (still replaying the log, or no
		// leader yet): the state is as old as this process's run at
		// least, not fresh, which 0 would say.
		last = s.started
	}
	return addr != "", time.Since(last)
}

// Replayed implements httpapi.Backend: true once this server has led with
// its log applied (after the leadership barrier), or has heard from a
// leader (Consul's rule for serving stale reads on a follower).
func (s *Server) Replayed() bool {
	return s.replayed.Load() || !s.raft.LastContact().IsZero()
}

// Leader is the leader's raft address, or "".
func (s *Server) Leader() string {
	addr, _ := s.raft.LeaderWithID()
	return string(addr)
}

// Peers lists the voters' raft addresses.
func (s *Server) Peers() ([]string, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	var out []string
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			out = append(out, string(srv.Address))
		}
	}
	return out, nil
}
