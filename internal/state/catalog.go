package state

import (
	"fmt"
	"reflect"
	"time"

	"github.com/holdfast/holdfast/internal/watch"
)

// RegisterRequest registers or updates a node and, optionally, one service
// and checks on it, as /v1/catalog/register does.
type RegisterRequest struct {
	Node            string
	ID              string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	NodeMeta        map[string]string
	Service         *Service
	Check           *HealthCheck
	Checks          []*HealthCheck
	// SkipNodeUpdate leaves an existing node's fields alone (check updates).
	SkipNodeUpdate bool
}

// AllChecks lists the request's checks: Check, if set, then Checks.
func (r *RegisterRequest) AllChecks() []*HealthCheck {
	if r.Check == nil {
		return r.Checks
	}
	return append([]*HealthCheck{r.Check}, r.Checks...)
}

// DeregisterRequest removes a check, a service (with its checks) or a whole
// node, as /v1/catalog/deregister does.
type DeregisterRequest struct {
	Node      string
	ServiceID string
	CheckID   string
}

// Register applies a catalog registration in one step. A check registered
// without a status is critical (as in Consul), and a check that is or
// becomes critical invalidates every session bound to it.
func (s *Store) Register(idx uint64, now time.Time, req *RegisterRequest) error {
	tx := s.write(idx, now)
	defer tx.Abort()
	if err := tx.register(req); err != nil {
		return err
	}
	tx.Commit()
	return nil
}

func (tx *wtx) register(req *RegisterRequest) error {
	if req.Node == "" {
		return fmt.Errorf("%w: Must provide node", ErrInvalidRequest)
	}
	old, err := tx.First(tabNodes, "id", req.Node)
	must(err)
	if old == nil || !req.SkipNodeUpdate {
		n := &Node{ID: req.ID, Node: req.Node, Address: req.Address, Datacenter: req.Datacenter,
			TaggedAddresses: req.TaggedAddresses, Meta: req.NodeMeta}
		tx.ensureNode(n)
	}
	if req.Service != nil {
		svc := *req.Service
		svc.Node = req.Node
		if svc.ID == "" {
			svc.ID = svc.Service
		}
		if svc.Service == "" {
			return fmt.Errorf("%w: Must provide service name", ErrInvalidRequest)
		}
		tx.ensureService(&svc)
	}
	for _, c := range req.AllChecks() {
		if err := tx.ensureCheck(req.Node, c); err != nil {
			return err
		}
	}
	return nil
}

func (tx *wtx) ensureNode(n *Node) {
	raw, err := tx.First(tabNodes, "id", n.Node)
	must(err)
	nn := *n
	nn.CreateIndex, nn.ModifyIndex = tx.idx, tx.idx
	if raw != nil {
		old := raw.(*Node)
		nn.CreateIndex, nn.ModifyIndex = old.CreateIndex, old.ModifyIndex
		if reflect.DeepEqual(old, &nn) {
			return
		}
		nn.ModifyIndex = tx.idx
	}
	must(tx.Insert(tabNodes, &nn))
	tx.bump(tabNodes)
}

func (tx *wtx) ensureService(svc *Service) {
	raw, err := tx.First(tabServices, "id", svc.Node, svc.ID)
	must(err)
	sv := *svc
	sv.CreateIndex, sv.ModifyIndex = tx.idx, tx.idx
	if raw != nil {
		old := raw.(*Service)
		sv.CreateIndex, sv.ModifyIndex = old.CreateIndex, old.ModifyIndex
		if reflect.DeepEqual(old, &sv) {
			return
		}
		sv.ModifyIndex = tx.idx
	}
	must(tx.Insert(tabServices, &sv))
	tx.bump(tabServices)
}

func (tx *wtx) ensureCheck(node string, c *HealthCheck) error {
	if c.CheckID == "" {
		return fmt.Errorf("%w: Must provide a CheckID", ErrInvalidRequest)
	}
	ck := *c
	ck.Node = node
	if ck.Name == "" {
		ck.Name = ck.CheckID
	}
	if ck.Status == "" {
		ck.Status = HealthCritical
	}
	switch ck.Status {
	case HealthPassing, HealthWarning, HealthCritical:
	default:
		return fmt.Errorf("%w: Invalid check status %q: must be passing, warning or critical", ErrInvalidRequest, ck.Status)
	}
	if ck.ServiceID != "" {
		raw, err := tx.First(tabServices, "id", node, ck.ServiceID)
		must(err)
		if raw == nil {
			return fmt.Errorf("%w: Missing service registration %q for check %q", ErrInvalidRequest, ck.ServiceID, ck.CheckID)
		}
		svc := raw.(*Service)
		ck.ServiceName, ck.ServiceTags = svc.Service, svc.Tags
	}
	raw, err := tx.First(tabChecks, "id", node, ck.CheckID)
	must(err)
	ck.CreateIndex, ck.ModifyIndex = tx.idx, tx.idx
	if raw != nil {
		old := raw.(*HealthCheck)
		ck.CreateIndex, ck.ModifyIndex = old.CreateIndex, old.ModifyIndex
		if reflect.DeepEqual(old, &ck) {
			return nil
		}
		ck.ModifyIndex = tx.idx
	}
	must(tx.Insert(tabChecks, &ck))
	tx.bump(tabChecks)
	if ck.Status == HealthCritical {
		tx.invalidateCheck(node, ck.CheckID)
	}
	return nil
}

