package server

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/gossip"
	"github.com/holdfast/holdfast/internal/state"
)

// Gossip and the catalog.
//
// While this server leads, it keeps the catalog in step with the gossip
// pool, as Consul's leader does with serf:
//
//   - an alive member's node is registered, at its gossip address, with a
//     passing serfHealth check ("Agent alive and reachable");
//   - a failed member's serfHealth goes critical ("Agent not live or
//     unreachable"); the state machine invalidates every session bound to
//     it in that same raft step, releasing (or deleting) their locks;
//   - a member that left gracefully is deregistered, which invalidates its
//     sessions too;
//   - a member that is leaving is left alone until it has left.
//
// On gaining leadership the leader reconciles every member once, then each
// change as the pool reports it, and every reconcile interval it does the
// whole pool again (a safety net for lost work). A full pass also
// deregisters nodes that carry a serfHealth check but that the pool does not
// know at all (reaped members) — but not in the first Timing.Settle after
// the pool started: a restarted server has not yet heard from the agents
// that are still alive, and must not drop their sessions for it.
//
// This server's own node is not reconciled from gossip: registerSelf keeps
// it registered.

const (
	// serfRetry is the wait after a failed reconcile.
	serfRetry = time.Second
	// Full reconcile periods by profile.
	serfReconcileLAN  = 60 * time.Second
	serfReconcileFast = 5 * time.Second
)

// Serf health check texts, Consul's.
const (
	serfCheckName       = "Serf Health Status"
	serfCheckAliveOut   = "Agent alive and reachable"
	serfCheckCriticalOu = "Agent not live or unreachable"
)

// membership is what reconciliation needs from the gossip pool. Tests feed
// a fake and call memberEvent themselves.
type membership interface {
	Members() []gossip.Member
}

// serfState is the server's side of gossip. pending holds, per member, the
// latest event not yet reconciled, and the latest loss (failed, left,
// reaped) before it if a later event followed; kick wakes the loop.
type serfState struct {
	pool     *gossip.Pool // nil when the membership is a fake
	members  membership
	started  time.Time     // when the pool started, on the server's clock
	grace    time.Duration // see the file comment
	interval time.Duration // full reconcile period

	self string // this server's node, which gossip does not reconcile
	// seenAt, if set, gives the raft index this server has applied,
	// stamped on each event as it arrives (see pendingEvent).
	seenAt  func() uint64
	mu      sync.Mutex
	pending map[string]*memberEvents
	kick    chan struct{}
	fullDue atomic.Bool // a full reconcile is asked for (wakeFull)
}

// memberEvents is what is pending for one member: its latest event, and,
// when that is not a loss, the latest loss before it. A member that fails
// and comes back before the loop gets to it must still go critical first:
// its sessions were held by a process that died.
type memberEvents struct {
	loss *pendingEvent
	last pendingEvent
}

// pendingEvent is an event of the pool, and the raft index this server
// had applied when it arrived (0: not known). A loss is replayed only if
// the member's serfHealth check has not changed since: a server that saw
// a member fail while it followed, and leads later, must not replay a
// failure the leader of the time reconciled (with the member's coming
// back after it), or it would invalidate sessions made long after the
// member recovered (the cluster audit: a follower given the leadership by
// a SIGTERM did).
type pendingEvent struct {
	gossip.Event
	at uint64
}

// isLoss reports whether an event ends a member's life as gossip knew it.
func isLoss(t gossip.EventType) bool {
	return t == gossip.EventFailed || t == gossip.EventLeave || t == gossip.EventReap
}

// add records ev after what is pending.
func (me *memberEvents) add(ev pendingEvent) {
	if isLoss(ev.Type) {
		me.loss = nil // the new loss is the latest event itself
	} else if isLoss(me.last.Type) {
		l := me.last
		me.loss = &l
	}
	me.last = ev
}

func newSerfState(self string) *serfState {
	return &serfState{self: self, pending: make(map[string]*memberEvents), kick: make(chan struct{}, 1)}
}

