package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/internal/gossip"
)

// The gossip pool over HTTP (/v1/agent/members, served by the agent
// itself rather than by httpapi, which knows nothing of gossip) and the
// members command that reads it.

// agentMember is one entry of /v1/agent/members in Consul's shape.
type agentMember = api.AgentMember

// poolView is what the HTTP side of an agent reads from its gossip pool;
// *gossip.Pool is one.
type poolView interface {
	Members() []gossip.Member
	Member(name string) (gossip.Member, bool)
}

// withAgentRoutes serves the agent's own endpoints, those that need the
// gossip pool or the process's metrics, and hands everything else to
// next. It matches the path exactly and does no cleaning, so KV keys with
// odd slashes reach next untouched.
func withAgentRoutes(pool *gossip.Pool, next http.Handler) http.Handler {
	var view poolView
	if pool != nil {
		view = pool
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/agent/members":
			serveMembers(view, w, r)
			return
		case "/v1/agent/metrics":
			agentTelemetry().serveMetrics(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// serveMembers answers GET /v1/agent/members from pool. With ?wan it
// answers an empty list: holdfast has no WAN pool.
func serveMembers(pool poolView, w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, fmt.Sprintf("method %s not allowed", r.Method), http.StatusMethodNotAllowed)
		return
	}
	out := []agentMember{}
	if _, wan := r.URL.Query()["wan"]; !wan && pool != nil {
		for _, m := range pool.Members() {
			tags := m.Tags
			if tags == nil {
				tags = map[string]string{}
			}
			out = append(out, agentMember{Name: m.Name, Addr: m.Addr, Port: m.Port, Tags: tags, Status: int(m.Status),
				ProtocolMin: 1, ProtocolMax: 5, ProtocolCur: 2, DelegateMin: 2, DelegateMax: 5, DelegateCur: 4})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

const membersUsage = `
Usage: holdfast members [options]

  Lists the agents of the gossip pool that the agent at -http-addr belongs
  to, servers and clients, with the status the pool gives each:

    alive    answering probes
    leaving  announced that it is leaving
    left     left gracefully (its node was deregistered)
    failed   declared dead by the failure detector (its serfHealth check
             is critical, so sessions bound to it were invalidated)

  Failed and left agents stay listed until the pool forgets them.
`

func runMembers(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "members", membersUsage)
	var hf httpFlags
	hf.register(fs)
	status := fs.String("status", "", "List only the members whose status (alive, leaving, left, failed) matches this regular expression, as consul members does.")
	detailed := fs.Bool("detailed", false, "Show every tag of each member.")
	if done, err := parseNoArgs(stdio, fs, args); done {
		return err
	}
	statusRe, err := regexp.Compile(*status)
	if err != nil {
		return fail(stdio, fmt.Sprintf("Failed to compile status regexp: %v", err))
	}
	members, err := fetchMembers(ctx, stdio, &hf)
	if err != nil {
		return fail(stdio, "Error retrieving members: "+err.Error())
	}
	var rows []string
	for _, m := range members {
		st := gossip.Status(m.Status).String()
		if !statusRe.MatchString(st) {
			continue
		}
		addr := net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port)))
		if *detailed {
			rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s\n", m.Name, addr, st, formatTags(m.Tags)))
			continue
		}
		rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s\t%s\n", m.Name, addr, st, memberType(m.Tags), m.Tags["dc"]))
	}
	if len(rows) == 0 {
		// As consul members: nothing printed, and exit 2.
		return &ExitError{Code: 2, Msg: "no members matched", Silent: true}
	}
	tw := tabwriter.NewWriter(stdio.Out, 0, 8, 2, ' ', 0)
	if *detailed {
		fmt.Fprintln(tw, "Node\tAddress\tStatus\tTags")
	} else {
		fmt.Fprintln(tw, "Node\tAddress\tStatus\tType\tDC")
	}
	for _, r := range rows {
		io.WriteString(tw, r)
	}
	return tw.Flush()
}

// memberType is "server" or "client" from the role tag (Consul's servers
// say "consul").
func memberType(tags map[string]string) string {
	switch tags["role"] {
	case "server", "consul":
		return "server"
	}
	return "client"
}

func formatTags(tags map[string]string) string {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + tags[k]
	}
	return strings.Join(parts, ",")
}

// fetchMembers reads /v1/agent/members from the agent the flags name,
// through the same client, address rules and token as every command.
func fetchMembers(ctx context.Context, stdio Stdio, hf *httpFlags) ([]agentMember, error) {
	cl, err := hf.client(stdio)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return cl.Agent().Members(ctx)
}
