package state

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/go-memdb"
)

// snapshotVersion is written first in every snapshot; Restore refuses
// versions it does not know rather than guess.
const snapshotVersion = 1

// Snapshot is a point-in-time copy of the store, cheap to take (memdb's
// trees are immutable) and safe to persist while writes go on.
type Snapshot struct{ tx *memdb.Txn }

// Snapshot captures the current state.
func (s *Store) Snapshot() *Snapshot { return &Snapshot{tx: s.db.Snapshot().Txn(false)} }

type record struct {
	T string          // table
	V json.RawMessage // the object
}

// dumped lists the tables a snapshot carries, in restore order (nodes
// before the checks and sessions that refer to them).
var dumped = []string{tabIndex, tabNodes, tabServices, tabChecks, tabSessions,
	tabKVs, tabTombstones, tabDelays, tabQueries}

// tabOldSessionChecks is a table that snapshots written before session-check
// bindings were derived from the sessions themselves still carry: one
// record (Node, CheckID, Session) per binding. The sessions records of those
// snapshots hold the same checks, from which Restore rebuilds the bindings,
// so these records are skipped. Refusing them would leave a data directory
// whose newest snapshot is that old unable to start.
const tabOldSessionChecks = "session_checks"

// recLockFloor is the record that carries the kvs table's LockFloor (a
// number), written after the tombstones when it is not 0. A snapshot
// without it restores a floor of 0.
const recLockFloor = "kvs_lock_floor"

// Persist writes the snapshot as a stream of JSON records.
func (sn *Snapshot) Persist(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(map[string]int{"Version": snapshotVersion}); err != nil {
		return err
	}
	put := func(t string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		return enc.Encode(record{T: t, V: b})
	}
	for _, t := range dumped {
		var err error
		switch t {
		// The tables kept as one object write one record per row, as a
		// table of rows would (see sessionTable and kvTable).
		case tabSessions:
			_, set := sessionsOf(sn.tx)
			err = eachErr(set, func(r *storedSession) error { return put(t, &r.Session) })
		case tabKVs:
			err = eachErr(kvTableOf(sn.tx).Entries, func(e *DirEntry) error { return put(t, e) })
		case tabTombstones:
			kv := kvTableOf(sn.tx)
			err = eachErr(kv.Graves, func(g *tombstone) error { return put(t, g) })
			if err == nil && kv.LockFloor != 0 {
				err = put(recLockFloor, kv.LockFloor)
			}
		default:
			err = sn.putRows(t, put)
		}
		if err != nil {
			return err
		}
	}
	return bw.Flush()
}

// putRows writes the rows of go-memdb table t. The kvs table's index
// lives in its object; it is written as an index record, in key order, as
// when the index table held it.
func (sn *Snapshot) putRows(t string, put func(string, any) error) error {
	var kvIndex *indexEntry
	if idx := kvTableOf(sn.tx).Index; t == tabIndex && idx != 0 {
		kvIndex = &indexEntry{Key: tabKVs, Value: idx}
	}
	it, err := sn.tx.Get(t, "id")
	if err != nil {
		return err
	}
	for r := it.Next(); ; r = it.Next() {
		if kvIndex != nil && (r == nil || r.(*indexEntry).Key > tabKVs) {
			if err := put(t, kvIndex); err != nil {
				return err
			}
			kvIndex = nil
		}
		if r == nil {
			return nil
		}
		if err := put(t, r); err != nil {
			return err
		}
	}
}

// eachErr calls f on every item of tree in key order, stopping at the
// first error, which it returns.
func eachErr[T keyed](tree cowTree[T], f func(T) error) error {
	var err error
	tree.each(func(x T) bool {
		err = f(x)
		return err == nil
	})
	return err
}

func newObj(table string) (interface{}, error) {
	switch table {
	case tabIndex:
		return &indexEntry{}, nil
	case tabNodes:
		return &Node{}, nil
	case tabServices:
		return &Service{}, nil
	case tabChecks:
		return &HealthCheck{}, nil
	case tabSessions:
		return &Session{}, nil
	case tabKVs:
		return &DirEntry{}, nil
	case tabTombstones:
		return &tombstone{}, nil
	case tabDelays:
		return &lockDelay{}, nil
	case tabQueries:
		return &PreparedQuery{}, nil
	}
	return nil, fmt.Errorf("state: snapshot has unknown table %q", table)
}

// ErrNewerSnapshot marks a snapshot of a format newer than this build's.
var ErrNewerSnapshot = errors.New("written by a newer holdfast")

// CheckSnapshotVersion reads a snapshot's header and says whether this
// build reads its format: an error wrapping ErrNewerSnapshot if a newer
// holdfast wrote it.
func CheckSnapshotVersion(r io.Reader) error {
	_, err := snapshotHeader(json.NewDecoder(r))
	return err
}

func snapshotHeader(dec *json.Decoder) (int, error) {
	var hdr struct{ Version int }
	if err := dec.Decode(&hdr); err != nil {
		return 0, fmt.Errorf("state: reading snapshot header: %w", err)
	}
	switch {
	case hdr.Version > snapshotVersion:
		return 0, fmt.Errorf("state: snapshot version %d, where this holdfast reads %d: %w", hdr.Version, snapshotVersion, ErrNewerSnapshot)
	case hdr.Version != snapshotVersion:
		return 0, fmt.Errorf("state: snapshot version %d is not supported (want %d)", hdr.Version, snapshotVersion)
	}
	return hdr.Version, nil
}

