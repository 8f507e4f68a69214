package state

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/holdfast/holdfast/internal/watch"
)

// KVOp names a KV operation; the names are Consul's transaction verbs.
type KVOp string

// KV operations. OpCheckLock is holdfast's first fencing check: it passes
// only if the key is held by Entry.Session with exactly Entry.LockIndex.
// OpCheckSequencer is what the check-lock verb has meant since semaphore
// permits could be fenced: OpCheckLock for a lock, and for a semaphore's
// .lock key a permit check (CheckSequencer). OpCheckLock stays for the
// commands already in logs, which must replay as they were first applied.
const (
	OpSet     KVOp = "set"
	OpCAS     KVOp = "cas"
	OpLock    KVOp = "lock"
	OpUnlock  KVOp = "unlock"
	OpGet     KVOp = "get"
	OpGetTree KVOp = "get-tree"
	// OpGetOrEmpty is OpGet that, for a missing key, answers the entry
	// asked for with no value instead of failing the transaction
	// (Consul's api.KVGetOrEmpty).
	OpGetOrEmpty     KVOp = "get-or-empty"
	OpCheckIndex     KVOp = "check-index"
	OpCheckSession   KVOp = "check-session"
	OpCheckNotExists KVOp = "check-not-exists"
	OpCheckLock      KVOp = "check-lock"
	OpCheckSequencer KVOp = "check-sequencer"
	OpDelete         KVOp = "delete"
	OpDeleteTree     KVOp = "delete-tree"
	OpDeleteCAS      KVOp = "delete-cas"
)

// ReadOnly reports whether the operation only reads or checks the store.
func (o KVOp) ReadOnly() bool {
	switch o {
	case OpGet, OpGetOrEmpty, OpGetTree, OpCheckIndex, OpCheckSession, OpCheckNotExists, OpCheckLock, OpCheckSequencer:
		return true
	}
	return false
}

// KVRequest is one KV operation. For OpCAS and OpDeleteCAS, Entry.ModifyIndex
// is the expected index; for OpUnlock a non-zero Entry.LockIndex makes the
// release conditional on that exact acquisition (a fenced release).
type KVRequest struct {
	Op    KVOp
	Entry DirEntry
}

// KVS applies one KV write. It returns whether the operation took effect
// (false: CAS mismatch, lock held by another, lock-delay, release by a
// non-holder). Errors mean the request itself was bad: ErrMissingKey,
// ErrMissingSession, ErrInvalidSession, ErrInvalidRequest.
func (s *Store) KVS(idx uint64, now time.Time, req *KVRequest) (bool, error) {
	var ok bool
	err := s.single(idx, now, func(tx *wtx) (err error) {
		ok, err = tx.kvs(req)
		return err
	})
	return ok, err
}

func (tx *wtx) kvs(req *KVRequest) (bool, error) {
	e := req.Entry
	if e.Key == "" && req.Op != OpDeleteTree {
		return false, ErrMissingKey
	}
	switch req.Op {
	case OpSet:
		tx.kvSet(&e, false)
		return true, nil
	case OpCAS:
		return tx.kvCAS(&e), nil
	case OpLock:
		return tx.kvLock(&e)
	case OpUnlock:
		return tx.kvUnlock(&e)
	case OpDelete:
		tx.kvDelete(e.Key)
		return true, nil
	case OpDeleteCAS:
		return tx.kvDeleteCAS(e.Key, e.ModifyIndex), nil
	case OpDeleteTree:
		tx.kvDeleteTree(e.Key)
		return true, nil
	}
	return false, fmt.Errorf("%w: unknown KV write %q", ErrInvalidRequest, req.Op)
}

// kvSet writes e. Unless lockOp, the key's Session and LockIndex are kept
// from the existing entry (a new key has none): a plain write never takes or
// drops a lock, and, unlike Consul, never resets the LockIndex (so a
// sequencer is never reused). A write that changes nothing is skipped, so it
// wakes no watcher.
func (tx *wtx) kvSet(e *DirEntry, lockOp bool) {
	ent := *e
	ent.Value = append([]byte(nil), e.Value...)
	ent.ModifyIndex = tx.idx
	ent.CreateIndex = tx.idx
	old := tx.kvGet(e.Key)
	if !lockOp {
		ent.Session, ent.LockIndex = "", 0
		if old != nil {
			ent.Session, ent.LockIndex = old.Session, old.LockIndex
		}
	}
	if old != nil {
		ent.CreateIndex = old.CreateIndex
		if old.Flags == ent.Flags && old.Session == ent.Session &&
			old.LockIndex == ent.LockIndex && bytes.Equal(old.Value, ent.Value) {
			return
		}
	}
	tx.kvStore(&ent, old)
	tx.bump(tabKVs)
}

