package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/internal/state"
)

func TestEncodeKVSRoundTrip(t *testing.T) {
	now := time.Unix(1700000000, 123456789)
	reqs := []*state.KVRequest{
		{Op: state.OpSet, Entry: state.DirEntry{Key: "a", Value: []byte("v")}},
		{Op: state.OpSet, Entry: state.DirEntry{Key: "empty", Value: []byte{}}},
		{Op: state.OpSet, Entry: state.DirEntry{Key: "nil"}},
		{Op: state.OpCAS, Entry: state.DirEntry{Key: "c", ModifyIndex: 1<<64 - 1, Flags: 42, Value: bytes.Repeat([]byte{0xff}, 300)}},
		{Op: state.OpLock, Entry: state.DirEntry{Key: "l/é", Session: "adf4238a-882b-9ddc-4a9d-5b6758e4159e", Value: []byte("x")}},
		{Op: state.OpUnlock, Entry: state.DirEntry{Key: "l", Session: "s", LockIndex: 7}},
		{Op: state.OpDelete, Entry: state.DirEntry{Key: "d"}},
		{Op: state.OpDeleteCAS, Entry: state.DirEntry{Key: "d", ModifyIndex: 9}},
		{Op: state.OpDeleteTree, Entry: state.DirEntry{Key: ""}},
		{Op: state.OpSet, Entry: state.DirEntry{LockIndex: 1, Key: "all", Flags: 2, Value: []byte("3"), Session: "4", CreateIndex: 5, ModifyIndex: 6}},
	}
	for _, req := range reqs {
		data, err := EncodeKVS(now, req)
		if err != nil {
			t.Fatal(err)
		}
		if Type(data[1]) != TypeKVSBinary {
			t.Fatalf("%v: type %d", req.Op, data[1])
		}
		typ, at, body := envelope(&raft.Log{Data: data})
		if typ != TypeKVSBinary || !at.Equal(now) {
			t.Fatalf("envelope %v %v", typ, at)
		}
		var got state.KVRequest
		decodeKVS(1, body, &got)
		if !reflect.DeepEqual(&got, req) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, *req)
		}
	}
	// An op without a code (a read op, or one added later) goes as JSON.
	data, err := EncodeKVS(now, &state.KVRequest{Op: state.OpGet, Entry: state.DirEntry{Key: "k"}})
	if err != nil || Type(data[1]) != TypeKVS {
		t.Fatalf("fallback: %v %v", data, err)
	}
}

func TestKVOpCodesInverse(t *testing.T) {
	if len(kvOpCodes) != 15 {
		t.Fatalf("%d codes", len(kvOpCodes))
	}
	for op, c := range kvOpCodes {
		if kvOps[c] != op {
			t.Fatalf("code %d: %q != %q", c, kvOps[c], op)
		}
	}
}

func TestDecodeKVSMalformedPanics(t *testing.T) {
	good, _ := EncodeKVS(time.Unix(0, 0), &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "key", Value: []byte("value")}})
	body := bodyOf(good)
	bad := [][]byte{
		{},
		{0},
		{99},
		body[:len(body)-1],
		append(append([]byte(nil), body...), 0),
		{1, 0x80},
	}
	for _, b := range bad {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.HasPrefix(fmt.Sprint(r), "fsm: log entry 5") {
					t.Errorf("body %x: panic %v", b, r)
				}
			}()
			var req state.KVRequest
			decodeKVS(5, b, &req)
		}()
	}
}

// toBinary rewrites the TypeKVS (JSON) entries of logs as TypeKVSBinary
// ones with the same time, each with probability p.
func toBinary(t *testing.T, logs []*raft.Log, r *rand.Rand, p float64) []*raft.Log {
	out := make([]*raft.Log, len(logs))
	for i, l := range logs {
		out[i] = l
		if Type(l.Data[1]) != TypeKVS || r.Float64() >= p {
			continue
		}
		var req state.KVRequest
		if err := json.Unmarshal(bodyOf(l.Data), &req); err != nil {
			t.Fatal(err)
		}
		now := time.Unix(0, int64(binary.BigEndian.Uint64(l.Data[2:headerLen])))
		data, err := EncodeKVS(now, &req)
		if err != nil {
			t.Fatal(err)
		}
		c := *l
		c.Data = data
		out[i] = &c
	}
	return out
}

