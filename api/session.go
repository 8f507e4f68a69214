package api

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"
)

// Session behaviours: what happens to the keys a session holds when it is
// invalidated.
const (
	// SessionBehaviorRelease unlocks the keys (the default).
	SessionBehaviorRelease = "release"
	// SessionBehaviorDelete deletes the keys.
	SessionBehaviorDelete = "delete"
)

// ErrSessionNotFound is returned by Session.Renew when the server no longer
// knows the session: it was destroyed or invalidated, and every lock it
// held is gone.
var ErrSessionNotFound = errors.New("api: session not found")

// ServiceCheck names a check a session is bound to through a service.
type ServiceCheck struct {
	ID        string
	Namespace string
}

// SessionEntry is a session as the server reports it. The fields are in
// the order Consul emits them. LockDelay travels as integer nanoseconds,
// TTL as the string it was created with ("" for none).
//
// As the argument of Create and CreateNoChecks, zero fields are left out
// of the request so the server's defaults apply; see Create.
type SessionEntry struct {
	ID            string
	Name          string
	Node          string
	LockDelay     time.Duration
	Behavior      string
	TTL           string
	NodeChecks    []string
	ServiceChecks []ServiceCheck
	// Checks is the pre-1.7 form of NodeChecks; servers omit it.
	Checks      []string `json:",omitempty"`
	CreateIndex uint64
	ModifyIndex uint64
}

// Session is the session endpoint, /v1/session. Get one with
// Client.Session.
type Session struct{ c *Client }

// Session returns the session endpoint.
func (c *Client) Session() *Session { return &Session{c} }

// Create creates a session and returns its ID. A nil se sends no body, so
// every setting is the server's default: the agent's node, the serfHealth
// check, behaviour release, lock-delay 15s, no TTL.
//
// Fields of se are sent only when set:
//   - Name, Node, Behavior, TTL: when not "".
//   - LockDelay: when positive, as whole milliseconds ("15000ms"). Zero is
//     left out, so the server default of 15s applies, as with Consul's
//     client. A negative LockDelay sends 0, which turns lock-delay off; this
//     is the way to ask for no lock-delay, which Consul's client cannot.
//   - NodeChecks, ServiceChecks, Checks: when not nil. A non-nil empty
//     NodeChecks is sent as [] and binds the session to no check at all
//     (as CreateNoChecks does); a nil one keeps the default serfHealth.
func (s *Session) Create(ctx context.Context, se *SessionEntry, w *WriteOptions) (string, *WriteMeta, error) {
	if se == nil {
		return s.create(ctx, nil, w)
	}
	return s.create(ctx, createBody(se), w)
}

// CreateNoChecks is Create with NodeChecks forced to empty: the session is
// bound to no health check and lives until it is destroyed, its TTL runs
// out, or its node leaves the catalog. se may be nil.
func (s *Session) CreateNoChecks(ctx context.Context, se *SessionEntry, w *WriteOptions) (string, *WriteMeta, error) {
	body := map[string]any{}
	if se != nil {
		body = createBody(se)
	}
	body["NodeChecks"] = []string{}
	delete(body, "ServiceChecks") // bound to no check at all, as its doc says
	delete(body, "Checks")
	return s.create(ctx, body, w)
}

func createBody(se *SessionEntry) map[string]any {
	body := map[string]any{}
	for name, v := range map[string]string{"Name": se.Name, "Node": se.Node, "Behavior": se.Behavior, "TTL": se.TTL} {
		if v != "" {
			body[name] = v
		}
	}
	switch {
	case se.LockDelay > 0:
		body["LockDelay"] = durationToMillis(se.LockDelay)
	case se.LockDelay < 0:
		body["LockDelay"] = "0ms"
	}
	if se.NodeChecks != nil {
		body["NodeChecks"] = se.NodeChecks
	}
	if se.ServiceChecks != nil {
		body["ServiceChecks"] = se.ServiceChecks
	}
	if se.Checks != nil {
		body["Checks"] = se.Checks
	}
	return body
}

func (s *Session) create(ctx context.Context, body map[string]any, w *WriteOptions) (string, *WriteMeta, error) {
	r := s.c.newRequest(http.MethodPut, "/v1/session/create")
	if body != nil {
		if err := jsonBody(r, body); err != nil {
			return "", nil, err
		}
	}
	var out struct{ ID string }
	wm, err := s.c.write(ctx, r, w, &out)
	if err != nil {
		return "", wm, err
	}
	return out.ID, wm, nil
}

// Destroy invalidates session id at once: its locks are released or its
// keys deleted according to its behaviour, and its lock-delay starts.
// Destroying an unknown session succeeds.
func (s *Session) Destroy(ctx context.Context, id string, w *WriteOptions) (*WriteMeta, error) {
	r := s.c.newRequest(http.MethodPut, "/v1/session/destroy/"+id)
	return s.c.write(ctx, r, w, nil)
}

// Renew restarts the TTL of session id and returns the session as the
// server now has it (the server may answer with a longer TTL than was
// asked for; renew at half of it). If the server does not know the session
// the error is ErrSessionNotFound.
func (s *Session) Renew(ctx context.Context, id string, w *WriteOptions) (*SessionEntry, *WriteMeta, error) {
	r := s.c.newRequest(http.MethodPut, "/v1/session/renew/"+id)
	var out []*SessionEntry
	wm, err := s.c.write(ctx, r, w, &out)
	if isNotFound(err) {
		return nil, wm, ErrSessionNotFound
	}
	if err != nil {
		return nil, wm, err
	}
	if len(out) == 0 {
		return nil, wm, ErrSessionNotFound
	}
	return out[0], wm, nil
}

// Info reads session id; an unknown session gives a nil entry and no error.
func (s *Session) Info(ctx context.Context, id string, q *QueryOptions) (*SessionEntry, *QueryMeta, error) {
	out, qm, err := s.list(ctx, "/v1/session/info/"+id, q)
	if err != nil || len(out) == 0 {
		return nil, qm, err
	}
	return out[0], qm, nil
}

// Node lists the sessions of node.
func (s *Session) Node(ctx context.Context, node string, q *QueryOptions) ([]*SessionEntry, *QueryMeta, error) {
	return s.list(ctx, "/v1/session/node/"+node, q)
}

// List lists every session.
func (s *Session) List(ctx context.Context, q *QueryOptions) ([]*SessionEntry, *QueryMeta, error) {
	return s.list(ctx, "/v1/session/list", q)
}

func (s *Session) list(ctx context.Context, path string, q *QueryOptions) ([]*SessionEntry, *QueryMeta, error) {
	var out []*SessionEntry
	qm, err := s.c.query(ctx, path, url.Values{}, q, &out)
	if err != nil {
		return nil, qm, err
	}
	return out, qm, nil
}
