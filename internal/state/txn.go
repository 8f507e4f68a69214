package state

import (
	"fmt"
	"time"
)

// MaxTxnOps bounds the operations of one transaction, as Consul's current
// agent does (its older releases allowed 64).
const MaxTxnOps = 128

// TxnOp is one operation of a transaction. Only KV operations exist today.
type TxnOp struct {
	KV *KVRequest `json:",omitempty"`
}

// TxnResult is the result of one operation: the entry it read or wrote
// (writes and checks carry no Value).
type TxnResult struct {
	KV *DirEntry `json:",omitempty"`
}

// TxnError says why operation OpIndex failed.
type TxnError struct {
	OpIndex int
	What    string
}

// Txn applies ops all-or-nothing: if any operation fails, nothing is
// written and the errors say which and why.
func (s *Store) Txn(idx uint64, now time.Time, ops []*TxnOp) ([]*TxnResult, []*TxnError) {
	tx := s.write(idx, now)
	defer tx.Abort()
	results, errs := tx.runOps(ops, false)
	if errs != nil {
		return nil, errs
	}
	tx.Commit()
	return results, nil
}

// TxnRead runs a transaction whose operations only read or check (each
// KVOp.ReadOnly) on the store as it is, without a log entry, and returns
// the KV store's index with the results. An operation that writes is an
// error of that operation.
func (s *Store) TxnRead(ops []*TxnOp) (uint64, []*TxnResult, []*TxnError) {
	tx := &wtx{Txn: s.db.Txn(false), kw: s.kw}
	defer tx.Abort()
	results, errs := tx.runOps(ops, true)
	return tx.kvt().Index, results, errs
}

// runOps runs ops in tx, in order, each seeing the effects of those before
// it. It returns their results, or (results nil) the errors of those that
// failed. readOnly refuses an operation that writes.
func (tx *wtx) runOps(ops []*TxnOp, readOnly bool) ([]*TxnResult, []*TxnError) {
	var results []*TxnResult
	var errs []*TxnError
	for i, op := range ops {
		switch {
		case op == nil || op.KV == nil:
			errs = append(errs, &TxnError{OpIndex: i, What: "no operation specified"})
			continue
		case readOnly && !op.KV.Op.ReadOnly():
			errs = append(errs, &TxnError{OpIndex: i, What: fmt.Sprintf("%q writes: not in a read-only transaction", op.KV.Op)})
			continue
		}
		res, err := tx.txnKV(op.KV)
		if err != nil {
			errs = append(errs, &TxnError{OpIndex: i, What: err.Error()})
			continue
		}
		results = append(results, res...)
	}
	if errs != nil {
		return nil, errs
	}
	return results, nil
}

func noValue(e *DirEntry) []*TxnResult {
	if e == nil {
		return nil
	}
	c := *e
	c.Value = nil
	return []*TxnResult{{KV: &c}}
}

func (tx *wtx) txnKV(req *KVRequest) ([]*TxnResult, error) {
	key := req.Entry.Key
	if key == "" && req.Op != OpDeleteTree && req.Op != OpGetTree {
		return nil, ErrMissingKey
	}
	cur := tx.kvGet(key)
	switch req.Op {
	case OpGet:
		if cur == nil {
			return nil, fmt.Errorf("key %q doesn't exist", key)
		}
		c := *cur
		return []*TxnResult{{KV: &c}}, nil
	case OpGetOrEmpty:
		if cur == nil {
			c := req.Entry
			c.Value = nil
			return []*TxnResult{{KV: &c}}, nil
		}
		c := *cur
		return []*TxnResult{{KV: &c}}, nil
	case OpGetTree:
		var out []*TxnResult
		tx.kvt().Entries.prefix(key, func(e *DirEntry) bool {
			c := *e
			out = append(out, &TxnResult{KV: &c})
			return true
		})
		return out, nil
	case OpCheckIndex:
		if cur == nil {
			return nil, fmt.Errorf("failed to check index, key %q doesn't exist", key)
		}
		if cur.ModifyIndex != req.Entry.ModifyIndex {
			return nil, fmt.Errorf("failed index check for key %q, current modify index %d != %d", key, cur.ModifyIndex, req.Entry.ModifyIndex)
		}
		return noValue(cur), nil
	case OpCheckSession:
		if cur == nil {
			return nil, fmt.Errorf("failed to check session, key %q doesn't exist", key)
		}
		if cur.Session != req.Entry.Session {
			return nil, fmt.Errorf("failed session check for key %q, current session %q != %q", key, cur.Session, req.Entry.Session)
		}
		return noValue(cur), nil
	case OpCheckLock:
		if err := checkLock(cur, key, req.Entry.Session, req.Entry.LockIndex); err != nil {
			return nil, err
		}
		return noValue(cur), nil
	case OpCheckSequencer:
		if err := CheckSequencer(tx.kvGet, key, req.Entry.Session, req.Entry.LockIndex); err != nil {
			return nil, err
		}
		return noValue(cur), nil
	case OpCheckNotExists:
		if cur != nil {
			return nil, fmt.Errorf("key %q exists", key)
		}
		return nil, nil
	case OpLock:
		if req.Entry.Session != "" && (cur == nil || cur.Session != req.Entry.Session) && tx.delayed(key) {
			return nil, fmt.Errorf("failed to lock key %q due to lock delay", key)
		}
	case OpSet, OpCAS, OpUnlock, OpDelete, OpDeleteTree, OpDeleteCAS:
	default:
		return nil, fmt.Errorf("unknown KV verb %q", req.Op)
	}
	ok, err := tx.kvs(req)
	if err != nil {
		return nil, err
	}
	if !ok {
		switch req.Op {
		case OpCAS:
			return nil, fmt.Errorf("failed to set key %q, index is stale", key)
		case OpLock:
			return nil, fmt.Errorf("failed to lock key %q, lock is already held", key)
		case OpUnlock:
			return nil, fmt.Errorf("failed to unlock key %q, lock isn't held, or is held by another session", key)
		case OpDeleteCAS:
			return nil, fmt.Errorf("failed to delete key %q, index is stale", key)
		}
		return nil, fmt.Errorf("operation %q on key %q failed", req.Op, key)
	}
	switch req.Op {
	case OpDelete, OpDeleteTree, OpDeleteCAS:
		return nil, nil
	}
	return noValue(tx.kvGet(key)), nil
}
