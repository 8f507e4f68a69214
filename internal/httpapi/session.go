package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// Session-create defaults, Consul's.
const (
	defaultLockDelay = 15 * time.Second
	// lockDelayUnit: a LockDelay below this many nanoseconds is read as
	// that many seconds (Consul's rule, so "LockDelay": 15 means 15s).
	lockDelayUnit = 1000
)

// sessionJSON is a session as Consul prints it: LockDelay in integer
// nanoseconds, NodeChecks never null, ServiceChecks null when empty.
type sessionJSON struct {
	ID            string
	Name          string
	Node          string
	LockDelay     time.Duration
	Behavior      string
	TTL           string
	NodeChecks    []string
	ServiceChecks []state.ServiceCheck
	CreateIndex   uint64
	ModifyIndex   uint64
}

func toSessionJSON(s *state.Session) *sessionJSON {
	out := &sessionJSON{
		ID: s.ID, Name: s.Name, Node: s.Node, LockDelay: s.LockDelay, Behavior: s.Behavior,
		TTL: s.TTL, NodeChecks: s.NodeChecks, CreateIndex: s.CreateIndex, ModifyIndex: s.ModifyIndex,
	}
	if out.NodeChecks == nil {
		out.NodeChecks = []string{}
	}
	if len(s.ServiceChecks) > 0 {
		out.ServiceChecks = s.ServiceChecks
	}
	return out
}

func toSessionsJSON(ss []*state.Session) []*sessionJSON {
	out := make([]*sessionJSON, 0, len(ss))
	for _, s := range ss {
		out = append(out, toSessionJSON(s))
	}
	return out
}

// sessionCreateBody is the body of PUT /v1/session/create. encoding/json
// matches keys case-insensitively, as Consul does. Fields are pre-filled
// with the defaults before decoding, so an absent key keeps its default
// while an explicit null or [] replaces it.
type sessionCreateBody struct {
	Name          string
	Node          string
	LockDelay     json.RawMessage
	Behavior      string
	TTL           string
	Checks        []string // deprecated since Consul 1.7; merged into NodeChecks
	NodeChecks    []string
	ServiceChecks []state.ServiceCheck
}

// decodeSessionCreate turns a session-create body into the session to
// propose (without ID; the backend assigns it). An empty body means all
// defaults. Errors are 400s whose text follows "Request decode failed: "
// for malformed JSON. It reads only its arguments, so it is safe to fuzz.
func decodeSessionCreate(body []byte, nodeName string) (*state.Session, error) {
	in := sessionCreateBody{
		Node:       nodeName,
		Behavior:   state.BehaviorRelease,
		Checks:     []string{state.SerfCheckID},
		NodeChecks: []string{state.SerfCheckID},
	}
	lockDelay := defaultLockDelay
	if len(bytes.TrimSpace(body)) > 0 {
		if err := decodeStrict(body, &in); err != nil {
			return nil, invalidf("Request decode failed: %v", err)
		}
		if raw := bytes.TrimSpace(in.LockDelay); len(raw) > 0 && string(raw) != "null" {
			d, err := parseLockDelay(raw)
			if err != nil {
				return nil, invalidf("Request decode failed: %v", err)
			}
			lockDelay = d
		}
	}
	fixupSessionChecks(&in)

	if in.Node == "" {
		in.Node = nodeName
	}
	switch in.Behavior {
	case "":
		in.Behavior = state.BehaviorRelease
	case state.BehaviorRelease, state.BehaviorDelete:
	default:
		return nil, invalidf("Invalid Behavior setting '%s'", in.Behavior)
	}
	if in.TTL != "" {
		d, err := time.ParseDuration(in.TTL)
		if err != nil {
			return nil, invalidf("Session TTL '%s' invalid: %v", in.TTL, err)
		}
		if d < 0 {
			return nil, invalidf("Invalid Session TTL '%d': must not be negative", d)
		}
	}
	for _, c := range in.ServiceChecks {
		if c.ID == "" {
			return nil, invalidf("Request decode failed: a service check has no ID")
		}
	}

	// Bind the deprecated Checks list too: node checks first, then any
	// legacy check not already among them.
	nodeChecks := make([]string, 0, len(in.NodeChecks)+len(in.Checks))
	seen := map[string]bool{}
	for _, list := range [][]string{in.NodeChecks, in.Checks} {
		for _, c := range list {
			if c == "" {
				return nil, invalidf("Request decode failed: a check ID is empty")
			}
			if !seen[c] {
				seen[c] = true
				nodeChecks = append(nodeChecks, c)
			}
		}
	}
	s := &state.Session{
		Name:       in.Name,
		Node:       in.Node,
		LockDelay:  lockDelay,
		Behavior:   in.Behavior,
		TTL:        in.TTL,
		NodeChecks: nodeChecks,
	}
	if len(in.ServiceChecks) > 0 {
		s.ServiceChecks = in.ServiceChecks
	}
	return s, nil
}

