package server

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/fs"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/state"
)

// writeBig writes n values of size bytes to 8 keys under prefix in turn,
// then deletes them, as a burst of large values that is later cleaned up
// does: the state stays small while the log grows.
func writeBig(t *testing.T, s *Server, prefix string, n, size int) {
	t.Helper()
	val := []byte(strings.Repeat("x", size))
	for i := 0; i < n; i++ {
		key := prefix + strconv.Itoa(i%8)
		if _, _, err := s.KVS(context.Background(), &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: key, Value: val}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.KVS(context.Background(), &state.KVRequest{Op: state.OpDeleteTree, Entry: state.DirEntry{Key: prefix}}); err != nil {
		t.Fatal(err)
	}
}

// waitLogSize waits, up to 20 s of real time, for the log's segment files
// in dir to take at most limit bytes, and returns their size then.
func waitLogSize(t *testing.T, dir string, limit int64) int64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := segmentBytes(filepath.Join(dir, raftDirName))
		if err != nil {
			t.Fatal(err)
		}
		if n <= limit || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Finding (scale audit): raft bounds its log in entries (a snapshot every
// 16,384, 10,240 kept after it), so a burst of large values left the log
// at 2.1 GiB for a store that was empty again, until 17,000 more writes
// came (13 GiB at worst), replayed at every start. Past LogSizeLimit the
// server now snapshots and compacts the log itself; with the limit off,
// the same writes leave the log over it.
func TestLogSizeLimitCompactsALogOfLargeValues(t *testing.T) {
	const (
		segment = 64 << 10
		limit   = 1 << 20
	)
	for _, on := range []bool{true, false} {
		dir, _, cfg := segmentedConfig(t, fs.New(), segment)
		cfg.LogSizeLimit = limit
		if !on {
			cfg.LogSizeLimit = -1
		}
		s := startServer(t, cfg)
		// 96 values of 40 KiB: 3.75 MiB of log, far below raft's entry
		// counts.
		writeBig(t, s, "big/", 96, 40<<10)
		if err := putKey(s, "after"); err != nil {
			t.Fatal(err)
		}
		if !on {
			n, err := segmentBytes(filepath.Join(dir, raftDirName))
			if err != nil {
				t.Fatal(err)
			}
			if n <= limit+limit/8+segment {
				t.Fatalf("without a limit the log takes %d bytes; the test needs it over %d", n, limit)
			}
			continue
		}
		// The size is looked at every limit/8 of writes, so the log may
		// end up to that much (and a segment) over the limit.
		bound := int64(limit + limit/8 + segment)
		n := waitLogSize(t, dir, bound)
		if n > bound {
			t.Fatalf("the log takes %d bytes, over its limit of %d (and the slack of a look's step and a segment)", n, limit)
		}
		// The trim lends raft a TrailingLogs of a few entries (a quarter
		// of the limit) for its one snapshot, and gives raft's back after.
		deadline := time.Now().Add(20 * time.Second)
		for s.raft.ReloadableConfig().TrailingLogs != 10240 {
			if time.Now().After(deadline) {
				t.Fatalf("TrailingLogs left at %d after the trim, want raft's setting back (10240)", s.raft.ReloadableConfig().TrailingLogs)
			}
			time.Sleep(time.Millisecond)
		}
		if err := s.Shutdown(); err != nil {
			t.Fatal(err)
		}
		// The state comes back from the snapshot and what is left of the
		// log.
		s2 := startServer(t, cfg)
		_, e := s2.fsm.State().KVGet(nil, "after")
		if e == nil {
			t.Fatal("key written after the burst is gone after the restart")
		}
		if _, list := s2.fsm.State().KVList(nil, "big/"); len(list) != 0 {
			t.Fatalf("%d deleted keys came back", len(list))
		}
	}
}

// An in-memory server (-dev) bounds its log too: it held every entry until
// raft's entry counts came round, gigabytes after a burst of large values.
func TestLogSizeLimitInMemory(t *testing.T) {
	const limit = 1 << 20
	for _, on := range []bool{true, false} {
		cfg := testConfig("", clocktest.NewFake(epoch), nil)
		cfg.LogSizeLimit = limit
		if !on {
			cfg.LogSizeLimit = -1
		}
		s := startServer(t, cfg)
		writeBig(t, s, "big/", 96, 40<<10)
		deadline := time.Now().Add(20 * time.Second)
		for {
			n, err := s.stores.size()
			if err != nil {
				t.Fatal(err)
			}
			if !on {
				if n <= limit+limit/8 {
					t.Fatalf("without a limit the log holds %d bytes; the test needs it over %d", n, limit)
				}
				break
			}
			if n <= limit+limit/8 { // the slack of a look's step
				// The count is what the entries left hold.
				first, _ := s.stores.log.FirstIndex()
				last, _ := s.stores.log.LastIndex()
				var sum int64
				var l raft.Log
				for i := first; i <= last && first > 0; i++ {
					if s.stores.log.GetLog(i, &l) == nil {
						sum += int64(len(l.Data))
					}
				}
				if now, _ := s.stores.size(); now != sum {
					t.Fatalf("size says %d bytes, the entries %d..%d hold %d", now, first, last, sum)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the log holds %d bytes, over its limit of %d", n, limit)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// The log cache keeps small entries and not large ones, which raft reads
// back from the store.
func TestBoundedCacheSkipsLargeEntries(t *testing.T) {
	mem := raft.NewInmemStore()
	c := newBoundedCache(mem, newGrowth())
	small := &raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("small")}
	big := &raft.Log{Index: 2, Term: 1, Type: raft.LogCommand, Data: make([]byte, maxCachedEntry+1)}
	if err := c.StoreLogs([]*raft.Log{small, big}); err != nil {
		t.Fatal(err)
	}
	if c.ring[1] != small || c.ring[2] != nil {
		t.Fatalf("cache slots %v %v: want the small entry cached and the big one not", c.ring[1], c.ring[2])
	}
	var got raft.Log
	if err := c.GetLog(2, &got); err != nil || len(got.Data) != maxCachedEntry+1 {
		t.Fatalf("big entry read back: %v, %d bytes", err, len(got.Data))
	}
	// A big entry at a slot empties it, so that the slot never serves the
	// entry stored there before.
	wrap := &raft.Log{Index: 1 + logCacheSize, Term: 1, Type: raft.LogCommand, Data: make([]byte, maxCachedEntry+1)}
	if err := c.StoreLogs([]*raft.Log{wrap}); err != nil {
		t.Fatal(err)
	}
	if c.ring[1] != nil {
		t.Fatal("slot still holds the older entry")
	}
	if err := c.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	if err := c.GetLog(1, &got); err != raft.ErrLogNotFound {
		t.Fatalf("deleted entry: %v", err)
	}
}