func genKVLogs(seed uint64, n int) []*raft.Log {
	r := rand.New(rand.NewPCG(seed, 7))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var logs []*raft.Log
	add := func(typ Type, body interface{}) {
		data, err := Encode(typ, now, body)
		if err != nil {
			panic(err)
		}
		logs = append(logs, &raft.Log{Index: uint64(len(logs) + 1), Type: raft.LogCommand, Data: data})
	}
	add(TypeRegister, &state.RegisterRequest{Node: "n1", Address: "127.0.0.1"})
	add(TypeSessionCreate, &state.Session{ID: "s1", Node: "n1", Behavior: "release", LockDelay: time.Second})
	add(TypeSessionCreate, &state.Session{ID: "s2", Node: "n1", Behavior: "delete"})
	keys := []string{"a", "b", "d/e", "d/f", "g"}
	ops := []state.KVOp{state.OpSet, state.OpCAS, state.OpLock, state.OpUnlock, state.OpDelete, state.OpDeleteCAS, state.OpDeleteTree}
	for i := 0; i < n; i++ {
		now = now.Add(time.Duration(r.IntN(1500)) * time.Millisecond)
		e := state.DirEntry{Key: keys[r.IntN(len(keys))], Flags: uint64(r.IntN(3))}
		switch r.IntN(3) {
		case 0:
		case 1:
			e.Value = []byte{}
		default:
			e.Value = []byte(fmt.Sprint(i))
		}
		op := ops[r.IntN(len(ops))]
		switch op {
		case state.OpCAS, state.OpDeleteCAS:
			e.ModifyIndex = uint64(r.IntN(len(logs) + 2))
		case state.OpLock:
			e.Session = []string{"s1", "s2", "nope"}[r.IntN(3)]
		case state.OpUnlock:
			e.Session = []string{"s1", "s2"}[r.IntN(2)]
			e.LockIndex = uint64(r.IntN(3))
		case state.OpDeleteTree:
			e.Key = e.Key[:r.IntN(len(e.Key)+1)]
		}
		if r.IntN(30) == 0 {
			add(TypeSessionDestroy, SessionDestroy{ID: []string{"s1", "s2"}[r.IntN(2)]})
			add(TypeSessionCreate, &state.Session{ID: "s1", Node: "n1", Behavior: "release", LockDelay: time.Second})
		}
		add(TypeKVS, &state.KVRequest{Op: op, Entry: e})
	}
	return logs
}

func persist(t *testing.T, f *FSM) []byte {
	var buf bytes.Buffer
	if err := f.State().Snapshot().Persist(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func resultString(v interface{}) string {
	res, ok := v.(*Result)
	if !ok || res == nil {
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("%v %v", res.OK, res.Err)
}

// A log of JSON KV writes (as every log written before TypeKVSBinary is)
// and the same log with some or all of them binary must give the same
// results and the same state, applied one by one or in batches.
func TestKVSBinaryEqualsJSON(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		jsonLogs := genKVLogs(seed, 300)
		r := rand.New(rand.NewPCG(seed, 3))
		for _, p := range []float64{0, 0.5, 1} {
			logs := toBinary(t, jsonLogs, r, p)
			ref, one, batched := New(), New(), New()
			for i := range logs {
				want := resultString(ref.Apply(jsonLogs[i]))
				if got := resultString(one.Apply(logs[i])); got != want {
					t.Fatalf("seed %d p %v: entry %d: %s, JSON gives %s", seed, p, i, got, want)
				}
			}
			for i := 0; i < len(logs); {
				n := min(1+r.IntN(30), len(logs)-i)
				batched.ApplyBatch(logs[i : i+n])
				i += n
			}
			if !bytes.Equal(persist(t, ref), persist(t, one)) || !bytes.Equal(persist(t, ref), persist(t, batched)) {
				t.Fatalf("seed %d p %v: state differs from the JSON log's", seed, p)
			}
		}
	}
}

// The state must not keep a value that points into the log entry (raft's
// log cache holds on to it, and it must not change under a reader).
func TestKVSBinaryValueCopied(t *testing.T) {
	f := New()
	data, _ := EncodeKVS(time.Unix(0, 0), &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "k", Value: []byte("abc")}})
	f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: data})
	for i := range data {
		data[i] = 'X'
	}
	if _, e := f.State().KVGet(nil, "k"); e == nil || string(e.Value) != "abc" || e.Key != "k" {
		t.Fatalf("entry %+v", e)
	}
}

func FuzzKVSBinary(f *testing.F) {
	f.Add(uint8(1), "k", "", []byte("v"), uint64(0), uint64(0), uint64(0), uint64(0), false)
	f.Fuzz(func(t *testing.T, op uint8, key, sess string, val []byte, li, fl, ci, mi uint64, nilVal bool) {
		if nilVal {
			val = nil
		} else if val == nil {
			val = []byte{}
		}
		ops := []state.KVOp{state.OpSet, state.OpCAS, state.OpLock, state.OpUnlock, state.OpDelete, state.OpDeleteCAS, state.OpDeleteTree}
		req := &state.KVRequest{Op: ops[int(op)%len(ops)], Entry: state.DirEntry{LockIndex: li, Key: key, Flags: fl,
			Value: val, Session: sess, CreateIndex: ci, ModifyIndex: mi}}
		data, err := EncodeKVS(time.Unix(0, 1), req)
		if err != nil {
			t.Fatal(err)
		}
		var got state.KVRequest
		decodeKVS(1, bodyOf(data), &got)
		if !reflect.DeepEqual(&got, req) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, *req)
		}
	})
}

