package api

import (
	"context"
	"fmt"
	"net/http"
)

// Health states of a check.
const (
	HealthPassing  = "passing"
	HealthWarning  = "warning"
	HealthCritical = "critical"
)

// SerfHealthCheckID is the check every node carries for gossip health.
// Sessions are bound to it unless they name other checks.
const SerfHealthCheckID = "serfHealth"

// Node is a catalog node.
type Node struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	Meta            map[string]string
	CreateIndex     uint64
	ModifyIndex     uint64
}

// AgentService is a service instance as the catalog reports it under a
// node, and as it is registered.
type AgentService struct {
	ID      string
	Service string
	Tags    []string
	Address string
	Meta    map[string]string
	Port    int
}

// CatalogNode is a node with its services.
type CatalogNode struct {
	Node     *Node
	Services map[string]*AgentService
}

// HealthCheckDefinition says how a check is run. The catalog only stores
// it; holdfast runs none of these itself.
type HealthCheckDefinition struct {
	HTTP     string `json:",omitempty"`
	TCP      string `json:",omitempty"`
	Method   string `json:",omitempty"`
	Interval string `json:",omitempty"`
	Timeout  string `json:",omitempty"`
	TTL      string `json:",omitempty"`
}

// HealthCheck is a check on a node, optionally tied to a service. A check
// registered without a Status is critical, and any session bound to it is
// invalidated.
type HealthCheck struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
	ServiceTags []string
	Type        string
	Definition  HealthCheckDefinition
	CreateIndex uint64
	ModifyIndex uint64
}

// HealthChecks is a list of checks.
type HealthChecks []*HealthCheck

// CatalogRegistration registers or updates a node, and optionally one
// service and one or more checks on it.
type CatalogRegistration struct {
	ID              string            `json:",omitempty"`
	Node            string            // required
	Address         string            // required
	Datacenter      string            `json:",omitempty"`
	TaggedAddresses map[string]string `json:",omitempty"`
	NodeMeta        map[string]string `json:",omitempty"`
	Service         *AgentService     `json:",omitempty"`
	Check           *HealthCheck      `json:",omitempty"`
	Checks          HealthChecks      `json:",omitempty"`
	SkipNodeUpdate  bool              `json:",omitempty"`
}

// CatalogDeregistration removes a node, or only one of its services or
// checks when ServiceID or CheckID is set. Removing a check invalidates
// the sessions bound to it; removing a node invalidates all its sessions.
type CatalogDeregistration struct {
	Node       string
	Address    string `json:",omitempty"`
	Datacenter string `json:",omitempty"`
	ServiceID  string `json:",omitempty"`
	CheckID    string `json:",omitempty"`
}

// Catalog is the catalog endpoint, /v1/catalog. Get one with
// Client.Catalog.
type Catalog struct{ c *Client }

// Catalog returns the catalog endpoint.
func (c *Client) Catalog() *Catalog { return &Catalog{c} }

// Register registers reg.
func (cat *Catalog) Register(ctx context.Context, reg *CatalogRegistration, w *WriteOptions) (*WriteMeta, error) {
	r := cat.c.newRequest(http.MethodPut, "/v1/catalog/register")
	if err := jsonBody(r, reg); err != nil {
		return nil, err
	}
	return cat.c.write(ctx, r, w, nil)
}

// Deregister removes what dereg names.
func (cat *Catalog) Deregister(ctx context.Context, dereg *CatalogDeregistration, w *WriteOptions) (*WriteMeta, error) {
	r := cat.c.newRequest(http.MethodPut, "/v1/catalog/deregister")
	if err := jsonBody(r, dereg); err != nil {
		return nil, err
	}
	return cat.c.write(ctx, r, w, nil)
}

// Nodes lists the nodes of the catalog.
func (cat *Catalog) Nodes(ctx context.Context, q *QueryOptions) ([]*Node, *QueryMeta, error) {
	var out []*Node
	qm, err := cat.c.query(ctx, "/v1/catalog/nodes", nil, q, &out)
	if err != nil {
		return nil, qm, err
	}
	return out, qm, nil
}

