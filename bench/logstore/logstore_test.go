package logstore_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
)

// payloadSize approximates one encoded KV PUT command (key, value, lease and
// request metadata) as the FSM will see it in raft.Log.Data.
const payloadSize = 200

// logStore is what both candidates provide: raft's LogStore plus Close.
type logStore interface {
	raft.LogStore
	io.Closer
}

type backend struct {
	name string
	open func(tb testing.TB, dir string) logStore
}

// backends lists the candidates. Both are opened exactly as a production
// server would open them: fsync on every write, default tuning otherwise.
var backends = []backend{
	{name: "wal", open: openWAL},
	{name: "bolt", open: openBolt},
}

func openWAL(tb testing.TB, dir string) logStore {
	tb.Helper()
	w, err := wal.Open(dir, wal.WithLogger(hclog.NewNullLogger()))
	if err != nil {
		tb.Fatalf("open raft-wal: %v", err)
	}
	return w
}

func openBolt(tb testing.TB, dir string) logStore {
	tb.Helper()
	s, err := raftboltdb.New(raftboltdb.Options{
		Path:   filepath.Join(dir, "raft.db"),
		NoSync: false, // spelled out: the comparison is only fair with fsync on
	})
	if err != nil {
		tb.Fatalf("open raft-boltdb: %v", err)
	}
	return s
}

// openStore opens a fresh store in a per-benchmark directory on the real
// disk and arranges for it to be closed when the benchmark ends.
func openStore(b *testing.B, be backend) logStore {
	b.Helper()
	s := be.open(b, b.TempDir())
	b.Cleanup(func() {
		if err := s.Close(); err != nil {
			b.Errorf("close %s: %v", be.name, err)
		}
	})
	return s
}

// newBatch returns n log entries with random (incompressible) payloads.
// Callers renumber them with setIndexes before each store call; both stores
// encode the entries during StoreLogs, so reusing the structs is safe.
func newBatch(rng *rand.Rand, n int) []*raft.Log {
	logs := make([]*raft.Log, n)
	for i := range logs {
		data := make([]byte, payloadSize)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		logs[i] = &raft.Log{
			Term:       3,
			Type:       raft.LogCommand,
			Data:       data,
			AppendedAt: time.Now(),
		}
	}
	return logs
}

// setIndexes numbers the batch consecutively from first and returns the
// index following the last entry.
func setIndexes(logs []*raft.Log, first uint64) uint64 {
	for i, l := range logs {
		l.Index = first + uint64(i)
	}
	return first + uint64(len(logs))
}

// fill appends count entries starting at first, in batches of batch, and
// returns the next free index.
func fill(b *testing.B, s logStore, rng *rand.Rand, first uint64, count, batch int) uint64 {
	b.Helper()
	logs := newBatch(rng, batch)
	next := first
	for done := 0; done < count; done += batch {
		n := min(batch, count-done)
		next = setIndexes(logs[:n], next)
		if err := s.StoreLogs(logs[:n]); err != nil {
			b.Fatalf("fill: %v", err)
		}
	}
	return next
}

// BenchmarkStoreLogs measures one durable append of a batch of entries, the
// operation on the leader's and followers' commit path. raft hands the log
// store everything queued since the previous write, so the batch size grows
// with load: 1 is an idle cluster, 128 a busy one.
func BenchmarkStoreLogs(b *testing.B) {
	for _, be := range backends {
		for _, batch := range []int{1, 8, 32, 128} {
			b.Run(fmt.Sprintf("store=%s/batch=%d", be.name, batch), func(b *testing.B) {
				s := openStore(b, be)
				rng := rand.New(rand.NewPCG(1, uint64(batch)))
				logs := newBatch(rng, batch)
				next := uint64(1)
				b.SetBytes(int64(batch * payloadSize))
				ops := 0
				for b.Loop() {
					next = setIndexes(logs, next)
					if err := s.StoreLogs(logs); err != nil {
						b.Fatal(err)
					}
					ops++
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ops*batch), "ns/entry")
			})
		}
	}
}

// BenchmarkGetLog measures reading one entry back by index from a log of
// 10,000 entries, as replication to a lagging follower does. The stores are
// used bare here; the server puts raft.NewLogCache in front of either one.
func BenchmarkGetLog(b *testing.B) {
	const entries = 10_000
	for _, be := range backends {
		b.Run("store="+be.name, func(b *testing.B) {
			s := openStore(b, be)
			rng := rand.New(rand.NewPCG(2, 2))
			fill(b, s, rng, 1, entries, 500)
			var out raft.Log
			for b.Loop() {
				idx := 1 + rng.Uint64N(entries)
				if err := s.GetLog(idx, &out); err != nil {
					b.Fatal(err)
				}
				if out.Index != idx {
					b.Fatalf("GetLog(%d) returned index %d", idx, out.Index)
				}
			}
		})
	}
}

// BenchmarkDeleteRange measures the log truncation raft performs after a
// snapshot: a prefix of the log is removed while the newest trailing entries
// are kept for followers that are slightly behind. Each operation first
// appends one snapshot interval of new entries (untimed) and then removes the
// same number of the oldest ones (timed), so the store stays in the steady
// state a long-running server sees, with the free space and segment churn
// that follows from it.
func BenchmarkDeleteRange(b *testing.B) {
	const (
		trailing = 10_240 // raft.DefaultConfig().TrailingLogs
		interval = 4_096  // entries written between two snapshots
		batch    = 512    // batch size used to write the untimed part
	)
	for _, be := range backends {
		b.Run("store="+be.name, func(b *testing.B) {
			s := openStore(b, be)
			rng := rand.New(rand.NewPCG(3, 3))
			first := uint64(1)
			next := fill(b, s, rng, first, trailing, batch)
			ops := 0
			for b.Loop() {
				b.StopTimer()
				next = fill(b, s, rng, next, interval, batch)
				b.StartTimer()
				if err := s.DeleteRange(first, first+interval-1); err != nil {
					b.Fatal(err)
				}
				first += interval
				ops++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ops*interval), "ns/entry")
			b.StopTimer()
			got, err := s.FirstIndex()
			if err != nil || got != first {
				b.Fatalf("FirstIndex after truncation = %d, %v; want %d", got, err, first)
			}
		})
	}
}
