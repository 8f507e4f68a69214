package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/types"

	"github.com/holdfast/holdfast/internal/state"
)

// testLogs returns entries first..first+n-1 with distinct payloads.
func testLogs(first uint64, n int) []*raft.Log {
	logs := make([]*raft.Log, n)
	for i := range logs {
		idx := first + uint64(i)
		logs[i] = &raft.Log{
			Index: idx,
			Term:  2,
			Type:  raft.LogCommand,
			Data:  []byte(fmt.Sprintf("put /k/%d value-%d", idx, idx)),
		}
	}
	return logs
}

func checkLog(t *testing.T, s raft.LogStore, idx uint64) {
	t.Helper()
	var got raft.Log
	if err := s.GetLog(idx, &got); err != nil {
		t.Fatalf("GetLog(%d): %v", idx, err)
	}
	want := fmt.Sprintf("put /k/%d value-%d", idx, idx)
	if got.Index != idx || got.Term != 2 || got.Type != raft.LogCommand || string(got.Data) != want {
		t.Fatalf("GetLog(%d) = {Index:%d Term:%d Type:%v Data:%q}, want Data %q",
			idx, got.Index, got.Term, got.Type, got.Data, want)
	}
}

func checkRange(t *testing.T, s raft.LogStore, first, last uint64) {
	t.Helper()
	if got, err := s.FirstIndex(); err != nil || got != first {
		t.Fatalf("FirstIndex = %d, %v; want %d", got, err, first)
	}
	if got, err := s.LastIndex(); err != nil || got != last {
		t.Fatalf("LastIndex = %d, %v; want %d", got, err, last)
	}
	for i := first; i <= last; i++ {
		checkLog(t, s, i)
	}
}

func mustStore(t *testing.T, s raft.LogStore, logs []*raft.Log) {
	t.Helper()
	if err := s.StoreLogs(logs); err != nil {
		t.Fatalf("StoreLogs(%d..%d): %v", logs[0].Index, logs[len(logs)-1].Index, err)
	}
}

func closeStores(t *testing.T, s *stores) {
	t.Helper()
	if err := s.close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// writeSnapshot stores a snapshot with the given body through the raft API
// (term 2, the test servers' node1 the one voter) and returns its ID.
func writeSnapshot(t *testing.T, snaps raft.SnapshotStore, index uint64, body string) string {
	t.Helper()
	_, trans := raft.NewInmemTransport("node1")
	cfg := raft.Configuration{Servers: []raft.Server{{
		Suffrage: raft.Voter, ID: "node1", Address: trans.LocalAddr(),
	}}}
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, 2, cfg, 1, trans)
	if err != nil {
		t.Fatalf("snapshot create: %v", err)
	}
	if _, err := io.WriteString(sink, body); err != nil {
		t.Fatalf("snapshot write: %v", err)
	}
	if err := sink.Close(); err != nil {
		t.Fatalf("snapshot close: %v", err)
	}
	return sink.ID()
}