// Restore reads a snapshot written by Persist into a new Store.
func Restore(r io.Reader) (*Store, error) {
	dec := json.NewDecoder(bufio.NewReaderSize(r, 1<<16))
	if _, err := snapshotHeader(dec); err != nil {
		return nil, err
	}
	s := New()
	tx := s.db.Txn(true)
	defer tx.Abort()
	var kv kvTable
	own := newOwner()
	for {
		var rec record
		if err := dec.Decode(&rec); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("state: reading snapshot: %w", err)
		}
		if rec.T == tabOldSessionChecks {
			continue
		}
		if rec.T == recLockFloor {
			if err := json.Unmarshal(rec.V, &kv.LockFloor); err != nil {
				return nil, fmt.Errorf("state: decoding %s record: %w", rec.T, err)
			}
			continue
		}
		obj, err := newObj(rec.T)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(rec.V, obj); err != nil {
			return nil, fmt.Errorf("state: decoding %s record: %w", rec.T, err)
		}
		switch o := obj.(type) {
		case *Session:
			err = restoreSession(tx, o)
		case *DirEntry:
			err = restoreKV(&kv, o, own)
		case *tombstone:
			kv.Graves = kv.Graves.withOwned(o, own)
		case *indexEntry:
			if o.Key == tabKVs {
				kv.Index = o.Value
			} else {
				err = tx.Insert(rec.T, obj)
			}
		default:
			err = tx.Insert(rec.T, obj)
		}
		if err != nil {
			return nil, fmt.Errorf("state: restoring %s: %w", rec.T, err)
		}
	}
	if kv.Entries.Len() > 0 || kv.Graves.Len() > 0 || kv.Index != 0 || kv.LockFloor != 0 {
		must(tx.Insert(tabKVs, &kv))
	}
	tx.Commit()
	return s, nil
}

// restoreKV adds a snapshot's KV entry to kv.
func restoreKV(kv *kvTable, e *DirEntry, own uint64) error {
	if e.Key == "" {
		return fmt.Errorf("KV entry has no key")
	}
	kv.put(e, kv.Entries.get(e.Key), own)
	return nil
}

// Reap drops tombstones at or below upTo and lock-delays that ended by now.
// The leader proposes it periodically.
func (s *Store) Reap(idx uint64, now time.Time, upTo uint64) {
	s.single(idx, now, func(tx *wtx) error { tx.reap(upTo); return nil })
}

func (tx *wtx) reap(upTo uint64) {
	// The survivors go into a new tree, in key order and in place (the
	// transaction's own nodes): linear in the tombstones, where removing
	// each dead one would copy a path of the tree per tombstone. A reap
	// with none to drop (an idle store) builds nothing.
	t := tx.kvt()
	dead := false
	t.Graves.each(func(g *tombstone) bool {
		dead = g.Index <= upTo
		return !dead
	})
	if dead {
		var kept cowTree[*tombstone]
		t.Graves.each(func(g *tombstone) bool {
			if g.Index > upTo {
				kept = kept.withOwned(g, tx.kvOwn)
			}
			return true
		})
		t.Graves = kept
		tx.kvDirty = true
	}
	it, err := tx.Get(tabDelays, "id")
	must(err)
	var ended []interface{}
	for r := it.Next(); r != nil; r = it.Next() {
		if r.(*lockDelay).Until <= tx.now.UnixNano() {
			ended = append(ended, r)
		}
	}
	for _, d := range ended {
		must(tx.Delete(tabDelays, d))
	}
}

// LockHighWater is the highest LockIndex this store has handed out that
// it still knows of: its keys' own and the LockFloor its deleted keys
// left. RaiseLockIndexes takes it as the floor for a backup restored over
// the store.
func (s *Store) LockHighWater() uint64 {
	kv := kvTableOf(s.db.Txn(false))
	hw := kv.LockFloor
	kv.Entries.each(func(e *DirEntry) bool {
		hw = max(hw, e.LockIndex)
		return true
	})
	return hw
}

// RaiseLockIndexes readies a store read from a backup to replace a live
// one that has handed out LockIndexes up to floor (its LockHighWater).
// Every key locked at least once, at a LockIndex of floor or less, moves
// to floor+1 (held or not), and the LockFloor to at least floor, so no
// acquisition after the restore repeats a (Key, LockIndex) handed out
// before it: a fencing token taken from the live state is never valid
// again for a different holding. Keys never locked keep a LockIndex of 0.
// It must run before the store is in use: it wakes no watcher.
func (s *Store) RaiseLockIndexes(floor uint64) {
	tx := s.write(0, time.Time{})
	defer tx.Abort()
	t := tx.kvt()
	var low []*DirEntry
	t.Entries.each(func(e *DirEntry) bool {
		if e.LockIndex != 0 && e.LockIndex <= floor {
			low = append(low, e)
		}
		return true
	})
	for _, old := range low {
		ent := *old
		ent.LockIndex = floor + 1
		t.put(&ent, old, tx.kvOwn)
	}
	if floor > t.LockFloor {
		t.LockFloor = floor
	}
	tx.kvDirty = true
	tx.Commit()
}

// CheckHeld returns an error naming the first key held by a session the
// store does not have. Raft's own snapshots never hold one; an archive
// made by hand can, and its key could then never be acquired again.
func (s *Store) CheckHeld() error {
	tx := s.db.Txn(false)
	_, sessions := sessionsOf(tx)
	var err error
	kvTableOf(tx).Entries.each(func(e *DirEntry) bool {
		if e.Session != "" && sessions.get(e.Session) == nil {
			err = fmt.Errorf("key %q is locked by session %s, which the state does not have", e.Key, e.Session)
		}
		return err == nil
	})
	return err
}

// MaxIndex is the highest index any table of the store was changed at.
func (s *Store) MaxIndex() uint64 {
	return s.TableIndex(dumped...)
}
