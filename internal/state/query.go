package state

import (
	"fmt"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/watch"
)

// QuerySet creates or updates a prepared query. A query bound to a session
// is refused unless the session exists; a Name must be unique. A q with a
// CreateIndex is an update of the query created at that index, refused
// with ErrQueryNotFound if that query is gone; with none (as every entry
// written before this rule has), q is created or replaced.
func (s *Store) QuerySet(idx uint64, q *PreparedQuery) error {
	return s.single(idx, time.Time{}, func(tx *wtx) error { return tx.querySet(q) })
}

func (tx *wtx) querySet(q *PreparedQuery) error {
	if q.ID == "" {
		return fmt.Errorf("%w: query has no ID", ErrInvalidRequest)
	}
	if q.Service.Service == "" {
		return fmt.Errorf("%w: Must provide a Service name to query", ErrInvalidRequest)
	}
	if q.Session != "" && !tx.sessionExists(q.Session) {
		return fmt.Errorf("%w %q", ErrInvalidSession, q.Session)
	}
	if q.Name != "" {
		raw, err := tx.First(tabQueries, "name", strings.ToLower(q.Name))
		must(err)
		if raw != nil && raw.(*PreparedQuery).ID != q.ID {
			return fmt.Errorf("%w: Name %q is in use by another query", ErrInvalidRequest, q.Name)
		}
	}
	nq := *q
	nq.CreateIndex, nq.ModifyIndex = tx.idx, tx.idx
	raw, err := tx.First(tabQueries, "id", q.ID)
	must(err)
	if q.CreateIndex != 0 && (raw == nil || raw.(*PreparedQuery).CreateIndex != q.CreateIndex) {
		// An update (it names the query it read) of a query that is gone:
		// deleted, or taken by its session's invalidation, since the
		// leader looked. Recreating it would bring back what the
		// invalidation removed.
		return fmt.Errorf("%w: Cannot modify non-existent prepared query: '%s'", ErrQueryNotFound, q.ID)
	}
	if raw != nil {
		nq.CreateIndex = raw.(*PreparedQuery).CreateIndex
	}
	must(tx.Insert(tabQueries, &nq))
	tx.bump(tabQueries)
	return nil
}

// QueryDelete deletes a prepared query; ErrQueryNotFound if there is none.
func (s *Store) QueryDelete(idx uint64, id string) error {
	return s.single(idx, time.Time{}, func(tx *wtx) error { return tx.queryDelete(id) })
}

func (tx *wtx) queryDelete(id string) error {
	raw, err := tx.First(tabQueries, "id", id)
	must(err)
	if raw == nil {
		return ErrQueryNotFound
	}
	must(tx.Delete(tabQueries, raw))
	tx.bump(tabQueries)
	return nil
}

// QueryGet returns a query by ID, or nil.
func (s *Store) QueryGet(ws watch.Set, id string) (uint64, *PreparedQuery) {
	tx := s.read(ws)
	ch, raw, err := tx.FirstWatch(tabQueries, "id", id)
	must(err)
	ws.Add(ch)
	idx := tableIndex(tx, tabQueries)
	if raw == nil {
		return idx, nil
	}
	return idx, raw.(*PreparedQuery)
}

// QueryByName returns a query by its (case-insensitive) name, or nil.
func (s *Store) QueryByName(ws watch.Set, name string) (uint64, *PreparedQuery) {
	tx := s.read(ws)
	ch, raw, err := tx.FirstWatch(tabQueries, "name", strings.ToLower(name))
	must(err)
	ws.Add(ch)
	idx := tableIndex(tx, tabQueries)
	if raw == nil {
		return idx, nil
	}
	return idx, raw.(*PreparedQuery)
}

// QueryList lists every prepared query ordered by ID.
func (s *Store) QueryList(ws watch.Set) (uint64, []*PreparedQuery) {
	tx := s.read(ws)
	it, err := tx.Get(tabQueries, "id")
	must(err)
	ws.Add(it.WatchCh())
	out := []*PreparedQuery{}
	for r := it.Next(); r != nil; r = it.Next() {
		out = append(out, r.(*PreparedQuery))
	}
	return tableIndex(tx, tabQueries), out
}