func checkSnapshot(t *testing.T, snaps raft.SnapshotStore, index uint64, body string) {
	t.Helper()
	metas, err := snaps.List()
	if err != nil || len(metas) == 0 {
		t.Fatalf("snapshot list = %v, %v; want one snapshot", metas, err)
	}
	if metas[0].Index != index {
		t.Fatalf("newest snapshot index = %d, want %d", metas[0].Index, index)
	}
	_, rc, err := snaps.Open(metas[0].ID)
	if err != nil {
		t.Fatalf("snapshot open: %v", err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil || string(got) != body {
		t.Fatalf("snapshot body = %q, %v; want %q", got, err, body)
	}
}

// openWithin opens the stores but fails the test if that takes longer than a
// lock wait could explain: bbolt waits forever on a held lock, and a hang in
// the middle of the package's tests is much harder to read.
func openWithin(t *testing.T, dir string) *stores {
	t.Helper()
	type result struct {
		s   *stores
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := openStores(dir, nil)
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("openStores(%q): %v", dir, r.err)
		}
		return r.s
	case <-time.After(30 * time.Second):
		t.Fatalf("openStores(%q) still blocked after 30s", dir)
		return nil
	}
}

func TestOpenStoresDiskSurvivesReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")

	s := openWithin(t, dir)
	for _, d := range []string{dir, filepath.Join(dir, raftDirName), filepath.Join(dir, snapshotDirName)} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o700 {
			t.Errorf("%s has mode %o, want 700", d, perm)
		}
	}
	// raft only deletes all logs after a snapshot restore when the store says
	// it is monotonic; the cache must pass that through from raft-wal.
	if m, ok := s.log.(raft.MonotonicLogStore); !ok || !m.IsMonotonic() {
		t.Errorf("log store %T does not report IsMonotonic", s.log)
	}

	// raft reads its term and vote before anything was ever written; a
	// missing key must come back as zero without an error.
	if v, err := s.stable.GetUint64([]byte("CurrentTerm")); err != nil || v != 0 {
		t.Fatalf("CurrentTerm on a new store = %d, %v; want 0, nil", v, err)
	}
	mustStore(t, s.log, testLogs(1, 1))
	mustStore(t, s.log, testLogs(2, 127))
	mustStore(t, s.log, testLogs(129, 72))
	if err := s.stable.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if err := s.stable.Set([]byte("LastVoteCand"), []byte("n3")); err != nil {
		t.Fatal(err)
	}
	writeSnapshot(t, s.snaps, 150, "state at 150")
	// Truncation after the snapshot, as raft does it.
	if err := s.log.DeleteRange(1, 100); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s.log, 101, 200)
	closeStores(t, s)
	// close is idempotent, so a deferred close after an explicit one is fine.
	closeStores(t, s)

	// Reopening in the same process also checks that close released every
	// file lock (raft-wal's own Close leaves its meta DB open).
	s = openWithin(t, dir)
	defer closeStores(t, s)
	checkRange(t, s.log, 101, 200)
	if v, err := s.stable.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("CurrentTerm = %d, %v; want 7", v, err)
	}
	if v, err := s.stable.Get([]byte("LastVoteCand")); err != nil || string(v) != "n3" {
		t.Fatalf("LastVoteCand = %q, %v; want n3", v, err)
	}
	checkSnapshot(t, s.snaps, 150, "state at 150")

	// Appending carries on from where the previous process stopped.
	mustStore(t, s.log, testLogs(201, 10))
	checkRange(t, s.log, 101, 210)
}

func TestOpenStoresInmem(t *testing.T) {
	s, err := openStores("", nil)
	if err != nil {
		t.Fatal(err)
	}
	mustStore(t, s.log, testLogs(1, 40))
	checkRange(t, s.log, 1, 40)
	if err := s.stable.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	if v, err := s.stable.GetUint64([]byte("CurrentTerm")); err != nil || v != 3 {
		t.Fatalf("CurrentTerm = %d, %v; want 3", v, err)
	}
	writeSnapshot(t, s.snaps, 30, "mem")
	checkSnapshot(t, s.snaps, 30, "mem")
	if err := s.log.DeleteRange(1, 20); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s.log, 21, 40)
	closeStores(t, s)

	// Nothing is shared between two in-memory opens.
	s2, err := openStores("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStores(t, s2)
	if last, err := s2.log.LastIndex(); err != nil || last != 0 {
		t.Fatalf("fresh in-memory LastIndex = %d, %v; want 0", last, err)
	}
}

// syncCheckFS wraps raft-wal's real file system and records, per segment
// file, whether bytes were written since that file's last successful Sync.
type syncCheckFS struct {
	types.VFS
	mu    sync.Mutex
	dirty map[string]bool
	syncs int
}

func (v *syncCheckFS) wrap(name string, f types.WritableFile, err error) (types.WritableFile, error) {
	if err != nil {
		return nil, err
	}
	return &syncCheckFile{WritableFile: f, fs: v, name: name}, nil
}

func (v *syncCheckFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	return v.wrap(name, f, err)
}

func (v *syncCheckFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	return v.wrap(name, f, err)
}

// unsynced returns the files with writes not yet synced, and the number of
// successful syncs so far.
func (v *syncCheckFS) unsynced() ([]string, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var names []string
	for n, d := range v.dirty {
		if d {
			names = append(names, n)
		}
	}
	return names, v.syncs
}

