package state

import (
	"fmt"
	"time"

	"github.com/holdfast/holdfast/internal/watch"
)

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
	sess := *in
	if sess.Behavior == "" {
		sess.Behavior = BehaviorRelease
	}
	sess.CreateIndex, sess.ModifyIndex = tx.idx, tx.idx
	for _, id := range sess.CheckIDs() {
		raw, err := tx.First(tabChecks, "id", sess.Node, id)
		must(err)
		if raw == nil {
			return &kindError{kind: ErrMissingCheck, msg: fmt.Sprintf("Missing check '%s' registration", id)}
		}
		if raw.(*HealthCheck).Status == HealthCritical {
			return &kindError{kind: ErrCriticalCheck, msg: fmt.Sprintf("Check '%s' is in critical state", id)}
		}
	}
	must(tx.Insert(tabSessions, &sess))
	tx.bump(tabSessions)
	return nil
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
	raw, err := tx.First(tabSessions, "id", id)
	must(err)
	if raw == nil {
		return
	}
	sess := raw.(*Session)
	must(tx.Delete(tabSessions, sess))
	tx.bump(tabSessions)

	it, err := tx.Get(tabKVs, "session", id)
	must(err)
	var held []*DirEntry
	for r := it.Next(); r != nil; r = it.Next() {
		held = append(held, r.(*DirEntry))
	}
	for _, e := range held {
		switch sess.Behavior {
		case BehaviorDelete:
			tx.kvDelete(e.Key)
		default:
			ent := *e
			ent.Session = ""
			ent.ModifyIndex = tx.idx
			must(tx.Insert(tabKVs, &ent))
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
	it, err := tx.Get(tabSessions, "check", node, checkID)
	must(err)
	var ids []string
	for r := it.Next(); r != nil; r = it.Next() {
		ids = append(ids, r.(*Session).ID)
	}
	for _, id := range ids {
		tx.invalidate(id)
	}
}

// ---- reads ----

// SessionGet returns the session (nil if absent) and the sessions table
// index.
func (s *Store) SessionGet(ws watch.Set, id string) (uint64, *Session) {
	tx := s.read(ws)
	ch, raw, err := tx.FirstWatch(tabSessions, "id", id)
	must(err)
	ws.Add(ch)
	idx := tableIndex(tx, tabSessions)
	if raw == nil {
		return idx, nil
	}
	return idx, raw.(*Session)
}

// SessionList returns every session ordered by ID.
func (s *Store) SessionList(ws watch.Set) (uint64, []*Session) {
	tx := s.read(ws)
	it, err := tx.Get(tabSessions, "id")
	must(err)
	ws.Add(it.WatchCh())
	out := []*Session{}
	for r := it.Next(); r != nil; r = it.Next() {
		out = append(out, r.(*Session))
	}
	return tableIndex(tx, tabSessions), out
}

// NodeSessions returns the sessions of one node.
func (s *Store) NodeSessions(ws watch.Set, node string) (uint64, []*Session) {
	tx := s.read(ws)
	it, err := tx.Get(tabSessions, "node", node)
	must(err)
	ws.Add(it.WatchCh())
	out := []*Session{}
	for r := it.Next(); r != nil; r = it.Next() {
		out = append(out, r.(*Session))
	}
	return tableIndex(tx, tabSessions), out
}
