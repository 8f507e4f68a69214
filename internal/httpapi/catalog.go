package httpapi

import (
	"bytes"
	"net/http"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// registerBody is the body of PUT /v1/catalog/register. Its fields decode
// case-insensitively; fields of Consul's richer types that holdfast does
// not keep (Weights, Proxy, …) are ignored.
type registerBody struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	NodeMeta        map[string]string
	Service         *state.Service
	Check           *state.HealthCheck
	Checks          []*state.HealthCheck
	SkipNodeUpdate  bool
}

func (h *handler) catalogRegister(w http.ResponseWriter, r *http.Request, _ string) error {
	body, err := readBody(r, h.opts.MaxValueSize)
	if err != nil {
		return err
	}
	var in registerBody
	if len(bytes.TrimSpace(body)) == 0 {
		return invalidf("Missing node registration: the request body is empty")
	}
	if err := decodeStrict(body, &in); err != nil {
		return invalidf("Request decode failed: %v", err)
	}
	if in.Node == "" {
		return invalidf("Must provide node")
	}
	dc, err := h.ownDatacenter(in.Datacenter)
	if err != nil {
		return err
	}
	if in.Address == "" && !in.SkipNodeUpdate {
		return invalidf("Must provide address if SkipNodeUpdate is not set")
	}
	for _, c := range append([]*state.HealthCheck{in.Check}, in.Checks...) {
		if c != nil && c.Node != "" && c.Node != in.Node {
			return invalidf("Check %q belongs to node %q, not %q", c.CheckID, c.Node, in.Node)
		}
	}
	req := &state.RegisterRequest{
		Node: in.Node, ID: in.ID, Address: in.Address, Datacenter: dc,
		TaggedAddresses: in.TaggedAddresses, NodeMeta: in.NodeMeta,
		Service: in.Service, Check: in.Check, SkipNodeUpdate: in.SkipNodeUpdate,
	}
	for _, c := range in.Checks {
		if c != nil {
			req.Checks = append(req.Checks, c)
		}
	}
	if err := h.b.Register(r.Context(), req); err != nil {
		return err
	}
	return writeJSON(w, r, true)
}

func (h *handler) catalogDeregister(w http.ResponseWriter, r *http.Request, _ string) error {
	body, err := readBody(r, h.opts.MaxValueSize)
	if err != nil {
		return err
	}
	var in struct {
		Datacenter string
		state.DeregisterRequest
	}
	if len(bytes.TrimSpace(body)) > 0 {
		if err := decodeStrict(body, &in); err != nil {
			return invalidf("Request decode failed: %v", err)
		}
	}
	if in.Node == "" {
		return invalidf("Must provide node")
	}
	if _, err := h.ownDatacenter(in.Datacenter); err != nil {
		return err
	}
	if in.CheckID != "" && in.ServiceID != "" {
		return invalidf("Give CheckID or ServiceID, not both")
	}
	if err := h.b.Deregister(r.Context(), &in.DeregisterRequest); err != nil {
		return err
	}
	return writeJSON(w, r, true)
}

// withDatacenter returns n with this server's datacenter filled in when
// the node was stored without one, as Consul always prints it; n itself
// is not modified.
func (h *handler) withDatacenter(n *state.Node) *state.Node {
	if n == nil || n.Datacenter != "" {
		return n
	}
	nn := *n
	nn.Datacenter = h.b.Datacenter()
	return &nn
}

func (h *handler) catalogNodes(w http.ResponseWriter, r *http.Request, _ string) error {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	if err := refuseFilter(r); err != nil {
		return err
	}
	nodes, err := readList(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, []*state.Node) {
		return s.Nodes(ws)
	})
	if err != nil {
		return err
	}
	out := make([]*state.Node, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, h.withDatacenter(n))
	}
	return writeJSON(w, r, out)
}

// nodeServiceJSON is a service as /v1/catalog/node/<n> prints it (Consul's
// NodeService, trimmed to what holdfast keeps).
type nodeServiceJSON struct {
	ID          string
	Service     string
	Tags        []string
	Address     string
	Meta        map[string]string
	Port        int
	CreateIndex uint64
	ModifyIndex uint64
}

type nodeServicesJSON struct {
	Node     *state.Node
	Services map[string]*nodeServiceJSON
}

// catalogNode answers {"Node":…,"Services":{id:…}}, or 200 with a null body
// for an unknown node, as Consul does (its client turns null into nil).
func (h *handler) catalogNode(w http.ResponseWriter, r *http.Request, name string) error {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	if name == "" {
		return invalidf("Missing node name")
	}
	if err := refuseFilter(r); err != nil {
		return err
	}
	var node *state.Node
	var svcs []*state.Service
	err = h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		idx, n, ss := s.NodeInfo(ws, name)
		node, svcs = n, ss
		return idx, n != nil
	})
	if err != nil {
		return err
	}
	if node == nil {
		return writeJSON(w, r, nil)
	}
	out := &nodeServicesJSON{Node: h.withDatacenter(node), Services: map[string]*nodeServiceJSON{}}
	for _, s := range svcs {
		tags := s.Tags
		if tags == nil {
			tags = []string{}
		}
		out.Services[s.ID] = &nodeServiceJSON{ID: s.ID, Service: s.Service, Tags: tags,
			Address: s.Address, Meta: s.Meta, Port: s.Port, CreateIndex: s.CreateIndex, ModifyIndex: s.ModifyIndex}
	}
	return writeJSON(w, r, out)
}

func (h *handler) healthNode(w http.ResponseWriter, r *http.Request, name string) error {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	if name == "" {
		return invalidf("Missing node name")
	}
	if err := refuseFilter(r); err != nil {
		return err
	}
	checks, err := readScoped(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, []*state.HealthCheck) {
		return s.NodeChecks(ws, name)
	})
	if err != nil {
		return err
	}
	out := make([]*state.HealthCheck, 0, len(checks))
	for _, c := range checks {
		if c.ServiceTags == nil {
			cc := *c
			cc.ServiceTags = []string{}
			c = &cc
		}
		out = append(out, c)
	}
	return writeJSON(w, r, out)
}

func (h *handler) agentSelf(w http.ResponseWriter, r *http.Request, _ string) error {
	return writeJSON(w, r, h.b.Self())
}

func (h *handler) statusLeader(w http.ResponseWriter, r *http.Request, _ string) error {
	return writeJSON(w, r, h.b.Leader())
}

func (h *handler) statusPeers(w http.ResponseWriter, r *http.Request, _ string) error {
	peers, err := h.b.Peers()
	if err != nil {
		return err
	}
	if peers == nil {
		peers = []string{}
	}
	return writeJSON(w, r, peers)
}