type syncCheckFile struct {
	types.WritableFile
	fs   *syncCheckFS
	name string
}

func (f *syncCheckFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	f.fs.dirty[f.name] = true
	f.fs.mu.Unlock()
	return f.WritableFile.WriteAt(p, off)
}

func (f *syncCheckFile) Sync() error {
	if err := f.WritableFile.Sync(); err != nil {
		return err
	}
	f.fs.mu.Lock()
	f.fs.dirty[f.name] = false
	f.fs.syncs++
	f.fs.mu.Unlock()
	return nil
}

// TestStoreLogsSyncsBeforeReturning checks the durability promise through
// the same code path openStores uses: after every StoreLogs returns, each
// byte raft-wal wrote to a segment file has been fsynced.
func TestStoreLogsSyncsBeforeReturning(t *testing.T) {
	vfs := &syncCheckFS{VFS: fs.New(), dirty: map[string]bool{}}
	s, err := openDiskStores(t.TempDir(), hclog.NewNullLogger(), vfs, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStores(t, s)

	next := uint64(1)
	for _, n := range []int{1, 1, 8, 32, 128, 3} {
		_, before := vfs.unsynced()
		mustStore(t, s.log, testLogs(next, n))
		next += uint64(n)
		dirty, after := vfs.unsynced()
		if len(dirty) > 0 {
			t.Fatalf("StoreLogs of %d entries returned with unsynced writes to %v", n, dirty)
		}
		if after == before {
			t.Fatalf("StoreLogs of %d entries returned without any fsync", n)
		}
	}
	checkRange(t, s.log, 1, next-1)
}

const helperDirEnv = "HOLDFAST_RAFTSTORE_HELPER_DIR"

// TestOpenStoresHelperProcess is not a test on its own: the lock test runs
// the test binary again with only this function selected, to open the stores
// from a second process. It reports the outcome on stdout.
func TestOpenStoresHelperProcess(t *testing.T) {
	dir := os.Getenv(helperDirEnv)
	if dir == "" {
		t.Skip("helper for TestOpenStoresLockedByOtherProcess")
	}
	s, err := openStores(dir, nil)
	if err != nil {
		fmt.Printf("OPEN-ERROR: %v\n", err)
		return
	}
	checkRange(t, s.log, 1, 5)
	closeStores(t, s)
	fmt.Println("OPEN-OK")
}

func runHelper(t *testing.T, dir string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestOpenStoresHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), helperDirEnv+"="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("second process still blocked after %v:\n%s", time.Since(start), out.String())
	}
	if err != nil {
		t.Fatalf("second process: %v\n%s", err, out.String())
	}
	return out.String()
}

// TestOpenStoresLockedByOtherProcess opens the stores here and then from a
// second process, which must be refused at once with a clear error. Once the
// first holder closes, the second process gets in.
func TestOpenStoresLockedByOtherProcess(t *testing.T) {
	if os.Getenv(helperDirEnv) != "" {
		t.Skip("running as helper")
	}
	dir := t.TempDir()
	s := openWithin(t, dir)
	mustStore(t, s.log, testLogs(1, 5))

	out := runHelper(t, dir)
	want := fmt.Sprintf("OPEN-ERROR: server: raft storage %s is already in use by pid %d", filepath.Join(dir, raftDirName), os.Getpid())
	if !strings.Contains(out, want) {
		t.Fatalf("second process output lacks %q:\n%s", want, out)
	}

	// A second open inside this process is refused too, rather than hanging.
	if s2, err := openStores(dir, nil); err == nil {
		s2.close()
		t.Fatal("second open in the same process succeeded")
	} else if !strings.Contains(err.Error(), "is already in use") {
		t.Fatalf("second open in the same process: %v", err)
	}

	closeStores(t, s)
	if out := runHelper(t, dir); !strings.Contains(out, "OPEN-OK") {
		t.Fatalf("open after the first holder closed failed:\n%s", out)
	}
}

// Faults faultFS injects into raft-wal's segment files.
const (
	faultNone      int32 = iota
	faultTornWrite       // a write stores half its bytes and fails with ENOSPC, as on a full disk
	faultSync            // writes go through, fsync fails with EIO
	faultCreate          // a new file cannot be created (ENOSPC), as on a full disk
)

