package httpapi

import (
	"net/http"
	"strings"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// catalogServices answers {name: [tags…]} for every service.
func (h *handler) catalogServices(w http.ResponseWriter, r *http.Request, _ string) error {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	if err := refuseFilter(r); err != nil {
		return err
	}
	svcs, err := readList(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, map[string][]string) {
		return s.Services(ws)
	})
	if err != nil {
		return err
	}
	if svcs == nil {
		svcs = map[string][]string{}
	}
	return writeJSON(w, r, svcs)
}

// catalogServiceJSON is Consul's CatalogService: one instance with its
// node, trimmed to what holdfast keeps.
type catalogServiceJSON struct {
	ID                       string
	Node                     string
	Address                  string
	Datacenter               string
	TaggedAddresses          map[string]string
	NodeMeta                 map[string]string
	ServiceID                string
	ServiceName              string
	ServiceAddress           string
	ServiceTags              []string
	ServiceMeta              map[string]string
	ServicePort              int
	ServiceWeights           weightsJSON
	ServiceEnableTagOverride bool
	CreateIndex              uint64
	ModifyIndex              uint64
}

// parseServiceRead checks what every read of one service's instances
// checks, in Consul's order: the read options, a service name, no ?filter.
func (h *handler) parseServiceRead(r *http.Request, name string) (*readOpts, error) {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, invalidf("Missing service name")
	}
	if err := refuseFilter(r); err != nil {
		return nil, err
	}
	return ro, nil
}

// catalogService answers the instances of one service (?tag=, repeatable,
// keeps those carrying every tag given).
func (h *handler) catalogService(w http.ResponseWriter, r *http.Request, name string) error {
	ro, err := h.parseServiceRead(r, name)
	if err != nil {
		return err
	}
	sns, err := readList(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, []*state.ServiceNode) {
		return s.ServiceNodes(ws, name)
	})
	if err != nil {
		return err
	}
	tags := r.URL.Query()["tag"]
	out := []*catalogServiceJSON{}
	for _, sn := range sns {
		if !hasTags(sn.Service.Tags, tags) {
			continue
		}
		n, s := sn.Node, sn.Service
		dc := n.Datacenter
		if dc == "" {
			dc = h.b.Datacenter()
		}
		cs := &catalogServiceJSON{
			ID: n.ID, Node: n.Node, Address: n.Address, Datacenter: dc,
			TaggedAddresses: n.TaggedAddresses, NodeMeta: n.Meta,
			ServiceID: s.ID, ServiceName: s.Service, ServiceAddress: s.Address,
			ServiceTags: s.Tags, ServiceMeta: s.Meta, ServicePort: s.Port,
			ServiceWeights: weightsJSON{Passing: 1, Warning: 1},
			CreateIndex:    s.CreateIndex, ModifyIndex: s.ModifyIndex,
		}
		if cs.ServiceTags == nil {
			cs.ServiceTags = []string{}
		}
		if cs.ServiceMeta == nil {
			cs.ServiceMeta = map[string]string{}
		}
		if cs.NodeMeta == nil {
			cs.NodeMeta = map[string]string{}
		}
		out = append(out, cs)
	}
	return writeJSON(w, r, out)
}

// hasTags reports whether have carries every tag of want, compared
// case-insensitively as Consul does. A wanted tag starting with "!" must
// be absent instead (prepared queries use this).
func hasTags(have, want []string) bool {
	for _, t := range want {
		neg := strings.HasPrefix(t, "!")
		if neg {
			t = t[1:]
		}
		found := false
		for _, h := range have {
			if strings.EqualFold(h, t) {
				found = true
				break
			}
		}
		if found == neg {
			return false
		}
	}
	return true
}
