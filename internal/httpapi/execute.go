package httpapi

import (
	"net/http"
	"strconv"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// executeJSON is Consul's PreparedQueryExecuteResponse.
type executeJSON struct {
	Service    string
	Nodes      []serviceEntryJSON
	DNS        struct{ TTL string }
	Datacenter string
	Failovers  int
}

// queryExecute serves GET /v1/query/<id-or-name>/execute: the healthy
// instances of the query's service. With Service.OnlyPassing only
// instances whose every check passes count, otherwise every instance with
// no critical check; Service.Tags keeps instances with every tag listed
// and without every tag listed with a leading "!". ?limit=N keeps the
// first N.
//
// Unlike Consul, holdfast does not shuffle the instances (it has one
// datacenter and no randomness in this layer): they come ordered by node
// and service ID. Execution never blocks, as in Consul; ?index is ignored.
func (h *handler) queryExecute(w http.ResponseWriter, r *http.Request, idOrName string) error {
	ro, err := h.queryRunOpts(r, idOrName)
	if err != nil {
		return err
	}
	limit := 0
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return invalidf("Invalid ?limit %q: give a whole number of results", s)
		}
		limit = n
	}
	var pq *state.PreparedQuery
	var csn []*state.CheckServiceNode
	err = h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		idx, q := findQuery(s, ws, idOrName)
		pq = q
		if q == nil {
			return idx, false
		}
		sidx, x := s.CheckServiceNodes(ws, q.Service.Service)
		csn = x
		return max(idx, sidx), true
	})
	if err != nil {
		return err
	}
	if pq == nil {
		return notFoundf("Query not found")
	}
	out := &executeJSON{Service: pq.Service.Service, Nodes: []serviceEntryJSON{}, Datacenter: h.b.Datacenter()}
	out.DNS.TTL = pq.DNS.TTL
	for _, c := range csn {
		if !c.Healthy(pq.Service.OnlyPassing) || !hasTags(c.Service.Tags, pq.Service.Tags) {
			continue
		}
		if limit > 0 && len(out.Nodes) == limit {
			break
		}
		out.Nodes = append(out.Nodes, h.serviceEntry(c))
	}
	return writeJSON(w, r, out)
}

// queryRunOpts reads the options of execute and explain, which never
// block (?index is ignored), for the query idOrName.
func (h *handler) queryRunOpts(r *http.Request, idOrName string) (*readOpts, error) {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return nil, err
	}
	ro.index = 0
	if idOrName == "" {
		return nil, invalidf("Missing query ID")
	}
	return ro, nil
}

// findQuery finds a query by ID, then by name, as execute and explain do.
func findQuery(s *state.Store, ws watch.Set, idOrName string) (uint64, *state.PreparedQuery) {
	idx, q := s.QueryGet(ws, idOrName)
	if q == nil {
		idx, q = s.QueryByName(ws, idOrName)
	}
	return idx, q
}

// queryExplain serves GET /v1/query/<id-or-name>/explain: the query that
// execute would run, as {"Query": ...}. Consul's answer is the query with
// its template filled in; holdfast has no templates, so it is the stored
// query. Like execute, it never blocks.
func (h *handler) queryExplain(w http.ResponseWriter, r *http.Request, idOrName string) error {
	ro, err := h.queryRunOpts(r, idOrName)
	if err != nil {
		return err
	}
	var pq *state.PreparedQuery
	err = h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		idx, q := findQuery(s, ws, idOrName)
		pq = q
		return idx, q != nil
	})
	if err != nil {
		return err
	}
	if pq == nil {
		return notFoundf("Query not found")
	}
	return writeJSON(w, r, struct{ Query *state.PreparedQuery }{pq})
}
