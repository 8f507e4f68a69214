package fsm

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// The body of TypeKVSBinary, the command every KV write through the HTTP
// API becomes. It carries exactly what the JSON body of TypeKVS does, but
// costs a fraction to build and to apply, without reflection and with two
// allocations (the strings) to decode:
//
//	op          one byte: kvOpCodes (1 set, 2 cas, 3 lock, ...)
//	LockIndex   uvarint
//	Flags       uvarint
//	CreateIndex uvarint
//	ModifyIndex uvarint
//	Key         uvarint length, bytes
//	Session     uvarint length, bytes
//	Value       uvarint (length+1, 0 for a nil value), bytes
//
// TypeKVS (JSON) stays: logs written before TypeKVSBinary existed replay
// through it, and EncodeKVS falls back to it for an op it has no code for.

// kvOpCodes number the ops of a KV request: the writes, and the reads and
// checks a transaction may also hold. Values are part of the log format:
// never renumber.
var kvOpCodes = map[state.KVOp]byte{
	state.OpSet:            1,
	state.OpCAS:            2,
	state.OpLock:           3,
	state.OpUnlock:         4,
	state.OpDelete:         5,
	state.OpDeleteCAS:      6,
	state.OpDeleteTree:     7,
	state.OpGet:            8,
	state.OpGetTree:        9,
	state.OpCheckIndex:     10,
	state.OpCheckSession:   11,
	state.OpCheckNotExists: 12,
	state.OpCheckLock:      13,
	state.OpCheckSequencer: 14,
	state.OpGetOrEmpty:     15,
}

// kvOps is kvOpCodes inverted (index = code).
var kvOps = [...]state.KVOp{1: state.OpSet, 2: state.OpCAS, 3: state.OpLock, 4: state.OpUnlock,
	5: state.OpDelete, 6: state.OpDeleteCAS, 7: state.OpDeleteTree, 8: state.OpGet,
	9: state.OpGetTree, 10: state.OpCheckIndex, 11: state.OpCheckSession,
	12: state.OpCheckNotExists, 13: state.OpCheckLock, 14: state.OpCheckSequencer,
	15: state.OpGetOrEmpty}

// lastWriteCode is the highest code of a write; the codes above it are
// the reads and checks only a transaction carries.
const lastWriteCode = 7

// EncodeKVS builds the command for a KV write: TypeKVSBinary, or TypeKVS
// (JSON) for an op without a binary code or that is not a write (which the
// store refuses either way).
func EncodeKVS(now time.Time, req *state.KVRequest) ([]byte, error) {
	code, ok := kvOpCodes[req.Op]
	if !ok || code > lastWriteCode {
		return Encode(TypeKVS, now, req)
	}
	out := header(TypeKVSBinary, now, kvSize(req))
	return appendKV(out, code, &req.Entry), nil
}

// The body of TypeTxnBinary, the command every transaction through the
// HTTP API becomes: the count of operations as a uvarint, then each
// operation's KV request encoded as a TypeKVSBinary body is. TypeTxn (JSON)
// stays for logs written before it, and for an operation EncodeTxn has no
// code for.

// EncodeTxn builds the command for a transaction: TypeTxnBinary, or TypeTxn
// (JSON) if an operation is not a KV request with a binary code.
func EncodeTxn(now time.Time, ops []*state.TxnOp) ([]byte, error) {
	n := binary.MaxVarintLen64
	for _, op := range ops {
		if op == nil || op.KV == nil {
			return Encode(TypeTxn, now, ops)
		}
		if _, ok := kvOpCodes[op.KV.Op]; !ok {
			return Encode(TypeTxn, now, ops)
		}
		n += kvSize(op.KV)
	}
	out := header(TypeTxnBinary, now, n)
	out = binary.AppendUvarint(out, uint64(len(ops)))
	for _, op := range ops {
		out = appendKV(out, kvOpCodes[op.KV.Op], &op.KV.Entry)
	}
	return out, nil
}