// startGossip joins this server to a gossip pool of its own (a pool of one
// until someone joins it) if Config.Gossip is set. It is called by New once
// raft is up.
func (s *Server) startGossip() error {
	if s.cfg.Gossip == nil {
		return nil
	}
	gc := *s.cfg.Gossip
	gc.Name = s.cfg.NodeName
	tags := make(map[string]string, len(gc.Tags)+4)
	for k, v := range gc.Tags {
		tags[k] = v
	}
	tags["role"] = "server"
	if tags["dc"] == "" {
		tags["dc"] = s.cfg.Datacenter
	}
	if tags["raft"] == "" {
		tags["raft"] = string(s.trans.LocalAddr())
	}
	if s.cfg.Bootstrap == BootstrapExpect {
		tags["expect"] = strconv.Itoa(s.cfg.BootstrapExpect)
	}
	if tags["http"] == "" && s.cfg.HTTPAddr != "" {
		tags["http"] = s.cfg.HTTPAddr
	}
	gc.Tags = tags
	if gc.Logger == nil {
		gc.Logger = s.log.Named("gossip")
	}
	if gc.Clock == nil {
		gc.Clock = s.clk
	}
	sf := newSerfState(s.cfg.NodeName)
	sf.seenAt = s.raft.AppliedIndex
	gc.Notify = sf.memberEvent
	pool, err := gossip.New(gc)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	sf.pool = pool
	s.serf = sf
	interval := serfReconcileLAN
	if pool.Profile() == gossip.ProfileFast {
		interval = serfReconcileFast
	}
	s.startSerf(sf, pool, pool.Timing().Settle(), interval)
	return nil
}

// startSerf starts reconciling m into the catalog; events reach it
// through sf.memberEvent.
func (s *Server) startSerf(sf *serfState, m membership, grace, interval time.Duration) {
	if sf.seenAt == nil {
		sf.seenAt = s.raft.AppliedIndex
	}
	sf.members = m
	sf.started = s.clk.Now()
	sf.grace = grace
	sf.interval = interval
	s.wg.Add(1)
	go s.serfLoop(sf)
}

// stopGossip stops gossiping, without a goodbye. Called by Shutdown.
func (s *Server) stopGossip() {
	if s.serf != nil && s.serf.pool != nil {
		if err := s.serf.pool.Shutdown(); err != nil {
			s.log.Warn("stopping gossip", "error", err)
		}
	}
}

// Gossip returns this server's gossip pool, or nil if it has none. Callers
// may Join through it and list its Members.
func (s *Server) Gossip() *gossip.Pool {
	if s.serf == nil {
		return nil
	}
	return s.serf.pool
}

// memberEvent records a membership change for the reconcile loop. It never
// blocks: the pool calls it from its delivery goroutine.
func (sf *serfState) memberEvent(ev gossip.Event) {
	if ev.Member.Name == sf.self {
		return
	}
	pe := pendingEvent{Event: ev}
	if sf.seenAt != nil {
		pe.at = sf.seenAt()
	}
	sf.mu.Lock()
	if me := sf.pending[ev.Member.Name]; me != nil {
		me.add(pe)
	} else {
		sf.pending[ev.Member.Name] = &memberEvents{last: pe}
	}
	sf.mu.Unlock()
	select {
	case sf.kick <- struct{}{}:
	default:
	}
}

// wakeFull asks the loop for a full reconcile now: after a restore of a
// backup, whose catalog knows the pool of its own time.
func (sf *serfState) wakeFull() {
	sf.fullDue.Store(true)
	sf.wake()
}

// wake makes the reconcile loop look again (leadership gained).
func (sf *serfState) wake() {
	select {
	case sf.kick <- struct{}{}:
	default:
	}
}

// takePending empties the pending set and returns its events by member
// name, a member's pending loss before its latest event.
func (sf *serfState) takePending() []pendingEvent {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	names := make([]string, 0, len(sf.pending))
	for name := range sf.pending {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]pendingEvent, 0, len(names))
	for _, name := range names {
		me := sf.pending[name]
		if me.loss != nil {
			out = append(out, *me.loss)
		}
		out = append(out, me.last)
	}
	sf.pending = make(map[string]*memberEvents)
	return out
}

