package state

import (
	"fmt"

	"github.com/hashicorp/go-memdb"
)

// Table names; also the keys of the per-table index in tableIndex.
const (
	tabIndex      = "index"
	tabKVs        = "kvs"
	tabTombstones = "tombstones"
	tabDelays     = "lock_delays"
	tabSessions   = "sessions"
	tabNodes      = "nodes"
	tabServices   = "services"
	tabChecks     = "checks"
	tabQueries    = "prepared_queries"
)

// indexEntry records the last raft index that changed a table.
type indexEntry struct {
	Key   string
	Value uint64
}

// tombstone remembers a deleted key (or deleted prefix) so that a prefix
// listing's index still moves forward when its last key goes away.
type tombstone struct {
	Key   string
	Index uint64
}

// lockDelay is the replicated lock-delay of one key: no acquire of Key
// succeeds before Until.
type lockDelay struct {
	Key   string
	Until int64 // unix nanoseconds, from the leader-stamped command time
}

// sessionCheckIndex indexes a session under each check it is bound to
// ("node\x00checkID\x00"), so a check that goes critical finds its sessions
// without a table of bindings: one index entry per binding instead of three.
type sessionCheckIndex struct{}

func checkKey(node, check string) []byte {
	b := make([]byte, 0, len(node)+len(check)+2)
	b = append(b, node...)
	b = append(b, 0)
	b = append(b, check...)
	return append(b, 0)
}

// FromObject implements memdb.MultiIndexer.
func (sessionCheckIndex) FromObject(raw interface{}) (bool, [][]byte, error) {
	s, ok := raw.(*Session)
	if !ok {
		return false, nil, fmt.Errorf("state: check index on %T", raw)
	}
	ids := s.CheckIDs()
	if len(ids) == 0 {
		return false, nil, nil
	}
	vals := make([][]byte, 0, len(ids))
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if !seen[id] { // a check named twice is one binding
			seen[id] = true
			vals = append(vals, checkKey(s.Node, id))
		}
	}
	return true, vals, nil
}

// FromArgs implements memdb.Indexer: (node, checkID).
func (sessionCheckIndex) FromArgs(args ...interface{}) ([]byte, error) {
	if len(args) != 2 {
		return nil, fmt.Errorf("state: check index wants node and check ID, got %d args", len(args))
	}
	node, ok1 := args[0].(string)
	check, ok2 := args[1].(string)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("state: check index wants strings")
	}
	return checkKey(node, check), nil
}

func str(field string) memdb.Indexer { return &memdb.StringFieldIndex{Field: field} }

// strField indexes a string field of *T exactly as memdb.StringFieldIndex
// (without Lowercase) does: the value plus a null terminator, an empty value
// not indexed, prefix queries without the terminator. It reads the field
// through get instead of reflection, which StringFieldIndex pays on every
// insert and delete; use it for the tables every write touches.
type strField[T any] struct {
	get func(*T) string
}

// FromObject implements memdb.SingleIndexer.
func (s strField[T]) FromObject(obj interface{}) (bool, []byte, error) {
	o, ok := obj.(*T)
	if !ok {
		return false, nil, fmt.Errorf("state: string index on %T", obj)
	}
	v := s.get(o)
	if v == "" {
		return false, nil, nil
	}
	b := make([]byte, len(v)+1)
	copy(b, v)
	return true, b, nil
}

// FromArgs implements memdb.Indexer: one string.
func (s strField[T]) FromArgs(args ...interface{}) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("must provide only a single argument")
	}
	arg, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("argument must be a string: %#v", args[0])
	}
	b := make([]byte, len(arg)+1)
	copy(b, arg)
	return b, nil
}

// PrefixFromArgs implements memdb.PrefixIndexer: FromArgs without the
// terminator.
func (s strField[T]) PrefixFromArgs(args ...interface{}) ([]byte, error) {
	b, err := s.FromArgs(args...)
	if err != nil {
		return nil, err
	}
	return b[:len(b)-1], nil
}

func compound(fields ...string) memdb.Indexer {
	ix := make([]memdb.Indexer, len(fields))
	for i, f := range fields {
		ix[i] = str(f)
	}
	return &memdb.CompoundIndex{Indexes: ix}
}

func idIndex(ix memdb.Indexer) *memdb.IndexSchema {
	return &memdb.IndexSchema{Name: "id", Unique: true, Indexer: ix}
}

func optIndex(name string, ix memdb.Indexer) *memdb.IndexSchema {
	return &memdb.IndexSchema{Name: name, AllowMissing: true, Indexer: ix}
}

func schema() *memdb.DBSchema {
	t := func(name string, ixs ...*memdb.IndexSchema) *memdb.TableSchema {
		m := make(map[string]*memdb.IndexSchema, len(ixs))
		for _, ix := range ixs {
			m[ix.Name] = ix
		}
		return &memdb.TableSchema{Name: name, Indexes: m}
	}
	tables := []*memdb.TableSchema{
		t(tabIndex, idIndex(strField[indexEntry]{func(e *indexEntry) string { return e.Key }})),
		t(tabKVs, idIndex(strField[DirEntry]{func(e *DirEntry) string { return e.Key }}),
			optIndex("session", strField[DirEntry]{func(e *DirEntry) string { return e.Session }})),
		t(tabTombstones, idIndex(str("Key"))),
		t(tabDelays, idIndex(str("Key"))),
		t(tabSessions, idIndex(strField[Session]{func(s *Session) string { return s.ID }}),
			optIndex("node", strField[Session]{func(s *Session) string { return s.Node }}),
			optIndex("check", sessionCheckIndex{})),
		t(tabNodes, idIndex(str("Node"))),
		t(tabServices, idIndex(compound("Node", "ID")),
			optIndex("node", str("Node")),
			optIndex("service", &memdb.StringFieldIndex{Field: "Service", Lowercase: true})),
		t(tabChecks, idIndex(compound("Node", "CheckID")),
			optIndex("node", str("Node")),
			optIndex("node_service", compound("Node", "ServiceID")),
			optIndex("status", str("Status")),
			optIndex("service", &memdb.StringFieldIndex{Field: "ServiceName", Lowercase: true})),
		t(tabQueries, idIndex(str("ID")),
			optIndex("name", &memdb.StringFieldIndex{Field: "Name", Lowercase: true}),
			optIndex("session", str("Session"))),
	}
	s := &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{}}
	for _, tb := range tables {
		s.Tables[tb.Name] = tb
	}
	return s
}
