package server

import (
	"context"
	"testing"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/state"
)

// inmemMetrics returns a go-metrics instance of its own (not the process's
// global) writing to a fresh in-memory sink, without the runtime
// collector's goroutine.
func inmemMetrics() (*metrics.Metrics, *metrics.InmemSink) {
	sink := metrics.NewInmemSink(time.Hour, time.Hour)
	conf := metrics.DefaultConfig("holdfast")
	conf.EnableHostname = false
	conf.EnableRuntimeMetrics = false
	m, err := metrics.New(conf, sink)
	if err != nil {
		panic(err)
	}
	return m, sink
}

func gaugesOf(sink *metrics.InmemSink) map[string]float32 {
	data := sink.Data()
	out := map[string]float32{}
	for _, iv := range data {
		iv.RLock()
		for _, g := range iv.Gauges {
			out[g.Name] = g.Value
		}
		iv.RUnlock()
	}
	return out
}

func counterSum(sink *metrics.InmemSink, name string) float64 {
	var sum float64
	for _, iv := range sink.Data() {
		iv.RLock()
		if c, ok := iv.Counters[name]; ok {
			sum += c.Sum
		}
		iv.RUnlock()
	}
	return sum
}

func TestStatsGaugesFollowTheState(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	m, sink := inmemMetrics()
	cfg := testConfig("", clk, nil)
	cfg.Metrics = m
	s := startServer(t, cfg)
	ctx := context.Background()
	id := mustSession(t, s, state.Session{TTL: "10s", LockDelay: 15 * time.Second})
	mustSession(t, s, state.Session{})
	for _, k := range []string{"a", "b"} {
		if _, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: k}}); err != nil {
			t.Fatal(err)
		}
	}
	if ok, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "l", Session: id}}); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}

	// Another session's acquire of the held key is refused.
	other := mustSession(t, s, state.Session{})
	if ok, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "l", Session: other}}); err != nil || ok {
		t.Fatalf("second acquire: %v %v, want refused", ok, err)
	}

	s.emitStats()
	got := gaugesOf(sink)
	if a, r := counterSum(sink, "holdfast.lock.acquired"), counterSum(sink, "holdfast.lock.refused"); a != 1 || r != 1 {
		t.Errorf("lock counters: acquired %v refused %v, want 1 and 1", a, r)
	}
	for name, want := range map[string]float32{
		"holdfast.session_ttl.active":     1,
		"holdfast.state.sessions":         3,
		"holdfast.state.kv_entries":       3,
		"holdfast.state.kv_locked":        1,
		"holdfast.state.nodes":            1,
		"holdfast.state.checks":           1,
		"holdfast.state.services":         0,
		"holdfast.state.prepared_queries": 0,
		"holdfast.raft.applied_index":     float32(s.raft.AppliedIndex()),
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (set: %v), want %v", name, v, ok, want)
		}
	}
	if got["holdfast.raft.log_bytes"] <= 0 {
		t.Errorf("holdfast.raft.log_bytes = %v, want the in-memory log's size", got["holdfast.raft.log_bytes"])
	}

	// The TTL lapses: the invalidation is sampled once, and the gauges
	// follow at their next setting.
	clk.Advance(10 * time.Second)
	waitSessionGone(t, s, id)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		for _, iv := range sink.Data() {
			iv.RLock()
			if v, ok := iv.Samples["holdfast.session_ttl.invalidate"]; ok {
				n += v.Count
			}
			iv.RUnlock()
		}
		if n == 1 {
			break
		}
		// The sample is taken after the write commits, on the expiry's
		// goroutine, which may still be on its way.
		if n > 1 || time.Now().After(deadline) {
			t.Fatalf("session_ttl.invalidate sampled %d times, want 1", n)
		}
		time.Sleep(time.Millisecond)
	}
	// The key went back with its session's lock-delay of 15 s:
	// the other session's acquire is refused for it.
	if ok, left, err := s.KVS(ctx, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "l", Session: other}}); err != nil || ok || left <= 0 {
		t.Fatalf("acquire in lock-delay: %v %v %v, want refused with time left", ok, left, err)
	}
	s.emitStats()
	if d := counterSum(sink, "holdfast.lock.delayed"); d != 1 {
		t.Errorf("lock.delayed = %v, want 1", d)
	}
	got = gaugesOf(sink)
	for name, want := range map[string]float32{
		"holdfast.session_ttl.active": 0,
		"holdfast.state.sessions":     2,
		"holdfast.state.kv_locked":    0,
	} {
		if got[name] != want {
			t.Errorf("after the TTL lapsed: %s = %v, want %v", name, got[name], want)
		}
	}
}

func TestSelfStats(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	mustSession(t, s, state.Session{TTL: "10s"})
	stats, ok := s.Self()["Stats"].(map[string]interface{})
	if !ok {
		t.Fatalf("Self has no Stats: %v", s.Self())
	}
	rs, _ := stats["raft"].(map[string]string)
	if rs["state"] != "Leader" || rs["applied_index"] == "" || rs["applied_index"] == "0" {
		t.Errorf("raft stats: %v", rs)
	}
	hs, _ := stats["holdfast"].(map[string]string)
	for k, want := range map[string]string{"leader": "true", "server": "true", "sessions": "1", "session_ttl_active": "1", "nodes": "1"} {
		if hs[k] != want {
			t.Errorf("holdfast stats %s = %q, want %q (all: %v)", k, hs[k], want, hs)
		}
	}
}
