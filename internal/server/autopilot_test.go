package server

import (
	"context"
	"errors"
	"testing"
	"time"
)

func healthOf(h *ClusterHealth, name string) ServerHealth {
	for _, s := range h.Servers {
		if s.Name == name {
			return s
		}
	}
	return ServerHealth{}
}

// TestClusterAutopilotHealth: the leader judges three servers healthy,
// tolerating one failure; a follower that reports itself behind (no term,
// never heard from a leader) is unhealthy, since the moment it was first
// seen so on the leader's clock, and healthy again once it catches up; a
// follower stopped is failed in gossip and unhealthy; a follower does not
// judge.
func TestClusterAutopilotHealth(t *testing.T) {
	c := newTestCluster(t)
	servers, leader := c.startThree()
	ctx := context.Background()
	var h *ClusterHealth
	var err error
	gaWait(t, 10*time.Second, "three healthy servers", func() bool {
		h, err = leader.AutopilotHealth(ctx)
		return err == nil && h.Healthy
	})
	if h.FailureTolerance != 1 || h.OptimisticFailureTolerance != 1 || len(h.Servers) != 3 {
		t.Fatalf("three healthy servers: %+v", h)
	}
	var follower, other *Server
	for _, s := range servers {
		if s == leader {
			continue
		}
		if follower == nil {
			follower = s
		} else {
			other = s
		}
		if _, err := s.AutopilotHealth(ctx); !errors.Is(err, ErrNoLeader) {
			t.Errorf("health asked of follower %s: %v, want ErrNoLeader", s.NodeName(), err)
		}
	}
	name := follower.NodeName()
	healthySince := healthOf(h, name).StableSince

	c.clk.Advance(time.Minute)
	c.mu.Lock()
	c.behind[name] = true
	c.mu.Unlock()
	if h, err = leader.AutopilotHealth(ctx); err != nil {
		t.Fatal(err)
	}
	f := healthOf(h, name)
	if h.Healthy || h.FailureTolerance != 0 || h.OptimisticFailureTolerance != 1 || f.Healthy || f.LastContact >= 0 || !f.StableSince.Equal(c.clk.Now()) {
		t.Fatalf("a follower behind: %+v (cluster healthy %v, tolerance %d)", f, h.Healthy, h.FailureTolerance)
	}
	if !f.StableSince.After(healthySince) {
		t.Errorf("StableSince did not move when %s became unhealthy: %v then %v", name, healthySince, f.StableSince)
	}

	c.clk.Advance(time.Minute)
	c.mu.Lock()
	c.behind[name] = false
	c.mu.Unlock()
	gaWait(t, 10*time.Second, name+" healthy again", func() bool {
		h, err = leader.AutopilotHealth(ctx)
		return err == nil && h.Healthy
	})
	if got := healthOf(h, name).StableSince; !got.Equal(c.clk.Now()) {
		t.Errorf("%s healthy again since %v, want %v", name, got, c.clk.Now())
	}

	other.Shutdown()
	gaWait(t, 20*time.Second, other.NodeName()+" failed in gossip", func() bool {
		h, err = leader.AutopilotHealth(ctx)
		return err == nil && healthOf(h, other.NodeName()).SerfStatus == "failed"
	})
	if o := healthOf(h, other.NodeName()); o.Healthy || h.Healthy || h.FailureTolerance != 0 {
		t.Fatalf("with %s stopped: %+v, cluster %+v", other.NodeName(), o, h)
	}
}

func TestParseProgress(t *testing.T) {
	for _, c := range []struct {
		stats map[string]any
		want  Progress
		err   bool
	}{
		{map[string]any{"term": "3", "last_log_index": "42", "last_contact": "0"}, Progress{Term: 3, LastIndex: 42}, false},
		{map[string]any{"term": "3", "last_log_index": "42", "last_contact": "12.5ms"}, Progress{3, 42, 12500 * time.Microsecond}, false},
		{map[string]any{"term": "3", "last_log_index": "42", "last_contact": "never"}, Progress{3, 42, -1}, false},
		{map[string]any{"term": "3", "last_log_index": "42"}, Progress{3, 42, -1}, false},
		{map[string]any{"term": "x", "last_log_index": "42"}, Progress{}, true},
		{map[string]any{"term": "3", "last_log_index": 42.0}, Progress{}, true},
		{map[string]any{"term": "3", "last_log_index": "42", "last_contact": "soon"}, Progress{}, true},
		{nil, Progress{}, true},
	} {
		got, err := ParseProgress(c.stats)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("ParseProgress(%v) = %+v, %v; want %+v, error %v", c.stats, got, err, c.want, c.err)
		}
	}
}

// TestClusterTransferLeadershipTo: the leader hands the leadership to the
// follower named, then (no name) to the most up-to-date one; the requests
// that cannot be done are refused with their reasons, and a follower
// refuses with ErrNoLeader (its router forwards to the leader).
func TestClusterTransferLeadershipTo(t *testing.T) {
	c := newTestCluster(t)
	servers, leader := c.startThree()
	var target *Server
	for _, s := range servers {
		if s != leader {
			target = s
			if err := s.TransferLeadershipTo(""); !errors.Is(err, ErrNoLeader) {
				t.Errorf("transfer asked of follower %s: %v, want ErrNoLeader", s.NodeName(), err)
			}
			break
		}
	}
	for _, cs := range []struct {
		id   string
		want error
	}{{"nosuch", ErrNoSuchPeer}, {leader.NodeName(), ErrTransferToSelf}} {
		if err := leader.TransferLeadershipTo(cs.id); !errors.Is(err, cs.want) {
			t.Errorf("transfer to %q: %v, want %v", cs.id, err, cs.want)
		}
	}
	if err := leader.TransferLeadershipTo(target.NodeName()); err != nil {
		t.Fatalf("transfer to %s: %v", target.NodeName(), err)
	}
	gaWait(t, 10*time.Second, target.NodeName()+" leads", target.IsLeader)
	if err := target.TransferLeadershipTo(""); err != nil {
		t.Fatalf("transfer from %s to any follower: %v", target.NodeName(), err)
	}
	gaWait(t, 10*time.Second, "another server leads", func() bool {
		for _, s := range servers {
			if s != target && s.IsLeader() {
				return true
			}
		}
		return false
	})

	solo := c.start("solo", BootstrapAlone, 0, nil)
	gaWait(t, 10*time.Second, "solo leads", solo.IsLeader)
	if err := solo.TransferLeadershipTo(""); !errors.Is(err, ErrNoOtherVoter) {
		t.Errorf("transfer asked of a lone server: %v, want ErrNoOtherVoter", err)
	}
}
