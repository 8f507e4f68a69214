package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/state"
)

// compactingTuning keeps only two log entries behind a snapshot, so a
// snapshot of a few writes already removes the start of the log.
func compactingTuning(c *raft.Config) { c.TrailingLogs = 2 }

// snapshotAndCompact writes n keys through s, takes a snapshot and checks
// that the log no longer starts at index 1.
func snapshotAndCompact(t *testing.T, s *Server, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		req := &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: fmt.Sprintf("k%d", i), Value: []byte("v")}}
		if ok, _, err := s.KVS(ctx, req); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if first, err := s.stores.log.FirstIndex(); err != nil || first <= 1 {
		t.Fatalf("log starts at %d (%v) after the snapshot; the test needs it compacted", first, err)
	}
}

// newNoPanic is New, with a panic turned into a test failure.
func newNoPanic(t *testing.T, cfg Config) (s *Server, err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("New panicked instead of returning an error: %v", p)
		}
	}()
	return New(cfg)
}

// TestDamagedSnapshotIsAnError: when the start of the log has been
// compacted into a snapshot and that snapshot cannot be used (its metadata
// unreadable, its state failing its checksum, or the directory emptied),
// the server cannot rebuild its state. New must say so with an error
// naming the data directory, not panic inside raft with a stack trace
// (raft.NewRaft panics when the log entry after the snapshot it restored,
// or index 1 if none, is missing).
func TestDamagedSnapshotIsAnError(t *testing.T) {
	for _, damage := range []struct {
		name string
		do   func(t *testing.T, snapDir string)
	}{
		{"unreadable metadata", func(t *testing.T, snapDir string) {
			metas, _ := filepath.Glob(filepath.Join(snapDir, "*", "meta.json"))
			if len(metas) == 0 {
				t.Fatal("no snapshot metadata to damage")
			}
			for _, m := range metas {
				if err := os.WriteFile(m, []byte(`{"Vers`), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"snapshot that fails its checksum", func(t *testing.T, snapDir string) {
			states, _ := filepath.Glob(filepath.Join(snapDir, "*", "state.bin"))
			if len(states) == 0 {
				t.Fatal("no snapshot state to damage")
			}
			for _, p := range states {
				b, err := os.ReadFile(p)
				if err != nil || len(b) < 20 {
					t.Fatalf("snapshot state %s: %d bytes, %v", p, len(b), err)
				}
				b[len(b)/2] ^= 0xff
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"snapshots removed", func(t *testing.T, snapDir string) {
			entries, err := os.ReadDir(snapDir)
			if err != nil || len(entries) == 0 {
				t.Fatalf("no snapshot to remove: %v", err)
			}
			for _, e := range entries {
				if err := os.RemoveAll(filepath.Join(snapDir, e.Name())); err != nil {
					t.Fatal(err)
				}
			}
		}},
	} {
		t.Run(damage.name, func(t *testing.T) {
			dir := t.TempDir()
			clk := clocktest.NewFake(epoch)
			s := newTunedServer(t, dir, clk, compactingTuning)
			snapshotAndCompact(t, s, 10)
			if err := s.Shutdown(); err != nil {
				t.Fatal(err)
			}
			damage.do(t, filepath.Join(dir, snapshotDirName))

			s2, err := newNoPanic(t, testConfig(dir, clk, compactingTuning))
			if err == nil {
				s2.Shutdown()
				t.Fatal("New started on a log whose start is in no usable snapshot")
			}
			if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "damaged") {
				t.Fatalf("error %q does not say which data directory is damaged", err)
			}
			// The stores were closed: the directory can be opened again.
			st, err := openStores(dir, nil)
			if err != nil {
				t.Fatalf("data directory still held after the failed start: %v", err)
			}
			closeStores(t, st)
		})
	}
}

// TestWritesResumeAfterAFailedLogWrite: a write that fails because the
// raft log cannot be written (here half written, then ENOSPC, as on a full
// disk) is refused with the error, and once the disk takes writes again the
// server leads and writes again, without a restart. Before, raft-wal kept
// the failed entries in its index, every later append was refused as
// non-monotonic, and the server answered "No cluster leader" until it was
// restarted.
func TestWritesResumeAfterAFailedLogWrite(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	vfs := newFaultFS()
	cfg := testConfig(t.TempDir(), clk, nil)
	cfg.logFS = vfs
	s := startServer(t, cfg)
	ctx := context.Background()
	put := func(k string) (bool, error) {
		ok, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: k, Value: []byte(k)}})
		return ok, err
	}
	if ok, err := put("before"); !ok || err != nil {
		t.Fatal(ok, err)
	}

	vfs.fault.Store(faultTornWrite)
	if ok, err := put("lost"); ok || err == nil {
		t.Fatalf("a write to a full disk = %v, %v; want an error", ok, err)
	}
	vfs.fault.Store(faultNone)

	// raft stepped down on the failure and elects itself again; the leader
	// loop retries a failed barrier after a second of the server's clock.
	deadline := time.Now().Add(15 * time.Second)
	for {
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := s.WaitForLeader(wctx)
		cancel()
		if err == nil {
			if ok, err := put("after"); ok && err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the server never wrote again after the disk took writes again")
		}
		clk.Advance(time.Second)
	}
	for _, k := range []string{"before", "after"} {
		if _, e := s.State().KVGet(nil, k); e == nil {
			t.Fatalf("%s missing", k)
		}
	}
}

// TestDataDirOfAnotherNode: a data directory keeps the raft configuration
// of the server that made it, whose only voter is that server's node name.
// Started under another name (the host was renamed and -node defaults to
// the host name, or -node was forgotten), a server is not in that
// configuration and can never elect itself: before, it ran on answering
// "No cluster leader" to everything, with one warning in its log. It must
// refuse to start and say which node name the directory belongs to.
func TestDataDirOfAnotherNode(t *testing.T) {
	dir := t.TempDir()
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, dir, clk)
	if ok, _, err := s.KVS(context.Background(), &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "k", Value: []byte("v")}}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(dir, clk, nil)
	cfg.NodeName = "renamed"
	s2, err := newNoPanic(t, cfg)
	if err == nil {
		s2.Shutdown()
		t.Fatal("a server started on the data directory of another node")
	}
	for _, want := range []string{dir, `"node1"`, `"renamed"`} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %s", err, want)
		}
	}
	// Nothing was changed or left open: the right name starts.
	s3 := newTestServer(t, dir, clk)
	if _, e := s3.State().KVGet(nil, "k"); e == nil {
		t.Fatal("k lost")
	}
}

