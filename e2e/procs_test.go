package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"testing"
)

// agentRuntime reads the "Stats" -> "runtime" section of /v1/agent/self.
func agentRuntime(t *testing.T, a *agent) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + a.httpAddr + "/v1/agent/self")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var self struct {
		Stats struct {
			Runtime map[string]string `json:"runtime"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&self); err != nil {
		t.Fatal(err)
	}
	return self.Stats.Runtime
}

// An agent held to one CPU still runs two Ps, so that the raft log's fsync
// (which keeps its P while it runs) does not stop every other goroutine;
// a GOMAXPROCS the operator sets is left as it is.
func TestServerAgentRaisesGOMAXPROCSOnOneCPU(t *testing.T) {
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		t.Skip("no taskset on this machine (util-linux)")
	}
	if v, ok := os.LookupEnv("GOMAXPROCS"); ok {
		t.Skipf("GOMAXPROCS=%s is set in the test's environment", v)
	}
	wrap := []string{taskset, "-c", "0"}
	flags := func() []string { return []string{"-dev", "-server-addr", freeAddr(t), "-serf-addr", "127.0.0.1:0"} }
	a := launchUnder(t, wrap, "procs", flags()...)
	a.waitReady()
	rt := agentRuntime(t, a)
	if rt["cpu_count"] != "1" || rt["max_procs"] != "2" {
		t.Fatalf("agent on one CPU: runtime stats %v, want cpu_count 1 and max_procs 2", rt)
	}

	t.Setenv("GOMAXPROCS", "1")
	b := launchUnder(t, wrap, "procs-env", flags()...)
	b.waitReady()
	if rt := agentRuntime(t, b); rt["max_procs"] != "1" {
		t.Fatalf("agent with GOMAXPROCS=1 set: runtime stats %v, want max_procs 1", rt)
	}
}
