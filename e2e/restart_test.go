package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestCrashDurability: writers stream PUTs at an agent on a data directory;
// the agent is killed with SIGKILL while they write, and restarted on the
// same directory. Every write that was answered true must be there: each
// key holds at least the last value acknowledged for it (and no more than
// the last value sent).
func TestCrashDurability(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raftAddr := freeAddr(t)
	a := startAgent(t, agentOpts{dataDir: dir, raftAddr: raftAddr})

	const (
		writers      = 8
		perWriter    = 2000 // bound on each writer's writes
		killAfter    = 400  // acknowledged writes, all writers together
		writeTimeout = 5 * time.Second
	)
	hc := &http.Client{
		Timeout:   writeTimeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: writers, DisableCompression: true},
	}
	t.Cleanup(hc.CloseIdleConnections)
	var (
		acked   [writers]atomic.Uint64 // last value answered true, per writer
		sent    [writers]atomic.Uint64 // last value sent, per writer
		total   atomic.Int64
		reached = make(chan struct{})
		once    sync.Once
		wg      sync.WaitGroup
	)
	deadline := time.Now().Add(15 * time.Second)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			url := fmt.Sprintf("%s/v1/kv/crash/w%d", a.url(), w)
			for v := uint64(1); v <= perWriter && time.Now().Before(deadline); v++ {
				sent[w].Store(v)
				req, _ := http.NewRequest("PUT", url, strings.NewReader(strconv.FormatUint(v, 10)))
				resp, err := hc.Do(req)
				if err != nil {
					return // the agent is gone
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "true" {
					return
				}
				acked[w].Store(v)
				if total.Add(1) == killAfter {
					once.Do(func() { close(reached) })
				}
			}
		}(w)
	}

	select {
	case <-reached:
	case <-time.After(15 * time.Second):
		t.Logf("only %d writes acknowledged in 15s; killing anyway", total.Load())
	}
	a.kill() // SIGKILL, with writes in flight
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(20 * time.Second):
		t.Fatal("writers did not stop after the agent died")
	}
	if n := total.Load(); n < 50 {
		t.Fatalf("only %d writes acknowledged before the kill: too few to test anything", n)
	}

	b := startAgent(t, agentOpts{dataDir: dir, raftAddr: raftAddr})
	kv := b.client().KV()
	var inFlight uint64
	for w := 0; w < writers; w++ {
		p, _, err := kv.Get(fmt.Sprintf("crash/w%d", w), &api.QueryOptions{RequireConsistent: true})
		if err != nil {
			t.Fatalf("after restart: %v", err)
		}
		ack, snt := acked[w].Load(), sent[w].Load()
		var got uint64
		if p != nil {
			got, err = strconv.ParseUint(string(p.Value), 10, 64)
			if err != nil {
				t.Fatalf("crash/w%d holds %q", w, p.Value)
			}
		}
		if got < ack || got > snt {
			t.Errorf("crash/w%d = %d after restart; acknowledged %d, sent up to %d", w, got, ack, snt)
		}
		inFlight += got - ack
	}
	t.Logf("%d writes acknowledged before SIGKILL; %d unacknowledged ones survived too", total.Load(), inFlight)
}

// TestCleanRestart: SIGTERM shuts the agent down with exit code 0, and a
// restart on the same directory brings back its sessions, their locks, and
// the lock-delay of a session destroyed before the restart (holdfast keeps
// lock-delay in the replicated state; Consul forgets it).
func TestCleanRestart(t *testing.T) {
	t.Parallel()
	restartKeepsSessions(t, func(a *agent) {
		if code := a.terminate(15 * time.Second); code != 0 {
			t.Fatalf("exit code %d after SIGTERM\nstderr:\n%s", code, tail(a.stderr.String(), 4096))
		}
	})
}

// TestKilledRestart is TestCleanRestart with SIGKILL: sessions, locks and
// lock-delays were acknowledged once they were in the fsynced log, so a
// process that gets no chance to shut down loses none of them.
// (TestCrashDurability kills the agent during plain writes only.)
func TestKilledRestart(t *testing.T) {
	t.Parallel()
	restartKeepsSessions(t, func(a *agent) { a.kill() })
}