const crashHelperDirEnv = "HOLDFAST_CRASH_HELPER_DIR"

// crashTuning snapshots every 64 entries, checked every 10ms, and keeps 16
// entries behind each: a few hundred writes go through many snapshots and
// log compactions.
func crashTuning(c *raft.Config) {
	c.SnapshotThreshold = 64
	c.SnapshotInterval = 10 * time.Millisecond
	c.TrailingLogs = 16
}

// crashKeys is how many keys the crash helper cycles through.
const crashKeys = 50

// TestCrashHelperProcess is not a test on its own: TestCrashWhileSnapshotting
// runs the test binary again with only this function selected. It writes
// value i to key c/<i mod crashKeys> for i = 1, 2, ... and prints "ACK i"
// once write i is acknowledged, until it is killed.
func TestCrashHelperProcess(t *testing.T) {
	dir := os.Getenv(crashHelperDirEnv)
	if dir == "" {
		t.Skip("helper for TestCrashWhileSnapshotting")
	}
	s := newTunedServer(t, dir, clocktest.NewFake(epoch), crashTuning)
	ctx := context.Background()
	last := uint64(0)
	if _, e := s.State().KVGet(nil, "c/last"); e != nil {
		fmt.Sscan(string(e.Value), &last)
	}
	for i := last + 1; ; i++ {
		v := []byte(fmt.Sprint(i))
		ops := []*state.TxnOp{
			{KV: &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: fmt.Sprintf("c/%d", i%crashKeys), Value: v}}},
			{KV: &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "c/last", Value: v}}},
		}
		if _, errs, err := s.Txn(ctx, ops); err != nil || len(errs) > 0 {
			fmt.Printf("FAILED %d: %v %v\n", i, err, errs)
			return
		}
		fmt.Printf("ACK %d\n", i)
	}
}

// TestCrashWhileSnapshotting: a server writing as fast as it can, with a
// snapshot and a log compaction every 64 entries, is killed with SIGKILL
// (at some point of a write, a snapshot or a compaction), three times in a
// row on the same directory. After each kill the directory opens, and
// every acknowledged write is there: the last acknowledged value of each
// key, or the one write that was in flight.
func TestCrashWhileSnapshotting(t *testing.T) {
	if os.Getenv(crashHelperDirEnv) != "" {
		t.Skip("running as helper")
	}
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	var acked uint64 // last write acknowledged, over all runs
	for round := 1; round <= 3; round++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashHelperProcess$", "-test.v")
		cmd.Env = append(os.Environ(), crashHelperDirEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill after a number of acknowledgements that varies by round,
		// so the kills land at different points of the snapshot cycle.
		target := acked + uint64(300+37*round)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var n uint64
			if _, err := fmt.Sscanf(sc.Text(), "ACK %d", &n); err == nil {
				acked = n
				if n >= target {
					break
				}
			} else if strings.HasPrefix(sc.Text(), "FAILED") {
				t.Fatalf("round %d: helper: %s", round, sc.Text())
			}
		}
		cmd.Process.Kill()
		io.Copy(io.Discard, out)
		cmd.Wait()
		cancel()
		if acked < target {
			t.Fatalf("round %d: helper stopped at %d acknowledged writes, before %d:\n%s", round, acked, target, stderr.String())
		}

		s := newTunedServer(t, dir, clocktest.NewFake(epoch), crashTuning)
		for k := uint64(0); k < crashKeys; k++ {
			// The last acknowledged write to key k, and the next one,
			// which may have been in flight.
			want := acked - (acked+crashKeys-k)%crashKeys
			_, e := s.State().KVGet(nil, fmt.Sprintf("c/%d", k))
			var got uint64
			if e != nil {
				fmt.Sscan(string(e.Value), &got)
			}
			if got != want && got != want+crashKeys {
				t.Fatalf("round %d: c/%d = %d after SIGKILL; its last acknowledged write was %d (%d acknowledged in all)",
					round, k, got, want, acked)
			}
		}
		// The run went through snapshots and compactions, or the test
		// tested less than it says.
		if metas, err := s.stores.snaps.List(); err != nil || len(metas) == 0 {
			t.Fatalf("round %d: no snapshot was taken: %v", round, err)
		}
		if first, _ := s.stores.log.FirstIndex(); first <= 1 {
			t.Fatalf("round %d: the log was never compacted", round)
		}
		if err := s.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
}
