package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The common_*.go files are copies of bench/loadgen's, so that both tools
// measure and print alike. This fails when they drift apart.
func TestCommonFilesMatchLoadgen(t *testing.T) {
	theirs, err := filepath.Glob("../loadgen/common_*.go")
	if err != nil || len(theirs) == 0 {
		t.Skip("bench/loadgen not beside this module")
	}
	ours, _ := filepath.Glob("common_*.go")
	if len(ours) != len(theirs) {
		t.Fatalf("loadgen has %d common files, peers %d: cp ../loadgen/common_*.go .", len(theirs), len(ours))
	}
	for _, p := range theirs {
		a, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Base(p))
		if err != nil {
			t.Fatalf("%v: cp ../loadgen/common_*.go .", err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from bench/loadgen's: cp ../loadgen/common_*.go .", filepath.Base(p))
		}
	}
}

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