// restartKeepsSessions builds sessions, locks and a lock-delay on an agent,
// stops it with stop, restarts it on the same directory and checks they
// are all back.
func restartKeepsSessions(t *testing.T, stop func(*agent)) {
	dir := t.TempDir()
	raftAddr := freeAddr(t)
	a := startAgent(t, agentOpts{dataDir: dir, raftAddr: raftAddr})
	c := a.client()
	kv, s := c.KV(), c.Session()

	plain, _, err := s.Create(&api.SessionEntry{Name: "plain"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ttl, _, err := s.Create(&api.SessionEntry{Name: "ttl", TTL: "60s", Behavior: "delete"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	gone, _, err := s.Create(&api.SessionEntry{Name: "gone", LockDelay: 30 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for key, sess := range map[string]string{"r/plain": plain, "r/ttl": ttl, "r/gone": gone} {
		if ok, _, err := kv.Acquire(&api.KVPair{Key: key, Value: []byte(key), Session: sess}, nil); err != nil || !ok {
			t.Fatalf("acquire %s: %v %v", key, ok, err)
		}
	}
	if _, err := s.Destroy(gone, nil); err != nil {
		t.Fatal(err)
	}
	before, _, err := s.List(nil)
	if err != nil || len(before) != 2 {
		t.Fatalf("sessions before restart: %v %v", before, err)
	}
	_, meta, err := kv.Get("r/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	lastIndex := meta.LastIndex

	stop(a)

	b := startAgent(t, agentOpts{dataDir: dir, raftAddr: raftAddr})
	c = b.client()
	kv, s = c.KV(), c.Session()
	after, _, err := s.List(nil)
	if err != nil || len(after) != 2 {
		t.Fatalf("sessions after restart: %v %v", after, err)
	}
	byID := map[string]*api.SessionEntry{}
	for _, e := range before {
		byID[e.ID] = e
	}
	for _, e := range after {
		old := byID[e.ID]
		if old == nil || old.Name != e.Name || old.TTL != e.TTL || old.Behavior != e.Behavior ||
			old.LockDelay != e.LockDelay || old.CreateIndex != e.CreateIndex || old.Node != e.Node {
			t.Errorf("session after restart %+v, before %+v", e, old)
		}
	}
	for key, sess := range map[string]string{"r/plain": plain, "r/ttl": ttl} {
		p, _, err := kv.Get(key, nil)
		if err != nil || p == nil || p.Session != sess || p.LockIndex != 1 || string(p.Value) != key {
			t.Errorf("%s after restart: %+v %v", key, p, err)
		}
	}
	if e, _, err := s.Renew(ttl, nil); err != nil || e == nil || e.ID != ttl {
		t.Errorf("renew after restart: %+v %v", e, err)
	}

	// r/gone was freed by an invalidation with a 30s lock-delay less than
	// a restart ago: still refused, with the delay left.
	code, body, hdr, err := rawPut(ctxTimeout(t, 10*time.Second), b.url(), "/v1/kv/r/gone?acquire="+plain, "x")
	if err != nil || code != 200 || body != "false" {
		t.Fatalf("acquire under lock-delay after restart: %d %q %v", code, body, err)
	}
	if left, err := time.ParseDuration(hdr.Get("X-Holdfast-Lock-Delay")); err != nil || left <= 0 || left > 30*time.Second {
		t.Errorf("X-Holdfast-Lock-Delay %q after restart: %v", hdr.Get("X-Holdfast-Lock-Delay"), err)
	}

	// New writes carry on from the old indexes.
	if _, err := kv.Put(&api.KVPair{Key: "r/new", Value: []byte("n")}, nil); err != nil {
		t.Fatal(err)
	}
	p, _, err := kv.Get("r/new", nil)
	if err != nil || p == nil || p.ModifyIndex <= lastIndex {
		t.Fatalf("write after restart: %+v %v (index before %d)", p, err, lastIndex)
	}
}

// TestRestartReplay: while a restarted agent replays its log, it must not
// answer from the half-built state as if it were current. Reads in the
// default mode must not report an acknowledged key missing with
// X-Consul-KnownLeader true, and a session destroy must not answer true
// for a session it has not replayed yet (and then let it live on).
func TestRestartReplay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raftAddr := freeAddr(t)
	a := startAgent(t, agentOpts{dataDir: dir, raftAddr: raftAddr})
	c := a.client()
	sess, _, err := c.Session().Create(&api.SessionEntry{Name: "replayed"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: "replay/lock", Session: sess}, nil); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	// Enough log for the replay to take a while.
	const keys = 300
	for i := 0; i < keys; i++ {
		if _, err := c.KV().Put(&api.KVPair{Key: fmt.Sprintf("replay/k%d", i), Value: []byte("v")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	a.kill()

	b := launchAgent(t, agentOpts{dataDir: dir, raftAddr: raftAddr})
	hc := &http.Client{Timeout: 5 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	last := fmt.Sprintf("%s/v1/kv/replay/k%d", b.url(), keys-1)
	var (
		missing   []string // reads that said "no such key" with a known leader
		destroyed bool     // a destroy was answered true
		readOK    bool
	)
	deadline := time.Now().Add(20 * time.Second)
	for attempt := 0; attempt < 20000 && time.Now().Before(deadline) && !(readOK && destroyed); attempt++ {
		if !readOK {
			resp, err := hc.Get(last)
			if err == nil {
				resp.Body.Close()
				switch {
				case resp.StatusCode == 200:
					readOK = true
				case resp.StatusCode == 404 && resp.Header.Get("X-Consul-KnownLeader") == "true":
					missing = append(missing, "index "+resp.Header.Get("X-Consul-Index"))
				}
			}
		}
		if !destroyed {
			code, body, _, err := rawPut(ctxTimeout(t, 5*time.Second), b.url(), "/v1/session/destroy/"+sess, "")
			destroyed = err == nil && code == 200 && body == "true"
		}
	}
	if !readOK || !destroyed {
		t.Fatalf("restarted agent never answered: read %v, destroy %v", readOK, destroyed)
	}
	b.waitReady()
	if len(missing) > 0 {
		t.Errorf("%d default-mode reads of an acknowledged key answered 404 with X-Consul-KnownLeader true "+
			"while the restarted leader replayed its log (first at %s, last at %s)", len(missing), missing[0], missing[len(missing)-1])
	}
	info, _, err := b.client().Session().Info(sess, &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if info != nil {
		p, _, _ := b.client().KV().Get("replay/lock", &api.QueryOptions{RequireConsistent: true})
		t.Errorf("session destroy answered true during the replay, but the session lives on (and holds replay/lock: %v)",
			p != nil && p.Session == sess)
	}
}

// TestAgentChecksSurviveRestart: the agent keeps its checks and services
// in its data directory, so a restart brings them back with their status,
// and a session bound to an agent TTL check lives on (Consul's agent does
// the same; before, the restarted agent deregistered the check as stale
// and the session died with it).
func TestAgentChecksSurviveRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raftAddr := freeAddr(t)
	a := startAgent(t, agentOpts{dataDir: dir, raftAddr: raftAddr})
	c := a.client()
	if err := c.Agent().CheckRegister(&api.AgentCheckRegistration{ID: "app", Name: "app",
		AgentServiceCheck: api.AgentServiceCheck{TTL: "60s"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Agent().UpdateTTL("app", "up", api.HealthPassing); err != nil {
		t.Fatal(err)
	}
	if err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "web", Port: 80,
		Check: &api.AgentServiceCheck{TTL: "60s", Status: api.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	sess, _, err := c.Session().Create(&api.SessionEntry{Name: "bound", Checks: []string{"serfHealth", "app"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: "r/bound", Session: sess}, nil); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if code := a.terminate(15 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}

	b := startAgent(t, agentOpts{dataDir: dir, raftAddr: raftAddr})
	c = b.client()
	eventually(t, 10*time.Second, "the agent's checks back after the restart", func() bool {
		checks, err := c.Agent().Checks()
		return err == nil && checks["app"] != nil && checks["app"].Status == api.HealthPassing &&
			checks["service:web"] != nil && checks["service:web"].Status == api.HealthPassing
	})
	if svcs, err := c.Agent().Services(); err != nil || svcs["web"] == nil || svcs["web"].Port != 80 {
		t.Fatalf("services after restart: %v %v", svcs, err)
	}
	if e, _, err := c.Session().Info(sess, nil); err != nil || e == nil {
		t.Fatalf("the session bound to the agent's TTL check did not survive the restart: %+v %v", e, err)
	}
	if p, _, err := c.KV().Get("r/bound", nil); err != nil || p == nil || p.Session != sess {
		t.Fatalf("r/bound after restart: %+v %v", p, err)
	}
	// The check is live again: failing it ends the session.
	if err := c.Agent().UpdateTTL("app", "down", api.HealthCritical); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the session to end with its check", func() bool {
		e, _, err := c.Session().Info(sess, nil)
		return err == nil && e == nil
	})
}