// faultFS wraps raft-wal's real file system and fails segment writes or
// syncs as its fault says.
type faultFS struct {
	wrappingFS
	fault atomic.Int32
}

func newFaultFS() *faultFS {
	v := &faultFS{}
	v.wrappingFS = wrappingFS{VFS: fs.New(), wrap: func(f types.WritableFile) types.WritableFile {
		return &faultFile{WritableFile: f, fs: v}
	}}
	return v
}

// wrappingFS is raft-wal's file system with every file it opens for
// writing passed through wrap: how tests make log writes fail or wait.
type wrappingFS struct {
	types.VFS
	wrap func(types.WritableFile) types.WritableFile
}

func (v *faultFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	if v.fault.Load() == faultCreate {
		return nil, syscall.ENOSPC
	}
	return v.wrappingFS.Create(dir, name, size)
}

func (v *wrappingFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return v.wrap(f), nil
}

func (v *wrappingFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return v.wrap(f), nil
}

type faultFile struct {
	types.WritableFile
	fs *faultFS
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	if f.fs.fault.Load() == faultTornWrite {
		n, err := f.WritableFile.WriteAt(p[:len(p)/2], off)
		if err == nil {
			err = syscall.ENOSPC
		}
		return n, err
	}
	return f.WritableFile.WriteAt(p, off)
}

func (f *faultFile) Sync() error {
	if f.fs.fault.Load() == faultSync {
		return syscall.EIO
	}
	return f.WritableFile.Sync()
}

// TestAppendAfterFailedWrite: an append that fails on the disk (a full
// disk: half the batch written; or a failed fsync) leaves the log as it
// was, and once the disk is usable again the same indexes can be appended,
// as raft will do, and read back after a restart. With raft-wal v0.4.0 the
// failed entries stayed in its in-memory index and every later append was
// refused as non-monotonic until a restart: one full-disk moment left the
// server without a leader for good. v0.4.1 undoes a failed append.
func TestAppendAfterFailedWrite(t *testing.T) {
	for name, fault := range map[string]int32{"torn write": faultTornWrite, "failed fsync": faultSync} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			vfs := newFaultFS()
			s, err := openDiskStores(dir, hclog.NewNullLogger(), vfs, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer closeStores(t, s)
			mustStore(t, s.log, testLogs(1, 10))
			if err := s.stable.SetUint64([]byte("CurrentTerm"), 2); err != nil {
				t.Fatal(err)
			}

			vfs.fault.Store(fault)
			if err := s.log.StoreLogs(lostLogs(11, 5)); err == nil {
				t.Fatal("StoreLogs succeeded on a failing disk")
			}
			checkRange(t, s.log, 1, 10)

			vfs.fault.Store(faultNone)
			mustStore(t, s.log, testLogs(11, 5))
			mustStore(t, s.log, testLogs(16, 5))
			checkRange(t, s.log, 1, 20)
			if v, err := s.stable.GetUint64([]byte("CurrentTerm")); err != nil || v != 2 {
				t.Fatalf("CurrentTerm after the failed append = %d, %v; want 2", v, err)
			}
			closeStores(t, s)

			// What is on disk: the entries written after the failure.
			s = openWithin(t, dir)
			checkRange(t, s.log, 1, 20)
		})
	}
}

// lostLogs are entries first..first+n-1 of an append that fails.
func lostLogs(first uint64, n int) []*raft.Log {
	logs := testLogs(first, n)
	for _, l := range logs {
		l.Data = []byte("never acknowledged")
	}
	return logs
}

