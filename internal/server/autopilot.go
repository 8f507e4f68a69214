package server

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/internal/gossip"
)

// The health of the servers, as Consul's autopilot reports it
// (/v1/operator/autopilot/health). holdfast's autopilot behaviour is fixed
// (docs/compatibility.md §14): these are the thresholds its health uses,
// Consul's defaults.
const (
	// HealthLastContact is how long a follower may go without hearing from
	// the leader and still be healthy (Consul's LastContactThreshold).
	HealthLastContact = 200 * time.Millisecond
	// HealthMaxTrailingLogs is how many log entries a server may be behind
	// the leader's last one and still be healthy (MaxTrailingLogs).
	HealthMaxTrailingLogs = 250
)

// Progress is how far one server's raft is, by its own report.
type Progress struct {
	Term, LastIndex uint64
	// LastContact is the time since the server last heard from a leader
	// (0 on the leader); negative if it never did.
	LastContact time.Duration
}

// Progress reports this server's raft term, last log index and last
// contact with a leader (Config.PeerProgress asks other servers for
// theirs).
func (s *Server) Progress() Progress {
	p := Progress{Term: s.raft.CurrentTerm(), LastIndex: s.raft.LastIndex()}
	if s.raft.State() != raft.Leader {
		p.LastContact = -1
		if last := s.raft.LastContact(); !last.IsZero() {
			p.LastContact = max(time.Since(last), 0)
		}
	}
	return p
}

// ParseProgress reads a Progress from raft's stats (term, last_log_index,
// last_contact), as /v1/agent/self gives them under Stats.raft.
func ParseProgress(stats map[string]any) (Progress, error) {
	var p Progress
	var err error
	if p.Term, err = strconv.ParseUint(toString(stats["term"]), 10, 64); err != nil {
		return p, fmt.Errorf("its raft term %v: %v", stats["term"], err)
	}
	if p.LastIndex, err = strconv.ParseUint(toString(stats["last_log_index"]), 10, 64); err != nil {
		return p, fmt.Errorf("its last log index %v: %v", stats["last_log_index"], err)
	}
	switch lc := toString(stats["last_contact"]); lc {
	case "never", "":
		p.LastContact = -1
	default:
		if p.LastContact, err = time.ParseDuration(lc); err != nil {
			return p, fmt.Errorf("its last contact %q: %v", lc, err)
		}
	}
	return p, nil
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

// ServerHealth is one server's health, as autopilot reports it.
type ServerHealth struct {
	ID, Name, Address string
	SerfStatus        string
	Leader, Voter     bool
	// LastContact is negative when unknown (the server could not be
	// asked, or never heard from a leader).
	LastContact         time.Duration
	LastTerm, LastIndex uint64
	Healthy             bool
	// StableSince is when this leader first saw the server in its
	// present state of health.
	StableSince time.Time
}

// ClusterHealth is the health of every server of the raft configuration.
type ClusterHealth struct {
	// Healthy: every server is.
	Healthy bool
	// FailureTolerance is how many voters could fail with the cluster
	// still taking writes: the healthy voters beyond a quorum.
	FailureTolerance int
	// OptimisticFailureTolerance counts, beyond a quorum, the voters the
	// gossip pool holds alive, healthy or not yet (catching up, say).
	OptimisticFailureTolerance int
	Servers                    []ServerHealth
}

// healthMemory keeps, for StableSince, when the leader first saw each
// server in its present state of health, in one term of leadership.
type healthMemory struct {
	mu    sync.Mutex
	term  uint64
	since map[string]stableState
}

type stableState struct {
	healthy bool
	since   time.Time
}

// stable records server id's health at now in term and gives the time it
// has been so.
func (h *healthMemory) stable(term uint64, id string, healthy bool, now time.Time) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.term != term || h.since == nil {
		h.term, h.since = term, map[string]stableState{}
	}
	st, ok := h.since[id]
	if !ok || st.healthy != healthy {
		st = stableState{healthy: healthy, since: now}
		h.since[id] = st
	}
	return st.since
}

// AutopilotHealth is the health of the servers, judged by the leader:
// a server is healthy when the gossip pool holds it alive, it heard from
// the leader within HealthLastContact, it is in the leader's term, and its
// log is at most HealthMaxTrailingLogs entries behind the leader's. The
// followers are asked (Config.PeerProgress) at once, each within ctx.
func (s *Server) AutopilotHealth(ctx context.Context) (*ClusterHealth, error) {
	if !s.IsLeader() {
		return nil, ErrNoLeader
	}
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, ErrNoLeader
	}
	members := map[string]gossip.Member{}
	if s.serf != nil {
		for _, m := range s.serf.members.Members() {
			members[m.Name] = m
		}
	}
	me := s.Progress()
	servers := f.Configuration().Servers
	out := &ClusterHealth{Healthy: true, Servers: make([]ServerHealth, len(servers))}
	var wg sync.WaitGroup
	for i, srv := range servers {
		h := &out.Servers[i]
		*h = ServerHealth{ID: string(srv.ID), Name: string(srv.ID), Address: string(srv.Address),
			Voter: srv.Suffrage == raft.Voter, LastContact: -1, SerfStatus: gossip.StatusNone.String()}
		if string(srv.ID) == s.cfg.NodeName {
			h.Leader, h.SerfStatus = true, gossip.StatusAlive.String()
			h.LastContact, h.LastTerm, h.LastIndex = 0, me.Term, me.LastIndex
			continue
		}
		m, ok := members[string(srv.ID)]
		if !ok {
			continue
		}
		h.SerfStatus = m.Status.String()
		if m.Status != gossip.StatusAlive || s.cfg.PeerProgress == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := s.cfg.PeerProgress(ctx, m)
			if err != nil {
				s.log.Debug("autopilot health: cannot ask a server how far its raft is", "server", h.ID, "error", err)
				return
			}
			h.LastContact, h.LastTerm, h.LastIndex = p.LastContact, p.Term, p.LastIndex
		}()
	}
	wg.Wait()
	now := s.clk.Now()
	voters, healthyVoters, aliveVoters := 0, 0, 0
	for i := range out.Servers {
		h := &out.Servers[i]
		h.Healthy = h.SerfStatus == gossip.StatusAlive.String() &&
			h.LastContact >= 0 && h.LastContact <= HealthLastContact &&
			h.LastTerm == me.Term && h.LastIndex+HealthMaxTrailingLogs >= me.LastIndex
		h.StableSince = s.health.stable(me.Term, h.ID, h.Healthy, now)
		out.Healthy = out.Healthy && h.Healthy
		if h.Voter {
			voters++
			if h.Healthy {
				healthyVoters++
			}
			if h.SerfStatus == gossip.StatusAlive.String() {
				aliveVoters++
			}
		}
	}
	out.FailureTolerance = max(healthyVoters-(voters/2+1), 0)
	out.OptimisticFailureTolerance = max(aliveVoters-(voters/2+1), 0)
	return out, nil
}
