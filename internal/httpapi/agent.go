package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// AgentBackend is what the /v1/agent/check* and /v1/agent/service*
// endpoints need: the agent that runs this node's checks and keeps its
// services (internal/agent implements it). All methods may be called
// concurrently.
//
// Errors: bad input wraps state.ErrInvalidRequest (400); a check or service
// the agent does not have is an error with a NotFound() bool method that
// returns true (404); anything else is the catalog write's own error.
type AgentBackend interface {
	// RegisterCheck registers (or replaces) a check on the agent's node,
	// writes it to the catalog and starts running it.
	RegisterCheck(ctx context.Context, def *state.CheckDefinition) error
	// DeregisterCheck stops a check and removes it from the catalog.
	DeregisterCheck(ctx context.Context, id string) error
	// UpdateCheck sets a TTL check's status and output and restarts its TTL.
	UpdateCheck(ctx context.Context, id, status, output string) error
	// Checks is the agent's view of its checks; the caller owns it.
	Checks() []*state.HealthCheck
	// RegisterService registers (or replaces) a service with its checks;
	// replaceChecks also removes the service's checks not listed.
	RegisterService(ctx context.Context, svc *state.Service, checks []*state.CheckDefinition, replaceChecks bool) error
	// DeregisterService removes a service and its checks.
	DeregisterService(ctx context.Context, id string) error
	// Services is the agent's services; the caller owns it.
	Services() []*state.Service
}

// agentRoutes registers the endpoints served by the AgentBackend.
func (h *handler) agentRoutes() {
	h.handle("/v1/agent/check/register", false, "PUT", h.agentCheckRegister)
	h.handle("/v1/agent/check/deregister", true, "PUT", h.agentCheckDeregister)
	h.handle("/v1/agent/check/pass", true, "PUT", h.agentCheckTTL(state.HealthPassing))
	h.handle("/v1/agent/check/warn", true, "PUT", h.agentCheckTTL(state.HealthWarning))
	h.handle("/v1/agent/check/fail", true, "PUT", h.agentCheckTTL(state.HealthCritical))
	h.handle("/v1/agent/check/update", true, "PUT", h.agentCheckUpdate)
	h.handle("/v1/agent/checks", false, "GET", h.agentChecks)
	h.handle("/v1/agent/service/register", false, "PUT", h.agentServiceRegister)
	h.handle("/v1/agent/service/deregister", true, "PUT", h.agentServiceDeregister)
	h.handle("/v1/agent/services", false, "GET", h.agentServices)
}

// IsAgentPath reports whether a request path is one of the endpoints an
// AgentBackend serves (/v1/agent/check*, /v1/agent/service*). A client
// agent, which forwards everything else to a server, serves these itself
// with AgentHandler: its checks run on its own node.
func IsAgentPath(p string) bool {
	switch p {
	case "/v1/agent/checks", "/v1/agent/services", "/v1/agent/check/register", "/v1/agent/service/register":
		return true
	}
	return strings.HasPrefix(p, "/v1/agent/check/") || strings.HasPrefix(p, "/v1/agent/service/")
}

// AgentHandler serves only the agent's check and service endpoints (those
// IsAgentPath accepts) over ag, for an agent that has no Backend of its
// own: a client agent, whose ag writes to the catalog through a server.
// datacenter is the agent's, for ?dc and /v1/agent/services. Other paths
// answer 404. Safe for concurrent use.
func AgentHandler(ag AgentBackend, datacenter string, opts Options) http.Handler {
	opts.Agent = ag
	h := &handler{b: datacenterOnly{dc: datacenter}, opts: opts.withDefaults()}
	h.agentRoutes()
	return h
}

// datacenterOnly is the Backend of an AgentHandler: the agent endpoints
// read nothing from a backend but its datacenter. Any other method would
// panic on the nil embedded interface, and none is reachable.
type datacenterOnly struct {
	Backend
	dc string
}

func (d datacenterOnly) Datacenter() string { return d.dc }

var errNoAgent = &Error{Kind: KindNotImplemented,
	Msg: "This server runs no local agent: agent checks and services are not available here"}

