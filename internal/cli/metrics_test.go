package cli

import (
	"testing"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"
)

// newTestMetrics is go-metrics as the agent configures it, on a fresh
// in-memory sink behind a sampledSink, without the runtime collector.
func newTestMetrics(t testing.TB) (*metrics.Metrics, *metrics.InmemSink) {
	inmem := metrics.NewInmemSink(time.Hour, time.Hour)
	conf := metrics.DefaultConfig("") // sampledSink puts "holdfast" first
	conf.EnableHostname = false
	conf.EnableRuntimeMetrics = false
	m, err := metrics.New(conf, &sampledSink{next: inmem})
	if err != nil {
		t.Fatal(err)
	}
	return m, inmem
}

func TestSampledSink(t *testing.T) {
	m, inmem := newTestMetrics(t)
	const n = 20 * hotEvery
	for i := 0; i < n; i++ {
		m.IncrCounter([]string{"raft", "apply"}, 1)                  // hot counter
		m.AddSample([]string{"raft", "leader", "dispatchLog"}, 2)    // hot sample
		m.AddSample([]string{"raft", "leader", "dispatchLog2"}, 2)   // not hot: a name raft does not use
		m.IncrCounter([]string{"raft", "state", "leader"}, 1)        // not hot
		m.SetGauge([]string{"raft", "leader", "dispatchNumLogs"}, 3) // hot gauge
	}
	iv := inmem.Data()[0]
	iv.RLock()
	defer iv.RUnlock()
	for name, want := range map[string]struct {
		count int
		sum   float64
	}{
		"holdfast.raft.apply":               {n / hotEvery, n}, // each passed call carries hotEvery
		"holdfast.raft.state.leader":        {n, n},
		"holdfast.raft.leader.dispatchLog":  {n / hotEvery, 2 * n / hotEvery},
		"holdfast.raft.leader.dispatchLog2": {n, 2 * n},
	} {
		got, ok := iv.Counters[name]
		if !ok {
			got, ok = iv.Samples[name]
		}
		if !ok {
			t.Errorf("%s: not in the sink", name)
			continue
		}
		if got.Count != want.count || got.Sum != want.sum {
			t.Errorf("%s: count %d sum %v, want %d and %v", name, got.Count, got.Sum, want.count, want.sum)
		}
	}
	if g, ok := iv.Gauges["holdfast.raft.leader.dispatchNumLogs"]; !ok || g.Value != 3 {
		t.Errorf("hot gauge: %+v %v, want 3", g, ok)
	}
}

func TestHotSlotsAreDistinct(t *testing.T) {
	keys := [][]string{
		{"raft", "apply"}, {"raft", "commitTime"}, {"raft", "commitNumLogs"},
		{"raft", "verify_leader"}, {"raft", "barrier"},
		{"raft", "fsm", "enqueue"}, {"raft", "fsm", "apply"},
		{"raft", "fsm", "applyBatch"}, {"raft", "fsm", "applyBatchNum"},
		{"raft", "leader", "dispatchLog"}, {"raft", "leader", "dispatchNumLogs"},
	}
	if len(keys) != hotSlots {
		t.Fatalf("%d hot keys listed here, hotSlots is %d", len(keys), hotSlots)
	}
	seen := map[int]bool{}
	for _, k := range keys {
		i := hotSlot(k)
		if i < 0 || i >= hotSlots || seen[i] {
			t.Errorf("hotSlot(%v) = %d: out of range or taken", k, i)
		}
		seen[i] = true
	}
	for _, k := range [][]string{{"raft"}, {"raft", "state", "leader"}, {"memberlist", "gossip"},
		{"raft", "fsm", "snapshot"}, {"apply"}, {"holdfast", "raft", "apply"}} {
		if i := hotSlot(k); i != -1 {
			t.Errorf("hotSlot(%v) = %d, want -1", k, i)
		}
	}
}

// BenchmarkRaftHotMetrics is what raft's per-write metrics cost through
// the agent's configuration: MeasureSince of raft.commitTime and an
// IncrCounter of raft.apply, sampled, into both sinks.
func BenchmarkRaftHotMetrics(b *testing.B) {
	t := agentTelemetry()
	_ = t
	start := time.Now()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		metrics.IncrCounter([]string{"raft", "apply"}, 1)
		metrics.MeasureSince([]string{"raft", "commitTime"}, start)
	}
}
