package httpapi

import (
	"context"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// Backend is what the HTTP API needs from a server. internal/server
// implements it; tests use a fake that applies straight to a state.Store.
//
// All methods may be called concurrently. Writes block until the command is
// committed and applied (or fail); none of them return before the change is
// visible to reads from State().
type Backend interface {
	// State returns the current store. It may change after a snapshot
	// restore (the old store's AbandonCh is then closed), so blocking
	// readers must call State again on each evaluation.
	State() *state.Store

	// NodeName is this agent's node; sessions default to it.
	NodeName() string
	// Datacenter is this agent's datacenter name.
	Datacenter() string
	// Self describes this agent for /v1/agent/self: at least
	// {"Config":{"NodeName":…,"Datacenter":…,…},"Member":{…}}. It returns
	// a new map each call, which the caller owns (the handler adds
	// "Stats").
	Self() map[string]interface{}

	// KVS applies one KV write. For a lock refused because of lock-delay it
	// returns ok=false and the delay still to run (zero otherwise).
	KVS(ctx context.Context, req *state.KVRequest) (ok bool, lockDelay time.Duration, err error)
	// SessionCreate validates and creates a session and returns its ID.
	// The session's Node defaults to NodeName(), Behavior to release,
	// LockDelay is taken as given (the HTTP layer applies the 15s default),
	// NodeChecks as given (the HTTP layer applies the serfHealth default).
	SessionCreate(ctx context.Context, s *state.Session) (string, error)
	// SessionDestroy invalidates a session; unknown IDs are not an error.
	SessionDestroy(ctx context.Context, id string) error
	// SessionRenew restarts a session's TTL; state.ErrSessionNotFound if it
	// does not exist.
	SessionRenew(ctx context.Context, id string) (*state.Session, error)
	Register(ctx context.Context, req *state.RegisterRequest) error
	Deregister(ctx context.Context, req *state.DeregisterRequest) error
	// Txn applies a transaction; errs is non-empty when it was rolled back.
	Txn(ctx context.Context, ops []*state.TxnOp) (res []*state.TxnResult, errs []*state.TxnError, err error)
	// QuerySet creates (q.ID == "") or updates a prepared query and returns
	// its ID.
	QuerySet(ctx context.Context, q *state.PreparedQuery) (string, error)
	QueryDelete(ctx context.Context, id string) error

	// ConsistentRead returns once a read of State() is linearizable: this
	// server is the leader, a quorum confirmed it, and every entry committed
	// before the call is applied.
	ConsistentRead(ctx context.Context) error
	// LeaderStatus reports whether a leader is known and how long since this
	// server last heard from it (zero on the leader).
	LeaderStatus() (known bool, lastContact time.Duration)
	// Replayed reports whether this server's state has caught up, once
	// since it started, with the log it found on the disk, or has heard
	// from a leader. Before that it is an older snapshot's, and even a
	// stale read would answer from before writes already acknowledged,
	// with a lower index than clients have seen.
	Replayed() bool
	// Leader is the leader's raft address ("" if none); Peers are the voters'.
	Leader() string
	Peers() ([]string, error)
}

// Temporary is implemented by backend errors that are transient server
// trouble (no leader, shutting down); they map to 500 so that clients that
// retry on 500 (as Consul's do) retry.
type Temporary interface{ Temporary() bool }

// BadInput is implemented by backend errors that say the request's own
// content was wrong (a damaged snapshot archive): 400, not to be retried.
type BadInput interface{ BadInput() bool }
