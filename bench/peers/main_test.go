package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestFlagsAndTargets(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"-target", "nope", "-workload", "put"}, &out, &errb); code != 2 {
		t.Fatalf("bad target: exit %d", code)
	}
	if code := run([]string{"-target", "etcd", "-workload", "nope"}, &out, &errb); code != 2 {
		t.Fatalf("bad workload: exit %d", code)
	}
	// Nothing listens on port 1: ping gives up after -duration and fails.
	for _, target := range []string{"etcd", "zk"} {
		out.Reset()
		start := time.Now()
		code := run([]string{"-target", target, "-addr", "127.0.0.1:1", "-workload", "ping", "-duration", "300ms", "-quiet"}, &out, &errb)
		if code != 1 || !strings.Contains(out.String(), "result target="+target+" workload=ping ") {
			t.Fatalf("%s ping of nothing: exit %d, %q", target, code, out.String())
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("%s ping took %s", target, time.Since(start))
		}
	}
}
