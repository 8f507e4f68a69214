//go:build linux

package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestRunPrintsEveryWay(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := run([]string{"-dir", dir, "-d", "20ms", "-rounds", "1"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"append+fsync", "append+fdatasync", "fallocate+fsync", "fallocate+fdatasync", "zerofill+fsync", "zerofill+fdatasync"}
	if len(lines) != 1+len(want) {
		t.Fatalf("got %d lines:\n%s", len(lines), out.String())
	}
	for i, w := range want {
		f := strings.Fields(lines[i+1])
		if len(f) != 6 || f[0] != w {
			t.Fatalf("line %d: %q, want way %s", i+1, lines[i+1], w)
		}
		if n, err := strconv.Atoi(f[1]); err != nil || n < 1 {
			t.Fatalf("line %d: %q: no syncs counted", i+1, lines[i+1])
		}
	}
	// The temporary files are gone.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left %d files behind", len(ents))
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-size", "0"}, {"-rounds", "0"}, {"-d", "0s"}, {"-nope"}} {
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
