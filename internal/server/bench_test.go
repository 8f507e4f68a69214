package server

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"testing"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/state"
)

// BenchmarkKVSetDurable measures committed PUTs through raft on durable
// storage (raft-wal, fsync per batch), without HTTP, from 32 goroutines.
func BenchmarkKVSetDurable(b *testing.B) {
	s := newBenchServer(b)
	var n atomic.Int64
	b.SetParallelism(16) // 2 cores x 16 = 32 writers
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			i := n.Add(1)
			req := &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{
				Key: "bench/" + strconv.FormatInt(i%1000, 10), Value: []byte(strconv.FormatInt(i, 10))}}
			if ok, _, err := s.KVS(ctx, req); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
}

func newBenchServer(b *testing.B) *Server {
	b.Helper()
	dir := b.TempDir()
	s, err := New(Config{NodeName: "bench", DataDir: dir, RaftAddr: "127.0.0.1:0", Clock: clock.Real(),
		Logger: hclog.NewNullLogger()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 10e9)
	defer cancel()
	if err := s.WaitForLeader(ctx); err != nil {
		b.Fatal(err)
	}
	return s
}
