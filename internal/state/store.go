package state

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/holdfast/holdfast/internal/watch"
)

// Sentinel errors. Callers match them with errors.Is; messages are Consul's
// where a client may look for them.
var (
	ErrMissingSession  = errors.New("missing session")
	ErrInvalidSession  = errors.New("invalid session")
	ErrMissingNode     = errors.New("Missing node registration")
	ErrMissingCheck    = errors.New("Missing check registration")
	ErrCriticalCheck   = errors.New("check is in critical state")
	ErrMissingKey      = errors.New("Missing key name")
	ErrInvalidRequest  = errors.New("invalid request")
	ErrQueryNotFound   = errors.New("query not found")
	ErrSessionNotFound = errors.New("session not found")
)

// kindError is an error whose text is exactly what a client must see (a
// Consul message, which the sentinel alone cannot carry) while errors.Is
// still matches its sentinel kind.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Store is holdfast's replicated state: KV, sessions, catalog, prepared
// queries, lock-delays and the per-table index.
//
// Writes come only from the raft apply path (one goroutine); every write
// method takes the raft index and the leader-stamped time of the command and
// never reads a clock, so every replica computes the same state. Reads may
// run concurrently with writes and with each other: each read sees a
// consistent snapshot (go-memdb's immutable radix trees).
type Store struct {
	db      *memdb.MemDB
	abandon chan struct{}
	kw      *kvWatch
}

// New returns an empty store.
func New() *Store {
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		panic(fmt.Sprintf("state: bad schema: %v", err)) // a programming error
	}
	return &Store{db: db, abandon: make(chan struct{}), kw: new(kvWatch)}
}

// AbandonCh is closed when this store is replaced by a snapshot restore;
// blocking readers add it to their watch set and re-read from the new store.
func (s *Store) AbandonCh() <-chan struct{} { return s.abandon }

// Abandon closes AbandonCh. Called once, by the FSM, after a restore.
func (s *Store) Abandon() { close(s.abandon) }

// wtx is a write transaction stamped with the raft index and leader time.
type wtx struct {
	*memdb.Txn
	idx uint64
	now time.Time
	// bumps are the tables changed so far and the last index that changed
	// each, written to the index table once, at Commit: a batch of
	// hundreds of session writes updates the sessions entry once, not per
	// write. (Table indexes are only read by read transactions; the kvs
	// table keeps its own, see bump.)
	bumps []indexEntry
	// kv is the working kvTable (nil until the transaction touches KV),
	// kvOwn the mark of the nodes it made (cowTree.withOwned), kvDirty
	// whether a write changed it, and kvFire the keys written, whose
	// watchers kw wakes after Commit.
	kv      *kvTable
	kvOwn   uint64
	kvDirty bool
	kvFire  []string
	kw      *kvWatch
}

func (s *Store) write(idx uint64, now time.Time) *wtx {
	return &wtx{Txn: s.db.Txn(true), idx: idx, now: now, kw: s.kw}
}

// bump records that table changed at the transaction's index.
func (tx *wtx) bump(table string) {
	if table == tabKVs {
		// The kvs table keeps its index in its one object (kvTable.Index),
		// which a KV write replaces anyway.
		tx.kvt().Index = tx.idx
		tx.kvDirty = true
		return
	}
	for i := range tx.bumps {
		if tx.bumps[i].Key == table {
			tx.bumps[i].Value = tx.idx
			return
		}
	}
	tx.bumps = append(tx.bumps, indexEntry{Key: table, Value: tx.idx})
}

// Commit writes the table indexes the transaction moved and commits it.
func (tx *wtx) Commit() {
	for i := range tx.bumps {
		e := tx.bumps[i]
		must(tx.Insert(tabIndex, &e))
	}
	tx.bumps = nil
	tx.kvCommit()
	tx.Txn.Commit()
	tx.kvNotify()
}

// must panics on a memdb error: with a fixed schema they only come from
// programming errors, and a replica must not diverge silently.
func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("state: %v", err))
	}
}

func tableIndex(tx *memdb.Txn, tables ...string) uint64 {
	var max uint64
	for _, t := range tables {
		if t == tabKVs {
			max = maxU(max, kvTableOf(tx).Index)
			continue
		}
		raw, err := tx.First(tabIndex, "id", t)
		must(err)
		if raw != nil {
			if v := raw.(*indexEntry).Value; v > max {
				max = v
			}
		}
	}
	return max
}

// read opens a read transaction and adds the abandon channel to ws.
func (s *Store) read(ws watch.Set) *memdb.Txn {
	ws.Add(s.abandon)
	return s.db.Txn(false)
}

// TableIndex returns the last index that changed any of the named tables
// ("kvs", "sessions", "nodes", "services", "checks", "prepared_queries").
func (s *Store) TableIndex(tables ...string) uint64 {
	return tableIndex(s.db.Txn(false), tables...)
}
