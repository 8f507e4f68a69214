// Package agent runs the checks of one agent's own node and keeps the
// agent's local registry of services and checks, as a Consul agent does:
// TTL checks that go critical unless they are updated in time, and HTTP
// and TCP checks that really probe their target every Interval.
//
// The agent does not own the catalog: every change it makes (a check
// registered, a status changed, a service removed) is written through a
// CatalogWriter, which a server implements by committing the write through
// raft. The state machine then does the rest in the same step: a check that
// is or becomes critical, or is deregistered, invalidates every session
// bound to it (and the prepared queries bound to those sessions).
//
// # Owners
//
// Each registered check has one goroutine, its runner, which owns
// everything live about the check: its status and output, its timer (the
// TTL deadline, or the time of the next probe) and the catalog entry of the
// check. Only the runner writes the check's status to the catalog, so its
// writes can never be reordered; other goroutines talk to it through
// channels (an update from /v1/agent/check/pass, a "hold still" while a
// registration or deregistration writes, "stop"). A probe runs in its own
// short-lived goroutine and hands its result back to the runner, so a slow
// target never keeps the runner from an update, a hold or a stop.
//
// The registry (which checks and services exist) belongs to the Agent and
// is changed only by Register*/Deregister*, one at a time: each holds the
// runners it replaces or removes still, writes the catalog, and only then
// changes the registry. A catalog write that fails therefore changes
// nothing: the old runners carry on as if nothing had happened.
//
// # Restarts
//
// With Config.StateFile set, the registry is written to that file after
// every change, every TTL update and every status change of a probed
// check, and a new Agent on the same file
// registers it again (Restore): a TTL check with its status and what was
// left of its TTL, so the sessions bound to it survive the restart as they
// do in Consul. ForgetStale then removes only what no run of the agent
// knows any more.
//
// # Time
//
// Every timer (TTL deadlines, probe intervals, probe timeouts, retries of
// failed writes) runs on the injected clock.Clock, so tests drive checks
// with clocktest.Fake: a TTL check updated at t goes critical when the
// clock reaches t+TTL, not a nanosecond before. Probes use real sockets
// (the injected Dialer and HTTP client), but their timeout is measured on
// the clock too.
package agent
