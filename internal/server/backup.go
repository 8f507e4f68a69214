package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

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
	s.log.Info("snapshot taken for a backup: sending it", "index", meta.Index, "size", sizeText(meta.Size))
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
// state knows of (state.RaiseLockIndexes). To read that mark with nothing
// in flight, writes wait at the gate from just before raft takes the
// backup until the state machine has it; the archive is read, checked and
// decoded before that. Session expiries decided on the replaced state are
// dropped, and the backup's sessions get full TTLs from now, as after a
// change of leader. The gossip pool is reconciled into the restored
// catalog at once, and the agent's own checks and services written again
// (Config.OnSelfRegistered).
//
// Restores run one at a time: a second waits, before it reads its
// archive, for the first to end (each holds the whole decoded state: two
// of a 313 MiB state at once took 1.9 GB).
//
// A damaged or foreign archive is an *ArchiveError and changes nothing,
// and so does a restore whose caller is gone (ctx) before it would begin.
func (s *Server) RestoreSnapshot(ctx context.Context, r io.Reader) error {
	select {
	case s.restoring <- struct{}{}:
		defer func() { <-s.restoring }()
	case <-ctx.Done():
		return fmt.Errorf("server: restore abandoned by its caller while another restore ran: %w", ctx.Err())
	case <-s.shutdownCh:
		return ErrShuttingDown
	}
	meta, restored, err := ReadArchive(r)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("server: restore abandoned by its caller before it began: %w", err)
	}
	if s.raft.State() != raft.Leader {
		return ErrNoLeader
	}
	s.log.Info("restoring a backup snapshot: writes wait until it is in", "backup_index", meta.Index, "size", sizeText(meta.Size))
	started := time.Now()
	if err := s.gate.hold(); err != nil {
		return ErrShuttingDown
	}
	replaced, err := s.restoreHeld(meta, restored)
	if replaced {
		// The timers follow the new state before the gate opens: each
		// expiry decided so far (under expMu, at the epoch then) is
		// refused by replaced, and each decided from now on finds the
		// session re-armed, or gone.
		s.expMu.Lock()
		s.timers.Clear()
		s.resetSessionTimers()
		s.gate.replaced()
		s.expMu.Unlock()
	}
	s.gate.pass(s.raft)
	if !replaced {
		return err
	}
	if err != nil {
		// raft loaded the backup and then could not commit the entry
		// that follows it (leadership lost): the state is the backup's.
		s.log.Warn("the backup snapshot is in, but raft could not commit after it", "error", err)
	}
	// The rest of the leader's soft state follows: the stamps' clock if
	// the backup's lock-delays run ahead of it; the pool's members and
	// this agent's registrations, which the backup knows as they were.
	s.raiseStamps()
	if s.serf != nil {
		s.serf.wakeFull()
	}
	if s.cfg.OnSelfRegistered != nil {
		go s.cfg.OnSelfRegistered()
	}
	s.log.Info("restored a backup snapshot", "backup_index", meta.Index, "sessions", len(sessionsOf(restored)),
		"took", time.Since(started).Round(time.Millisecond))
	return nil
}

// restoreHeld hands the decoded backup to raft, with the gate held, and
// reports whether the state machine took it.
func (s *Server) restoreHeld(meta ArchiveMeta, restored *state.Store) (bool, error) {
	live := s.fsm.State()
	floor := live.LockHighWater()
	restored.RaiseLockIndexes(floor)
	s.log.Info("LockIndexes of the backup raised above the live state's", "lock_index_floor", floor)
	// raft needs the size first: count the encoding, then stream it (the
	// store is immutable, so both passes write the same bytes).
	var n countWriter
	if err := restored.Snapshot().Persist(&n); err != nil {
		return false, fmt.Errorf("server: encoding the restored state: %w", err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(restored.Snapshot().Persist(pw)) }()
	defer pr.Close()
	// Past the backup's index and its state's, so that no write after the
	// restore gets an index its state already has.
	rm := &raft.SnapshotMeta{Version: raft.SnapshotVersion(meta.Version), ID: meta.ID,
		Index: max(meta.Index, restored.MaxIndex()), Term: meta.Term, Size: int64(n)}
	// No timeout: raft's one timer covers both the restore and the entry
	// after it, and answered "timed out" for a restore it then completed
	// (a large state, a slow disk).
	err := s.raft.Restore(rm, pr, 0)
	replaced := s.fsm.State() != live
	if err != nil && !replaced {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return false, ErrNoLeader
		case errors.Is(err, raft.ErrRaftShutdown):
			return false, ErrShuttingDown
		}
		return false, fmt.Errorf("server: restoring the snapshot: %w", err)
	}
	return replaced, err
}

// countWriter counts the bytes written to it.
type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}

func sessionsOf(st *state.Store) []*state.Session {
	_, all := st.SessionList(nil)
	return all
}
