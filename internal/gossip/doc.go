// Package gossip is holdfast's membership pool and failure detector: a thin
// layer over hashicorp/memberlist (SWIM) that every agent, server or client,
// runs.
//
// A Pool knows every agent it has heard of, with the agent's tags (role,
// http and raft addresses, datacenter) and a status: alive, suspect,
// leaving, left (it said goodbye with Leave) or failed (the failure
// detector gave up on it). Changes arrive in order through Config.Notify.
//
// The package decides nothing about the catalog. The server's leader turns
// the pool into catalog state (internal/server/serf.go): an alive member's
// node is registered with a passing serfHealth check, a failed one's check
// goes critical (invalidating the sessions bound to it), and one that left
// is deregistered. That is how "the gossip failure detector is the default
// session health check" of the session contract becomes real.
//
// Timing. memberlist runs its own timers on real time; how fast a dead
// agent is declared failed is set by the Profile: ProfileLAN is
// memberlist's LAN configuration (probe every second, suspect for four
// probe intervals: a killed agent of a small settled pool is declared
// failed in about five to seven seconds, up to about 26 when other members
// left or failed in the last half minute, as suspicion then waits its
// longest for confirmations nobody sends); ProfileFast probes every 200ms
// and is for tests. The pool's own timers (reaping forgotten members, reconnecting
// to failed ones, join retries) run on an injected clock.Clock.
package gossip
