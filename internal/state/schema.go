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
	tabBindings   = "session_bindings" // derived from sessions; see sessionBinding
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

// sessionBinding holds the sessions bound to one check of one node, or,
// with Check "", the node's sessions bound to no check: what the "node"
// and multi-valued "check" indexes of a sessions table of rows would give,
// for a slot in a sessionSet per session instead of a radix leaf per index.
// A session is in the binding of each distinct check it names, so
// invalidating a check reaches exactly its sessions, and a node's bindings,
// adjacent in the table, hold its sessions.
//
// Bindings are derived from the sessions table: not in snapshots, rebuilt on
// restore. Each update replaces the object, so its watch channel (and the
// prefix of its node) fires exactly when a bound session comes or goes.
type sessionBinding struct {
	Node, Check string
	Sessions    sessionSet
	// one is []string{Check}, shared as the NodeChecks of every session
	// bound to Check alone (the default: [serfHealth]).
	one []string
}

// noCheck is the Check of the binding of sessions bound to no check. No
// check has an empty ID (registration refuses it).
const noCheck = ""

// checkKey is the key of the binding of check on node.
func checkKey(node, check string) []byte {
	b := make([]byte, 0, len(node)+len(check)+2)
	b = append(b, node...)
	b = append(b, 0)
	b = append(b, check...)
	return append(b, 0)
}

// bindingIndex keys a sessionBinding by "node\x00check\x00"; its prefix
// form takes the node alone and finds all of that node's bindings.
type bindingIndex struct{}

// FromObject implements memdb.SingleIndexer.
func (bindingIndex) FromObject(raw interface{}) (bool, []byte, error) {
	b, ok := raw.(*sessionBinding)
	if !ok {
		return false, nil, fmt.Errorf("state: binding index on %T", raw)
	}
	return true, checkKey(b.Node, b.Check), nil
}

// FromArgs implements memdb.Indexer: (node, checkID).
func (bindingIndex) FromArgs(args ...interface{}) ([]byte, error) {
	if len(args) != 2 {
		return nil, fmt.Errorf("state: binding index wants node and check ID, got %d args", len(args))
	}
	node, ok1 := args[0].(string)
	check, ok2 := args[1].(string)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("state: binding index wants strings")
	}
	return checkKey(node, check), nil
}

// PrefixFromArgs implements memdb.PrefixIndexer: (node).
func (bindingIndex) PrefixFromArgs(args ...interface{}) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("state: binding prefix wants a node, got %d args", len(args))
	}
	node, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("state: binding prefix wants a string")
	}
	return append([]byte(node), 0), nil
}

// sessionTable is the one object of the sessions table: every session,
// in ID order. A session is not a row of its own because a go-memdb row
// costs, per index, a radix leaf, a node and two watch channels (about 450
// bytes, nearly three times the session); in a sessionSet it costs about 9.
// Replacing this object in a write transaction keeps sessions as atomic,
// isolated and watchable as any table: the object's watch channel fires on
// every session change (what a list watches), and each session carries its
// own channel for a watcher of that one session (storedSession.watchCh).
type sessionTable struct {
	Sessions sessionSet
}

// oneObject keys the one object of a table that holds a single object of
// type T (sessionTable, kvTable): every object has key, and FromArgs
// takes no argument.
type oneObject[T any] struct{ key []byte }

// FromObject implements memdb.SingleIndexer.
func (ix oneObject[T]) FromObject(raw interface{}) (bool, []byte, error) {
	if _, ok := raw.(*T); !ok {
		return false, nil, fmt.Errorf("state: index of %T on %T", new(T), raw)
	}
	return true, ix.key, nil
}

// FromArgs implements memdb.Indexer.
func (ix oneObject[T]) FromArgs(args ...interface{}) ([]byte, error) {
	if len(args) != 0 {
		return nil, fmt.Errorf("state: the table of %T has one object and takes no key", new(T))
	}
	return ix.key, nil
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
		t(tabKVs, idIndex(oneObject[kvTable]{[]byte{'k'}})),
		t(tabDelays, idIndex(str("Key"))),
		t(tabSessions, idIndex(oneObject[sessionTable]{[]byte{'s'}})),
		t(tabBindings, idIndex(bindingIndex{})),
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