// TestOpenStoresRemovesUnfinishedSnapshots: raft writes a snapshot into
// "<id>.tmp" and renames it when complete; a process killed meanwhile
// leaves the .tmp directory behind. raft skips it on every listing and
// never removes it, so each crash during a snapshot used to leave a copy
// of the state on disk for good. Opening the stores (under the directory
// lock, so no snapshot is being written) removes them, and only them.
func TestOpenStoresRemovesUnfinishedSnapshots(t *testing.T) {
	dir := t.TempDir()
	s := openWithin(t, dir)
	writeSnapshot(t, s.snaps, 30, "done")
	closeStores(t, s)

	snapDir := filepath.Join(dir, snapshotDirName)
	unfinished := filepath.Join(snapDir, "2-45-1795327664835.tmp")
	if err := os.MkdirAll(unfinished, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(unfinished, "state.bin"), []byte("half a snap"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = openWithin(t, dir)
	defer closeStores(t, s)
	if _, err := os.Stat(unfinished); !os.IsNotExist(err) {
		t.Fatalf("unfinished snapshot still there after open: %v", err)
	}
	checkSnapshot(t, s.snaps, 30, "done")
}

// TestTornTailIsDropped: a crash in the middle of an append (power lost
// while the last batch was being written, so it was never acknowledged)
// leaves a segment whose last batch is damaged. Opening the directory drops
// that batch, keeps everything before it, and appends go on from there.
func TestTornTailIsDropped(t *testing.T) {
	dir := t.TempDir()
	s := openWithin(t, dir)
	mustStore(t, s.log, testLogs(1, 10))
	mustStore(t, s.log, lostLogs(11, 5))
	closeStores(t, s)

	seg, b := onlySegment(t, dir)
	end := len(bytes.TrimRight(b, "\x00"))
	last := bytes.LastIndex(b[:end], []byte("never acknowledged"))
	if last < 0 {
		t.Fatal("the last batch is not in the segment")
	}
	for i := last; i < last+8; i++ { // damage the last entry of the last batch
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}

	s = openWithin(t, dir)
	defer closeStores(t, s)
	checkRange(t, s.log, 1, 10)
	mustStore(t, s.log, testLogs(11, 5))
	checkRange(t, s.log, 1, 15)
}

// Finding: a data directory the agent's user may not write was reported
// as a bare "create DIR: mkdir DIR: permission denied". A refused
// permission now says what the operator can do. (Root, which CI runs the
// tests as, ignores directory permissions, so this checks the hint: given
// for a refused permission and for nothing else.)
func TestPermissionHint(t *testing.T) {
	perm := &os.PathError{Op: "mkdir", Path: "/x", Err: syscall.EACCES}
	if h := permissionHint(perm); !strings.Contains(h, "-data-dir") {
		t.Fatalf("hint for %v = %q", perm, h)
	}
	other := &os.PathError{Op: "mkdir", Path: "/x", Err: syscall.ENOSPC}
	if h := permissionHint(other); h != "" {
		t.Fatalf("hint for %v = %q, want none", other, h)
	}
}

// Finding (storage audit): when raft-wal could not create the next segment
// file (a full disk), it logged "rotate error" once and refused every
// later write as "segment is sealed", for good: the server held elections
// every second and answered "No cluster leader" even after the disk had
// room again, until someone restarted it. And a restart was then refused,
// with advice to move the data directory aside, because the segment the
// meta store listed was missing, though it had never held a write. The
// server now reports the failure (the agent stops on it), and the restart
// goes through with every acknowledged write.
func TestLogRotationFailureStopsAndRestartRecovers(t *testing.T) {
	vfs := newFaultFS()
	dir, _, cfg := segmentedConfig(t, vfs, 64<<10)
	s := startServer(t, cfg)
	vfs.fault.Store(faultCreate)

	var acked []string
	var failure error
	for i := 0; i < 2000 && failure == nil; i++ {
		key := fmt.Sprintf("k%04d", i)
		ok, _, err := s.KVS(context.Background(), &state.KVRequest{Op: state.OpSet,
			Entry: state.DirEntry{Key: key, Value: bytes.Repeat([]byte("x"), 512)}})
		if err == nil && ok {
			acked = append(acked, key)
		}
		select {
		case failure = <-s.Failed():
		default:
		}
	}
	if failure == nil {
		t.Fatalf("%d writes through a segment size of 64 KiB with no file creatable, and no failure reported", len(acked))
	}
	if !strings.Contains(failure.Error(), "could not start a new segment file") || !strings.Contains(failure.Error(), dir) {
		t.Fatalf("failure: %v", failure)
	}
	t.Logf("%d writes acknowledged before: %v", len(acked), failure)
	s.Shutdown()

	vfs.fault.Store(faultNone)
	s2, err := New(cfg)
	if err != nil {
		t.Fatalf("restart after the failed rotation: %v", err)
	}
	t.Cleanup(func() { s2.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s2.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range acked {
		if _, e := s2.State().KVGet(nil, k); e == nil {
			t.Fatalf("acknowledged key %s lost", k)
		}
	}
	if err := putKey(s2, "after"); err != nil {
		t.Fatalf("write after the restart: %v", err)
	}
}

// failingStable is a stable store whose writes fail, as on a disk that
// went read-only.
type failingStable struct{ raft.StableStore }

func (failingStable) Set([]byte, []byte) error       { return syscall.EROFS }
func (failingStable) SetUint64([]byte, uint64) error { return syscall.EROFS }

// Storage audit: a data directory that went read-only made raft panic at
// the next election ("failed to save current term: ... read-only file
// system") with only a stack trace. raft must stop there; the stable store
// now says what happened, and where, in one line first.
func TestStableStoreFailureIsSaidPlainly(t *testing.T) {
	var buf bytes.Buffer
	s := &loudStable{StableStore: failingStable{raft.NewInmemStore()}, dir: "/data/raft",
		log: hclog.New(&hclog.LoggerOptions{Output: &buf})}
	if err := s.SetUint64([]byte("CurrentTerm"), 2); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("SetUint64: %v; want the store's error passed on", err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("n1")); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("Set: %v", err)
	}
	if got := strings.Count(buf.String(), "raft cannot record its term and vote in /data/raft"); got != 2 {
		t.Fatalf("log:\n%s\nwant the plain line for each failure", buf.String())
	}
}

// onlySegment returns the path and the bytes of the one raft log segment
// in dir, failing the test if there is not exactly one.
func onlySegment(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, raftDirName, "*.wal"))
	if len(segs) != 1 {
		t.Fatalf("segments %v, want one", segs)
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	return segs[0], b
}

// Every entry stored through checkedLog is read back as raft stored it
// (its own Extensions too), and one whose index, term, type or data
// changed in the store fails; entries stored without a checksum (before
// there were any) read as they are.
func TestCheckedLogEntries(t *testing.T) {
	inner := raft.NewInmemStore()
	c := &checkedLog{LogStore: inner, dir: "/data/raft"}
	logs := []*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("one")},
		{Index: 2, Term: 1, Type: raft.LogCommand, Data: []byte("two"), Extensions: []byte("ext")},
		{Index: 3, Term: 2, Type: raft.LogNoop},
	}
	if err := c.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if logs[1].Extensions == nil || string(logs[1].Extensions) != "ext" {
		t.Fatalf("StoreLogs changed raft's entry: %q", logs[1].Extensions)
	}
	for _, want := range logs {
		var got raft.Log
		if err := c.GetLog(want.Index, &got); err != nil {
			t.Fatal(err)
		}
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type ||
			!bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Extensions, want.Extensions) {
			t.Fatalf("read back %+v, stored %+v", got, *want)
		}
	}
	// An entry changed in the store: its type (a write become a no-op,
	// which raft would skip), or a byte of its data.
	for _, change := range []func(l *raft.Log){
		func(l *raft.Log) { l.Type = raft.LogNoop },
		func(l *raft.Log) { l.Data = []byte("owe") },
		func(l *raft.Log) { l.Term = 9 },
	} {
		var stored raft.Log
		if err := inner.GetLog(1, &stored); err != nil {
			t.Fatal(err)
		}
		bad := stored
		change(&bad)
		if err := inner.StoreLog(&bad); err != nil {
			t.Fatal(err)
		}
		var got raft.Log
		if err := c.GetLog(1, &got); err == nil || !strings.Contains(err.Error(), "entry 1 in /data/raft fails its checksum") {
			t.Fatalf("changed entry read back: %+v, %v", got, err)
		}
		if err := inner.StoreLog(&stored); err != nil {
			t.Fatal(err)
		}
	}
	// An entry with no checksum (stored before checkedLog) reads as it is.
	if err := inner.StoreLog(&raft.Log{Index: 4, Term: 2, Type: raft.LogCommand, Data: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	var old raft.Log
	if err := c.GetLog(4, &old); err != nil || string(old.Data) != "old" {
		t.Fatalf("entry without a checksum: %+v, %v", old, err)
	}
}
