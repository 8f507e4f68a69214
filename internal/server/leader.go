package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// monitorLeadership starts the leader duties when this server gains
// leadership and stops them when it loses it. It is the only goroutine that
// starts or stops them.
func (s *Server) monitorLeadership() {
	defer s.wg.Done()
	ch := s.raft.LeaderCh()
	for {
		select {
		case isLeader := <-ch:
			if isLeader {
				s.startLeading()
			} else {
				s.stopLeading()
			}
		case <-s.shutdownCh:
			return
		}
	}
}

func (s *Server) startLeading() {
	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	if s.leaderCancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.leaderCancel, s.leaderDone = cancel, done
	go func() {
		defer close(done)
		s.leaderLoop(ctx)
	}()
}

// stopLeading drops all leader-local soft state: the session timers go, and
// consistent reads wait for the next term's barrier.
func (s *Server) stopLeading() {
	s.leaderMu.Lock()
	cancel, done := s.leaderCancel, s.leaderDone
	s.leaderCancel, s.leaderDone = nil, nil
	s.leaderMu.Unlock()
	s.readyForReads.Store(false)
	if cancel != nil {
		cancel()
		<-done
	}
	s.timers.Clear()
}

// leaderLoop runs the duties of one term.
func (s *Server) leaderLoop(ctx context.Context) {
	// Everything committed by earlier terms must be applied before this
	// server answers consistent reads or judges sessions.
	for {
		err := s.raft.Barrier(s.cfg.ApplyTimeout).Error()
		if err == nil {
			break
		}
		s.log.Warn("leadership barrier failed; retrying", "error", err)
		if !s.sleep(ctx, time.Second) {
			return
		}
	}
	s.raiseStamps()
	// The timers are armed before the server says it is ready, so that
	// whoever waited for that (WaitForLeader; a test that then moves
	// its fake clock) finds every session's TTL counting from here.
	s.resetSessionTimers()
	s.readyForReads.Store(true)
	s.replayed.Store(true)
	s.log.Info("cluster leadership acquired", "node", s.cfg.NodeName)
	s.checkLogSize() // the log an earlier run left can be compacted now
	if s.serf != nil {
		s.serf.wake() // start reconciling the gossip pool for this term
		var promoting sync.WaitGroup
		promoting.Add(1)
		go func() {
			defer promoting.Done()
			s.promoteLoop(ctx)
		}()
		defer promoting.Wait()
	}

	// Reaping: tombstones older than one interval and ended lock-delays.
	// And this server's own node stays in the catalog with a passing
	// serfHealth check whatever is done to it through the catalog API:
	// gossip does not reconcile it, and without it every session created
	// with defaults is refused. Consul's agent puts it back by anti-entropy
	// within a minute; here a watch on the node and its checks puts it back
	// at once.
	t := s.clk.NewTimer(s.cfg.ReapInterval)
	defer t.Stop()
	var prev, prevEpoch uint64
	for {
		wctx, stopWatch := context.WithCancel(ctx)
		changed := s.watchSelf(wctx)
		if err := s.registerSelf(); err != nil {
			s.log.Warn("registering this node in the catalog failed; retrying", "error", err)
			stopWatch()
			if !s.sleep(ctx, time.Second) {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			stopWatch()
			return
		case <-changed:
		case <-t.C():
			// prev is an index of the state of prevEpoch: after a restore
			// it says nothing of the restored tombstones' age.
			if prev > 0 {
				if _, err := s.applyAt(prevEpoch, fsm.TypeReap, fsm.Reap{TombstonesUpTo: prev}); err != nil && !errors.Is(err, errStateReplaced) {
					s.log.Warn("reaping tombstones failed", "error", err)
				}
			}
			prevEpoch = s.gate.Epoch()
			prev = s.raft.AppliedIndex()
			t.Reset(s.cfg.ReapInterval)
		}
		stopWatch()
	}
}

// watchSelf returns a channel that is sent to (or closed) when this
// server's node or one of its checks changes in the catalog, or the state
// is replaced by a snapshot, until ctx ends.
func (s *Server) watchSelf(ctx context.Context) <-chan error {
	ws := watch.NewSet()
	st := s.fsm.State()
	st.NodeInfo(ws, s.cfg.NodeName)
	st.NodeChecks(ws, s.cfg.NodeName)
	return ws.WatchCh(ctx)
}

// sleep waits d on the server's clock; false if ctx ended first.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	return clock.Sleep(ctx, s.clk, d) == nil
}

