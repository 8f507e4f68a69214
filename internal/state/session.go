package state

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unique"

	"github.com/hashicorp/go-memdb"

	"github.com/holdfast/holdfast/internal/watch"
)

// storedSession is a session as the store keeps it: the Session readers
// get a pointer to (never modified once stored), and the channel that
// tells a watcher of this one session that it is gone. A stored session
// takes one 160-byte allocation, the size of a Session alone.
type storedSession struct {
	Session
	// gone is made by the first watcher and closed after the commit that
	// invalidates the session; closedChan once that has happened.
	gone atomic.Pointer[chan struct{}]
}

var closedChan = func() *chan struct{} {
	c := make(chan struct{})
	close(c)
	return &c
}()

// watchCh returns the channel closed once the session is invalidated (at
// once if it already is).
func (s *storedSession) watchCh() <-chan struct{} {
	for {
		if p := s.gone.Load(); p != nil {
			return *p
		}
		c := make(chan struct{})
		if s.gone.CompareAndSwap(nil, &c) {
			return c
		}
	}
}

// invalidated closes the watch channel; it runs after the commit that
// removed the session, so a watcher that read the session before sees its
// channel close, and one that comes later either reads a store without it
// or gets closedChan.
func (s *storedSession) invalidated() {
	if p := s.gone.Swap(closedChan); p != nil && p != closedChan {
		close(*p)
	}
}

// sessionsOf returns tx's sessions and the channel that fires when any
// session comes or goes.
func sessionsOf(tx *memdb.Txn) (<-chan struct{}, sessionSet) {
	ch, raw, err := tx.FirstWatch(tabSessions, "id")
	must(err)
	if raw == nil {
		return ch, sessionSet{}
	}
	return ch, raw.(*sessionTable).Sessions
}

func setSessions(tx *memdb.Txn, set sessionSet) {
	must(tx.Insert(tabSessions, &sessionTable{Sessions: set}))
}

// session returns the stored session id, or nil.
func (tx *wtx) session(id string) *storedSession {
	_, set := sessionsOf(tx.Txn)
	return set.get(id)
}

// SessionCreate stores a new session whose ID, TTL, behaviour and lock-delay
// the proposer has already validated. The node must be registered and every
// bound check must exist on it and not be critical; otherwise nothing is
// written and ErrMissingNode, ErrMissingCheck or ErrCriticalCheck comes back.
func (s *Store) SessionCreate(idx uint64, sess *Session) error {
	return s.single(idx, time.Time{}, func(tx *wtx) error { return tx.sessionCreate(sess) })
}

func (tx *wtx) sessionCreate(in *Session) error {
	if in.ID == "" {
		return fmt.Errorf("%w: session has no ID", ErrInvalidRequest)
	}
	if tx.sessionExists(in.ID) {
		return fmt.Errorf("%w: session %q already exists", ErrInvalidRequest, in.ID)
	}
	node, err := tx.First(tabNodes, "id", in.Node)
	must(err)
	if node == nil {
		return ErrMissingNode
	}
	row := &storedSession{Session: *in}
	sess := &row.Session
	if sess.Behavior == "" {
		sess.Behavior = BehaviorRelease
	}
	sess.CreateIndex, sess.ModifyIndex = tx.idx, tx.idx
	var nodeChecks []string // the node checks, sharing the catalog's strings
	if len(sess.NodeChecks) > 0 {
		nodeChecks = make([]string, len(sess.NodeChecks))
	}
	for i, id := range sess.CheckIDs() {
		raw, err := tx.First(tabChecks, "id", sess.Node, id)
		must(err)
		if raw == nil {
			return &kindError{kind: ErrMissingCheck, msg: fmt.Sprintf("Missing check '%s' registration", id)}
		}
		hc := raw.(*HealthCheck)
		if hc.Status == HealthCritical {
			return &kindError{kind: ErrCriticalCheck, msg: fmt.Sprintf("Check '%s' is in critical state", id)}
		}
		if i < len(nodeChecks) {
			nodeChecks[i] = hc.CheckID
		}
	}
	if nodeChecks != nil {
		sess.NodeChecks = nodeChecks
	}
	sess.Node = node.(*Node).Node
	internSession(sess)
	insertSession(tx.Txn, row)
	tx.bump(tabSessions)
	return nil
}

