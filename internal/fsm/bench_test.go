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
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: logs[i%len(logs)]})
	}
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
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: logs[i%len(logs)]})
	}
}