func TestEncodeTxnRoundTrip(t *testing.T) {
	now := time.Unix(1700000000, 5)
	var ops []*state.TxnOp
	for op, code := range kvOpCodes {
		ops = append(ops, &state.TxnOp{KV: &state.KVRequest{Op: op, Entry: state.DirEntry{
			Key: fmt.Sprint("k", code), Session: "s", LockIndex: uint64(code), ModifyIndex: 1<<64 - 1,
			Flags: 3, Value: []byte{code}}}})
	}
	ops = append(ops, &state.TxnOp{KV: &state.KVRequest{Op: state.OpGetTree, Entry: state.DirEntry{Key: ""}}})
	data, err := EncodeTxn(now, ops)
	if err != nil {
		t.Fatal(err)
	}
	typ, at, body := envelope(&raft.Log{Data: data})
	if typ != TypeTxnBinary || !at.Equal(now) {
		t.Fatalf("envelope %v %v", typ, at)
	}
	if got := decodeTxn(1, body); !reflect.DeepEqual(got, ops) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, ops)
	}
	// An operation that is not a KV request with a code goes as JSON.
	for _, bad := range [][]*state.TxnOp{{{}}, {{KV: &state.KVRequest{Op: "later"}}}} {
		data, err := EncodeTxn(now, append([]*state.TxnOp{ops[0]}, bad...))
		if err != nil || Type(data[1]) != TypeTxn {
			t.Fatalf("fallback: type %d, %v", data[1], err)
		}
	}
	// Malformed bodies panic, as an undecodable JSON body does.
	for _, b := range [][]byte{{}, {1}, {2, body[1]}, {200, 1}, append(append([]byte(nil), body...), 0), body[:len(body)-1]} {
		func() {
			defer func() {
				if recover() == nil {
					t.Fatalf("decodeTxn(%v) did not panic", b)
				}
			}()
			decodeTxn(1, b)
		}()
	}
}

// bodyOf is the body of an entry: after the header, before the checksum
// (version 2).
func bodyOf(data []byte) []byte {
	if data[0] >= 2 {
		return data[headerLen : len(data)-crcLen]
	}
	return data[headerLen:]
}

// decodeOrPanic runs decode and returns the message it panicked with, if
// it did.
func decodeOrPanic(decode func()) (msg string, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			msg, panicked = fmt.Sprint(r), true
		}
	}()
	decode()
	return "", false
}

// Whatever bytes a log entry's binary KV or transaction body holds, the
// decoders either stop with a panic that names the entry (the state
// machine stops rather than apply it) or return requests that encode and
// decode back to themselves. FuzzKVSBinary only ever fed them what the
// encoder makes.
func FuzzKVSDecodeRaw(f *testing.F) {
	req := &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: "s", Value: []byte("v"), Flags: 3}}
	one, _ := EncodeKVS(time.Unix(0, 1), req)
	txn, _ := EncodeTxn(time.Unix(0, 1), []*state.TxnOp{{KV: req}, {KV: &state.KVRequest{Op: state.OpGet, Entry: state.DirEntry{Key: "x"}}}})
	f.Add(false, bodyOf(one))
	f.Add(true, bodyOf(txn))
	f.Add(true, []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, isTxn bool, body []byte) {
		const want = "fsm: log entry 7"
		if !isTxn {
			var got state.KVRequest
			if msg, p := decodeOrPanic(func() { decodeKVS(7, body, &got) }); p {
				if !strings.HasPrefix(msg, want) {
					t.Fatalf("decodeKVS panicked with %q, not naming the entry", msg)
				}
				return
			}
			var again state.KVRequest
			decodeKVS(7, appendKV(nil, kvOpCodes[got.Op], &got.Entry), &again)
			if !reflect.DeepEqual(again, got) {
				t.Fatalf("decoded %+v re-encodes to %+v", got, again)
			}
			return
		}
		var ops []*state.TxnOp
		if msg, p := decodeOrPanic(func() { ops = decodeTxn(7, body) }); p {
			if !strings.HasPrefix(msg, want) {
				t.Fatalf("decodeTxn panicked with %q, not naming the entry", msg)
			}
			return
		}
		data, err := EncodeTxn(time.Unix(0, 1), ops)
		if err != nil {
			t.Fatal(err)
		}
		typ, _, b := envelope(&raft.Log{Data: data})
		if typ != TypeTxnBinary {
			t.Fatalf("decoded transaction %+v re-encodes as type %d", ops, typ)
		}
		if again := decodeTxn(7, b); !reflect.DeepEqual(again, ops) {
			t.Fatalf("decoded transaction does not re-encode to itself: %+v vs %+v", ops, again)
		}
	})
}