func (h *handler) agent() (AgentBackend, error) {
	if h.opts.Agent == nil {
		return nil, errNoAgent
	}
	return h.opts.Agent, nil
}

// agentErr gives an agent's not-found errors their Kind; other errors are
// classified by KindOf as usual.
func agentErr(err error) error {
	var nf interface{ NotFound() bool }
	if errors.As(err, &nf) && nf.NotFound() {
		return &Error{Kind: KindNotFound, Msg: err.Error()}
	}
	return err
}

// duration decodes a Go duration string ("10s") or a number of
// nanoseconds, as Consul's check definitions take either.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if s == "" {
			*d = 0
			return nil
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("invalid duration %q: %v", s, err)
		}
		*d = duration(v)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("invalid duration %s: give a string such as \"10s\" or a number of nanoseconds", b)
	}
	if v, err := n.Int64(); err == nil {
		*d = duration(v)
		return nil
	}
	f, err := n.Float64() // 1e9
	if err != nil || f != math.Trunc(f) || math.Abs(f) > math.MaxInt64 {
		return fmt.Errorf("invalid duration %s: not a whole number of nanoseconds", b)
	}
	*d = duration(int64(f))
	return nil
}

// checkBody is a check definition as /v1/agent/check/register, and the
// Check and Checks of a service definition, take it (keys match
// case-insensitively). Fields of check types holdfast does not run are
// decoded only to refuse them with a sentence.
type checkBody struct {
	ID        string
	CheckID   string // the key a service definition's checks use
	Name      string
	Notes     string
	ServiceID string
	Status    string

	TTL      duration
	Interval duration
	Timeout  duration

	HTTP          string
	Method        string
	Header        map[string][]string
	Body          string
	TLSSkipVerify bool
	TCP           string

	// Accepted and ignored: holdfast does not reap critical services,
	// nor count successes and failures before a status change.
	DeregisterCriticalServiceAfter duration
	SuccessBeforePassing           int
	FailuresBeforeWarning          int
	FailuresBeforeCritical         int
	Namespace, Partition           string
	TLSServerName                  string

	// Check types holdfast does not run.
	Args              []string
	ScriptArgs        []string
	Script            string
	DockerContainerID string
	Shell             string
	GRPC              string
	GRPCUseTLS        bool
	H2PING            string
	H2PingUseTLS      bool
	UDP               string
	AliasNode         string
	AliasService      string
	OSService         string
	TCPUseTLS         bool
}

// definition turns a decoded check into the agent's definition, refusing
// check types holdfast does not run.
func (c *checkBody) definition() (*state.CheckDefinition, error) {
	id := c.ID
	if id == "" {
		id = c.CheckID
	}
	name := id
	if name == "" {
		name = c.Name
	}
	unsupported := func(kind string) error {
		return invalidf("Check %q is %s check: holdfast runs only TTL, HTTP and TCP checks", name, kind)
	}
	switch {
	case len(c.Args) > 0 || len(c.ScriptArgs) > 0 || c.Script != "":
		return nil, unsupported("a script")
	case c.DockerContainerID != "":
		return nil, unsupported("a Docker")
	case c.GRPC != "":
		return nil, unsupported("a gRPC")
	case c.H2PING != "":
		return nil, unsupported("an H2PING")
	case c.UDP != "":
		return nil, unsupported("a UDP")
	case c.AliasNode != "" || c.AliasService != "":
		return nil, unsupported("an alias")
	case c.OSService != "":
		return nil, unsupported("an OS-service")
	case c.TCPUseTLS:
		return nil, invalidf("Check %q asks for TCPUseTLS: holdfast's TCP checks only connect", name)
	}
	return &state.CheckDefinition{
		ID: id, Name: c.Name, Notes: c.Notes, ServiceID: c.ServiceID, Status: c.Status,
		TTL: time.Duration(c.TTL), Interval: time.Duration(c.Interval), Timeout: time.Duration(c.Timeout),
		HTTP: c.HTTP, Method: c.Method, Header: c.Header, Body: c.Body, TLSSkipVerify: c.TLSSkipVerify,
		TCP: c.TCP,
	}, nil
}

