package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// txnKVOp is Consul's KV transaction operation. Index is the expected
// ModifyIndex for cas, check-index and delete-cas. LockIndex is holdfast's:
// the fence for check-lock, and for unlock a fenced release (0 = any).
type txnKVOp struct {
	Verb      string
	Key       string
	Value     []byte
	Flags     uint64
	Index     uint64
	Session   string
	LockIndex uint64
	Namespace string
	Partition string
}

// txnOpBody is one element of the PUT /v1/txn array. Consul also has Node,
// Service and Check operations; holdfast accepts them only as null.
type txnOpBody struct {
	KV      *txnKVOp
	Node    json.RawMessage
	Service json.RawMessage
	Check   json.RawMessage
}

// txnVerb is a KV verb a transaction may use: its name as sent, and the
// state operation it means.
type txnVerb struct {
	name string
	op   state.KVOp
}

// txnVerbs are the KV verbs a transaction may use. Each is Consul's name
// for its operation, but check-lock, holdfast's fence, which means
// OpCheckSequencer: a lock's or a semaphore permit's sequencer.
var txnVerbs = map[string]txnVerb{}

func init() {
	for _, op := range []state.KVOp{
		state.OpSet, state.OpCAS, state.OpLock, state.OpUnlock, state.OpGet, state.OpGetOrEmpty, state.OpGetTree,
		state.OpCheckIndex, state.OpCheckSession, state.OpCheckNotExists,
		state.OpDelete, state.OpDeleteTree, state.OpDeleteCAS,
	} {
		txnVerbs[string(op)] = txnVerb{string(op), op}
	}
	txnVerbs[string(state.OpCheckLock)] = txnVerb{string(state.OpCheckLock), state.OpCheckSequencer}
}

// decodeTxn turns a PUT /v1/txn body into state operations. maxValue
// bounds each value. It reads only its arguments, so it is safe to fuzz.
func decodeTxn(body []byte, maxValue int64) ([]*state.TxnOp, error) {
	in, ok := fastTxnBody(body)
	if !ok {
		if err := decodeStrict(body, &in); err != nil {
			return nil, invalidf("Failed to parse body: %v", err)
		}
	}
	if len(in) > state.MaxTxnOps {
		return nil, &Error{Kind: KindTooLarge, Msg: "Transaction contains too many operations (" +
			itoa(int64(len(in))) + " > " + itoa(state.MaxTxnOps) + ")"}
	}
	ops := make([]*state.TxnOp, 0, len(in))
	// One allocation for all the operations and their requests.
	slab := make([]struct {
		op  state.TxnOp
		req state.KVRequest
	}, len(in))
	for i, op := range in {
		if op == nil {
			return nil, invalidf("Operation %d is null", i)
		}
		for j, raw := range []json.RawMessage{op.Node, op.Service, op.Check} {
			if r := bytes.TrimSpace(raw); len(r) > 0 && string(r) != "null" {
				return nil, invalidf("Operation %d is a %s operation: holdfast transactions support only KV operations",
					i, [...]string{"Node", "Service", "Check"}[j])
			}
		}
		kv := op.KV
		if kv == nil {
			return nil, invalidf("Operation %d has no KV part", i)
		}
		tv, ok := txnVerbs[kv.Verb]
		verb := tv.op
		if !ok {
			return nil, invalidf("Operation %d has unknown KV verb %q", i, kv.Verb)
		}
		if err := validateKey(kv.Key); err != nil {
			return nil, invalidf("Operation %d: %v", i, err)
		}
		if kv.Key == "" && verb != state.OpGetTree && verb != state.OpDeleteTree {
			return nil, invalidf("Operation %d (%s) is missing a key name", i, kv.Verb)
		}
		if n := int64(len(kv.Value)); n > maxValue {
			return nil, &Error{Kind: KindTooLarge, Msg: "Value for key " + quote(kv.Key) + " is too large (" +
				itoa(n) + " > " + itoa(maxValue) + " bytes)"}
		}
		switch verb {
		case state.OpLock, state.OpUnlock, state.OpCheckSession, state.OpCheckSequencer:
			if kv.Session == "" && verb != state.OpCheckSession {
				return nil, invalidf("Operation %d (%s) is missing a session", i, kv.Verb)
			}
		}
		e := state.DirEntry{Key: kv.Key, Value: kv.Value, Flags: kv.Flags, Session: kv.Session}
		switch verb {
		case state.OpCAS, state.OpCheckIndex, state.OpDeleteCAS:
			e.ModifyIndex = kv.Index
		case state.OpCheckSequencer, state.OpUnlock:
			e.LockIndex = kv.LockIndex
		}
		x := &slab[i]
		x.req = state.KVRequest{Op: verb, Entry: e}
		x.op.KV = &x.req
		ops = append(ops, &x.op)
	}
	return ops, nil
}

func txnReadOnly(ops []*state.TxnOp) bool {
	for _, op := range ops {
		if op.KV == nil || !op.KV.Op.ReadOnly() {
			return false
		}
	}
	return true
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// txnResponse is the body of /v1/txn: Results on success (200), Errors
// when the transaction was rolled back (409).
type txnResponse struct {
	Results []*state.TxnResult
	Errors  []*state.TxnError
}

func (h *handler) txn(w http.ResponseWriter, r *http.Request, _ string) error {
	body, err := readBody(r, h.opts.MaxTxnSize, txnSizeDoc)
	if err != nil {
		return err
	}
	ops, err := decodeTxn(body, h.opts.MaxValueSize)
	if err != nil {
		return err
	}
	if len(ops) == 0 {
		return writeJSON(w, r, &txnResponse{})
	}
	var res []*state.TxnResult
	var errs []*state.TxnError
	if txnReadOnly(ops) {
		// A transaction that only reads is served as a read, as Consul
		// serves it: no log entry, ?stale and ?consistent honoured, and
		// the read headers, with the KV store's index. It does not block.
		ro, err := h.parseRead(query(r))
		if err != nil {
			return err
		}
		ro.index = 0
		err = h.read(w, r, ro, func(s *state.Store, _ watch.Set) (uint64, bool) {
			var idx uint64
			idx, res, errs = s.TxnRead(ops)
			return idx, true
		})
		if err != nil {
			return err
		}
	} else if res, errs, err = h.b.Txn(r.Context(), ops); err != nil {
		return err
	}
	if len(errs) > 0 {
		// A rolled-back transaction answers 409 with the same JSON
		// conventions as any other answer, ?pretty included (Consul
		// encodes its conflict body with the request's pretty setting).
		return writeJSONStatus(w, r, http.StatusConflict, &txnResponse{Errors: errs})
	}
	return writeTxnResults(w, r, res)
}

// writeTxnResults writes a committed transaction's answer. The lock
// recipe's transactions read the key and its queue, so the answer can hold
// many entries: it is built by hand, as KV reads are (kvjson.go), except
// for ?pretty and strings json.Marshal would escape.
func writeTxnResults(w http.ResponseWriter, r *http.Request, res []*state.TxnResult) error {
	if wantPretty(r) {
		return writeJSON(w, r, &txnResponse{Results: res})
	}
	n := 32
	for _, x := range res {
		if x != nil && x.KV != nil {
			n += 8 + entrySize(x.KV)
		}
	}
	buf, ok := appendTxnResults(make([]byte, 0, n), res)
	if !ok {
		return writeJSON(w, r, &txnResponse{Results: res})
	}
	return sendJSON(w, buf)
}
