package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/bench/loadkit"
)

// runFake runs the command line against a fresh fake server and returns
// the JSON result.
func runFake(t *testing.T, f *fakeConsul, addr string, args ...string) map[string]any {
	t.Helper()
	var out, errb bytes.Buffer
	args = append([]string{"-addr", addr, "-json"}, args...)
	code := run(args, &out, &errb)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if code != 0 || len(lines) != 2 {
		t.Fatalf("loadgen %v: exit %d\nstdout: %s\nstderr: %s", args, code, out.String(), errb.String())
	}
	if !strings.HasPrefix(lines[0], "result target=holdfast ") {
		t.Fatalf("bad line %q", lines[0])
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func num(t *testing.T, m map[string]any, k string) float64 {
	t.Helper()
	v, ok := m[k].(float64)
	if !ok {
		t.Fatalf("no numeric %q in %v", k, m)
	}
	return v
}

func TestWorkloadsAgainstFake(t *testing.T) {
	cases := []struct {
		workload string
		unit     string
		extra    []string
	}{
		{loadkit.WorkloadSessionChurn, "ops", nil},
		{loadkit.WorkloadLockOwn, "cycles", nil},
		{loadkit.WorkloadLockContend, "handoffs", []string{"-clients", "4"}},
		{loadkit.WorkloadPut, "ops", []string{"-keys", "50"}},
		{loadkit.WorkloadGetConsistent, "ops", []string{"-keys", "50"}},
		{loadkit.WorkloadWatchWake, "wakes", []string{"-watchers", "3"}},
		{loadkit.WorkloadPing, "ops", nil},
	}
	for _, c := range cases {
		t.Run(c.workload, func(t *testing.T) {
			f, addr := newFakeConsul(t)
			args := append([]string{"-workload", c.workload, "-duration", "300ms", "-pid", strconv.Itoa(os.Getpid())}, c.extra...)
			m := runFake(t, f, addr, args...)
			if m["workload"] != c.workload || m["unit"] != c.unit {
				t.Fatalf("result %v", m)
			}
			if num(t, m, "ops") < 1 || num(t, m, "rate") <= 0 || num(t, m, "errors") != 0 {
				t.Fatalf("no progress or errors: %v", m)
			}
			if num(t, m, "p99_ms") < num(t, m, "p50_ms") {
				t.Fatalf("p99 < p50: %v", m)
			}
			if _, ok := m["cpu_pct"]; !ok {
				t.Fatalf("-pid given but no cpu_pct: %v", m)
			}
			switch c.workload {
			case loadkit.WorkloadLockContend:
				if num(t, m, "acquires") < num(t, m, "ops") {
					t.Fatalf("fewer acquires than hand-offs: %v", m)
				}
			case loadkit.WorkloadWatchWake:
				if num(t, m, "ops") != 3*num(t, m, "rounds") || num(t, m, "missed") != 0 {
					t.Fatalf("every watcher must wake every round: %v", m)
				}
			}
			// Everything the run created is cleaned up.
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.sessions) != 0 {
				t.Fatalf("%d sessions left behind", len(f.sessions))
			}
		})
	}
}

func TestSessionsKeepaliveAgainstFake(t *testing.T) {
	f, addr := newFakeConsul(t)
	// TTL 2s: every session is renewed once a second, first within a second.
	m := runFake(t, f, addr, "-workload", loadkit.WorkloadSessionsKeepalive, "-sessions", "300", "-clients", "4",
		"-session-ttl", "2s", "-duration", "1500ms", "-pid", strconv.Itoa(os.Getpid()))
	if num(t, m, "created") != 300 || num(t, m, "expired") != 0 || num(t, m, "errors") != 0 {
		t.Fatalf("result %v", m)
	}
	// 300 sessions at one renewal per second each for 1.5 s: about 450.
	if r := num(t, m, "ops"); r < 300 || r > 600 {
		t.Fatalf("renewals %v, want about 450: %v", r, m)
	}
	for _, k := range []string{"rss_before_mib", "rss_after_mib", "rss_delta_mib", "cpu_pct", "create_per_s"} {
		num(t, m, k)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sessions) != 0 {
		t.Fatalf("%d sessions left behind", len(f.sessions))
	}
}

func TestSessionsKeepaliveCountsExpired(t *testing.T) {
	f, addr := newFakeConsul(t)
	f.mu.Lock()
	f.dropAll = true
	f.mu.Unlock()
	var out, errb bytes.Buffer
	code := run([]string{"-addr", addr, "-workload", loadkit.WorkloadSessionsKeepalive, "-sessions", "20", "-clients", "2",
		"-session-ttl", "2s", "-duration", "1200ms", "-quiet"}, &out, &errb)
	// Every renewal finds its session gone: nothing renewed, all counted as expired.
	if code == 0 || !strings.Contains(out.String(), " ops=0 ") || !strings.Contains(out.String(), " expired=20 ") {
		t.Fatalf("exit %d out %q err %q", code, out.String(), errb.String())
	}
}

func TestUnreachableServerFails(t *testing.T) {
	var out, errb bytes.Buffer
	// A port nothing listens on: every op fails, the run still ends on time.
	code := run([]string{"-addr", "127.0.0.1:1", "-workload", loadkit.WorkloadPut, "-duration", "200ms", "-clients", "2", "-quiet"}, &out, &errb)
	if code == 0 || !strings.Contains(out.String(), "ops=0 ") {
		t.Fatalf("exit %d out %q", code, out.String())
	}
	if code := run([]string{"-workload", "bogus"}, &out, &errb); code != 2 {
		t.Fatalf("bad flag exit %d", code)
	}
}
