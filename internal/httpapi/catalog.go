package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"strconv"
	"time"

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
	Check           *catalogCheck
	Checks          []*catalogCheck
	SkipNodeUpdate  bool
}

// catalogCheck is a check of a catalog registration: a HealthCheck whose
// Definition durations may be numbers (nanoseconds) or duration strings,
// as Consul accepts them.
type catalogCheck struct {
	state.HealthCheck
	Definition struct {
		HTTP, TCP, Method              string
		Interval, Timeout, TTL         json.RawMessage
		DeregisterCriticalServiceAfter json.RawMessage
	}
}

// toState returns the check as the catalog keeps it: CheckID defaults to
// Name (as in Consul), durations become Go duration strings ("10s").
func (c *catalogCheck) toState() (*state.HealthCheck, error) {
	hc := c.HealthCheck
	if hc.CheckID == "" {
		hc.CheckID = hc.Name
	}
	d := &c.Definition
	hc.Definition = state.HealthCheckDefinition{HTTP: d.HTTP, TCP: d.TCP, Method: d.Method}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		to   *string
	}{
		{"Interval", d.Interval, &hc.Definition.Interval},
		{"Timeout", d.Timeout, &hc.Definition.Timeout},
		{"TTL", d.TTL, &hc.Definition.TTL},
		{"DeregisterCriticalServiceAfter", d.DeregisterCriticalServiceAfter, new(string)},
	} {
		v, err := checkDuration(f.raw)
		if err != nil {
			return nil, invalidf("Check %q: Definition.%s %s", hc.CheckID, f.name, err)
		}
		*f.to = v
	}
	return &hc, nil
}

// checkDuration reads a check definition's duration: absent, null or ""
// is none; a number is nanoseconds; a string must parse as a Go duration.
// It returns the duration as a string ("" for none).
func checkDuration(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var d time.Duration
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("is not a string or a number")
		}
		if s == "" {
			return "", nil
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return "", fmt.Errorf("%q is not a duration such as \"10s\"", s)
		}
		d = v
	} else {
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil || math.IsNaN(f) || f >= math.MaxInt64 || f <= math.MinInt64 {
			return "", fmt.Errorf("%s is not a duration (a number of nanoseconds or a string such as \"10s\")", raw)
		}
		d = time.Duration(f)
	}
	if d < 0 {
		return "", fmt.Errorf("%v must not be negative", d)
	}
	return d.String(), nil
}

func (h *handler) catalogRegister(w http.ResponseWriter, r *http.Request, _ string) error {
	body, err := readBody(r, h.opts.MaxValueSize, "")
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
	req := &state.RegisterRequest{
		Node: in.Node, ID: in.ID, Address: in.Address, Datacenter: dc,
		TaggedAddresses: in.TaggedAddresses, NodeMeta: in.NodeMeta,
		Service: in.Service, SkipNodeUpdate: in.SkipNodeUpdate,
	}
	// Check goes after Checks, as Consul applies them: when both name the
	// same check, Check's status is the one that stays.
	for _, c := range append(in.Checks, in.Check) {
		if c == nil {
			continue
		}
		hc, err := c.toState()
		if err != nil {
			return err
		}
		if hc.Node != "" && hc.Node != in.Node {
			return invalidf("Check %q belongs to node %q, not %q", hc.CheckID, hc.Node, in.Node)
		}
		req.Checks = append(req.Checks, hc)
	}
	if err := h.b.Register(r.Context(), req); err != nil {
		return err
	}
	return writeJSON(w, r, true)
}

func (h *handler) catalogDeregister(w http.ResponseWriter, r *http.Request, _ string) error {
	body, err := readBody(r, h.opts.MaxValueSize, "")
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

// catalogDatacenters lists the datacenters this server knows: its own,
// since holdfast serves one. Like Consul's, the answer is not a blocking
// read and carries no index.
func (h *handler) catalogDatacenters(w http.ResponseWriter, r *http.Request, _ string) error {
	return writeJSON(w, r, []string{h.b.Datacenter()})
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
	self := h.b.Self()
	stats, _ := self["Stats"].(map[string]interface{})
	if stats == nil {
		stats = map[string]interface{}{}
	}
	for k, v := range RuntimeStats() {
		stats[k] = v
	}
	self["Stats"] = stats
	return writeJSON(w, r, self)
}

// RuntimeStats is the "Stats" section of /v1/agent/self as far as
// holdfast fills it: Consul's "runtime" part, the Go runtime's view of the
// machine, as strings, as Consul writes them (max_procs shows whether the
// agent raised GOMAXPROCS; see cli's minServerProcs).
func RuntimeStats() map[string]interface{} {
	return map[string]interface{}{
		"runtime": map[string]string{
			"arch":       runtime.GOARCH,
			"os":         runtime.GOOS,
			"version":    runtime.Version(),
			"cpu_count":  strconv.Itoa(runtime.NumCPU()),
			"max_procs":  strconv.Itoa(runtime.GOMAXPROCS(0)),
			"goroutines": strconv.Itoa(runtime.NumGoroutine()),
		},
	}
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
