package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// TestAgentMetrics reads /v1/agent/metrics of a real agent through
// Consul's Go client (Agent().Metrics(), JSON) and as Prometheus would
// scrape it (?format=prometheus): raft's own metrics and holdfast's
// gauges of the state, which follow a TTL session and a lock.
func TestAgentMetrics(t *testing.T) {
	t.Parallel()
	a := startAgent(t, agentOpts{dev: true, node: "metrics"})
	c := a.client()
	id, _, err := c.Session().Create(&consul.SessionEntry{TTL: "30s", Behavior: "delete"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c.KV().Acquire(&consul.KVPair{Key: "m/lock", Session: id}, nil); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}

	// raft's per-write metrics and holdfast.apply keep one write in 16:
	// 40 more writes make sure of a few.
	for i := 0; i < 40; i++ {
		if _, err := c.KV().Put(&consul.KVPair{Key: "m/w", Value: []byte{byte(i)}}, nil); err != nil {
			t.Fatal(err)
		}
	}

	// The gauges are set every 5 s: poll the Prometheus text until they
	// show the session and the lock (or give up after 20 s).
	want := []string{
		"holdfast_session_ttl_active 1\n",
		"holdfast_state_sessions 1\n",
		"holdfast_state_kv_entries 2\n",
		"holdfast_state_kv_locked 1\n",
		"holdfast_raft_commitTime_count ",
		"holdfast_apply_count ",
		"holdfast_raft_state_leader 1\n",
		"go_goroutines ",
		"process_resident_memory_bytes ",
	}
	missing := want[0]
	defer func() {
		if t.Failed() && missing != "nothing" {
			t.Logf("the Prometheus text lacked %q", missing)
		}
	}()
	eventually(t, 20*time.Second, "the Prometheus text showing the session, the lock and the sampled writes", func() bool {
		resp, err := http.Get(a.url() + "/v1/agent/metrics?format=prometheus")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Fatalf("prometheus format: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				missing = w
				return false
			}
		}
		missing = "nothing"
		return true
	})

	// JSON, as Consul's agent answers it: the last complete 10 s interval
	// (or the first one, early in an agent's life), which holds the
	// gauges set twice in every interval.
	// Early in the agent's life that is the interval under way, which
	// may not hold the runtime gauges yet (their collector's first round
	// came late in a loaded run): poll.
	var gauges map[string]float32
	eventually(t, 20*time.Second, "the JSON gauges holding the state's and the runtime's", func() bool {
		info, err := c.Agent().Metrics()
		if err != nil {
			t.Fatal(err)
		}
		if info.Timestamp == "" {
			t.Fatal("no Timestamp in the JSON metrics")
		}
		gauges = map[string]float32{}
		for _, g := range info.Gauges {
			gauges[g.Name] = g.Value
		}
		_, nodes := gauges["holdfast.state.nodes"]
		_, goroutines := gauges["holdfast.runtime.num_goroutines"]
		return nodes && goroutines
	})

	resp, err := http.Get(a.url() + "/v1/agent/metrics?format=json")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), `format "json" is not known`) {
		t.Errorf("unknown format: %d %q, want 400 saying so", resp.StatusCode, b)
	}
}
