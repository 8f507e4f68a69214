package fsm_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/state"
)

// BenchmarkApplyKVSet measures one committed PUT through the FSM: decode
// the envelope, apply to the store, return the result.
func BenchmarkApplyKVSet(b *testing.B) {
	f := fsm.New()
	now := time.Unix(0, 0)
	logs := make([][]byte, 1000)
	for i := range logs {
		data, err := fsm.Encode(fsm.TypeKVS, now, &state.KVRequest{Op: state.OpSet,
			Entry: state.DirEntry{Key: "bench/key/" + strconv.Itoa(i), Value: []byte("0123456789abcdef")}})
		if err != nil {
			b.Fatal(err)
		}
		logs[i] = data
	}
	applyAll(b, f, logs)
}

// BenchmarkApplyKVSetBinary is BenchmarkApplyKVSet with the binary
// command the server writes (TypeKVSBinary).
func BenchmarkApplyKVSetBinary(b *testing.B) {
	f := fsm.New()
	now := time.Unix(0, 0)
	logs := make([][]byte, 1000)
	for i := range logs {
		data, err := fsm.EncodeKVS(now, &state.KVRequest{Op: state.OpSet,
			Entry: state.DirEntry{Key: "bench/key/" + strconv.Itoa(i), Value: []byte("0123456789abcdef")}})
		if err != nil {
			b.Fatal(err)
		}
		logs[i] = data
	}
	applyAll(b, f, logs)
}

// benchApplyTxn applies transactions shaped like the lock recipe's
// queueing step (a check that the queue entry does not exist, a set of
// it, a read of the lock key), encoded by enc.
func benchApplyTxn(b *testing.B, enc func(time.Time, []*state.TxnOp) ([]byte, error)) {
	f := fsm.New()
	now := time.Unix(0, 0)
	logs := make([][]byte, 1000)
	for i := range logs {
		q := "locks/l/.queue/" + strconv.Itoa(i)
		data, err := enc(now, []*state.TxnOp{
			{KV: &state.KVRequest{Op: state.OpCheckNotExists, Entry: state.DirEntry{Key: q}}},
			{KV: &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: q, Value: []byte("adf4238a-882b-9ddc-4a9d-5b6758e4159e")}}},
			{KV: &state.KVRequest{Op: state.OpGet, Entry: state.DirEntry{Key: "locks/l"}}},
		})
		if err != nil {
			b.Fatal(err)
		}
		logs[i] = data
	}
	applyAll(b, f, logs)
}

// BenchmarkApplyTxnJSON applies the JSON transaction command (TypeTxn).
func BenchmarkApplyTxnJSON(b *testing.B) {
	benchApplyTxn(b, func(now time.Time, ops []*state.TxnOp) ([]byte, error) {
		return fsm.Encode(fsm.TypeTxn, now, ops)
	})
}

// BenchmarkApplyTxnBinary applies the binary one the server writes
// (TypeTxnBinary).
func BenchmarkApplyTxnBinary(b *testing.B) { benchApplyTxn(b, fsm.EncodeTxn) }

// applyAll is the timed part of the apply benchmarks: f applies logs, in
// turn, b.N times.
func applyAll(b *testing.B, f *fsm.FSM, logs [][]byte) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: logs[i%len(logs)]})
	}
}