func (tx *wtx) kvCAS(e *DirEntry) bool {
	old := tx.kvGet(e.Key)
	if e.ModifyIndex == 0 && old != nil {
		return false
	}
	if e.ModifyIndex != 0 && (old == nil || old.ModifyIndex != e.ModifyIndex) {
		return false
	}
	tx.kvSet(e, false)
	return true
}

func (tx *wtx) sessionExists(id string) bool {
	return tx.session(id) != nil
}

// kvLock acquires e.Key for e.Session. The holder may re-acquire to update
// the value without moving the LockIndex. A key's first acquisition counts
// on from the table's LockFloor (1 on a store where no locked key was ever
// deleted), later ones from the key's own LockIndex.
func (tx *wtx) kvLock(e *DirEntry) (bool, error) {
	if e.Session == "" {
		return false, ErrMissingSession
	}
	if !tx.sessionExists(e.Session) {
		return false, fmt.Errorf("%w %q", ErrInvalidSession, e.Session)
	}
	ent := *e
	old := tx.kvGet(e.Key)
	held := old != nil && old.Session == e.Session
	// Lock-delay keeps a new holder out; the current holder updating its
	// value is not a new acquisition.
	if !held && tx.delayed(e.Key) {
		return false, nil
	}
	switch {
	case old == nil:
		ent.LockIndex = tx.kvt().LockFloor + 1
	case old.Session == e.Session:
		ent.LockIndex = old.LockIndex
	case old.Session != "":
		return false, nil
	case old.LockIndex == 0:
		ent.LockIndex = tx.kvt().LockFloor + 1
	default:
		ent.LockIndex = old.LockIndex + 1
	}
	tx.kvSet(&ent, true)
	return true, nil
}

// kvUnlock releases e.Key if e.Session holds it (and, when e.LockIndex is
// set, holds it at that LockIndex). Value and Flags are replaced, as in
// Consul; LockIndex is kept.
func (tx *wtx) kvUnlock(e *DirEntry) (bool, error) {
	if e.Session == "" {
		return false, ErrMissingSession
	}
	old := tx.kvGet(e.Key)
	if old == nil || old.Session != e.Session {
		return false, nil
	}
	if e.LockIndex != 0 && e.LockIndex != old.LockIndex {
		return false, nil
	}
	ent := *e
	ent.Session = ""
	ent.LockIndex = old.LockIndex
	tx.kvSet(&ent, true)
	return true, nil
}

func (tx *wtx) kvDelete(key string) {
	old := tx.kvGet(key)
	if old == nil {
		return
	}
	tx.kvRemove(old)
	tx.bury(key)
	tx.bump(tabKVs)
}

func (tx *wtx) kvDeleteCAS(key string, cas uint64) bool {
	old := tx.kvGet(key)
	if old == nil {
		return true // Consul answers true for an absent key
	}
	if old.ModifyIndex != cas {
		return false
	}
	tx.kvDelete(key)
	return true
}

func (tx *wtx) kvDeleteTree(prefix string) {
	var doomed []*DirEntry
	tx.kvt().Entries.prefix(prefix, func(e *DirEntry) bool { doomed = append(doomed, e); return true })
	if len(doomed) == 0 {
		return
	}
	// Each deleted key leaves its own tombstone, as a plain delete does:
	// a listing of a longer prefix (of "ab/" when "a" is deleted) finds
	// its index moved by the keys it lost, not only by the tombstones
	// under its own prefix.
	for _, e := range doomed {
		tx.kvRemove(e)
		tx.bury(e.Key)
	}
	if prefix != "" {
		tx.bury(prefix)
	}
	tx.bump(tabKVs)
}

// lockDelay returns the end of key's lock-delay, if it has one.
func (tx *wtx) lockDelay(key string) (until int64, ok bool) {
	raw, err := tx.First(tabDelays, "id", key)
	must(err)
	if raw == nil {
		return 0, false
	}
	return raw.(*lockDelay).Until, true
}

// delayed reports whether key is under a lock-delay at the stamped time.
// A key with no lock-delay row is never delayed, whatever the time.
func (tx *wtx) delayed(key string) bool {
	until, ok := tx.lockDelay(key)
	return ok && tx.now.UnixNano() < until
}

