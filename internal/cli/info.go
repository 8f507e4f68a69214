package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

const infoUsage = `
Usage: holdfast info [options]

  Prints what the agent at -http-addr says of itself, for operators and
  for debugging, section by section as consul info does: "raft" (the
  state, term, indexes and last contact of the raft node), "holdfast"
  (leader or not, the leader's address, counts of the state), "serf_lan"
  (the gossip pool) and "runtime" (Go's view of the machine). A client
  agent has no raft section.
`

func runInfo(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "info", infoUsage)
	var hf httpFlags
	hf.register(fs)
	if done, err := parseNoArgs(stdio, fs, args); done {
		return err
	}
	cl, err := hf.client(stdio)
	if err != nil {
		return fail(stdio, err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	self, err := cl.Agent().Self(ctx)
	if err != nil {
		return fail(stdio, "Error querying agent: "+err.Error())
	}
	stats := self["Stats"]
	out := stdio.Out
	for _, section := range sortedKeys(stats) {
		kv, ok := stats[section].(map[string]any)
		if !ok {
			continue
		}
		fmt.Fprintf(out, "%s:\n", section)
		for _, k := range sortedKeys(kv) {
			fmt.Fprintf(out, "\t%s = %s\n", k, strings.TrimSpace(fmt.Sprint(kv[k])))
		}
	}
	return nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
