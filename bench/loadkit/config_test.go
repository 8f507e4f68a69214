package loadkit

import (
	"bytes"
	"context"
	"errors"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func TestConfigCheck(t *testing.T) {
	c := Config{Workload: "put", Duration: time.Second, Timeout: time.Second, SetupTimeout: time.Second,
		Keys: 10, Sessions: 1, MaxOps: 1, SessionTTL: time.Minute}
	if err := c.Check(); err != nil || c.Clients != 32 || c.Watchers != 32 {
		t.Fatalf("check: %v clients=%d", err, c.Clients)
	}
	c.Workload = "nope"
	if err := c.Check(); err == nil {
		t.Fatal("unknown workload accepted")
	}
	c.Workload = WorkloadLockContend
	c.Clients = 0
	c.Watchers = 0
	if err := c.Check(); err != nil || c.Clients != 32 {
		t.Fatalf("lock-contend default clients %d, want 32", c.Clients)
	}
	for w, want := range map[string]int{WorkloadSessionChurn: 8, WorkloadLockOwn: 8, WorkloadWatchWake: 8, WorkloadPing: 1} {
		c.Workload, c.Clients, c.Watchers = w, 0, 0
		if err := c.Check(); err != nil || c.Clients != want {
			t.Errorf("%s default clients %d, want %d (err %v)", w, c.Clients, want, err)
		}
	}
}

func TestRunPrintsAndExits(t *testing.T) {
	cfg := &Config{Target: "t", Workload: WorkloadPut, Duration: time.Second, Timeout: time.Second,
		SetupTimeout: time.Hour, JSON: true}
	cases := []struct {
		name     string
		quiet    bool
		ops      int64
		err      error
		code     int
		stdout   []string // substrings
		stderr   []string
		noStderr string
	}{
		{name: "ok", ops: 3, code: 0, stdout: []string{"result target=t workload=put clients=2 ", " ops=3 errors=2 ", " gen_gcs=", `{"target":"t",`},
			stderr: []string{"error: op: e1\n"}},
		{name: "nothing done", ops: 0, code: 1, stdout: []string{" ops=0 "}, stderr: []string{"kit: no operation succeeded\n"}},
		{name: "failed", ops: 5, err: errors.New("boom"), code: 1, stdout: []string{" ops=5 "}, stderr: []string{"kit: boom\n"}},
		{name: "quiet", quiet: true, ops: 1, code: 0, noStderr: "error:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := *cfg
			cfg.Quiet = c.quiet
			var out, errb bytes.Buffer
			code := Run("kit", &cfg, &out, &errb, func(ctx context.Context, el *ErrLog, pw *ProcWatch) (*Result, error) {
				if ctx.Err() != nil || pw == nil {
					t.Error("no live context or ProcWatch")
				}
				el.Add("op", errors.New("e1"))
				el.Add("op", errors.New("e2"))
				return &Result{Clients: 2, Ops: c.ops, Elapsed: time.Second, Unit: "ops", LatName: "op"}, c.err
			})
			if code != c.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, c.code, out.String(), errb.String())
			}
			for _, s := range c.stdout {
				if !strings.Contains(out.String(), s) {
					t.Errorf("stdout %q lacks %q", out.String(), s)
				}
			}
			for _, s := range c.stderr {
				if !strings.Contains(errb.String(), s) {
					t.Errorf("stderr %q lacks %q", errb.String(), s)
				}
			}
			if c.noStderr != "" && strings.Contains(errb.String(), c.noStderr) {
				t.Errorf("stderr %q has %q", errb.String(), c.noStderr)
			}
		})
	}
}

func TestSetGenHeap(t *testing.T) {
	pct := debug.SetGCPercent(100)
	limit := debug.SetMemoryLimit(-1) // a negative limit only reads it
	t.Cleanup(func() {
		debug.SetGCPercent(pct)
		debug.SetMemoryLimit(limit)
	})
	env := func(vars map[string]string) func(string) string {
		return func(k string) string { return vars[k] }
	}
	for _, c := range []struct {
		name string
		mib  int
		vars map[string]string
	}{
		{"off", 0, nil},
		{"GOGC set", 64, map[string]string{"GOGC": "200"}},
		{"GOMEMLIMIT set", 64, map[string]string{"GOMEMLIMIT": "1GiB"}},
	} {
		if setGenHeap(c.mib, env(c.vars)) {
			t.Errorf("%s: setGenHeap changed the collector", c.name)
		}
		if got := debug.SetGCPercent(100); got != 100 {
			t.Errorf("%s: GOGC became %d", c.name, got)
		}
	}
	if !setGenHeap(64, env(nil)) {
		t.Fatal("setGenHeap(64) with a clean environment did nothing")
	}
	if got := debug.SetMemoryLimit(-1); got != 64<<20 {
		t.Errorf("memory limit %d, want %d", got, 64<<20)
	}
	if got := debug.SetGCPercent(100); got != -1 {
		t.Errorf("GOGC %d, want -1 (off)", got)
	}
}
