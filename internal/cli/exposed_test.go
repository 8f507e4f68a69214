package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestExposed(t *testing.T) {
	ls := []listener{
		{name: "http", addr: "127.0.0.1:8500"},
		{name: "raft", addr: "[::1]:8300"},
		{name: "a", addr: "localhost:1"},
		{name: "debug", addr: ""},
		{name: "b", addr: "127.0.0.2:1"},
		{name: "every", addr: "0.0.0.0:8500"},
		{name: "empty", addr: ":8301"},
		{name: "v6any", addr: "[::]:1"},
		{name: "lan", addr: "10.0.0.5:8300"},
		{name: "name", addr: "db1.example:8500"},
		{name: "keyed", addr: "0.0.0.0:8301", guarded: true},
	}
	var got []string
	for _, l := range exposed(ls) {
		got = append(got, l.name)
	}
	if want := "every empty v6any lan name"; strings.Join(got, " ") != want {
		t.Fatalf("exposed = %v, want %s", got, want)
	}
}

func TestWarnExposed(t *testing.T) {
	var buf bytes.Buffer
	logger := hclog.New(&hclog.LoggerOptions{Output: &buf})
	warnExposed(logger, listener{name: "http", addr: "127.0.0.1:8500"}, listener{name: "gossip", addr: "127.0.0.1:8301"})
	if buf.Len() != 0 {
		t.Fatalf("loopback only, yet logged: %s", buf.String())
	}
	warnExposed(logger, listener{name: "http", addr: "0.0.0.0:8500"}, listener{name: "raft", addr: "127.0.0.1:8300"})
	out := buf.String()
	if !strings.Contains(out, "[WARN]") || !strings.Contains(out, "no access control") ||
		!strings.Contains(out, "http=0.0.0.0:8500") || strings.Contains(out, "raft=") {
		t.Fatalf("warning = %q", out)
	}
}
