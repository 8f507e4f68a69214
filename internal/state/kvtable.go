package state

import (
	"math/bits"
	"sync/atomic"

	"github.com/hashicorp/go-memdb"
)

// kvTable is the one object of the kvs table: every KV entry by key, and
// the locked keys by holder. Like sessionTable, it replaces what would be
// a table of rows, for cost: a go-memdb insert copies the key's radix path
// (one node, edge slice and watch channel per level), records each copied
// node in an LRU of writable nodes and tracks each old channel, about 59
// allocations and 8 us per write in BenchmarkKVSetBatch; a cowTree insert
// copies about three nodes. A write transaction derives the next kvTable
// in wtx.kv and stores it once, at Commit, so it is as atomic and isolated
// as any table, and a read transaction sees the kvTable of its snapshot.
//
// Watches do not come from the table (its memdb channel would fire on
// every KV write); they come from kvWatch, which fires per key and per
// watched prefix.
type kvTable struct {
	Entries cowTree[*DirEntry]
	// Held has heldBy(e.Session, e.Key) for every entry with a Session:
	// what session invalidation releases or deletes.
	Held cowTree[heldKey]
	// Graves has a tombstone for every deleted key (and deleted prefix)
	// until it is reaped. A listing's index is the highest index among its
	// entries and the tombstones under its prefix; the tree finds the
	// latter without visiting them (cowTree.maxPrefix), so a prefix that
	// has seen many keys come and go (a semaphore's, a lock queue's) lists
	// as fast as one that has not.
	Graves cowTree[*tombstone]
	// Index is the table's index (what the index table holds for the
	// other tables): the last raft index that changed a KV entry.
	Index uint64
	// LockFloor is the highest LockIndex any deleted entry had reached.
	// The first acquisition of a key that has none (a new key, or one
	// written only by plain writes) counts on from it, so a key deleted
	// and created anew never hands out a LockIndex its earlier life
	// already gave: (Key, LockIndex, Session) stays unique without
	// keeping a tombstone per key for ever.
	LockFloor uint64
}

func (t *tombstone) treeKey() string    { return t.Key }
func (t *tombstone) treeWeight() uint64 { return t.Index }

func (e *DirEntry) treeKey() string { return e.Key }

// heldKey is "session\x00key"; a session ID never holds a NUL, so the
// prefix "session\x00" finds exactly that session's keys.
type heldKey string

func (h heldKey) treeKey() string { return string(h) }

func heldBy(session, key string) heldKey { return heldKey(session + "\x00" + key) }

func heldPrefix(session string) string { return session + "\x00" }

// kvTableOf returns the kvTable of tx (empty if there is none yet).
func kvTableOf(tx *memdb.Txn) kvTable {
	raw, err := tx.First(tabKVs, "id")
	must(err)
	if raw == nil {
		return kvTable{}
	}
	return *raw.(*kvTable)
}

// kvt is the transaction's working kvTable, read from the store on first
// use; Commit stores it if a write changed it.
func (tx *wtx) kvt() *kvTable {
	if tx.kv == nil {
		t := kvTableOf(tx.Txn)
		tx.kv, tx.kvOwn = &t, newOwner()
	}
	return tx.kv
}

// kvGet returns the entry at key as the transaction sees it, or nil.
func (tx *wtx) kvGet(key string) *DirEntry {
	return tx.kvt().Entries.get(key)
}

// put stores ent in place of old (nil: a new key), keeping Held in step;
// own is withOwned's.
func (t *kvTable) put(ent, old *DirEntry, own uint64) {
	t.Entries = t.Entries.withOwned(ent, own)
	if old != nil && old.Session != "" && old.Session != ent.Session {
		t.Held, _ = t.Held.without(string(heldBy(old.Session, old.Key)))
	}
	if ent.Session != "" && (old == nil || old.Session != ent.Session) {
		t.Held = t.Held.with(heldBy(ent.Session, ent.Key))
	}
}

// kvStore puts ent in place of old (nil: a new key).
func (tx *wtx) kvStore(ent, old *DirEntry) {
	tx.kvt().put(ent, old, tx.kvOwn)
	tx.kvChanged(ent.Key)
}

// kvRemove deletes old's key.
func (tx *wtx) kvRemove(old *DirEntry) {
	t := tx.kvt()
	t.Entries, _ = t.Entries.without(old.Key)
	if old.LockIndex > t.LockFloor {
		t.LockFloor = old.LockIndex
	}
	if old.Session != "" {
		t.Held, _ = t.Held.without(string(heldBy(old.Session, old.Key)))
	}
	tx.kvChanged(old.Key)
}

