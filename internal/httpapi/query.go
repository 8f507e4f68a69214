package httpapi

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// queryBody is the body of POST /v1/query and PUT /v1/query/<id>: the parts
// of Consul's PreparedQuery that holdfast keeps, and those it refuses (see
// unsupported). Consul Enterprise's Namespace and Partition are ignored, as
// elsewhere in the API: holdfast has neither.
type queryBody struct {
	ID       string
	Name     string
	Session  string
	Token    string
	Service  serviceQueryBody
	DNS      state.QueryDNS
	Template struct{ Type string }
}

// redactedToken is what Consul shows in place of a query's token to a
// reader without the right to see it. A definition read back that way and
// submitted again would store it as the token; Consul refuses it, and so
// does holdfast, whose reads never redact, so that a definition copied
// from Consul does not lose its token unnoticed.
const redactedToken = "<hidden>"

// serviceQueryBody is a query's Service: state.ServiceQuery and the
// filters of Consul's that holdfast does not apply.
type serviceQueryBody struct {
	state.ServiceQuery
	NodeMeta       map[string]string
	ServiceMeta    map[string]string
	IgnoreCheckIDs []string
	Connect        bool
	Peer           string
	SamenessGroup  string
}

// unsupported names the first field of q that asks for something holdfast
// does not do, or returns "". Such a query is refused rather than stored
// without the field: executed, it would return nodes the field excludes
// (NodeMeta, ServiceMeta), leave out nodes it keeps (IgnoreCheckIDs), or
// ask for instances or clusters holdfast does not have (Connect, Peer,
// SamenessGroup, a failover Peer). Failover to datacenters is accepted:
// with one datacenter there is nothing to fail over to, in Consul as here.
// The Go client sends every field; their zero values are accepted.
func (q *serviceQueryBody) unsupported() string {
	for i, t := range q.Failover.Targets {
		if t.Peer != "" {
			return "Service.Failover.Targets[" + itoa(int64(i)) + "].Peer"
		}
	}
	switch {
	case len(q.NodeMeta) > 0:
		return "Service.NodeMeta"
	case len(q.ServiceMeta) > 0:
		return "Service.ServiceMeta"
	case len(q.IgnoreCheckIDs) > 0:
		return "Service.IgnoreCheckIDs"
	case q.Connect:
		return "Service.Connect"
	case q.Peer != "":
		return "Service.Peer"
	case q.SamenessGroup != "":
		return "Service.SamenessGroup"
	}
	return ""
}

// decodeQuery reads a query definition. create says whether it is for a
// new query, whose body may not carry an ID (an update's ID is the URL's,
// as in Consul, whose Go client sends it in the body too).
func (h *handler) decodeQuery(r *http.Request, create bool) (*state.PreparedQuery, error) {
	body, err := readBody(r, h.opts.MaxValueSize, "")
	if err != nil {
		return nil, err
	}
	var in queryBody
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, invalidf("Request decode failed: the request body is empty (want a prepared query as JSON)")
	}
	if err := decodeStrict(body, &in); err != nil {
		return nil, invalidf("Request decode failed: %v", err)
	}
	if in.Template.Type != "" {
		return nil, invalidf("Prepared query templates are not supported")
	}
	if in.Service.Service == "" {
		return nil, invalidf("Must provide a Service name to query")
	}
	if f := in.Service.unsupported(); f != "" {
		return nil, invalidf("Prepared query field %s is not supported by holdfast: the query would not return what it asks for", f)
	}
	if err := checkQuery(&in, create); err != nil {
		return nil, err
	}
	return &state.PreparedQuery{Name: in.Name, Session: in.Session, Token: in.Token,
		Service: in.Service.ServiceQuery, DNS: in.DNS}, nil
}

// checkQuery refuses what Consul refuses in a definition it would store:
// an ID on a new query, the redacted token, a negative NearestN, failover
// Targets beside NearestN or Datacenters, and a DNS TTL that is not a
// duration of zero or more.
func checkQuery(in *queryBody, create bool) error {
	if create && in.ID != "" {
		return invalidf("A new prepared query cannot carry an ID (%q): the server assigns one; update a query with PUT /v1/query/<id>", in.ID)
	}
	if in.Token == redactedToken {
		return invalidf("Token %q is how Consul shows a token it hides, not a token: submit the query's own token, or none", in.Token)
	}
	f := &in.Service.Failover
	if f.NearestN < 0 {
		return invalidf("Service.Failover.NearestN must be 0 or more, not %d", f.NearestN)
	}
	if (f.NearestN != 0 || len(f.Datacenters) != 0) && len(f.Targets) != 0 {
		return invalidf("Service.Failover.Targets cannot be given together with NearestN or Datacenters")
	}
	if in.DNS.TTL != "" {
		ttl, err := time.ParseDuration(in.DNS.TTL)
		if err != nil {
			return invalidf("DNS.TTL %q is not a duration such as \"10s\"", in.DNS.TTL)
		}
		if ttl < 0 {
			return invalidf("DNS.TTL %q must not be negative", in.DNS.TTL)
		}
	}
	return nil
}

