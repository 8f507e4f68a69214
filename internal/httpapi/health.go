package httpapi

import (
	"net/http"
	"strconv"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// serviceEntryJSON is Consul's ServiceEntry: an instance with its node and
// the checks that bear on its health.
type serviceEntryJSON struct {
	Node    *state.Node
	Service *agentServiceJSON
	Checks  []*state.HealthCheck
}

// serviceEntry shapes one instance for /v1/health/service and prepared
// query execution.
func (h *handler) serviceEntry(c *state.CheckServiceNode) serviceEntryJSON {
	n := c.Node
	if n.Datacenter == "" {
		nn := *n
		nn.Datacenter = h.b.Datacenter()
		n = &nn
	}
	checks := make([]*state.HealthCheck, 0, len(c.Checks))
	for _, ck := range c.Checks {
		checks = append(checks, withTags(ck))
	}
	return serviceEntryJSON{Node: n, Service: agentService(c.Service, true, ""), Checks: checks}
}

// boolParam reads a flag such as ?passing: absent is false, present with
// no value is true, otherwise the value must parse as a bool.
func boolParam(r *http.Request, name string) (bool, error) {
	v, ok := r.URL.Query()[name]
	if !ok {
		return false, nil
	}
	if len(v) == 0 || v[0] == "" {
		return true, nil
	}
	b, err := strconv.ParseBool(v[0])
	if err != nil {
		return false, invalidf("Invalid value %q for ?%s: use true or false", v[0], name)
	}
	return b, nil
}

// healthService answers the instances of a service with their checks.
// ?passing keeps only instances whose every check passes; ?tag= keeps
// those carrying every tag given.
func (h *handler) healthService(w http.ResponseWriter, r *http.Request, name string) error {
	ro, err := h.parseServiceRead(r, name)
	if err != nil {
		return err
	}
	passing, err := boolParam(r, "passing")
	if err != nil {
		return err
	}
	csn, err := readList(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, []*state.CheckServiceNode) {
		return s.CheckServiceNodes(ws, name)
	})
	if err != nil {
		return err
	}
	tags := r.URL.Query()["tag"]
	out := []serviceEntryJSON{}
	for _, c := range csn {
		if passing && !c.Healthy(true) {
			continue
		}
		if !hasTags(c.Service.Tags, tags) {
			continue
		}
		out = append(out, h.serviceEntry(c))
	}
	return writeJSON(w, r, out)
}

// healthChecks answers the checks of every instance of a service.
func (h *handler) healthChecks(w http.ResponseWriter, r *http.Request, name string) error {
	ro, err := h.parseServiceRead(r, name)
	if err != nil {
		return err
	}
	checks, err := readList(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, []*state.HealthCheck) {
		return s.ServiceChecks(ws, name)
	})
	if err != nil {
		return err
	}
	return writeJSON(w, r, checksJSON(checks))
}

// healthState answers the checks in one state: any, passing, warning or
// critical.
func (h *handler) healthState(w http.ResponseWriter, r *http.Request, st string) error {
	ro, err := h.parseRead(r.URL.Query())
	if err != nil {
		return err
	}
	switch st {
	case state.HealthAny, state.HealthPassing, state.HealthWarning, state.HealthCritical:
	case "":
		return invalidf("Missing check state: use any, passing, warning or critical")
	default:
		return invalidf("Invalid check state %q: use any, passing, warning or critical", st)
	}
	if err := refuseFilter(r); err != nil {
		return err
	}
	checks, err := readList(h, w, r, ro, func(s *state.Store, ws watch.Set) (uint64, []*state.HealthCheck) {
		return s.ChecksInState(ws, st)
	})
	if err != nil {
		return err
	}
	return writeJSON(w, r, checksJSON(checks))
}

func checksJSON(cs []*state.HealthCheck) []*state.HealthCheck {
	out := make([]*state.HealthCheck, 0, len(cs))
	for _, c := range cs {
		out = append(out, withTags(c))
	}
	return out
}