// resetSessionTimers arms a full TTL for every session that has one: a new
// leader cannot know how long ago each was renewed, so it gives each the
// whole TTL again (the TTL is a lower bound).
func (s *Server) resetSessionTimers() {
	_, all := s.fsm.State().SessionList(nil)
	n := 0
	for _, sess := range all {
		if d := s.timerFor(sess); d > 0 {
			s.timers.Reset(sess.ID, d)
			n++
		}
	}
	s.log.Info("session timers armed", "sessions", n)
}

// timerFor is how long the leader waits for a renew of sess (0: no TTL).
func (s *Server) timerFor(sess *state.Session) time.Duration {
	if sess.TTL == "" {
		return 0
	}
	d, err := time.ParseDuration(sess.TTL)
	if err != nil || d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * s.cfg.SessionTTLMultiplier)
}

// registerSelf makes sure this server's node is in the catalog with a
// passing serfHealth check, so sessions created with defaults work.
func (s *Server) registerSelf() error {
	st := s.fsm.State()
	_, node, _ := st.NodeInfo(nil, s.cfg.NodeName)
	chk := st.Check(s.cfg.NodeName, state.SerfCheckID)
	if node != nil && node.Address == s.cfg.AdvertiseAddr && chk != nil && chk.Status == state.HealthPassing {
		return nil
	}
	res, err := s.apply(fsm.TypeRegister, &state.RegisterRequest{
		Node: s.cfg.NodeName, Address: s.cfg.AdvertiseAddr, Datacenter: s.cfg.Datacenter,
		Check: &state.HealthCheck{CheckID: state.SerfCheckID, Name: "Serf Health Status",
			Status: state.HealthPassing, Output: "Agent alive and reachable", Type: ""},
	})
	if err != nil {
		return err
	}
	if res.Err == nil && s.cfg.OnSelfRegistered != nil {
		// Whether this write put the node back is decided by the node
		// as it now stands, not by the reads above: a deregistration
		// applied between them (or between them and the write) left
		// the node read present, then this write created it anew, and
		// the agent was never told (TestOnSelfRegisteredWhenTheNodeComesBack
		// failed so under load, 6 times in 800).
		var before uint64
		if node != nil {
			before = node.CreateIndex
		}
		if _, now, _ := s.fsm.State().NodeInfo(nil, s.cfg.NodeName); now != nil && now.CreateIndex != before {
			go s.cfg.OnSelfRegistered()
		}
	}
	return res.Err
}

// storedSessionID returns the state's own copy of session ID id (id itself
// if the session is not there), so the timer of a session shares its ID
// string with the stored session instead of keeping the one the create
// request was built from: 48 bytes less per live TTL session.
func (s *Server) storedSessionID(id string) string {
	if _, sess := s.State().SessionGet(nil, id); sess != nil {
		return sess.ID
	}
	return id
}

