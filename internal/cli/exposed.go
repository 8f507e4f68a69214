package cli

import (
	"net"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// listener names one of the agent's addresses for warnExposed;
// guarded is one that admits only its peers (gossip with -encrypt).
type listener struct {
	name, addr string
	guarded    bool
}

// exposed returns the listeners that other hosts can reach: any address
// but a loopback one (an empty host or 0.0.0.0 is every interface).
// An empty address is a listener not opened. A host name other than
// localhost counts as reachable: what it resolves to is not this
// function's to guess.
func exposed(ls []listener) []listener {
	var out []listener
	for _, l := range ls {
		if l.addr == "" || l.guarded { // not listening (no -debug-addr), or only to peers
			continue
		}
		host, _, err := net.SplitHostPort(l.addr)
		if err != nil {
			host = l.addr
		}
		if strings.EqualFold(host, "localhost") {
			continue
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			continue
		}
		out = append(out, l)
	}
	return out
}

// warnExposed tells the operator, once at start, that holdfast checks no
// ACL token and encrypts neither HTTP nor raft (nor gossip without
// -encrypt): whoever reaches one of these addresses can read every key and
// take every lock.
func warnExposed(logger hclog.Logger, ls ...listener) {
	ex := exposed(ls)
	if len(ex) == 0 {
		return
	}
	args := make([]any, 0, 2*len(ex))
	for _, l := range ex {
		args = append(args, l.name, l.addr)
	}
	logger.Warn("listening beyond loopback with no access control: holdfast checks no ACL token and encrypts no HTTP or raft traffic (gossip only with -encrypt), "+
		"so anyone who reaches these addresses can read and write every key and take every lock; "+
		"keep them on a private network or behind a firewall", args...)
}