// Node reads one node and its services; an unknown node gives nil and no
// error.
func (cat *Catalog) Node(ctx context.Context, node string, q *QueryOptions) (*CatalogNode, *QueryMeta, error) {
	var out *CatalogNode
	qm, err := cat.c.query(ctx, "/v1/catalog/node/"+node, nil, q, &out)
	if err != nil {
		return nil, qm, err
	}
	return out, qm, nil
}

// Health is the health endpoint, /v1/health. Get one with Client.Health.
type Health struct{ c *Client }

// Health returns the health endpoint.
func (c *Client) Health() *Health { return &Health{c} }

// Node lists the checks of node, including the node-level serfHealth.
func (h *Health) Node(ctx context.Context, node string, q *QueryOptions) (HealthChecks, *QueryMeta, error) {
	var out HealthChecks
	qm, err := h.c.query(ctx, "/v1/health/node/"+node, nil, q, &out)
	if err != nil {
		return nil, qm, err
	}
	return out, qm, nil
}

// Status is the status endpoint, /v1/status. Get one with Client.Status.
type Status struct{ c *Client }

// Status returns the status endpoint.
func (c *Client) Status() *Status { return &Status{c} }

// Leader returns the Raft address of the current leader, "" if there is
// none.
func (s *Status) Leader(ctx context.Context) (string, error) {
	var out string
	_, err := s.c.query(ctx, "/v1/status/leader", nil, nil, &out)
	return out, err
}

// Peers returns the Raft addresses of the voting servers.
func (s *Status) Peers(ctx context.Context) ([]string, error) {
	var out []string
	_, err := s.c.query(ctx, "/v1/status/peers", nil, nil, &out)
	return out, err
}

// Agent is the endpoint of the agent the client talks to, /v1/agent. Get
// one with Client.Agent.
type Agent struct{ c *Client }

// Agent returns the agent endpoint.
func (c *Client) Agent() *Agent { return &Agent{c} }

// Self returns the agent's description of itself: a map of sections
// ("Config", "Member", …) each a JSON object.
func (a *Agent) Self(ctx context.Context) (map[string]map[string]any, error) {
	var out map[string]map[string]any
	_, err := a.c.query(ctx, "/v1/agent/self", nil, nil, &out)
	return out, err
}

// NodeName returns the agent's node name (Config.NodeName of Self), the
// node that sessions are created on by default.
func (a *Agent) NodeName(ctx context.Context) (string, error) {
	self, err := a.Self(ctx)
	if err != nil {
		return "", err
	}
	name, ok := self["Config"]["NodeName"].(string)
	if !ok || name == "" {
		return "", fmt.Errorf("api: agent self has no Config.NodeName")
	}
	return name, nil
}

// Leave asks the agent to leave its gossip pool gracefully and stop. A
// server of a cluster hands over its leadership first, and the leader
// then takes it out of the raft configuration. It returns once the agent
// has left the pool.
func (a *Agent) Leave(ctx context.Context) error {
	_, err := a.c.write(ctx, a.c.newRequest(http.MethodPut, "/v1/agent/leave"), nil, nil)
	return err
}

// AgentMember is one member of the gossip pool an agent belongs to, as
// /v1/agent/members reports it (Consul's shape). Status is serf's number:
// 1 alive, 2 leaving, 3 left, 4 failed.
type AgentMember struct {
	Name        string
	Addr        string
	Port        uint16
	Tags        map[string]string
	Status      int
	ProtocolMin uint8
	ProtocolMax uint8
	ProtocolCur uint8
	DelegateMin uint8
	DelegateMax uint8
	DelegateCur uint8
}

// Members lists the members of the agent's gossip pool.
func (a *Agent) Members(ctx context.Context) ([]AgentMember, error) {
	var out []AgentMember
	_, err := a.c.query(ctx, "/v1/agent/members", nil, nil, &out)
	return out, err
}
