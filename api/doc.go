// Package api is a Go client for holdfast's HTTP API, which is Consul's:
// the key/value store and its locks, sessions, the catalog and health
// checks the sessions are bound to, and status. It uses the standard
// library only, and it works against a Consul agent as well.
//
// # The story
//
// A session is a lease held by a client. It is bound to health checks
// (by default the gossip check "serfHealth" of the agent's node) and may
// carry a TTL that the client keeps alive with Session.Renew. When a check
// goes critical, the TTL runs out, or someone calls Session.Destroy, the
// session is invalidated: the keys it had locked are released (or deleted,
// for behaviour "delete"), and for the session's lock-delay nobody may
// lock them again, giving the old holder time to notice it lost them.
//
// Locks live on keys. KV.Acquire locks a key for a session and writes a
// value in the same step; KV.Release unlocks it. Locks are advisory: a
// plain KV.Put or KV.Delete ignores them. A KVPair's LockIndex counts
// acquisitions and serves as a sequencer.
//
// Reads can block. Pass the QueryMeta.LastIndex of one read as the
// QueryOptions.WaitIndex of the next and the server holds the request
// until something under it changes or WaitTime passes. A return is no
// proof of change; compare indexes, and start again from 0 if an index
// ever goes backwards.
//
// # Types on the wire
//
// KVPair, SessionEntry, HealthCheck and the rest marshal to the JSON
// Consul's servers send, field for field and in the same order, so they
// can be used on both sides of the wire. SessionEntry.LockDelay travels
// as integer nanoseconds and SessionEntry.TTL as the string it was
// created with.
//
// # Contexts and options
//
// Every method that talks to the server takes a context.Context as its
// first argument; cancelling it abandons the request, including a blocking
// read. Reads take a *QueryOptions and return a *QueryMeta; writes take a
// *WriteOptions and return a *WriteMeta. Nil options mean the defaults.
// The Client and the endpoint values (KV, Session, …) are safe for
// concurrent use.
//
// # Errors
//
// A response whose status is not 2xx becomes a *StatusError whose text is
// "Unexpected response code: <code> (<body>)", as with Consul's client.
// Absence is not an error where the API treats it as an answer: KV.Get of
// a missing key returns a nil pair, KV.List and KV.Keys an empty list,
// Session.Info a nil entry. Session.Renew of an unknown session returns
// ErrSessionNotFound. The client never retries; IsRetryable says which
// errors are worth retrying (network errors and 500s).
//
// # Transport
//
// A Client made without Config.HTTPClient sends its requests through a
// Transport: HTTP/1.1 keep-alive connections driven from the calling
// goroutine, parsed by net/http's own request writer and response reader.
// It spends less CPU per request than net/http's Transport (a fifth less
// in the load generator, which runs beside the server), which matters when
// client and server share a machine; bench/README.md has the figures. Like net/http's, it sends a GET again when a reused connection
// turns out to have been closed by the server before answering, and never a
// PUT or DELETE. https, proxies and large request bodies go through a
// net/http Transport instead. Any *http.Client can be passed instead.
//
// # What holdfast adds
//
// Consul answers an acquire refused because of lock-delay with a bare
// false, indistinguishable from losing a race. holdfast also sends the
// remaining delay in the X-Holdfast-Lock-Delay header, which Acquire
// returns as WriteMeta.LockDelayRemaining, so a caller can wait exactly
// that long. And Session.Create can ask for no lock-delay at all (a
// negative SessionEntry.LockDelay), which Consul's client cannot express.
package api