// insertSession adds row to the sessions table and to its bindings.
func insertSession(tx *memdb.Txn, row *storedSession) {
	bindSession(tx, row)
	_, set := sessionsOf(tx)
	setSessions(tx, set.with(row))
}

// restoreSession inserts a session read from a snapshot: as it was, but
// sharing strings with the catalog as sessionCreate does, and bound.
func restoreSession(tx *memdb.Txn, sess *Session) error {
	if sess.ID == "" {
		return fmt.Errorf("session has no ID")
	}
	row := &storedSession{Session: *sess}
	sess = &row.Session
	raw, err := tx.First(tabNodes, "id", sess.Node)
	must(err)
	if raw != nil {
		sess.Node = raw.(*Node).Node
	}
	for i, id := range sess.NodeChecks {
		raw, err := tx.First(tabChecks, "id", sess.Node, id)
		must(err)
		if raw != nil {
			sess.NodeChecks[i] = raw.(*HealthCheck).CheckID
		}
	}
	internSession(sess)
	if _, set := sessionsOf(tx); set.get(sess.ID) != nil { // a repeated record replaces
		unbindSession(tx, set.get(sess.ID))
	}
	insertSession(tx, row)
	return nil
}

// internSession makes sess share the strings every session repeats instead
// of holding its own copies (decoded from the raft log, they are fresh for
// each one): the behaviour's constant and one canonical copy of each TTL.
// The caller has already pointed Node (and the check IDs) at the catalog's.
func internSession(sess *Session) {
	switch sess.Behavior {
	case BehaviorRelease:
		sess.Behavior = BehaviorRelease
	case BehaviorDelete:
		sess.Behavior = BehaviorDelete
	}
	if sess.TTL != "" {
		sess.TTL = unique.Make(sess.TTL).Value()
	}
}

// sessionChecks returns the distinct checks sess is bound to, in order, or
// [noCheck] if none: the bindings it belongs to.
func sessionChecks(sess *Session) []string {
	ids := sess.CheckIDs()
	out := ids[:0]
	for _, id := range ids {
		if !slices.Contains(out, id) { // a check named twice is one binding
			out = append(out, id)
		}
	}
	if len(out) == 0 {
		return []string{noCheck}
	}
	return out
}

// bindSession adds sess to the binding of each of its checks. A session
// bound to one node check alone (the usual [serfHealth]) gets that
// binding's NodeChecks slice instead of keeping its own.
func bindSession(tx *memdb.Txn, row *storedSession) {
	sess := &row.Session
	for _, c := range sessionChecks(sess) {
		var b sessionBinding
		raw, err := tx.First(tabBindings, "id", sess.Node, c)
		must(err)
		if raw != nil {
			b = *raw.(*sessionBinding)
		} else {
			b = sessionBinding{Node: sess.Node, Check: c}
			if c != noCheck {
				b.one = []string{c}
			}
		}
		if len(sess.NodeChecks) == 1 && len(sess.ServiceChecks) == 0 && b.one != nil {
			sess.NodeChecks = b.one
		}
		b.Sessions = b.Sessions.with(row)
		must(tx.Insert(tabBindings, &b))
	}
}

// unbindSession removes sess from the bindings of its checks, deleting a
// binding it leaves empty.
func unbindSession(tx *memdb.Txn, row *storedSession) {
	sess := &row.Session
	for _, c := range sessionChecks(sess) {
		raw, err := tx.First(tabBindings, "id", sess.Node, c)
		must(err)
		var b sessionBinding
		ok := raw != nil
		if ok {
			b = *raw.(*sessionBinding)
			b.Sessions, ok = b.Sessions.without(sess.ID)
		}
		if !ok {
			panic(fmt.Sprintf("state: session %q missing from its binding %q/%q", sess.ID, sess.Node, c))
		}
		if b.Sessions.Len() == 0 {
			must(tx.Delete(tabBindings, raw))
		} else {
			must(tx.Insert(tabBindings, &b))
		}
	}
}