// fixupSessionChecks applies Consul 1.7's rules for the two check lists,
// both of which default to [serfHealth]:
//   - Checks given empty (or null): no node checks at all;
//   - Checks still [serfHealth]: defer to NodeChecks;
//   - NodeChecks given empty: drop the default Checks too
//     (that is how CreateNoChecks asks for a session without checks).
func fixupSessionChecks(in *sessionCreateBody) {
	switch {
	case len(in.Checks) == 0:
		in.NodeChecks = []string{}
	case len(in.Checks) == 1 && in.Checks[0] == state.SerfCheckID:
		in.Checks = nil
	case len(in.NodeChecks) == 0:
		in.Checks = nil
	}
}

var errLockDelayType = errors.New("LockDelay must be a number of nanoseconds or a duration string such as \"15s\"")

// parseLockDelay reads LockDelay the way Consul does: a JSON number is
// nanoseconds, a string is a Go duration, and either way a value below
// 1000ns is taken as that many seconds. Unlike Consul, a negative or
// unrepresentable delay is an error.
func parseLockDelay(raw json.RawMessage) (time.Duration, error) {
	var d time.Duration
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return 0, err
		}
		if strings.HasPrefix(strings.TrimSpace(s), "-") {
			return 0, fmt.Errorf("LockDelay %s must not be negative", s)
		}
		d = v
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		s := string(raw)
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			d = time.Duration(n)
			break
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || f >= math.MaxInt64 || f <= math.MinInt64 {
			return 0, fmt.Errorf("LockDelay %s is out of range", s)
		}
		if f < 0 {
			// Checked before the conversion, which makes -0.5 a 0.
			return 0, fmt.Errorf("LockDelay %s must not be negative", s)
		}
		d = time.Duration(f)
	default:
		return 0, errLockDelayType
	}
	if d < 0 {
		return 0, fmt.Errorf("LockDelay %v must not be negative", d)
	}
	if d < lockDelayUnit {
		d *= time.Second
	}
	return d, nil
}

func (h *handler) sessionCreate(w http.ResponseWriter, r *http.Request, _ string) error {
	body, err := readBody(r, h.opts.MaxValueSize, "")
	if err != nil {
		return err
	}
	s, err := decodeSessionCreate(body, h.b.NodeName())
	if err != nil {
		return err
	}
	id, err := h.b.SessionCreate(r.Context(), s)
	if err != nil {
		return err
	}
	return writeJSON(w, r, struct{ ID string }{id})
}

func (h *handler) sessionDestroy(w http.ResponseWriter, r *http.Request, id string) error {
	if id == "" {
		return invalidf("Missing session")
	}
	if err := h.b.SessionDestroy(r.Context(), id); err != nil {
		return err
	}
	return writeJSON(w, r, true)
}

func (h *handler) sessionRenew(w http.ResponseWriter, r *http.Request, id string) error {
	if id == "" {
		return invalidf("Missing session")
	}
	s, err := h.b.SessionRenew(r.Context(), id)
	if errors.Is(err, state.ErrSessionNotFound) || (err == nil && s == nil) {
		return notFoundf("Session id '%s' not found", id)
	}
	if err != nil {
		return err
	}
	return writeJSON(w, r, []*sessionJSON{toSessionJSON(s)})
}

func (h *handler) sessionInfo(w http.ResponseWriter, r *http.Request, id string) error {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	if id == "" {
		return invalidf("Missing session")
	}
	var sess *state.Session
	err = h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		idx, se := s.SessionGet(ws, id)
		sess = se
		return idx, se != nil
	})
	if err != nil {
		return err
	}
	out := []*sessionJSON{}
	if sess != nil {
		out = append(out, toSessionJSON(sess))
	}
	return writeJSON(w, r, out)
}

func (h *handler) sessionNode(w http.ResponseWriter, r *http.Request, node string) error {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	if strings.TrimSpace(node) == "" {
		return invalidf("Missing node name")
	}
	list, err := readScoped(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, []*state.Session) {
		return s.NodeSessions(ws, node)
	})
	if err != nil {
		return err
	}
	return writeJSON(w, r, toSessionsJSON(list))
}

func (h *handler) sessionList(w http.ResponseWriter, r *http.Request, _ string) error {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	list, err := readList(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, []*state.Session) {
		return s.SessionList(ws)
	})
	if err != nil {
		return err
	}
	return writeJSON(w, r, toSessionsJSON(list))
}
