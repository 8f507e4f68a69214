package state

import "github.com/hashicorp/go-memdb"

// Usage counts what the state holds, for the server's gauges
// (holdfast.state.* in /v1/agent/metrics).
type Usage struct {
	// KVEntries is the number of keys; KVLocked how many of them a session
	// holds.
	KVEntries, KVLocked int
	// Sessions is the number of live sessions.
	Sessions int
	// Nodes, Services and Checks are the catalog's registrations.
	Nodes, Services, Checks int
	// PreparedQueries is the number of prepared queries.
	PreparedQueries int
}

// Usage reads the counts from one read transaction. Keys, locks and
// sessions are counted in constant time; the catalog's tables and the
// prepared queries are walked, so the cost grows with their size (a few
// microseconds per thousand rows). Safe for concurrent use.
func (s *Store) Usage() Usage {
	tx := s.db.Txn(false)
	kv := kvTableOf(tx)
	_, sessions := sessionsOf(tx)
	return Usage{
		KVEntries:       kv.Entries.Len(),
		KVLocked:        kv.Held.Len(),
		Sessions:        sessions.Len(),
		Nodes:           countRows(tx, tabNodes),
		Services:        countRows(tx, tabServices),
		Checks:          countRows(tx, tabChecks),
		PreparedQueries: countRows(tx, tabQueries),
	}
}

func countRows(tx *memdb.Txn, table string) int {
	it, err := tx.Get(table, "id")
	must(err)
	n := 0
	for raw := it.Next(); raw != nil; raw = it.Next() {
		n++
	}
	return n
}
