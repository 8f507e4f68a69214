package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// Gossip end to end: a server agent and a client agent as real processes,
// gossiping on loopback with the fast failure-detector profile (set
// HOLDFAST_E2E_GOSSIP_PROFILE=lan to measure the default timing).
//
// The headline figure is TestGossipKilledClientReleasesLock's: the time
// from SIGKILL of a client agent to the release of the lock its session
// held, logged as "SIGKILL -> lock released".

func gossipProfile() string {
	if p := os.Getenv("HOLDFAST_E2E_GOSSIP_PROFILE"); p != "" {
		return p
	}
	return "fast"
}

var gossipLine = regexp.MustCompile(`^\s*gossip:\s+(\S+)`)

// gossipAddr is the gossip address the agent printed.
func (a *agent) gossipAddr() string {
	a.t.Helper()
	var addr string
	eventually(a.t, startTimeout, "agent "+a.node+" prints its gossip address", func() bool {
		for _, line := range strings.Split(a.stdout.String(), "\n") {
			if m := gossipLine.FindStringSubmatch(line); m != nil {
				addr = m[1]
				return true
			}
		}
		return false
	})
	return addr
}

// startGossipServer starts a -dev server agent gossiping on serfAddr
// (127.0.0.1:0 for any port).
func startGossipServer(t *testing.T, node, serfAddr string) *agent {
	t.Helper()
	a := launchWith(t, node, "-dev", "-server-addr", freeAddr(t), "-serf-addr", serfAddr, "-gossip-profile", gossipProfile())
	a.waitReady()
	return a
}

// launchClient starts a client agent joining join; it does not wait.
func launchClient(t *testing.T, node, join string) *agent {
	t.Helper()
	return launchWith(t, node, "-server=false", "-data-dir", t.TempDir(), "-serf-addr", "127.0.0.1:0",
		"-join", join, "-gossip-profile", gossipProfile())
}

// startClient starts a client agent and waits until, through it, its node
// is registered with a passing serfHealth check: it has joined, and the
// leader has reconciled it.
func startClient(t *testing.T, node, join string) *agent {
	t.Helper()
	a := launchClient(t, node, join)
	a.waitReady()
	return a
}

// membersOf runs `holdfast members` against the agent and returns its
// rows as node -> "status type".
func membersOf(t *testing.T, a *agent) map[string]string {
	t.Helper()
	out, err := exec.Command(binPath, "members", "-http-addr", a.httpAddr).CombinedOutput()
	if err != nil {
		t.Fatalf("holdfast members: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) == 0 || strings.Join(strings.Fields(lines[0]), " ") != "Node Address Status Type DC" {
		t.Fatalf("holdfast members output:\n%s", out)
	}
	rows := map[string]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < 4 {
			t.Fatalf("members row %q", l)
		}
		rows[f[0]] = f[2] + " " + f[3]
	}
	return rows
}

func sessionNodeChecks(s *api.SessionEntry) string {
	c := append([]string(nil), s.NodeChecks...)
	c = append(c, s.Checks...)
	sort.Strings(c)
	return strings.Join(c, ",")
}