// refuseNameAliasingID refuses a query name that is the ID of another
// query, as Consul does: queries are found by ID before name, so such a
// name could never be used, and refusing it keeps a name from posing as
// someone else's query. (IDs are random, so checking before the write
// leaves no race worth closing.)
// IDs are found in any case (queryID), so the name is compared the same way.
func (h *handler) refuseNameAliasingID(q *state.PreparedQuery) error {
	if q.Name == "" || strings.EqualFold(q.Name, q.ID) {
		return nil
	}
	if _, other := h.b.State().QueryGet(nil, foldID(q.Name)); other != nil {
		return invalidf("Name '%s' aliases an existing query ID", q.Name)
	}
	return nil
}

func (h *handler) queryCreate(w http.ResponseWriter, r *http.Request, _ string) error {
	q, err := h.decodeQuery(r, true)
	if err != nil {
		return err
	}
	if err := h.refuseNameAliasingID(q); err != nil {
		return err
	}
	id, err := h.b.QuerySet(r.Context(), q)
	if err != nil {
		return err
	}
	return writeJSON(w, r, struct{ ID string }{id})
}

func (h *handler) queryList(w http.ResponseWriter, r *http.Request, _ string) error {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	list, err := readList(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, []*state.PreparedQuery) {
		return s.QueryList(ws)
	})
	if err != nil {
		return err
	}
	if list == nil {
		list = []*state.PreparedQuery{}
	}
	return writeJSON(w, r, list)
}

// queryID splits /v1/query/<id>[/<action>]. An ID in UUID form is
// folded to lower case, the case holdfast makes IDs in: like Consul, which
// parses them, holdfast finds a query whatever the case of its ID.
func queryID(arg string) (id, action string) {
	id, action, _ = strings.Cut(arg, "/")
	return foldID(id), action
}

// foldID is s in lower case if it has the form of a UUID (see queryID),
// else s.
func foldID(s string) string {
	if isUUID(s) {
		return strings.ToLower(s)
	}
	return s
}

// isUUID reports whether s has the form of a UUID: 36 characters, hex
// digits in groups of 8, 4, 4, 4 and 12, joined by dashes.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

func (h *handler) queryGet(w http.ResponseWriter, r *http.Request, arg string) error {
	id, action := queryID(arg)
	switch action {
	case "":
	case "execute":
		return h.queryExecute(w, r, id)
	case "explain":
		return h.queryExplain(w, r, id)
	default:
		return notFoundf("Invalid URL path: unknown prepared query action %q", action)
	}
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	if id == "" {
		return invalidf("Missing query ID")
	}
	var pq *state.PreparedQuery
	err = h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		idx, found := s.QueryGet(ws, id)
		pq = found
		return idx, found != nil
	})
	if err != nil {
		return err
	}
	if pq == nil {
		return notFoundf("Query not found")
	}
	return writeJSON(w, r, []*state.PreparedQuery{pq})
}

func (h *handler) queryUpdate(w http.ResponseWriter, r *http.Request, arg string) error {
	id, action := queryID(arg)
	if action != "" {
		return notFoundf("Invalid URL path: %q", r.URL.Path)
	}
	if id == "" {
		return invalidf("Missing query ID")
	}
	q, err := h.decodeQuery(r, false)
	if err != nil {
		return err
	}
	if _, cur := h.b.State().QueryGet(nil, id); cur == nil {
		return notFoundf("Cannot modify non-existent prepared query: '%s'", id)
	}
	q.ID = id
	if err := h.refuseNameAliasingID(q); err != nil {
		return err
	}
	if _, err := h.b.QuerySet(r.Context(), q); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (h *handler) queryDelete(w http.ResponseWriter, r *http.Request, arg string) error {
	id, action := queryID(arg)
	if action != "" {
		return notFoundf("Invalid URL path: %q", r.URL.Path)
	}
	if id == "" {
		return invalidf("Missing query ID")
	}
	if err := h.b.QueryDelete(r.Context(), id); err != nil {
		if errors.Is(err, state.ErrQueryNotFound) {
			return notFoundf("Cannot modify non-existent prepared query: '%s'", id)
		}
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}
