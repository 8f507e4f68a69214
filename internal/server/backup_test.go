package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/state"
)

func saveArchive(t *testing.T, s *Server) (uint64, []byte) {
	t.Helper()
	idx, rc, err := s.SaveSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return idx, b
}

func kvs(t *testing.T, s *Server, op state.KVOp, e state.DirEntry) {
	t.Helper()
	if ok, _, err := s.KVS(context.Background(), &state.KVRequest{Op: op, Entry: e}); err != nil || !ok {
		t.Fatalf("%s %s: %v %v", op, e.Key, ok, err)
	}
}

// A backup taken while the server runs, restored over a state that went on
// changing, brings back the backup's keys and sessions exactly (on disk
// too: a restart finds them), gives its TTL sessions full timers, drops the
// timers of sessions it does not have, and hands out no LockIndex the
// replaced state already gave.
func TestSaveAndRestoreSnapshot(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	dir := t.TempDir()
	s := newTestServer(t, dir, clk)
	ttl := mustSession(t, s, state.Session{TTL: "30s"})
	kvs(t, s, state.OpSet, state.DirEntry{Key: "a", Value: []byte("1")})
	kvs(t, s, state.OpLock, state.DirEntry{Key: "lock", Session: ttl, Value: []byte("holder")})

	idx, archive := saveArchive(t, s)
	if idx == 0 {
		t.Fatal("snapshot index 0")
	}
	// Nothing written since: the same snapshot is served again.
	if idx2, again := saveArchive(t, s); idx2 != idx || len(again) == 0 {
		t.Fatalf("second save: index %d (want %d), %d bytes", idx2, idx, len(again))
	}
	meta, _, err := ReadArchive(bytes.NewReader(archive))
	if err != nil || meta.Index != idx {
		t.Fatalf("archive reads back as %+v, %v", meta, err)
	}

	// The live state goes on: the lock changes hands to a later session
	// (LockIndex 2, 3), "a" changes, "b" appears.
	kvs(t, s, state.OpUnlock, state.DirEntry{Key: "lock", Session: ttl})
	later := mustSession(t, s, state.Session{TTL: "10s"})
	kvs(t, s, state.OpLock, state.DirEntry{Key: "lock", Session: later})
	kvs(t, s, state.OpUnlock, state.DirEntry{Key: "lock", Session: later})
	kvs(t, s, state.OpLock, state.DirEntry{Key: "lock", Session: later})
	kvs(t, s, state.OpSet, state.DirEntry{Key: "a", Value: []byte("2")})
	kvs(t, s, state.OpSet, state.DirEntry{Key: "b", Value: []byte("x")})
	clk.Advance(20 * time.Second)

	if err := s.RestoreSnapshot(context.Background(), bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	check := func(s *Server, when string) {
		t.Helper()
		st := s.State()
		if _, e := st.KVGet(nil, "a"); e == nil || string(e.Value) != "1" {
			t.Fatalf("%s: a = %+v, want the backup's 1", when, e)
		}
		if _, e := st.KVGet(nil, "b"); e != nil {
			t.Fatalf("%s: b = %+v, want gone (written after the backup)", when, e)
		}
		if _, e := st.KVGet(nil, "lock"); e == nil || e.Session != ttl || string(e.Value) != "holder" || e.LockIndex != 4 {
			t.Fatalf("%s: lock = %+v, want held by %s as in the backup, at LockIndex 4 (above the live 3)", when, e, ttl)
		}
		if _, sess := st.SessionGet(nil, later); sess != nil {
			t.Fatalf("%s: session %s, created after the backup, is back", when, later)
		}
	}
	check(s, "after the restore")
	if n := s.timers.Len(); n != 1 {
		t.Fatalf("timers after the restore = %d, want 1 (the backup's TTL session only)", n)
	}
	// The backup's session got a full TTL at the restore, not what was
	// left of it when the backup was taken.
	clk.Advance(30*time.Second - time.Nanosecond)
	if _, sess := s.State().SessionGet(nil, ttl); sess == nil {
		t.Fatal("the backup's session expired before a full TTL from the restore")
	}
	// The next acquisition after a release counts on from there.
	kvs(t, s, state.OpUnlock, state.DirEntry{Key: "lock", Session: ttl})
	kvs(t, s, state.OpLock, state.DirEntry{Key: "lock", Session: ttl})
	if _, e := s.State().KVGet(nil, "lock"); e.LockIndex != 5 {
		t.Fatalf("acquired after the restore: LockIndex %d, want 5", e.LockIndex)
	}
	kvs(t, s, state.OpUnlock, state.DirEntry{Key: "lock", Session: ttl})
	kvs(t, s, state.OpLock, state.DirEntry{Key: "lock", Session: ttl, Value: []byte("holder")})

	s.Shutdown()
	s2 := newTestServer(t, dir, clk)
	if _, e := s2.State().KVGet(nil, "lock"); e == nil || e.LockIndex != 6 {
		t.Fatalf("after a restart: lock = %+v, want LockIndex 6", e)
	}
	if _, e := s2.State().KVGet(nil, "b"); e != nil {
		t.Fatalf("after a restart: b = %+v, want gone", e)
	}
}

// An archive that is damaged, cut short or not holdfast's is refused with
// an ArchiveError and changes nothing.
func TestRestoreSnapshotRefusesBadArchives(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	kvs(t, s, state.OpSet, state.DirEntry{Key: "a", Value: []byte("1")})
	_, archive := saveArchive(t, s)
	kvs(t, s, state.OpSet, state.DirEntry{Key: "a", Value: []byte("2")})

	var badState bytes.Buffer
	if err := WriteArchive(&badState, ArchiveMeta{Size: 7, Index: 3, Term: 1, Version: 1}, bytes.NewReader([]byte("{\"no\":1"))); err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(archive)
	flipped[len(flipped)/2] ^= 0x40
	for name, body := range map[string][]byte{
		"empty":            nil,
		"not gzip":         []byte("not an archive"),
		"cut short":        archive[:len(archive)/2],
		"a flipped bit":    flipped,
		"unreadable state": badState.Bytes(),
	} {
		before := s.State().TableIndex("kvs")
		err := s.RestoreSnapshot(context.Background(), bytes.NewReader(body))
		var ae *ArchiveError
		if !errors.As(err, &ae) {
			t.Fatalf("%s: err = %v, want an ArchiveError", name, err)
		}
		if _, e := s.State().KVGet(nil, "a"); string(e.Value) != "2" || s.State().TableIndex("kvs") != before {
			t.Fatalf("%s: the state changed: a = %+v", name, e)
		}
	}
	// Writes go on after a refused restore (the gate was let go).
	kvs(t, s, state.OpSet, state.DirEntry{Key: "a", Value: []byte("3")})
}

// Finding (snapshot audit): a restore of a backup killed after raft stored
// the backup as a snapshot past the log's end, and before raft deleted the
// log, left a data directory whose server never led again: every election
// failed with "non-monotonic log entries: tried to append index 627 after
// 625". A start now deletes a log that ends before the newest snapshot.
// The state here is what such a kill leaves: a log ending at L and a
// snapshot at L+2 (raft leaves a hole of one index on purpose).
func TestStartAfterRestoreCutShort(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	dir := t.TempDir()
	s := newTestServer(t, dir, clk)
	kvs(t, s, state.OpSet, state.DirEntry{Key: "old", Value: []byte("1")})
	_, archive := saveArchive(t, s)
	kvs(t, s, state.OpSet, state.DirEntry{Key: "old", Value: []byte("2")})
	kvs(t, s, state.OpSet, state.DirEntry{Key: "gone", Value: []byte("x")})
	s.Shutdown()

	_, restored, err := ReadArchive(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	st := persisted(t, restored)
	stores, err := openStores(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	last, _ := stores.log.LastIndex()
	writeSnapshot(t, stores.snaps, last+2, string(st))
	stores.close()

	s2 := newTestServer(t, dir, clk) // leads, or the test fails here
	if _, e := s2.State().KVGet(nil, "old"); e == nil || string(e.Value) != "1" {
		t.Fatalf("old = %+v, want the backup's 1", e)
	}
	if _, e := s2.State().KVGet(nil, "gone"); e != nil {
		t.Fatalf("gone = %+v, want the backup's state without it", e)
	}
	kvs(t, s2, state.OpSet, state.DirEntry{Key: "after", Value: []byte("y")})
}

// Finding (upgrade audit): a data directory written by a newer holdfast
// was met by a panic in the state machine after the agent said it was
// running (a log entry of an unknown command type), or by raft falling
// back to an older snapshot and the start calling the directory damaged
// (a snapshot of a newer format). A start now refuses both, saying so.
func TestStartRefusesNewerData(t *testing.T) {
	for _, c := range []struct {
		name string
		add  func(t *testing.T, st *stores, last uint64)
		want string
	}{
		{"log entry", func(t *testing.T, st *stores, last uint64) {
			data := make([]byte, 10)
			data[0], data[1] = 1, 12 // envelope 1, command type 12
			if err := st.log.StoreLogs([]*raft.Log{{Index: last + 1, Term: 2, Type: raft.LogCommand, Data: data}}); err != nil {
				t.Fatal(err)
			}
		}, "raft log entry %d: command type 12, which this holdfast does not know: written by a newer holdfast"},
		{"snapshot", func(t *testing.T, st *stores, last uint64) {
			writeSnapshot(t, st.snaps, last, `{"Version":2}`+"\n")
		}, ": snapshot version 2, where this holdfast reads 1: written by a newer holdfast"},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := clocktest.NewFake(epoch)
			dir := t.TempDir()
			s := newTestServer(t, dir, clk)
			kvs(t, s, state.OpSet, state.DirEntry{Key: "k", Value: []byte("v")})
			s.Shutdown()
			st, err := openStores(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			last, _ := st.log.LastIndex()
			c.add(t, st, last)
			st.close()
			_, err = New(testConfig(dir, clk, nil))
			want := c.want
			if strings.Contains(want, "%d") {
				want = fmt.Sprintf(want, last+1)
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("New on a directory with a newer %s: %v; want it refused with %q", c.name, err, want)
			}
		})
	}
}

// A data directory records its format; one of a newer format is refused
// by name, before anything of it is read.
func TestStartRefusesNewerDataFormat(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	dir := t.TempDir()
	s := newTestServer(t, dir, clk)
	s.Shutdown()
	st, err := openStores(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := st.stable.GetUint64(formatKey); err != nil || v != dataFormat {
		t.Fatalf("format recorded: %d, %v; want %d", v, err, dataFormat)
	}
	if err := st.stable.SetUint64(formatKey, dataFormat+1); err != nil {
		t.Fatal(err)
	}
	st.close()
	_, err = New(testConfig(dir, clk, nil))
	if want := fmt.Sprintf("is in data format %d, written by a newer holdfast", dataFormat+1); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("New: %v; want %q", err, want)
	}
}

// Finding (verification of the restore fixes): with the snapshot a cut
// restore left damaged too, deleting the log lost acknowledged writes that
// raft, falling back to the older snapshot, would have replayed from it.
// A log behind a snapshot that does not read back is kept.
func TestStartKeepsLogBehindDamagedSnapshot(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	dir := t.TempDir()
	s := newTestServer(t, dir, clk)
	kvs(t, s, state.OpSet, state.DirEntry{Key: "k", Value: []byte("v")})
	if _, rc, err := s.SaveSnapshot(); err != nil { // a snapshot for raft to fall back to
		t.Fatal(err)
	} else {
		rc.Close()
	}
	kvs(t, s, state.OpSet, state.DirEntry{Key: "acked", Value: []byte("1")})
	s.Shutdown()

	st, err := openStores(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	last, _ := st.log.LastIndex()
	id := writeSnapshot(t, st.snaps, last+2, `{"Version":1}`+"\n")
	st.close()
	// Damage it: the CRC raft keeps no longer matches.
	if err := os.WriteFile(filepath.Join(dir, snapshotDirName, id, "state.bin"), []byte(`{"Version":9}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := newTestServer(t, dir, clk)
	if _, e := s2.State().KVGet(nil, "acked"); e == nil || string(e.Value) != "1" {
		t.Fatalf("acked = %+v: the log behind the damaged snapshot was dropped", e)
	}
}

// readFails is a reader a test expects never to be read.
type readFails struct{ t *testing.T }

func (r readFails) Read([]byte) (int, error) {
	r.t.Error("the archive was read while another restore ran")
	return 0, io.ErrUnexpectedEOF
}

func TestRestoresRunOneAtATime(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	s := newTestServer(t, "", clk)
	kvs(t, s, state.OpSet, state.DirEntry{Key: "a", Value: []byte("1")})
	_, archive := saveArchive(t, s)

	// Another restore runs (its place is taken by hand): a second waits
	// without reading its archive, and gives up when its caller does.
	s.restoring <- struct{}{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.RestoreSnapshot(ctx, readFails{t})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "while another restore ran") {
		t.Fatalf("restore behind another, caller gone: %v", err)
	}
	<-s.restoring

	// With the first done, a restore goes through, and leaves the place free.
	kvs(t, s, state.OpSet, state.DirEntry{Key: "a", Value: []byte("2")})
	if err := s.RestoreSnapshot(context.Background(), bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	if _, e := s.State().KVGet(nil, "a"); e == nil || string(e.Value) != "1" {
		t.Fatalf("a = %+v after the restore, want the backup's 1", e)
	}
	if len(s.restoring) != 0 {
		t.Fatal("a finished restore still holds its place")
	}
}