// setLockDelay makes key unacquirable until now+d (keeping a later deadline
// if one is already set). d is clamped to MaxLockDelay.
func (tx *wtx) setLockDelay(key string, d time.Duration) {
	if d <= 0 {
		return
	}
	if d > MaxLockDelay {
		d = MaxLockDelay
	}
	until := tx.now.Add(d).UnixNano()
	if cur, ok := tx.lockDelay(key); ok && until <= cur {
		return
	}
	must(tx.Insert(tabDelays, &lockDelay{Key: key, Until: until}))
}

// ---- reads ----

// KVGet returns the entry at key (nil if absent) and the index to report:
// the key's ModifyIndex, or the KV table's index when it is absent.
func (s *Store) KVGet(ws watch.Set, key string) (uint64, *DirEntry) {
	if ws != nil {
		ws.Add(s.kw.key(key)) // before the read: see kvWatch
	}
	kv := kvTableOf(s.read(ws))
	e := kv.Entries.get(key)
	if e == nil {
		return kv.Index, nil
	}
	return e.ModifyIndex, e
}

// KVList returns the entries under prefix in key order, and the index to
// report: the highest ModifyIndex among them and the tombstones under the
// prefix, or the table index when that is zero. Returned entries are shared
// with the store and must not be modified.
func (s *Store) KVList(ws watch.Set, prefix string) (uint64, []*DirEntry) {
	tx := s.readPrefix(ws, prefix)
	kv := kvTableOf(tx)
	var out []*DirEntry
	var max uint64
	kv.Entries.prefix(prefix, func(e *DirEntry) bool {
		out = append(out, e)
		max = maxU(max, e.ModifyIndex)
		return true
	})
	return prefixIndex(&kv, prefix, max), out
}

// readPrefix is read for a listing of prefix: it adds the prefix's watch
// channel to ws first (see kvWatch).
func (s *Store) readPrefix(ws watch.Set, prefix string) *memdb.Txn {
	if ws != nil {
		ws.Add(s.kw.prefix(prefix))
	}
	return s.read(ws)
}

// prefixIndex is the index of a listing of prefix in kv, whose entries'
// highest ModifyIndex is max: the higher of that and the tombstones' under
// the prefix, or the table index when both are zero.
func prefixIndex(kv *kvTable, prefix string, max uint64) uint64 {
	if prefix == "" {
		return kv.Index
	}
	max = maxU(max, kv.Graves.maxPrefix(prefix))
	if max == 0 {
		return kv.Index
	}
	return max
}

// KVKeys lists the keys under prefix. With a separator, keys are cut after
// the first separator that follows the prefix and duplicates are folded,
// like a directory listing.
func (s *Store) KVKeys(ws watch.Set, prefix, sep string) (uint64, []string) {
	tx := s.readPrefix(ws, prefix)
	kv := kvTableOf(tx)
	var out []string
	var max uint64
	kv.Entries.prefix(prefix, func(e *DirEntry) bool {
		max = maxU(max, e.ModifyIndex)
		k := e.Key
		if sep != "" {
			if i := strings.Index(k[len(prefix):], sep); i >= 0 {
				k = k[:len(prefix)+i+len(sep)]
			}
		}
		if n := len(out); n == 0 || out[n-1] != k {
			out = append(out, k)
		}
		return true
	})
	return prefixIndex(&kv, prefix, max), out
}

// KVLockDelay returns when the lock-delay on key ends (the zero time if
// there is none). The leader checks it before proposing an acquire.
func (s *Store) KVLockDelay(key string) time.Time {
	raw, err := s.db.Txn(false).First(tabDelays, "id", key)
	must(err)
	if raw == nil {
		return time.Time{}
	}
	return time.Unix(0, raw.(*lockDelay).Until)
}

// LockDelayHorizon returns the latest lock-delay deadline in the store
// (the zero time if there is none). No deadline is set further than
// MaxLockDelay ahead of the time it was set at, so the store was written
// at LockDelayHorizon() - MaxLockDelay or later.
func (s *Store) LockDelayHorizon() time.Time {
	it, err := s.db.Txn(false).Get(tabDelays, "id")
	must(err)
	var latest int64
	for r := it.Next(); r != nil; r = it.Next() {
		latest = max(latest, r.(*lockDelay).Until)
	}
	if latest == 0 {
		return time.Time{}
	}
	return time.Unix(0, latest)
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}
