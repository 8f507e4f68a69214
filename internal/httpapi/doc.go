// Package httpapi serves holdfast's HTTP API: the parts of Consul's API
// that sessions, locks and their recipes need (KV, transactions, sessions,
// catalog and health of nodes, agent self, status, prepared queries), shaped
// so that Consul's own Go client works against it unchanged, plus
// holdfast's fencing check (GET /v1/fence/<key>).
//
// The package is a thin edge over a Backend, the interface it declares for
// what it needs from a server. Reads go straight to the Backend's state
// store, through watch.Block when the client asks to block; writes are
// handed to the Backend, which commits them before returning.
//
// Where Consul's behaviour is a quirk that clients depend on, holdfast keeps
// it (LockDelay below 1000 is seconds; "true" for DELETE ?cas of a missing
// key). Where Consul answers bad input with 500, holdfast answers 400 with a
// sentence, so that a client that retries 500s does not retry a request
// that can never succeed: one Kind per error and one table (statusOf) from
// Kind to status. Errors are plain-text bodies, never JSON.
//
// Extensions, all invisible to a Consul client:
//   - a refused ?acquire carries X-Holdfast-Lock-Delay when the cause is a
//     lock-delay rather than another holder;
//   - PUT ?release may carry ?lock-index=N, releasing only the N-th
//     acquisition (a fenced release), and the txn verbs unlock and
//     check-lock take a LockIndex field for the same purpose;
//   - GET /v1/fence/<key>?session=S&lock-index=N checks a sequencer.
package httpapi
