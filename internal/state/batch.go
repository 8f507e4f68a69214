package state

import "time"

// single runs one command in its own write transaction, committed if the
// command succeeds and discarded if it fails.
func (s *Store) single(idx uint64, now time.Time, f func(*wtx) error) error {
	tx := s.write(idx, now)
	defer tx.Abort()
	if err := f(tx); err != nil {
		return err
	}
	tx.Commit()
	return nil
}

// Batch applies a run of consecutive commands in one write transaction, so
// that a raft batch costs one copy of each touched path of the trees
// instead of one per command. Each command still carries its own index and
// stamped time, and readers see the whole run at once when it commits.
//
// Only commands that write nothing when they fail may run in a Batch (a
// failure cannot be rolled back without discarding the commands before it):
// KV writes, session create and destroy, deregistration, prepared-query
// writes and reaping. Register and Txn, which may fail after writing, must
// run alone (Store.Register, Store.Txn) between batches.
//
// A Batch is used by one goroutine (the raft apply path); no other write
// may happen on the store until it is committed.
type Batch struct {
	tx *wtx
}

// Batch starts a batch. The caller must Commit it.
func (s *Store) Batch() *Batch { return &Batch{tx: s.write(0, time.Time{})} }

func (b *Batch) at(idx uint64, now time.Time) *wtx {
	b.tx.idx, b.tx.now = idx, now
	return b.tx
}

// Commit makes every command of the batch visible and wakes their watchers.
func (b *Batch) Commit() { b.tx.Commit() }

// Abort discards the batch. After Commit it does nothing, so it may be
// deferred to release the store's writer lock on every way out.
func (b *Batch) Abort() { b.tx.Abort() }

// KVS is Store.KVS within the batch.
func (b *Batch) KVS(idx uint64, now time.Time, req *KVRequest) (bool, error) {
	return b.at(idx, now).kvs(req)
}

// SessionCreate is Store.SessionCreate within the batch.
func (b *Batch) SessionCreate(idx uint64, sess *Session) error {
	return b.at(idx, time.Time{}).sessionCreate(sess)
}

// SessionDestroy is Store.SessionDestroy within the batch.
func (b *Batch) SessionDestroy(idx uint64, now time.Time, id string) {
	b.at(idx, now).invalidate(id)
}

// Deregister is Store.Deregister within the batch.
func (b *Batch) Deregister(idx uint64, now time.Time, req *DeregisterRequest) error {
	return b.at(idx, now).deregister(req)
}

// QuerySet is Store.QuerySet within the batch.
func (b *Batch) QuerySet(idx uint64, q *PreparedQuery) error {
	return b.at(idx, time.Time{}).querySet(q)
}

// QueryDelete is Store.QueryDelete within the batch.
func (b *Batch) QueryDelete(idx uint64, id string) error {
	return b.at(idx, time.Time{}).queryDelete(id)
}

// Reap is Store.Reap within the batch.
func (b *Batch) Reap(idx uint64, now time.Time, upTo uint64) {
	b.at(idx, now).reap(upTo)
}
