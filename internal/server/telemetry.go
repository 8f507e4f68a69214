package server

import (
	"sync/atomic"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"
	"github.com/hashicorp/raft"
)

// The server's own metrics, beside those raft and memberlist emit through
// the same go-metrics sink (raft.commitTime, raft.fsm.apply, memberlist.*):
//
//	apply                    sample, ms: a write from the server's apply
//	                         path to the state machine's answer (the gate,
//	                         raft's log and fsync, the apply), one write in
//	                         applySampleEvery
//	session_ttl.active       gauge: sessions whose TTL timer runs here (0
//	                         but on the leader)
//	session_ttl.invalidate   sample, ms: the write that invalidates a session
//	                         whose TTL lapsed, from its start to its commit
//	state.kv_entries         gauge: keys in the KV store
//	state.kv_locked          gauge: keys a session holds
//	state.sessions           gauge: live sessions
//	state.nodes, state.services, state.checks, state.prepared_queries
//	                         gauges: the catalog and the prepared queries
//	lock.acquired            counter: acquires (PUT ?acquire) that took or
//	                         kept their key
//	lock.refused             counter: acquires refused, the key held by
//	                         another session (or the session's write lost
//	                         in the state machine)
//	lock.delayed             counter: acquires refused for the key's
//	                         lock-delay
//	raft.applied_index       gauge: the last index applied to the state
//	                         (go-metrics' gauges are float32: exact up to
//	                         16,777,216, then rounded)
//	raft.log_bytes           gauge: the log's segment files on the disk,
//	                         or its entries in memory
//
// Consul names the first two the same (consul.session_ttl.*). The gauges
// are set every statsInterval by one goroutine, so that the hot paths (a
// PUT, a read) pay nothing for them. That goroutine runs on real time, not
// on the server's clock: the gauges are read-outs, not behaviour, and a
// deadline of theirs on an injected fake clock would be one more timer in
// every test that counts a fake clock's waiters or moves it.

// applySampleEvery: one write in this many is timed for the apply sample,
// as the agent passes one in 16 of raft's own per-write metrics
// (internal/cli/metrics.go, sampledSink): timing every write costs more
// CPU than the sample needs.
const applySampleEvery = 16

// statsInterval is how often the gauges are set: twice in each of the
// 10-second intervals /v1/agent/metrics reports, so that every complete
// interval holds them.
const statsInterval = 5 * time.Second

// statsLoop sets the gauges at once and then every statsInterval until
// shutdown.
func (s *Server) statsLoop() {
	defer s.wg.Done()
	t := time.NewTicker(statsInterval)
	defer t.Stop()
	for {
		s.emitStats()
		select {
		case <-s.shutdownCh:
			return
		case <-t.C:
		}
	}
}

// emitStats sets each gauge once.
func (s *Server) emitStats() {
	m := s.metrics
	m.SetGauge([]string{"session_ttl", "active"}, float32(s.timersActive()))
	u := s.State().Usage()
	for _, g := range []struct {
		name string
		n    int
	}{
		{"kv_entries", u.KVEntries},
		{"kv_locked", u.KVLocked},
		{"sessions", u.Sessions},
		{"nodes", u.Nodes},
		{"services", u.Services},
		{"checks", u.Checks},
		{"prepared_queries", u.PreparedQueries},
	} {
		m.SetGauge([]string{"state", g.name}, float32(g.n))
	}
	m.SetGauge([]string{"raft", "applied_index"}, float32(s.raft.AppliedIndex()))
	s.lockStats.emit(m)
	if s.stores.size != nil {
		if n, err := s.stores.size(); err == nil {
			m.SetGauge([]string{"raft", "log_bytes"}, float32(n))
		}
	}
}

// timersActive is the number of sessions whose TTL timer runs on this
// server: only the leader runs them, and a follower says 0 rather than
// leave the count of its last term standing.
func (s *Server) timersActive() int {
	if s.raft.State() != raft.Leader {
		return 0
	}
	return s.timers.Len()
}

// lockStats counts acquires by outcome with one atomic add each; emit
// takes what was added since its last call (a swap to zero) and passes it
// to go-metrics' counters.
type lockStats struct {
	acquired, refused, delayed atomic.Uint64
}

// count records one acquire: taken (ok), or refused for a lock-delay
// (delayed) or because another session holds the key.
func (l *lockStats) count(ok, delayed bool) {
	switch {
	case ok:
		l.acquired.Add(1)
	case delayed:
		l.delayed.Add(1)
	default:
		l.refused.Add(1)
	}
}

func (l *lockStats) emit(m *metrics.Metrics) {
	for _, c := range []struct {
		name string
		n    *atomic.Uint64
	}{{"acquired", &l.acquired}, {"refused", &l.refused}, {"delayed", &l.delayed}} {
		if d := c.n.Swap(0); d > 0 {
			m.IncrCounter([]string{"lock", c.name}, float32(d))
		}
	}
}
