package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestExposed(t *testing.T) {
	ls := []listener{
		{"http", "127.0.0.1:8500"},
		{"raft", "[::1]:8300"},
		{"a", "localhost:1"},
		{"debug", ""},
		{"b", "127.0.0.2:1"},
		{"every", "0.0.0.0:8500"},
		{"empty", ":8301"},
		{"v6any", "[::]:1"},
		{"lan", "10.0.0.5:8300"},
		{"name", "db1.example:8500"},
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
	warnExposed(logger, listener{"http", "127.0.0.1:8500"}, listener{"gossip", "127.0.0.1:8301"})
	if buf.Len() != 0 {
		t.Fatalf("loopback only, yet logged: %s", buf.String())
	}
	warnExposed(logger, listener{"http", "0.0.0.0:8500"}, listener{"raft", "127.0.0.1:8300"})
	out := buf.String()
	if !strings.Contains(out, "[WARN]") || !strings.Contains(out, "no access control") ||
		!strings.Contains(out, "http=0.0.0.0:8500") || strings.Contains(out, "raft=") {
		t.Fatalf("warning = %q", out)
	}
}
