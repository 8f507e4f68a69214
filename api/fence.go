package api

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Fencing: a lock holder can be paused (GC, swap, SIGSTOP, a partition) for
// longer than its session lives. When it wakes it may still believe it holds
// the lock while another holder has acquired it since. Clocks cannot fix
// this; the resource it writes to can, if every write carries a sequencer
// naming the hold it was made under and the resource refuses writes under
// a hold that is no longer current. holdfast checks sequencers itself, in
// three places, and these helpers reach them:
//
//   - KV.Fence asks whether a sequencer is still current (GET /v1/fence).
//   - KV.PutFenced and KV.DeleteFenced make a KV write conditional on it
//     (a transaction whose first operation is check-lock).
//   - KV.ReleaseFenced gives up exactly the hold a sequencer names, never
//     a later one of the same session (?release=S&lock-index=N).
//
// None of this is Consul's API; a Consul server refuses these requests.

// Sequencer names one hold of a lock: the key, the session that holds it,
// and the key's LockIndex when it was acquired. LockIndex grows with every
// acquisition, so a sequencer is current only as long as that very hold
// lasts. A semaphore permit has one too: the semaphore's .lock key, the
// session, and in LockIndex the index of the write that granted the
// permit; the server checks it the same way (docs/compatibility.md).
type Sequencer struct {
	Key       string
	Session   string
	LockIndex uint64
}

// String renders the sequencer as key@lockindex/session, for logs.
func (s Sequencer) String() string {
	return s.Key + "@" + strconv.FormatUint(s.LockIndex, 10) + "/" + s.Session
}

// FenceStatus is the server's answer about a sequencer: Valid when the key
// is held by that session at that LockIndex, and in any case who holds it
// now ("" and 0 when nobody does or the key is missing); for a semaphore
// permit, Session and LockIndex are the sequencer's own while it is valid.
// Reason says why a sequencer is not valid.
type FenceStatus struct {
	Valid     bool
	Session   string
	LockIndex uint64
	Reason    string
}

// Fence asks the server whether seq is still current. The check is
// consistent (the leader confirms its leadership first) unless q asks for
// AllowStale. With q.WaitIndex set it blocks like any read, so a resource
// can wait for a sequencer to go stale: pass the returned LastIndex back.
func (k *KV) Fence(ctx context.Context, seq Sequencer, q *QueryOptions) (*FenceStatus, *QueryMeta, error) {
	if err := seq.check(); err != nil {
		return nil, nil, err
	}
	params := url.Values{
		"session":    {seq.Session},
		"lock-index": {strconv.FormatUint(seq.LockIndex, 10)},
	}
	out := &FenceStatus{}
	qm, err := k.c.query(ctx, "/v1/fence/"+strings.TrimPrefix(seq.Key, "/"), params, q, out)
	if err != nil {
		return nil, qm, err
	}
	return out, qm, nil
}

// ReleaseFenced unlocks p.Key for session p.Session only if that session
// holds it at lockIndex, writing p.Value and p.Flags as Release does. It
// reports whether it released; false means the hold named is not the
// current one (already released, lost, or acquired anew since), and the
// key was left alone.
func (k *KV) ReleaseFenced(ctx context.Context, p *KVPair, lockIndex uint64, w *WriteOptions) (bool, *WriteMeta, error) {
	if p == nil {
		return false, nil, errNilPair
	}
	if lockIndex == 0 {
		return false, nil, fmt.Errorf("api: fenced release of %q needs a LockIndex (a held lock's is at least 1)", p.Key)
	}
	return k.put(ctx, p, url.Values{
		"release":    {p.Session},
		"lock-index": {strconv.FormatUint(lockIndex, 10)},
	}, w)
}

// CheckLockOp returns the transaction operation that fails unless seq is
// current. Put it first in a transaction to fence the operations after it.
func CheckLockOp(seq Sequencer) *TxnOp {
	// The key as Fence and KV.Get name it: a leading "/" is dropped.
	return &TxnOp{KV: &KVTxnOp{Verb: KVCheckLock, Key: strings.TrimPrefix(seq.Key, "/"), Session: seq.Session, LockIndex: seq.LockIndex}}
}

// PutFenced writes p.Value and p.Flags to p.Key only if seq is current,
// atomically: the check and the write are one transaction. It reports
// whether the write happened; false means seq is stale and nothing was
// written. p.Key need not be seq.Key: a lock usually guards other keys.
func (k *KV) PutFenced(ctx context.Context, p *KVPair, seq Sequencer, w *WriteOptions) (bool, *WriteMeta, error) {
	if p == nil {
		return false, nil, errNilPair
	}
	if err := seq.check(); err != nil {
		return false, nil, err
	}
	if strings.HasPrefix(p.Key, "/") {
		return false, nil, fmt.Errorf("Invalid key. Key must not begin with a '/': %s", p.Key) // as KV.Put
	}
	ok, _, wm, err := k.c.Txn().Txn(ctx, TxnOps{
		CheckLockOp(seq),
		{KV: &KVTxnOp{Verb: KVSet, Key: p.Key, Value: p.Value, Flags: p.Flags}},
	}, w)
	return ok, wm, err
}

// DeleteFenced deletes key only if seq is current, atomically. It reports
// whether the delete happened.
func (k *KV) DeleteFenced(ctx context.Context, key string, seq Sequencer, w *WriteOptions) (bool, *WriteMeta, error) {
	if err := seq.check(); err != nil {
		return false, nil, err
	}
	ok, _, wm, err := k.c.Txn().Txn(ctx, TxnOps{
		CheckLockOp(seq),
		{KV: &KVTxnOp{Verb: KVDelete, Key: strings.TrimPrefix(key, "/")}}, // as KV.Delete
	}, w)
	return ok, wm, err
}

func (s Sequencer) check() error {
	switch {
	case s.Key == "":
		return fmt.Errorf("api: sequencer has no key")
	case s.Session == "":
		return fmt.Errorf("api: sequencer for %q has no session", s.Key)
	case s.LockIndex == 0:
		return fmt.Errorf("api: sequencer for %q has LockIndex 0 (a held lock's is at least 1)", s.Key)
	}
	return nil
}
