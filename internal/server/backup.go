package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/internal/state"
)

// SaveSnapshot takes a snapshot of the state, through raft (which then
// compacts its log as after any snapshot), and returns the raft index it
// holds and a stream of its archive (see WriteArchive). The caller must
// close the stream; closing it early stops the copy. Only the leader
// answers: the state a follower holds may be behind.
func (s *Server) SaveSnapshot() (uint64, io.ReadCloser, error) {
	if s.raft.State() != raft.Leader {
		return 0, nil, ErrNoLeader
	}
	meta, rc, err := s.openSnapshot()
	if err != nil {
		return 0, nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		defer rc.Close()
		pw.CloseWithError(WriteArchive(pw, ArchiveMeta{ID: meta.ID, Size: meta.Size, Index: meta.Index,
			Term: meta.Term, Version: int(meta.Version)}, rc))
	}()
	s.log.Info("snapshot saved for a backup", "index", meta.Index, "size", sizeText(meta.Size))
	return meta.Index, pr, nil
}

// openSnapshot takes a snapshot and opens it. With nothing applied since
// the newest one, raft takes none, and that newest one is the state.
func (s *Server) openSnapshot() (*raft.SnapshotMeta, io.ReadCloser, error) {
	f := s.raft.Snapshot()
	err := f.Error()
	if errors.Is(err, raft.ErrNothingNewToSnapshot) {
		list, lerr := s.stores.snaps.List()
		if lerr != nil {
			return nil, nil, fmt.Errorf("server: listing snapshots: %w", lerr)
		}
		if len(list) == 0 {
			return nil, nil, fmt.Errorf("server: raft took no snapshot (%v) and none is stored", err)
		}
		return s.stores.snaps.Open(list[0].ID)
	}
	if err != nil {
		if errors.Is(err, raft.ErrRaftShutdown) {
			return nil, nil, ErrShuttingDown
		}
		return nil, nil, fmt.Errorf("server: taking a snapshot: %w", err)
	}
	return f.Open()
}

// RestoreSnapshot replaces the whole state with the one in an archive that
// SaveSnapshot wrote, as Consul's snapshot restore does: for disaster
// recovery, not for a running fleet, whose sessions and locks go back to
// the backup's.
//
// Where Consul lets LockIndexes go back with the rest, a restore here never
// hands out a (Key, LockIndex) the replaced state already gave: every key
// the backup has locked comes back above the highest LockIndex the live
// state knows of (state.RestoreAbove). To read that mark with nothing in
// flight, writes wait at the gate from just before the restore until it is
// through. Sessions in the backup get full TTLs from now, as after a
// change of leader.
//
// A damaged or foreign archive is an *ArchiveError and changes nothing.
func (s *Server) RestoreSnapshot(r io.Reader) error {
	meta, st, err := ReadArchive(r)
	if err != nil {
		return err
	}
	if s.raft.State() != raft.Leader {
		return ErrNoLeader
	}
	if err := s.gate.hold(); err != nil {
		return ErrShuttingDown
	}
	defer s.gate.pass(s.raft)
	floor := s.fsm.State().LockHighWater()
	restored, err := state.RestoreAbove(bytes.NewReader(st), floor)
	if err != nil {
		return archiveErrorf("its state does not read back: %v", err)
	}
	var buf bytes.Buffer
	if err := restored.Snapshot().Persist(&buf); err != nil {
		return fmt.Errorf("server: encoding the restored state: %w", err)
	}
	rm := &raft.SnapshotMeta{Version: raft.SnapshotVersion(meta.Version), ID: meta.ID, Index: meta.Index,
		Term: meta.Term, Size: int64(buf.Len())}
	if rm.Version == 0 {
		rm.Version = raft.SnapshotVersionMax
	}
	if err := s.raft.Restore(rm, &buf, s.cfg.ApplyTimeout); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return ErrNoLeader
		case errors.Is(err, raft.ErrRaftShutdown):
			return ErrShuttingDown
		}
		return fmt.Errorf("server: restoring the snapshot: %w", err)
	}
	// The leader's soft state follows the new state: timers for its
	// sessions (and none for the sessions gone), and the stamps' clock
	// if the backup's lock-delays run ahead of it.
	s.timers.Clear()
	s.resetSessionTimers()
	s.raiseStamps()
	s.log.Info("restored a backup snapshot", "backup_index", meta.Index, "lock_index_floor", floor,
		"sessions", len(sessionsOf(restored)))
	return nil
}

func sessionsOf(st *state.Store) []*state.Session {
	_, all := st.SessionList(nil)
	return all
}
