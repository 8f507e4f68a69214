package api

import (
	"context"
	"errors"
	"net/http"
)

// KVOp is the verb of a KV operation inside a transaction.
type KVOp string

// The KV verbs of /v1/txn. All but KVCheckLock are Consul's.
const (
	KVSet        KVOp = "set"
	KVDelete     KVOp = "delete"
	KVDeleteCAS  KVOp = "delete-cas"
	KVDeleteTree KVOp = "delete-tree"
	KVCAS        KVOp = "cas"
	KVLock       KVOp = "lock"
	KVUnlock     KVOp = "unlock"
	KVGet        KVOp = "get"
	KVGetTree    KVOp = "get-tree"
	// KVGetOrEmpty is KVGet that answers a missing key with an entry
	// without a value instead of failing the transaction.
	KVGetOrEmpty     KVOp = "get-or-empty"
	KVCheckSession   KVOp = "check-session"
	KVCheckIndex     KVOp = "check-index"
	KVCheckNotExists KVOp = "check-not-exists"

	// KVCheckLock is holdfast's fence: it fails unless Key is locked by
	// Session at exactly LockIndex. Consul does not know it.
	KVCheckLock KVOp = "check-lock"
)

// KVTxnOp is one KV operation of a transaction. Index is the ModifyIndex
// that cas, check-index and delete-cas compare with. LockIndex is
// holdfast's: the index check-lock demands, or for unlock the hold to
// release (0: whatever the session holds). It is left out of the request
// when zero, so transactions without it are Consul's byte for byte.
type KVTxnOp struct {
	Verb      KVOp
	Key       string
	Value     []byte
	Flags     uint64
	Index     uint64
	Session   string
	LockIndex uint64 `json:",omitempty"`
}

// TxnOp is one operation of a transaction. holdfast's transactions hold
// KV operations only.
type TxnOp struct {
	KV *KVTxnOp
}

// TxnOps is a transaction: operations applied all together or not at all.
type TxnOps []*TxnOp

// TxnResult is what one operation returned: for a write or a check, the
// key as it stands after the transaction, without its value; for get, with
// it. Deletes return nothing.
type TxnResult struct {
	KV *KVPair
}

// TxnResults are the results of a transaction that committed, in order.
type TxnResults []*TxnResult

// TxnError says why operation OpIndex (0-based) failed.
type TxnError struct {
	OpIndex int
	What    string
}

// TxnErrors are the reasons a transaction was rolled back.
type TxnErrors []*TxnError

// TxnResponse is the body of a /v1/txn answer.
type TxnResponse struct {
	Results TxnResults
	Errors  TxnErrors
}

// Txn is the transaction endpoint, /v1/txn. Get one with Client.Txn.
type Txn struct{ c *Client }

// Txn returns the transaction endpoint.
func (c *Client) Txn() *Txn { return &Txn{c} }

// Txn applies ops atomically. ok reports whether the transaction
// committed; when it did not (the server answered 409), the response's
// Errors say which operations failed and why, and nothing was written.
// Any other failure is an error.
func (t *Txn) Txn(ctx context.Context, ops TxnOps, w *WriteOptions) (ok bool, resp *TxnResponse, wm *WriteMeta, err error) {
	r := t.c.newRequest(http.MethodPut, "/v1/txn")
	if ops == nil {
		ops = TxnOps{}
	}
	if err := jsonBody(r, ops); err != nil {
		return false, nil, nil, err
	}
	out := &TxnResponse{}
	wm, err = t.c.write(ctx, r, w, out)
	var se *StatusError
	if errors.As(err, &se) && se.Code == http.StatusConflict {
		rolled := &TxnResponse{}
		if jerr := unmarshalJSON([]byte(se.Body), rolled); jerr != nil {
			return false, nil, wm, err
		}
		return false, rolled, wm, nil
	}
	if err != nil {
		return false, nil, wm, err
	}
	return true, out, wm, nil
}
