package state_test

import (
	"strconv"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

// kvBenchStore returns a store holding n keys shaped like loadgen's put
// workload ("bench/<run>/put/<i>", 16-byte values) and the keys.
func kvBenchStore(b *testing.B, n int) (*fx, []string) {
	f := newFx(b)
	keys := make([]string, n)
	val := make([]byte, 16)
	for i := range keys {
		keys[i] = "bench/1a2b3c4d/put/" + strconv.Itoa(i)
		if _, err := f.s.KVS(f.next(), f.now, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: keys[i], Value: val}}); err != nil {
			b.Fatal(err)
		}
	}
	return f, keys
}

// BenchmarkKVSetBatch writes 5 keys per transaction into a store of 1,000
// (what the FSM does with a raft batch of PUTs at 32 clients); ns/op is per
// write.
func BenchmarkKVSetBatch(b *testing.B) {
	f, keys := kvBenchStore(b, 1000)
	val := []byte("0123456789abcdef")
	b.ReportAllocs()
	i := 0
	var batch *state.Batch
	for b.Loop() {
		if i%5 == 0 {
			batch = f.s.Batch()
		}
		val[0]++
		req := &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: keys[(i*7919)%len(keys)], Value: val}}
		if _, err := batch.KVS(f.next(), f.now, req); err != nil {
			b.Fatal(err)
		}
		i++
		if i%5 == 0 {
			batch.Commit()
		}
	}
	if i%5 != 0 {
		batch.Commit()
	}
}

// BenchmarkKVGet reads one key of 1,000.
func BenchmarkKVGet(b *testing.B) {
	f, keys := kvBenchStore(b, 1000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, e := f.s.KVGet(nil, keys[(i*7919)%len(keys)]); e == nil {
			b.Fatal("missing key")
		}
		i++
	}
}
