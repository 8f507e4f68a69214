package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"
	promsink "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// telemetry is where an agent's metrics go: go-metrics' global, which raft,
// memberlist and the server (internal/server/telemetry.go) emit to, feeds
// an in-memory sink of 10-second intervals kept for a minute (Consul's
// agent keeps the same) and a Prometheus registry that also carries Go's
// and the process's collectors.
type telemetry struct {
	inmem *metrics.InmemSink
	prom  http.Handler
}

var (
	telemetryOnce sync.Once
	agentMetrics  *telemetry
)

// agentTelemetry installs the process's telemetry the first time it is
// called and returns it. Once per process: go-metrics' global is the
// process's, and its runtime collector starts a goroutine that never ends,
// so a second agent in one process (the CLI's tests) shares the first's.
func agentTelemetry() *telemetry {
	telemetryOnce.Do(func() {
		inmem := metrics.NewInmemSink(10*time.Second, time.Minute)
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		// Expiration 0: a series stays until the process ends. A counter
		// that vanished after a quiet minute would read as a reset to
		// Prometheus' rate().
		ps, err := promsink.NewPrometheusSinkFrom(promsink.PrometheusOpts{Registerer: reg, Name: "holdfast"})
		if err != nil {
			panic(fmt.Sprintf("cli: prometheus sink: %v", err)) // a fresh registry refuses nothing
		}
		// No service name in the config: go-metrics would copy every key to
		// put it first, the 15 in 16 of raft's hot calls that sampledSink
		// drops too. sampledSink puts it first on what it passes.
		conf := metrics.DefaultConfig("")
		conf.EnableHostname = false // the host is Prometheus' instance label, not part of a name
		if _, err := metrics.NewGlobal(conf, &sampledSink{next: metrics.FanoutSink{inmem, ps}}); err != nil {
			panic(fmt.Sprintf("cli: metrics: %v", err)) // NewGlobal fails only on a bad sink URL
		}
		agentMetrics = &telemetry{inmem: inmem, prom: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	})
	return agentMetrics
}

// hotEvery: of the metrics raft emits for every write or every batch of
// writes (hotSlot), one in this many reaches the sinks.
const hotEvery = 16

// sampledSink passes every metric to next, its name prefixed with
// "holdfast", but raft's hot ones (hotSlot),
// of which it passes one in hotEvery: a sample's distribution (its
// quantiles, mean and extremes) stays, its count is of the samples passed
// (a sixteenth); a counter passed is multiplied by hotEvery, so its sum
// stays right on average; a gauge keeps a recent value.
//
// Why: raft 1.7.3 times and counts each write (raft.apply,
// raft.commitTime) and each batch (raft.leader.dispatchLog, raft.fsm.*,
// ...), most of them on its one leader goroutine. Through the two sinks
// that was 8.7 % of the agent's CPU at one PUT client, about 12 us per
// write, and 5.3 % at 32 (CPU profiles under bench/loadgen's put).
type sampledSink struct {
	next metrics.MetricSink
	seq  [hotSlots]atomic.Uint32
}

const hotSlots = 11

// hotSlot returns the slot of one of raft's per-write or per-batch metrics
// (key as raft gives it, without the service name), or -1 for any other.
func hotSlot(key []string) int {
	if len(key) < 2 || key[0] != "raft" {
		return -1
	}
	switch len(key) {
	case 2:
		switch key[1] {
		case "apply":
			return 0
		case "commitTime":
			return 1
		case "commitNumLogs":
			return 2
		case "verify_leader":
			return 3
		case "barrier":
			return 4
		}
	case 3:
		switch key[1] {
		case "fsm":
			switch key[2] {
			case "enqueue":
				return 5
			case "apply":
				return 6
			case "applyBatch":
				return 7
			case "applyBatchNum":
				return 8
			}
		case "leader":
			switch key[2] {
			case "dispatchLog":
				return 9
			case "dispatchNumLogs":
				return 10
			}
		}
	}
	return -1
}

// servicePrefix starts every metric's name.
const servicePrefix = "holdfast"

// pass reports whether this call of key reaches the sinks, with the key
// they get (prefixed) and the factor a counter's value is multiplied by.
func (s *sampledSink) pass(key []string) (bool, []string, float32) {
	f := float32(1)
	if i := hotSlot(key); i >= 0 {
		if s.seq[i].Add(1)%hotEvery != 0 {
			return false, nil, 0
		}
		f = hotEvery
	}
	return true, append([]string{servicePrefix}, key...), f
}

func (s *sampledSink) SetGauge(key []string, val float32) {
	if ok, k, _ := s.pass(key); ok {
		s.next.SetGauge(k, val)
	}
}

func (s *sampledSink) SetGaugeWithLabels(key []string, val float32, labels []metrics.Label) {
	if ok, k, _ := s.pass(key); ok {
		s.next.SetGaugeWithLabels(k, val, labels)
	}
}

func (s *sampledSink) EmitKey(key []string, val float32) {
	if ok, k, _ := s.pass(key); ok {
		s.next.EmitKey(k, val)
	}
}

func (s *sampledSink) IncrCounter(key []string, val float32) {
	if ok, k, f := s.pass(key); ok {
		s.next.IncrCounter(k, val*f)
	}
}

func (s *sampledSink) IncrCounterWithLabels(key []string, val float32, labels []metrics.Label) {
	if ok, k, f := s.pass(key); ok {
		s.next.IncrCounterWithLabels(k, val*f, labels)
	}
}

func (s *sampledSink) AddSample(key []string, val float32) {
	if ok, k, _ := s.pass(key); ok {
		s.next.AddSample(k, val)
	}
}

func (s *sampledSink) AddSampleWithLabels(key []string, val float32, labels []metrics.Label) {
	if ok, k, _ := s.pass(key); ok {
		s.next.AddSampleWithLabels(k, val, labels)
	}
}

// serveMetrics answers GET /v1/agent/metrics: the last complete 10-second
// interval as JSON, in the shape of Consul's agent (what the Go client's
// Agent().Metrics() decodes), or with ?format=prometheus every series in
// Prometheus' text format.
func (t *telemetry) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, fmt.Sprintf("method %s not allowed", r.Method), http.StatusMethodNotAllowed)
		return
	}
	switch f := r.URL.Query().Get("format"); f {
	case "prometheus":
		t.prom.ServeHTTP(w, r)
	case "":
		summary, err := t.inmem.DisplayMetrics(w, r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(summary)
	default:
		http.Error(w, fmt.Sprintf("format %q is not known: leave it out for JSON, or ask for format=prometheus", f), http.StatusBadRequest)
	}
}