func TestGossipKilledClientReleasesLock(t *testing.T) {
	srv := startGossipServer(t, "srv1", "127.0.0.1:0")
	cli := startClient(t, "client1", srv.gossipAddr())
	cc, sc := cli.client(), srv.client()

	// A session created through the client, naming no node, is the
	// client's; its default check is the gossip failure detector.
	id, _, err := cc.Session().Create(&api.SessionEntry{Name: "e2e-gossip"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	info, _, err := sc.Session().Info(id, &api.QueryOptions{RequireConsistent: true})
	if err != nil || info == nil {
		t.Fatalf("session info: %+v %v", info, err)
	}
	if info.Node != "client1" || sessionNodeChecks(info) != "serfHealth" {
		t.Fatalf("session through the client: node %q checks %q", info.Node, sessionNodeChecks(info))
	}
	ok, _, err := cc.KV().Acquire(&api.KVPair{Key: "gossip/leader", Value: []byte("client1"), Session: id}, nil)
	if err != nil || !ok {
		t.Fatalf("acquire through the client: %v %v", ok, err)
	}
	pair, meta, err := sc.KV().Get("gossip/leader", &api.QueryOptions{RequireConsistent: true})
	if err != nil || pair == nil || pair.Session != id {
		t.Fatalf("lock as the server sees it: %+v %v", pair, err)
	}
	if rows := membersOf(t, srv); rows["client1"] != "alive client" || rows["srv1"] != "alive server" {
		t.Fatalf("members before the kill: %v", rows)
	}

	// SIGKILL: no goodbye. The server's failure detector must notice, mark
	// serfHealth critical, and so invalidate the session and release the
	// lock. A blocking query on the key wakes when that happens.
	start := time.Now()
	cli.kill()
	idx := meta.LastIndex
	deadline := start.Add(60 * time.Second)
	released := false
	for attempt := 0; attempt < 1000 && time.Now().Before(deadline); attempt++ {
		pair, meta, err = sc.KV().Get("gossip/leader", &api.QueryOptions{WaitIndex: idx, WaitTime: 5 * time.Second})
		if err != nil {
			t.Fatalf("blocking read: %v", err)
		}
		if pair != nil && pair.Session == "" {
			released = true
			break
		}
		idx = meta.LastIndex
	}
	elapsed := time.Since(start)
	if !released {
		t.Fatalf("the lock of a SIGKILLed client agent was not released within %v", time.Since(start))
	}
	t.Logf("SIGKILL -> lock released in %v (gossip profile %s)", elapsed.Round(time.Millisecond), gossipProfile())

	if s, _, err := sc.Session().Info(id, nil); err != nil || s != nil {
		t.Fatalf("session after the kill: %+v %v", s, err)
	}
	checks, _, err := sc.Health().Node("client1", nil)
	if err != nil || len(checks) != 1 || checks[0].CheckID != "serfHealth" || checks[0].Status != "critical" ||
		checks[0].Output != "Agent not live or unreachable" {
		t.Fatalf("client1's checks after the kill: %+v %v", checks, err)
	}
	if rows := membersOf(t, srv); rows["client1"] != "failed client" {
		t.Fatalf("members after the kill: %v", rows)
	}
	// Consul's shape on the wire: status 4 is failed.
	resp, err := http.Get(srv.url() + "/v1/agent/members")
	if err != nil {
		t.Fatal(err)
	}
	var ms []struct {
		Name   string
		Status int
		Tags   map[string]string
	}
	json.NewDecoder(resp.Body).Decode(&ms)
	resp.Body.Close()
	for _, m := range ms {
		if m.Name == "client1" && (m.Status != 4 || m.Tags["role"] != "client") {
			t.Fatalf("/v1/agent/members entry: %+v", m)
		}
	}
}

func TestGossipClientLeavesGracefully(t *testing.T) {
	srv := startGossipServer(t, "srv1", "127.0.0.1:0")
	cli := startClient(t, "client1", srv.gossipAddr())
	cc, sc := cli.client(), srv.client()

	// holdfast members lists both, from either agent.
	for _, a := range []*agent{srv, cli} {
		rows := membersOf(t, a)
		if len(rows) != 2 || rows["srv1"] != "alive server" || rows["client1"] != "alive client" {
			t.Fatalf("members via %s: %v", a.node, rows)
		}
	}
	// /v1/agent/self through the client describes the client.
	self, err := cc.Agent().Self()
	if err != nil || self["Config"]["NodeName"] != "client1" || self["Config"]["Server"] != false {
		t.Fatalf("client self: %v %v", self["Config"], err)
	}

	id, _, err := cc.Session().Create(&api.SessionEntry{Name: "leaver", LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := cc.KV().Acquire(&api.KVPair{Key: "gossip/leaver", Value: []byte("x"), Session: id}, nil); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}

	// SIGTERM: the client leaves the pool, and the leader deregisters its
	// node, which invalidates its session.
	start := time.Now()
	if code := cli.terminate(20 * time.Second); code != 0 {
		t.Fatalf("client agent exit code %d after SIGTERM", code)
	}
	eventually(t, 30*time.Second, "client1 deregistered", func() bool {
		n, _, err := sc.Catalog().Node("client1", nil)
		return err == nil && n == nil
	})
	t.Logf("SIGTERM -> node deregistered in %v", time.Since(start).Round(time.Millisecond))
	if s, _, err := sc.Session().Info(id, nil); err != nil || s != nil {
		t.Fatalf("session after the leave: %+v %v", s, err)
	}
	if p, _, err := sc.KV().Get("gossip/leaver", nil); err != nil || p == nil || p.Session != "" {
		t.Fatalf("lock after the leave: %+v %v", p, err)
	}
	if rows := membersOf(t, srv); rows["client1"] != "left client" {
		t.Fatalf("members after the leave: %v", rows)
	}
	if !strings.Contains(cli.stdout.String(), "holdfast agent shutting down") {
		t.Fatalf("client stdout: %s", cli.stdout.String())
	}
}

func TestGossipJoinErrors(t *testing.T) {
	if binPath == "" {
		t.Skip("e2e tests do not run under -short")
	}
	// A malformed -join stops the agent at once, saying why.
	out, err := exec.Command(binPath, "agent", "-server=false", "-node", "x", "-http-addr", "127.0.0.1:0",
		"-serf-addr", "127.0.0.1:0", "-join", "a:b:c").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), `agent: bad -join: bad join address "a:b:c": want host:port`) {
		t.Fatalf("bad -join: %v\n%s", err, out)
	}

	// An address where nothing listens yet: the client agent runs, says
	// clearly why each attempt failed, answers API calls with Consul's
	// "No known Consul servers", and joins once a server is there.
	serf := freeAddr(t)
	cli := launchClient(t, "client1", serf)
	want := "could not join the pool through " + serf + ": nothing is listening there (connection refused"
	eventually(t, startTimeout, "the client logs its failed join", func() bool {
		return strings.Contains(cli.stderr.String(), want)
	})
	resp, err := http.Get(cli.url() + "/v1/kv/k")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || strings.TrimSpace(string(b)) != "No known Consul servers" {
		t.Fatalf("API call with no server known: %d %s", resp.StatusCode, b)
	}

	srv := startGossipServer(t, "srv1", serf)
	cli.waitReady()
	if rows := membersOf(t, srv); rows["client1"] != "alive client" {
		t.Fatalf("members after the retried join: %v", rows)
	}
	if !strings.Contains(cli.stderr.String(), "joined the gossip pool") {
		t.Fatalf("client never said it joined:\n%s", tail(cli.stderr.String(), 2048))
	}
}

// TestGossipEncrypted: a server started with a key from holdfast keygen
// says its gossip is encrypted; a client agent given the same key (in a
// file) joins and serves; one with another key, or none, is refused with
// a sentence saying why, and the server never lists it.
func TestGossipEncrypted(t *testing.T) {
	t.Parallel()
	if binPath == "" {
		t.Skip("e2e tests do not run under -short")
	}
	keygen := func() string {
		stdout, stderr, code := runHoldfast(t, "keygen")
		if code != 0 {
			t.Fatalf("holdfast keygen: exit %d\n%s", code, stderr)
		}
		return strings.TrimSpace(stdout)
	}
	key := keygen()
	srv := launchWith(t, "srv-enc", "-dev", "-server-addr", freeAddr(t), "-serf-addr", "127.0.0.1:0",
		"-gossip-profile", gossipProfile(), "-encrypt", key)
	srv.waitReady()
	srv.waitStdout("(encrypted)")
	keyFile := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl := launchWith(t, "cl-enc", "-server=false", "-data-dir", t.TempDir(), "-serf-addr", "127.0.0.1:0",
		"-join", srv.gossipAddr(), "-gossip-profile", gossipProfile(), "-encrypt-file", keyFile)
	cl.waitReady()
	if _, err := cl.client().KV().Put(&api.KVPair{Key: "enc/k", Value: []byte("v")}, nil); err != nil {
		t.Fatalf("a write through the client agent with the key: %v", err)
	}

	for _, c := range []struct {
		node string
		args []string
		why  string
	}{
		{"cl-nokey", nil, "the pool there is encrypted and this agent has no key"},
		{"cl-otherkey", []string{"-encrypt", keygen()}, "the pool there uses another key"},
	} {
		a := launchWith(t, c.node, append([]string{"-server=false", "-data-dir", t.TempDir(), "-serf-addr", "127.0.0.1:0",
			"-join", srv.gossipAddr(), "-gossip-profile", gossipProfile()}, c.args...)...)
		eventually(t, 20*time.Second, c.node+" says why it cannot join", func() bool {
			return strings.Contains(a.stderr.String(), c.why)
		})
		if rows := membersOf(t, srv); rows[c.node] != "" {
			t.Errorf("the encrypted pool lists %s: %v", c.node, rows)
		}
	}
	if rows := membersOf(t, srv); rows["cl-enc"] != "alive client" {
		t.Errorf("members of the encrypted pool: %v", rows)
	}
}