// decodeAgentBody decodes a required JSON body into v.
func (h *handler) decodeAgentBody(r *http.Request, v interface{}, what string) error {
	body, err := readBody(r, h.opts.MaxValueSize, "")
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return invalidf("Missing %s: the request body is empty", what)
	}
	if err := decodeStrict(body, v); err != nil {
		var he *Error
		if errors.As(err, &he) {
			return err
		}
		return invalidf("Request decode failed: %v", err)
	}
	return nil
}

// writeEmpty answers 200 with no body, as Consul's agent writes do.
func writeEmpty(w http.ResponseWriter) error {
	w.WriteHeader(http.StatusOK)
	return nil
}

func (h *handler) agentCheckRegister(w http.ResponseWriter, r *http.Request, _ string) error {
	ag, err := h.agent()
	if err != nil {
		return err
	}
	var in checkBody
	if err := h.decodeAgentBody(r, &in, "check definition"); err != nil {
		return err
	}
	def, err := in.definition()
	if err != nil {
		return err
	}
	if err := ag.RegisterCheck(r.Context(), def); err != nil {
		return agentErr(err)
	}
	return writeEmpty(w)
}

func (h *handler) agentCheckDeregister(w http.ResponseWriter, r *http.Request, id string) error {
	ag, err := h.agent()
	if err != nil {
		return err
	}
	if id == "" {
		return invalidf("Missing check ID")
	}
	if err := ag.DeregisterCheck(r.Context(), id); err != nil {
		return agentErr(err)
	}
	return writeEmpty(w)
}

// agentCheckTTL serves /v1/agent/check/pass|warn|fail/<id>?note=. (An
// unnamed func type, as handle expects.)
func (h *handler) agentCheckTTL(status string) func(http.ResponseWriter, *http.Request, string) error {
	return func(w http.ResponseWriter, r *http.Request, id string) error {
		ag, err := h.agent()
		if err != nil {
			return err
		}
		if id == "" {
			return invalidf("Missing check ID")
		}
		if err := ag.UpdateCheck(r.Context(), id, status, r.URL.Query().Get("note")); err != nil {
			return agentErr(err)
		}
		return writeEmpty(w)
	}
}

// agentCheckUpdate serves PUT /v1/agent/check/update/<id> with
// {"Status":…,"Output":…}.
func (h *handler) agentCheckUpdate(w http.ResponseWriter, r *http.Request, id string) error {
	ag, err := h.agent()
	if err != nil {
		return err
	}
	if id == "" {
		return invalidf("Missing check ID")
	}
	var in struct{ Status, Output string }
	if err := h.decodeAgentBody(r, &in, "check update"); err != nil {
		return err
	}
	switch in.Status {
	case state.HealthPassing, state.HealthWarning, state.HealthCritical:
	default:
		return invalidf("Invalid check status: '%s': use passing, warning or critical", in.Status)
	}
	if err := ag.UpdateCheck(r.Context(), id, in.Status, in.Output); err != nil {
		return agentErr(err)
	}
	return writeEmpty(w)
}

// agentChecks answers {id: HealthCheck} with the agent's own view.
func (h *handler) agentChecks(w http.ResponseWriter, r *http.Request, _ string) error {
	ag, err := h.agent()
	if err != nil {
		return err
	}
	if err := refuseFilter(r); err != nil {
		return err
	}
	out := map[string]*state.HealthCheck{}
	for _, c := range ag.Checks() {
		out[c.CheckID] = withTags(c)
	}
	return writeJSON(w, r, out)
}

// serviceBody is a service definition as /v1/agent/service/register takes
// it. Fields holdfast does not keep (Weights, TaggedAddresses,
// EnableTagOverride, …) are ignored; a Kind other than a typical service
// is refused.
type serviceBody struct {
	Kind    string
	ID      string
	Name    string
	Tags    []string
	Address string
	Port    int
	Meta    map[string]string
	Check   *checkBody
	Checks  []*checkBody
}