// putBack returns unreconciled events, in their order, to the pending set,
// before whatever arrived about the same member meanwhile: a newer event
// supersedes them, except that a loss is kept ahead of a newer event that
// is not one.
func (sf *serfState) putBack(evs []pendingEvent) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	old := make(map[string]*memberEvents)
	var order []string
	for _, ev := range evs {
		me := old[ev.Member.Name]
		if me == nil {
			me = &memberEvents{last: ev}
			old[ev.Member.Name] = me
			order = append(order, ev.Member.Name)
			continue
		}
		me.add(ev)
	}
	for _, name := range order {
		me := old[name]
		newer := sf.pending[name]
		if newer == nil {
			sf.pending[name] = me
			continue
		}
		// What is pending now came after me: replay it on top.
		if newer.loss != nil {
			me.add(*newer.loss)
		}
		me.add(newer.last)
		sf.pending[name] = me
	}
}

// leaderTerm returns the done channel of the current leader term if this
// server leads and has applied everything committed before its term;
// otherwise nil.
func (s *Server) leaderTerm() <-chan struct{} {
	s.leaderMu.Lock()
	done := s.leaderDone
	s.leaderMu.Unlock()
	if done == nil || !s.readyForReads.Load() {
		return nil
	}
	return done
}

// serfLoop runs for the server's life. While this server is a ready leader
// it reconciles: everything once per term and per interval, and each
// member as its events arrive. Otherwise it waits to become one.
func (s *Server) serfLoop(sf *serfState) {
	defer s.wg.Done()
	var (
		term <-chan struct{} // the reconciling term; closed when it ends
		full = true          // a full reconcile is due
	)
	timer := s.clk.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := time.Duration(0) // 0 leaves the timer as it is
		if term == nil {
			if done := s.leaderTerm(); done != nil {
				term, full = done, true
			}
			// Otherwise wait: the leader loop wakes us when a term is ready.
		}
		if term != nil {
			if full {
				if err := s.reconcileAll(sf); err != nil {
					s.log.Warn("reconciling the gossip pool into the catalog failed; will retry", "error", err)
					next = serfRetry
				} else {
					full = false
					next = sf.interval
				}
			} else if err := s.reconcilePending(sf); err != nil {
				s.log.Warn("reconciling a member into the catalog failed; will retry", "error", err)
				full = true
				next = serfRetry
			}
		}
		if next > 0 {
			timer.Reset(next)
		}
		select {
		case <-s.shutdownCh:
			return
		case <-term:
			term = nil
		case <-sf.kick:
			if sf.fullDue.Swap(false) && term != nil {
				full = true
			}
		case <-timer.C():
			if term != nil {
				full = true
			}
		}
	}
}

// reconcileAll brings every member into the catalog, then removes nodes
// the pool has forgotten (outside the grace period). Events pending when
// it starts are superseded by it, but for their losses: a member that
// failed and came back before the loop got to it is alive in the pool,
// and only the pending loss says that its sessions were held by a process
// that died. Those are replayed first.
func (s *Server) reconcileAll(sf *serfState) error {
	evs := sf.takePending()
	for i, ev := range evs {
		if !isLoss(ev.Type) {
			continue
		}
		if err := s.reconcileEvent(ev); err != nil {
			sf.putBack(evs[i:])
			return err
		}
	}
	members := sf.members.Members()
	known := make(map[string]bool, len(members))
	for _, m := range members {
		known[m.Name] = true
		if m.Name == s.cfg.NodeName {
			continue
		}
		if err := s.reconcileMember(m); err != nil {
			return err
		}
	}
	if s.clk.Now().Before(sf.started.Add(sf.grace)) {
		return nil
	}
	_, nodes := s.State().Nodes(nil)
	for _, n := range nodes {
		if known[n.Node] || n.Node == s.cfg.NodeName {
			continue
		}
		if err := s.reconcileGone(n.Node); err != nil {
			return err
		}
	}
	return nil
}

// reconcilePending reconciles the members whose events are pending. On an
// error the events not done go back to the pending set.
func (s *Server) reconcilePending(sf *serfState) error {
	evs := sf.takePending()
	for i, ev := range evs {
		if err := s.reconcileEvent(ev); err != nil {
			sf.putBack(evs[i:])
			return err
		}
	}
	return nil
}