// onSessionExpired is called by the timers when a session's TTL ran out.
// It must not block the timers, so the destroy is proposed elsewhere. If
// that fails for another reason than the end of this term (a disk that
// refuses the log's writes for a while), the session's timer is armed again
// to try once more a little later, for as long as this server leads: the
// timers belong to the term, so a retry never outlives it, and a session
// whose TTL ran out is never left without one.
//
// A renewal and an expiry of the same session are ordered by s.expMu. If
// the renewal comes first, it has reset the timer, and the expiry, finding
// it pending again, does nothing. If the expiry comes first, the session
// is marked expiring until its destroy is through, and a renewal meanwhile
// answers that the session is not found, rather than a 200 that the
// destroy would make a lie a moment later.
func (s *Server) onSessionExpired(id string) {
	s.expMu.Lock()
	if s.timers.Pending(id) {
		s.expMu.Unlock()
		return // renewed after this deadline fired: the renewal won
	}
	s.expiring[id] = struct{}{}
	// The destroy is pinned to the state it is judged on: a restore of a
	// backup after this point refuses it at the gate, and re-arms the
	// session's timer (RestoreSnapshot, also under expMu).
	epoch := s.gate.Epoch()
	s.expMu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			s.expMu.Lock()
			delete(s.expiring, id)
			s.expMu.Unlock()
		}()
		if _, sess := s.State().SessionGet(nil, id); sess == nil {
			return // already invalidated another way (destroy, check, node)
		}
		start := s.clk.Now()
		_, err := s.applyAt(epoch, fsm.TypeSessionDestroy, fsm.SessionDestroy{ID: id})
		switch {
		case err == nil:
			s.metrics.AddSample([]string{"session_ttl", "invalidate"}, float32(clock.Since(s.clk, start))/float32(time.Millisecond))
			if n := s.expiredLog.Note(); n > 0 {
				s.log.Info("session invalidated: its TTL lapsed", "session", id, "lapsed_since_last_line", n)
			} else {
				s.log.Debug("session expired", "session", id)
			}
		case err == ErrShuttingDown || err == ErrNoLeader || errors.As(err, new(*OutcomeUnknownError)) ||
			errors.Is(err, errStateReplaced):
			// The next leader arms the timer again (and, when the
			// destroy did reach the log, finds the session gone); a
			// restore that replaced the state has re-armed it already.
		default:
			s.log.Warn("invalidating an expired session failed; trying again", "session", id, "in", expiryRetry, "error", err)
			s.timers.Reset(id, expiryRetry)
		}
	}()
}

// stamp is the time written into a command, against which the state
// machine judges lock-delays, and the time the leader compares their
// deadlines with: the clock's reading when the server started, advanced
// by the clock's monotonic reading since (Go's time.Now carries one), and
// shifted by raiseStamps. A wall clock set back while the server runs (an
// NTP step at boot, a hand) would otherwise make every lock-delay written
// before the step end as much later: set back an hour, it would hold its
// key for an hour. A clock set forward ends lock-delays early, as it would
// on any server that trusts its clock; NTP slews small errors instead.
func (s *Server) stamp() time.Time {
	return s.stampBase.Add(s.clk.Now().Sub(s.stampBase) + time.Duration(s.stampShift.Load()))
}

// raiseStamps moves stamps forward, once the log is applied at the start
// of a term, if the state has a lock-delay deadline more than MaxLockDelay
// ahead of them: no deadline is set further ahead than that, so this
// clock is behind the one that wrote the state (set back while the server
// was down). Stamps then run from the state's time, and each lock-delay
// ends at most MaxLockDelay later.
func (s *Server) raiseStamps() {
	h := s.State().LockDelayHorizon()
	if h.IsZero() {
		return
	}
	if behind := h.Sub(s.stamp()) - state.MaxLockDelay; behind > 0 {
		s.stampShift.Add(int64(behind))
		s.log.Warn("this server's clock is behind the time its state was written at (set back while it was down?): "+
			"its times run on from the state's", "behind", behind.Round(time.Millisecond))
	}
}

// expiredLogEvery is the least time between two log lines about sessions
// whose TTL lapsed: 40,000 lapsing at once after a restart are a few lines.
const expiredLogEvery = 10 * time.Second

// expiryRetry is how long the leader waits before it tries again to
// invalidate an expired session after a failed attempt.
const expiryRetry = time.Second