func (h *handler) agentServiceRegister(w http.ResponseWriter, r *http.Request, _ string) error {
	ag, err := h.agent()
	if err != nil {
		return err
	}
	var in serviceBody
	if err := h.decodeAgentBody(r, &in, "service definition"); err != nil {
		return err
	}
	if in.Kind != "" && in.Kind != "typical" {
		return invalidf("Service kind %q is not supported: holdfast registers only typical services", in.Kind)
	}
	if in.Name == "" {
		return invalidf("Missing service name")
	}
	if in.Port < 0 || in.Port > 65535 {
		return invalidf("Service port %d is out of range", in.Port)
	}
	var defs []*state.CheckDefinition
	for _, c := range append([]*checkBody{in.Check}, in.Checks...) {
		if c == nil || reflect.DeepEqual(*c, checkBody{}) {
			continue // Consul skips empty check definitions too
		}
		def, err := c.definition()
		if err != nil {
			return err
		}
		defs = append(defs, def)
	}
	replace, err := boolParam(r, "replace-existing-checks")
	if err != nil {
		return err
	}
	svc := &state.Service{ID: in.ID, Service: in.Name, Tags: in.Tags, Address: in.Address, Port: in.Port, Meta: in.Meta}
	if err := ag.RegisterService(r.Context(), svc, defs, replace); err != nil {
		return agentErr(err)
	}
	return writeEmpty(w)
}

func (h *handler) agentServiceDeregister(w http.ResponseWriter, r *http.Request, id string) error {
	ag, err := h.agent()
	if err != nil {
		return err
	}
	if id == "" {
		return invalidf("Missing service ID")
	}
	if err := ag.DeregisterService(r.Context(), id); err != nil {
		return agentErr(err)
	}
	return writeEmpty(w)
}

// agentServiceJSON is Consul's AgentService, trimmed to what holdfast
// keeps. The indexes are left out of /v1/agent/services, as Consul does.
type agentServiceJSON struct {
	ID                string
	Service           string
	Tags              []string
	Meta              map[string]string
	Port              int
	Address           string
	Weights           weightsJSON
	EnableTagOverride bool
	CreateIndex       uint64 `json:",omitempty"`
	ModifyIndex       uint64 `json:",omitempty"`
	Datacenter        string `json:",omitempty"`
}

type weightsJSON struct{ Passing, Warning int }

func agentService(s *state.Service, withIndexes bool, dc string) *agentServiceJSON {
	out := &agentServiceJSON{ID: s.ID, Service: s.Service, Tags: s.Tags, Meta: s.Meta, Port: s.Port,
		Address: s.Address, Weights: weightsJSON{Passing: 1, Warning: 1}, Datacenter: dc}
	if out.Tags == nil {
		out.Tags = []string{}
	}
	if out.Meta == nil {
		out.Meta = map[string]string{}
	}
	if withIndexes {
		out.CreateIndex, out.ModifyIndex = s.CreateIndex, s.ModifyIndex
	}
	return out
}

func (h *handler) agentServices(w http.ResponseWriter, r *http.Request, _ string) error {
	ag, err := h.agent()
	if err != nil {
		return err
	}
	if err := refuseFilter(r); err != nil {
		return err
	}
	out := map[string]*agentServiceJSON{}
	for _, s := range ag.Services() {
		out[s.ID] = agentService(s, false, h.b.Datacenter())
	}
	return writeJSON(w, r, out)
}

// refuseFilter answers 400 to ?filter and ?node-meta: holdfast does not
// evaluate filter expressions or match node metadata, and ignoring either
// would return what the client excluded.
func refuseFilter(r *http.Request) error {
	q := r.URL.Query()
	if f := q.Get("filter"); strings.TrimSpace(f) != "" {
		return invalidf("Filter expressions (?filter=) are not supported by holdfast")
	}
	if _, ok := q["node-meta"]; ok {
		return invalidf("Node metadata filters (?node-meta=) are not supported by holdfast")
	}
	return nil
}

// withTags returns c with ServiceTags [] rather than null, as Consul
// prints it; c itself is not modified.
func withTags(c *state.HealthCheck) *state.HealthCheck {
	if c.ServiceTags != nil {
		return c
	}
	cc := *c
	cc.ServiceTags = []string{}
	return &cc
}