// reconcileEvent makes the catalog agree with one event of the pool. A
// loss whose member's serfHealth check changed after the loss arrived was
// reconciled already, with what followed it (see pendingEvent): it is
// not replayed.
func (s *Server) reconcileEvent(ev pendingEvent) error {
	if isLoss(ev.Type) && ev.at > 0 {
		if chk := s.State().Check(ev.Member.Name, state.SerfCheckID); chk != nil && chk.ModifyIndex > ev.at {
			s.log.Debug("not replaying a loss reconciled after it arrived", "member", ev.Member.Name,
				"event", ev.Type.String(), "seen_at", ev.at, "check_modified_at", chk.ModifyIndex)
			return nil
		}
	}
	if ev.Type == gossip.EventReap {
		return s.reconcileGone(ev.Member.Name)
	}
	return s.reconcileMember(ev.Member)
}

// reconcileMember makes the catalog, and for a server the raft
// configuration, agree with what gossip says of m. It writes only when
// something must change.
func (s *Server) reconcileMember(m gossip.Member) error {
	if err := s.reconcileCatalog(m); err != nil {
		return err
	}
	return s.reconcileRaft(m, false)
}

// reconcileCatalog makes the catalog agree with what gossip says of m.
func (s *Server) reconcileCatalog(m gossip.Member) error {
	if dc := m.Tags["dc"]; dc != "" && dc != s.cfg.Datacenter {
		// An agent of another datacenter in this pool (a wrong -join or
		// -datacenter): not this catalog's, as Consul's leader skips it.
		return nil
	}
	st := s.State()
	_, node, _ := st.NodeInfo(nil, m.Name)
	chk := st.Check(m.Name, state.SerfCheckID)
	dc := m.Tags["dc"]
	if dc == "" {
		dc = s.cfg.Datacenter
	}
	switch m.Status {
	case gossip.StatusAlive:
		if node != nil && node.Address == m.Addr && chk != nil && chk.Status == state.HealthPassing {
			return nil
		}
		req := &state.RegisterRequest{Node: m.Name, Address: m.Addr, Datacenter: dc,
			Check: &state.HealthCheck{CheckID: state.SerfCheckID, Name: serfCheckName,
				Status: state.HealthPassing, Output: serfCheckAliveOut}}
		if node != nil { // keep what else is known of the node
			req.ID, req.TaggedAddresses, req.NodeMeta = node.ID, node.TaggedAddresses, node.Meta
		}
		s.log.Info("member alive: registering its node", "member", m.Name, "addr", m.Addr)
		return s.applyCatalog(fsm.TypeRegister, req)

	case gossip.StatusFailed:
		if chk != nil && chk.Status == state.HealthCritical {
			return nil
		}
		req := &state.RegisterRequest{Node: m.Name, Address: m.Addr, Datacenter: dc,
			SkipNodeUpdate: node != nil,
			Check: &state.HealthCheck{CheckID: state.SerfCheckID, Name: serfCheckName,
				Status: state.HealthCritical, Output: serfCheckCriticalOu}}
		s.log.Info("member failed: its serfHealth check goes critical and its sessions are invalidated", "member", m.Name)
		return s.applyCatalog(fsm.TypeRegister, req)

	case gossip.StatusLeft:
		if node == nil {
			return nil
		}
		s.log.Info("member left: deregistering its node", "member", m.Name)
		return s.applyCatalog(fsm.TypeDeregister, &state.DeregisterRequest{Node: m.Name})
	}
	// Leaving: wait for it to have left.
	return nil
}

// reconcileGone deregisters a node the pool no longer knows, if it is a
// gossip node (one with a serfHealth check). Nodes registered through the
// catalog API without one are not gossip's business.
func (s *Server) reconcileGone(name string) error {
	if name == s.cfg.NodeName {
		return nil
	}
	if err := s.reconcileRaft(gossip.Member{Name: name}, true); err != nil {
		return err
	}
	if s.State().Check(name, state.SerfCheckID) == nil {
		return nil
	}
	s.log.Info("member forgotten by the pool: deregistering its node", "member", name)
	return s.applyCatalog(fsm.TypeDeregister, &state.DeregisterRequest{Node: name})
}

func (s *Server) applyCatalog(t fsm.Type, body interface{}) error {
	res, err := s.apply(t, body)
	if err != nil {
		return err
	}
	if res.Err != nil {
		return fmt.Errorf("server: catalog refused the change: %w", res.Err)
	}
	return nil
}
