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

// BenchmarkKVListTombstones lists a prefix holding 3 live keys and the
// tombstones of n deleted ones, as a semaphore's or lock queue's prefix
// has after a few minutes of contenders coming and going.
func BenchmarkKVListTombstones(b *testing.B) {
	for _, n := range []int{0, 1000, 100000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			f := newFx(b)
			batch := f.s.Batch()
			for i := range n {
				k := "service/sem/gone-" + strconv.Itoa(i)
				if _, err := batch.KVS(f.next(), f.now, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: k}}); err != nil {
					b.Fatal(err)
				}
				if _, err := batch.KVS(f.next(), f.now, &state.KVRequest{Op: state.OpDelete, Entry: state.DirEntry{Key: k}}); err != nil {
					b.Fatal(err)
				}
			}
			batch.Commit()
			for _, k := range []string{"service/sem/.lock", "service/sem/a", "service/sem/b", "service/other"} {
				f.set(k, "v")
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, es := f.s.KVList(nil, "service/sem/"); len(es) != 3 {
					b.Fatalf("%d entries", len(es))
				}
			}
		})
	}
}
