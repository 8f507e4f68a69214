package state

import (
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/holdfast/holdfast/internal/watch"
)

// This file holds the service-centred reads of the catalog (what
// /v1/catalog/service*, /v1/health/* and prepared-query execution need) and
// the definition types an agent runs its checks from.
//
// Every read returns the index to report with its result: the last index
// that changed any table the result was drawn from. Service names are
// matched case-insensitively, as Consul does. Returned slices and maps are
// new and belong to the caller; the objects they point to are the store's
// and must not be modified.

// ServiceNode is one instance of a service with the node it runs on.
type ServiceNode struct {
	Node    *Node
	Service *Service
}

// CheckServiceNode is one instance of a service with its node and every
// check that bears on its health: the node's own checks (those without a
// ServiceID, such as serfHealth) first, then the service's, each group in
// CheckID order.
type CheckServiceNode struct {
	Node    *Node
	Service *Service
	Checks  []*HealthCheck
}

// Healthy reports whether no check is critical; with onlyPassing it
// reports whether every check is passing. An instance without checks is
// healthy.
func (c *CheckServiceNode) Healthy(onlyPassing bool) bool {
	for _, ck := range c.Checks {
		switch {
		case ck.Status == HealthCritical:
			return false
		case onlyPassing && ck.Status != HealthPassing:
			return false
		}
	}
	return true
}

// HealthAny names every health state in ChecksInState.
const HealthAny = "any"

// CheckDefinition says how an agent runs one check on its own node: what
// /v1/agent/check/register takes, and each check of a service definition.
// It is not replicated: the agent derives from it the HealthCheck it writes
// to the catalog (whose Definition keeps the durations as strings). It
// lives in this package, as a plain type, so that the HTTP layer and the
// agent share it without importing each other.
//
// Exactly one of TTL, HTTP and TCP says what kind of check it is.
type CheckDefinition struct {
	ID        string // default: Name
	Name      string
	Notes     string
	ServiceID string // the agent's service the check belongs to, if any
	// Status is the status the check starts with; "" means critical.
	Status string

	// TTL: the check goes critical unless updated within TTL.
	TTL time.Duration

	// HTTP: GET (or Method) the URL every Interval, within Timeout,
	// sending Header and Body; TLSSkipVerify accepts any certificate.
	HTTP          string
	Method        string
	Header        map[string][]string
	Body          string
	TLSSkipVerify bool

	// TCP: connect to host:port every Interval, within Timeout.
	TCP string

	Interval time.Duration
	Timeout  time.Duration
}

// Services lists every service name with the union of its instances'
// tags (each tag once, in order of first appearance; [] when none), and
// the services table index.
func (s *Store) Services(ws watch.Set) (uint64, map[string][]string) {
	tx := s.read(ws)
	it, err := tx.Get(tabServices, "id")
	must(err)
	ws.Add(it.WatchCh())
	out := map[string][]string{}
	seen := map[string]map[string]bool{}
	for r := it.Next(); r != nil; r = it.Next() {
		svc := r.(*Service)
		tags, ok := out[svc.Service]
		if !ok {
			tags = []string{}
			seen[svc.Service] = map[string]bool{}
		}
		for _, t := range svc.Tags {
			if !seen[svc.Service][t] {
				seen[svc.Service][t] = true
				tags = append(tags, t)
			}
		}
		out[svc.Service] = tags
	}
	return tableIndex(tx, tabServices), out
}

// ServiceNodes lists the instances of a service, ordered by node and then
// service ID, each with its node. The index covers nodes and services.
func (s *Store) ServiceNodes(ws watch.Set, service string) (uint64, []*ServiceNode) {
	tx := s.read(ws)
	out := []*ServiceNode{}
	for _, svc := range serviceInstances(tx, ws, service) {
		if n := nodeWatch(tx, ws, svc.Node); n != nil {
			out = append(out, &ServiceNode{Node: n, Service: svc})
		}
	}
	return tableIndex(tx, tabNodes, tabServices), out
}

// CheckServiceNodes lists the instances of a service, ordered by node and
// then service ID, each with its node and checks (see CheckServiceNode).
// The index covers nodes, services and checks.
func (s *Store) CheckServiceNodes(ws watch.Set, service string) (uint64, []*CheckServiceNode) {
	tx := s.read(ws)
	out := []*CheckServiceNode{}
	nodeChecks := map[string][]*HealthCheck{}
	for _, svc := range serviceInstances(tx, ws, service) {
		n := nodeWatch(tx, ws, svc.Node)
		if n == nil {
			continue
		}
		nc, ok := nodeChecks[svc.Node]
		if !ok {
			it, err := tx.Get(tabChecks, "node", svc.Node)
			must(err)
			ws.Add(it.WatchCh())
			for r := it.Next(); r != nil; r = it.Next() {
				if c := r.(*HealthCheck); c.ServiceID == "" {
					nc = append(nc, c)
				}
			}
			nodeChecks[svc.Node] = nc
		}
		checks := append([]*HealthCheck{}, nc...)
		it, err := tx.Get(tabChecks, "node_service", svc.Node, svc.ID)
		must(err)
		ws.Add(it.WatchCh())
		for r := it.Next(); r != nil; r = it.Next() {
			checks = append(checks, r.(*HealthCheck))
		}
		out = append(out, &CheckServiceNode{Node: n, Service: svc, Checks: checks})
	}
	return tableIndex(tx, tabNodes, tabServices, tabChecks), out
}

// ServiceChecks lists the checks of every instance of a service, ordered
// by node and then CheckID, with the checks table index.
func (s *Store) ServiceChecks(ws watch.Set, service string) (uint64, []*HealthCheck) {
	tx := s.read(ws)
	it, err := tx.Get(tabChecks, "service", service)
	must(err)
	ws.Add(it.WatchCh())
	out := []*HealthCheck{}
	for r := it.Next(); r != nil; r = it.Next() {
		out = append(out, r.(*HealthCheck))
	}
	return tableIndex(tx, tabChecks), out
}

// ChecksInState lists the checks whose status is status, or every check for
// HealthAny, ordered by node and then CheckID, with the checks table index.
// A status that is none of these matches nothing; callers validate it.
func (s *Store) ChecksInState(ws watch.Set, status string) (uint64, []*HealthCheck) {
	tx := s.read(ws)
	var it memdb.ResultIterator
	var err error
	if status == HealthAny {
		it, err = tx.Get(tabChecks, "id")
	} else {
		it, err = tx.Get(tabChecks, "status", status)
	}
	must(err)
	ws.Add(it.WatchCh())
	out := []*HealthCheck{}
	for r := it.Next(); r != nil; r = it.Next() {
		out = append(out, r.(*HealthCheck))
	}
	return tableIndex(tx, tabChecks), out
}

// serviceInstances returns the instances of a service ordered by (node,
// ID), registering the lookup in ws.
func serviceInstances(tx *memdb.Txn, ws watch.Set, service string) []*Service {
	it, err := tx.Get(tabServices, "service", service)
	must(err)
	ws.Add(it.WatchCh())
	var out []*Service
	for r := it.Next(); r != nil; r = it.Next() {
		out = append(out, r.(*Service))
	}
	return out
}

// nodeWatch returns a node (nil if absent), registering the lookup in ws.
func nodeWatch(tx *memdb.Txn, ws watch.Set, name string) *Node {
	ch, raw, err := tx.FirstWatch(tabNodes, "id", name)
	must(err)
	ws.Add(ch)
	if raw == nil {
		return nil
	}
	return raw.(*Node)
}
