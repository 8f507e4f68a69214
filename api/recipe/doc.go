// Package recipe builds coordination on holdfast's (and Consul's) HTTP API:
// a session keeper that knows when its session can no longer be trusted,
// fair locks with sequencers, semaphores, and leader election. It uses the
// api package and an injected clock.Clock, nothing else.
//
// # Sessions
//
// Everything a recipe holds is held by a session, and a session lives only
// as long as the server hears from it. A client cannot see the server's
// clock, so it must decide for itself when to stop trusting its session.
// Session is the keeper that does: it creates the session, renews it at
// half its TTL on its own goroutine, and reports its connection state to
// listeners (Connected, Suspended, Reconnected, Lost).
//
// Lost comes when the server says the session is gone, or when a local
// deadline passes. By default (SafeDeadline) that deadline is the send
// time of the last renew that succeeded, plus the TTL, minus a margin for
// clock drift: the server restarts the TTL no earlier than that send time
// and invalidates no earlier than a TTL later, so the deadline passes
// before the server can hand the session's locks to anyone else.
// CuratorDeadline gives Apache Curator's rule instead. A Policy says
// whether a hold is already lost at Suspended (LoseOnSuspended, Curator's
// standard policy and the default) or only at Lost (LoseOnLost). The page
// docs/sessions.md explains the choice.
//
// # Holds and sequencers
//
// Lock, Semaphore and Election hand out holds: a Hold, a Permit, a
// Leadership. Each has a Lost channel, closed the moment the hold is lost
// (the key changed hands, or the session's policy says so), and a
// Sequencer naming it (key, session, LockIndex). Pass the sequencer to the
// resources you write to and have them check it (api.KV.Fence,
// api.KV.PutFenced): a holder paused past its session cannot be fenced out
// by any timeout, only by the resource refusing its stale sequencer. The
// server checks a Permit's sequencer too: it names the semaphore's .lock
// key and the index of the write that granted the permit (see Permit).
//
// Holds must be given up explicitly (Unlock, Release, Resign), also after
// they were lost: that is how a recipe leaves the queue and how a hold the
// server still keeps is freed.
//
// # Compatibility
//
// Lock and Semaphore use the keys, flags and value formats of Consul's Go
// client (github.com/hashicorp/consul/api), so that a holdfast Lock and a
// Consul Lock on the same key exclude each other and hand over to each
// other, and likewise for semaphores on the same prefix.
//
// # Concurrency
//
// A Session, Lock, Semaphore or Election may be used from several
// goroutines. Every call that talks to the server takes a context.
package recipe