// Deregister removes what req names, invalidating the sessions that depend
// on it, in one step. Removing something absent writes nothing.
func (s *Store) Deregister(idx uint64, now time.Time, req *DeregisterRequest) error {
	return s.single(idx, now, func(tx *wtx) error { return tx.deregister(req) })
}

func (tx *wtx) deregister(req *DeregisterRequest) error {
	if req.Node == "" {
		return fmt.Errorf("%w: Must provide node", ErrInvalidRequest)
	}
	switch {
	case req.CheckID != "":
		tx.deleteCheck(req.Node, req.CheckID)
	case req.ServiceID != "":
		tx.deleteService(req.Node, req.ServiceID)
	default:
		tx.deleteNode(req.Node)
	}
	return nil
}

func (tx *wtx) deleteCheck(node, id string) {
	raw, err := tx.First(tabChecks, "id", node, id)
	must(err)
	if raw == nil {
		return
	}
	must(tx.Delete(tabChecks, raw))
	tx.bump(tabChecks)
	tx.invalidateCheck(node, id)
}

func (tx *wtx) deleteService(node, id string) {
	raw, err := tx.First(tabServices, "id", node, id)
	must(err)
	if raw == nil {
		return
	}
	it, err := tx.Get(tabChecks, "node_service", node, id)
	must(err)
	var ids []string
	for r := it.Next(); r != nil; r = it.Next() {
		ids = append(ids, r.(*HealthCheck).CheckID)
	}
	for _, c := range ids {
		tx.deleteCheck(node, c)
	}
	must(tx.Delete(tabServices, raw))
	tx.bump(tabServices)
}

func (tx *wtx) deleteNode(node string) {
	raw, err := tx.First(tabNodes, "id", node)
	must(err)
	if raw == nil {
		return
	}
	// Sessions first, so each is invalidated once as a whole.
	_, sess := nodeSessions(tx.Txn, node)
	for _, id := range sessionIDs(sess) {
		tx.invalidate(id)
	}
	sit, err := tx.Get(tabServices, "node", node)
	must(err)
	var svcs []string
	for r := sit.Next(); r != nil; r = sit.Next() {
		svcs = append(svcs, r.(*Service).ID)
	}
	for _, id := range svcs {
		tx.deleteService(node, id)
	}
	cit, err := tx.Get(tabChecks, "node", node)
	must(err)
	var cks []string
	for r := cit.Next(); r != nil; r = cit.Next() {
		cks = append(cks, r.(*HealthCheck).CheckID)
	}
	for _, id := range cks {
		tx.deleteCheck(node, id)
	}
	must(tx.Delete(tabNodes, raw))
	tx.bump(tabNodes)
}

// ---- reads ----

// Nodes lists every node ordered by name.
func (s *Store) Nodes(ws watch.Set) (uint64, []*Node) {
	tx := s.read(ws)
	it, err := tx.Get(tabNodes, "id")
	must(err)
	ws.Add(it.WatchCh())
	out := []*Node{}
	for r := it.Next(); r != nil; r = it.Next() {
		out = append(out, r.(*Node))
	}
	return tableIndex(tx, tabNodes), out
}

// NodeInfo returns a node (nil if absent) and its services.
func (s *Store) NodeInfo(ws watch.Set, name string) (uint64, *Node, []*Service) {
	tx := s.read(ws)
	ch, raw, err := tx.FirstWatch(tabNodes, "id", name)
	must(err)
	ws.Add(ch)
	idx := tableIndex(tx, tabNodes, tabServices)
	if raw == nil {
		return idx, nil, nil
	}
	it, err := tx.Get(tabServices, "node", name)
	must(err)
	ws.Add(it.WatchCh())
	svcs := []*Service{}
	for r := it.Next(); r != nil; r = it.Next() {
		svcs = append(svcs, r.(*Service))
	}
	return idx, raw.(*Node), svcs
}

// NodeChecks lists a node's checks ordered by CheckID.
func (s *Store) NodeChecks(ws watch.Set, node string) (uint64, []*HealthCheck) {
	tx := s.read(ws)
	it, err := tx.Get(tabChecks, "node", node)
	must(err)
	ws.Add(it.WatchCh())
	out := []*HealthCheck{}
	for r := it.Next(); r != nil; r = it.Next() {
		out = append(out, r.(*HealthCheck))
	}
	return tableIndex(tx, tabChecks), out
}

// Check returns one check, or nil.
func (s *Store) Check(node, id string) *HealthCheck {
	raw, err := s.db.Txn(false).First(tabChecks, "id", node, id)
	must(err)
	if raw == nil {
		return nil
	}
	return raw.(*HealthCheck)
}
