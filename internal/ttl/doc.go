// Package ttl expires sessions on the leader.
//
// Session TTLs are leader-local soft state: they are not replicated, they
// are rebuilt with full TTLs when a server gains leadership and dropped when
// it loses it (see DESIGN.md, rule 4). This package holds that state and
// nothing else; it knows nothing of sessions, raft or the server.
//
// It comes in two layers:
//
//   - Heap is a pure data structure: ids ordered by deadline, with no
//     goroutines and no clock, so it can be tested and reasoned about on
//     its own.
//   - Timers puts one goroutine and one clock.Timer around a Heap: callers
//     Reset an id's deadline when a session is created or renewed, Remove
//     it when the session is destroyed, Clear everything on losing
//     leadership, and are called back through onExpire when a deadline
//     passes.
//
// Time comes only from the injected clock.Clock, so tests drive Timers with
// clocktest.Fake: advancing to a TTL minus a nanosecond expires nothing, and
// one more nanosecond expires exactly the id that was due.
package ttl