// decodeTxn decodes a TypeTxnBinary body. A malformed body panics, as an
// undecodable JSON body does.
func decodeTxn(idx uint64, body []byte) []*state.TxnOp {
	d := kvDecoder{b: body, idx: idx}
	n := d.uvarint()
	if n > uint64(len(body)) { // every operation takes at least one byte
		d.fail("operation count larger than the body")
	}
	ops := make([]*state.TxnOp, n)
	txops := make([]state.TxnOp, n)
	reqs := make([]state.KVRequest, n)
	for i := range ops {
		d.kvRequest(&reqs[i])
		txops[i].KV = &reqs[i]
		ops[i] = &txops[i]
	}
	if len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	return ops
}

// kvSize bounds the encoded size of req.
func kvSize(req *state.KVRequest) int {
	e := &req.Entry
	return 1 + 7*binary.MaxVarintLen64 + len(e.Key) + len(e.Session) + len(e.Value)
}

// appendKV appends the encoding of one KV request (op code and entry).
func appendKV(out []byte, code byte, e *state.DirEntry) []byte {
	out = append(out, code)
	out = binary.AppendUvarint(out, e.LockIndex)
	out = binary.AppendUvarint(out, e.Flags)
	out = binary.AppendUvarint(out, e.CreateIndex)
	out = binary.AppendUvarint(out, e.ModifyIndex)
	out = binary.AppendUvarint(out, uint64(len(e.Key)))
	out = append(out, e.Key...)
	out = binary.AppendUvarint(out, uint64(len(e.Session)))
	out = append(out, e.Session...)
	if e.Value == nil {
		out = binary.AppendUvarint(out, 0)
	} else {
		out = binary.AppendUvarint(out, uint64(len(e.Value))+1)
		out = append(out, e.Value...)
	}
	return out
}

// decodeKVS decodes a TypeKVSBinary body into req. req.Entry.Value points
// into body, which the log (and its cache) keeps: the state store copies a
// value before it keeps it. A malformed body panics, as an undecodable JSON
// body does.
func decodeKVS(idx uint64, body []byte, req *state.KVRequest) {
	d := kvDecoder{b: body, idx: idx}
	d.kvRequest(req)
	if len(d.b) != 0 {
		d.fail("trailing bytes")
	}
}

// kvRequest decodes one KV request (see appendKV) into req.
func (d *kvDecoder) kvRequest(req *state.KVRequest) {
	code := d.byte()
	if int(code) >= len(kvOps) || kvOps[code] == "" {
		panic(fmt.Sprintf("fsm: log entry %d: unknown KV op code %d", d.idx, code))
	}
	req.Op = kvOps[code]
	e := &req.Entry
	e.LockIndex = d.uvarint()
	e.Flags = d.uvarint()
	e.CreateIndex = d.uvarint()
	e.ModifyIndex = d.uvarint()
	e.Key = string(d.bytes(d.uvarint()))
	e.Session = string(d.bytes(d.uvarint()))
	if n := d.uvarint(); n > 0 {
		e.Value = d.bytes(n - 1)
	}
}

type kvDecoder struct {
	b   []byte
	idx uint64
}

func (d *kvDecoder) fail(what string) {
	panic(fmt.Sprintf("fsm: log entry %d: undecodable KV command: %s", d.idx, what))
}

func (d *kvDecoder) byte() byte {
	if len(d.b) == 0 {
		d.fail("truncated")
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *kvDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
	}
	d.b = d.b[n:]
	return v
}

func (d *kvDecoder) bytes(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail("truncated")
	}
	out := d.b[:n:n]
	d.b = d.b[n:]
	return out
}

// Results of KV writes that succeeded, shared: a Result is only read.
var (
	resultTrue  = &Result{OK: true}
	resultFalse = &Result{OK: false}
)

func kvResult(ok bool, err error) *Result {
	switch {
	case err != nil:
		return &Result{OK: ok, Err: err}
	case ok:
		return resultTrue
	}
	return resultFalse
}