// bury records the tombstone of key (a deleted key or prefix).
func (tx *wtx) bury(key string) {
	t := tx.kvt()
	t.Graves = t.Graves.withOwned(&tombstone{Key: key, Index: tx.idx}, tx.kvOwn)
	tx.kvDirty = true
}

// kvChanged notes that key changed, to wake its watchers after Commit.
func (tx *wtx) kvChanged(key string) {
	tx.kvDirty = true
	tx.kvFire = append(tx.kvFire, key)
}

// kvCommit stores the working kvTable, before the memdb commit.
func (tx *wtx) kvCommit() {
	if tx.kvDirty {
		t := *tx.kv
		must(tx.Insert(tabKVs, &t))
	}
}

// kvNotify wakes the watchers of the keys the transaction changed, after
// the memdb commit, so that a woken reader sees the change.
func (tx *wtx) kvNotify() {
	for _, k := range tx.kvFire {
		tx.kw.fire(k)
	}
	tx.kv, tx.kvOwn, tx.kvDirty, tx.kvFire = nil, 0, false, nil
}

// kvWatch holds the channels of blocking KV reads: a slot per hash of a
// watched key, and one per hash of a watched prefix. A channel is made
// when a reader first asks for its slot and closed (and the slot emptied)
// by the first write that touches it, so a write nobody watches costs a
// hash and an atomic load per key, plus one per length of watched prefix
// (a bit set of lengths: writes do not hash lengths nobody watched).
//
// A reader takes its channel before it reads the snapshot, and a writer
// fires after the commit that makes its write visible: a write either
// shows in the read or closes the channel the reader holds. Slots are
// shared by hash, so a write can wake a reader of another key (one chance
// in kvWatchSlots per write); the blocking query then reads again, finds
// its index unchanged and waits on, which is what memdb's watch on the
// closest radix node does for a missing key.
type kvWatch struct {
	slots [kvWatchSlots]atomic.Pointer[chan struct{}]
	// lens has bit L set once a prefix of length L has been watched; long
	// is set once a prefix of kvWatchLens or more bytes has.
	lens [kvWatchLens / 64]atomic.Uint64
	long atomic.Bool
}

const (
	kvWatchSlots = 1 << 16
	kvWatchLens  = 1024
	// FNV-1a offset bases: one for keys, one for prefixes, so that a
	// prefix watch on "a" and a key watch on "a" take different slots.
	fnvKey    = 14695981039346656037
	fnvPrefix = fnvKey ^ 0x9e3779b97f4a7c15
)

func hashSlot(basis uint64, s string) uint32 {
	h := uint64(basis)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return uint32(h^(h>>32)) & (kvWatchSlots - 1)
}

// ch returns the channel of slot i, making it if the slot is empty.
func (w *kvWatch) ch(i uint32) <-chan struct{} {
	for {
		if p := w.slots[i].Load(); p != nil {
			return *p
		}
		c := make(chan struct{})
		if w.slots[i].CompareAndSwap(nil, &c) {
			return c
		}
	}
}

func (w *kvWatch) close(i uint32) {
	if p := w.slots[i].Swap(nil); p != nil {
		close(*p)
	}
}

// key returns a channel that closes when key is written or deleted.
func (w *kvWatch) key(key string) <-chan struct{} { return w.ch(hashSlot(fnvKey, key)) }

// prefix returns a channel that closes when a key under prefix is written
// or deleted.
func (w *kvWatch) prefix(prefix string) <-chan struct{} {
	if n := len(prefix); n < kvWatchLens {
		if b := uint64(1) << (n % 64); w.lens[n/64].Load()&b == 0 {
			w.lens[n/64].Or(b)
		}
	} else if !w.long.Load() {
		w.long.Store(true)
	}
	return w.ch(hashSlot(fnvPrefix, prefix))
}

// fire wakes the watchers of key and of every watched prefix of it.
func (w *kvWatch) fire(key string) {
	w.close(hashSlot(fnvKey, key))
	for word := 0; word < len(w.lens) && word*64 <= len(key); word++ {
		for m := w.lens[word].Load(); m != 0; m &= m - 1 {
			n := word*64 + bits.TrailingZeros64(m)
			if n > len(key) {
				break
			}
			w.close(hashSlot(fnvPrefix, key[:n]))
		}
	}
	if w.long.Load() {
		for n := kvWatchLens; n <= len(key); n++ {
			w.close(hashSlot(fnvPrefix, key[:n]))
		}
	}
}