// nodeSessions returns the sessions of node ordered by ID, and a channel
// that fires when any of them comes or goes.
func nodeSessions(tx *memdb.Txn, node string) (<-chan struct{}, []*Session) {
	it, err := tx.Get(tabBindings, "id_prefix", node)
	must(err)
	out := []*Session{}
	n := 0
	for r := it.Next(); r != nil; r = it.Next() {
		r.(*sessionBinding).Sessions.each(func(s *storedSession) bool { out = append(out, &s.Session); return true })
		n++
	}
	if n > 1 { // a session with several checks is in several bindings
		slices.SortFunc(out, func(a, b *Session) int { return strings.Compare(a.ID, b.ID) })
		out = slices.CompactFunc(out, func(a, b *Session) bool { return a.ID == b.ID })
	}
	return it.WatchCh(), out
}

// sessionIDs lists the IDs of ss.
func sessionIDs(ss []*Session) []string {
	ids := make([]string, len(ss))
	for i, s := range ss {
		ids[i] = s.ID
	}
	return ids
}

// SessionDestroy invalidates session id: it is deleted with its check
// bindings; the keys it holds are released or deleted by its behaviour, each
// given the session's lock-delay from the stamped time now; and prepared
// queries bound to it are deleted. All of it happens at index idx, in one
// step. Destroying an unknown session writes nothing and is not an error.
func (s *Store) SessionDestroy(idx uint64, now time.Time, id string) error {
	return s.single(idx, now, func(tx *wtx) error { tx.invalidate(id); return nil })
}

func (tx *wtx) invalidate(id string) {
	_, set := sessionsOf(tx.Txn)
	row := set.get(id)
	if row == nil {
		return
	}
	set, _ = set.without(id)
	setSessions(tx.Txn, set)
	sess := &row.Session
	unbindSession(tx.Txn, row)
	tx.Defer(row.invalidated)
	tx.bump(tabSessions)

	var held []*DirEntry
	kv := tx.kvt()
	kv.Held.prefix(heldPrefix(id), func(h heldKey) bool {
		held = append(held, kv.Entries.get(string(h)[len(id)+1:]))
		return true
	})
	for _, e := range held {
		switch sess.Behavior {
		case BehaviorDelete:
			tx.kvDelete(e.Key)
		default:
			ent := *e
			ent.Session = ""
			ent.ModifyIndex = tx.idx
			tx.kvStore(&ent, e)
			tx.bump(tabKVs)
		}
		tx.setLockDelay(e.Key, sess.LockDelay)
	}

	qit, err := tx.Get(tabQueries, "session", id)
	must(err)
	var qs []interface{}
	for r := qit.Next(); r != nil; r = qit.Next() {
		qs = append(qs, r)
	}
	for _, q := range qs {
		must(tx.Delete(tabQueries, q))
	}
	if len(qs) > 0 {
		tx.bump(tabQueries)
	}
}

// invalidateCheck invalidates every session bound to check (node, checkID).
func (tx *wtx) invalidateCheck(node, checkID string) {
	if checkID == noCheck {
		return // no check has an empty ID; that binding is of unbound sessions
	}
	raw, err := tx.First(tabBindings, "id", node, checkID)
	must(err)
	if raw == nil {
		return
	}
	var ids []string
	raw.(*sessionBinding).Sessions.each(func(s *storedSession) bool { ids = append(ids, s.ID); return true })
	for _, id := range ids {
		tx.invalidate(id)
	}
}

// ---- reads ----

// SessionGet returns the session (nil if absent) and the sessions table
// index. The watch fires when that session is invalidated, or, if it is
// absent, when any session comes or goes.
func (s *Store) SessionGet(ws watch.Set, id string) (uint64, *Session) {
	tx := s.read(ws)
	ch, set := sessionsOf(tx)
	idx := tableIndex(tx, tabSessions)
	row := set.get(id)
	if row == nil {
		ws.Add(ch)
		return idx, nil
	}
	if ws != nil {
		ws.Add(row.watchCh())
	}
	return idx, &row.Session
}

// SessionList returns every session ordered by ID.
func (s *Store) SessionList(ws watch.Set) (uint64, []*Session) {
	tx := s.read(ws)
	ch, set := sessionsOf(tx)
	ws.Add(ch)
	out := make([]*Session, 0, set.Len())
	set.each(func(r *storedSession) bool { out = append(out, &r.Session); return true })
	return tableIndex(tx, tabSessions), out
}

// NodeSessions returns the sessions of one node.
func (s *Store) NodeSessions(ws watch.Set, node string) (uint64, []*Session) {
	tx := s.read(ws)
	ch, out := nodeSessions(tx, node)
	ws.Add(ch)
	return tableIndex(tx, tabSessions), out
}
