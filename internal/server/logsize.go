package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
)

// defaultLogSizeLimit is Config.LogSizeLimit's default.
const defaultLogSizeLimit = 512 << 20

// raft bounds its log in entries, not bytes: it takes a snapshot once
// SnapshotThreshold (16,384) entries have been written since the last one,
// and then keeps TrailingLogs (10,240) entries before the snapshot's end.
// With small writes that is a few megabytes. With values near the 512 KiB
// limit it is up to 13 GiB of log segments for a store that may be empty
// by then (written and deleted), kept until enough further writes come,
// and replayed at every start. So the server also bounds the log's size on
// the disk: when it passes Config.LogSizeLimit, the server takes a snapshot
// itself and keeps only as many entries after compaction as fit in a
// quarter of the limit. A state bigger than the limit raises it to the
// newest snapshot's size, so that snapshots never write more than the log
// took in.

// watchLogSize trims the log each time it has grown by another step (see
// growth),
// and once each time this server becomes leader (a log left big by an
// earlier run can only be snapshotted once it has been applied, which the
// leadership barrier waits for). It runs until shutdown.
func (s *Server) watchLogSize() {
	defer s.wg.Done()
	for {
		select {
		case <-s.shutdownCh:
			return
		case <-s.stores.growth.ch:
		case <-s.logCheck:
		}
		s.trimLog()
	}
}

// checkLogSize asks watchLogSize for a look at the log's size.
func (s *Server) checkLogSize() {
	select {
	case s.logCheck <- struct{}{}:
	default:
	}
}

// trimLog takes a snapshot, and compacts the log to a quarter of the limit,
// if the log's segment files (or, in memory, its entries) take more than
// Config.LogSizeLimit. It
// estimates the entries to keep from their average size, and lends raft
// that TrailingLogs for the one snapshot.
func (s *Server) trimLog() {
	limit := s.cfg.LogSizeLimit
	if limit <= 0 || s.stores.size == nil {
		return
	}
	size, err := s.stores.size()
	if err != nil {
		s.log.Warn("cannot measure the raft log", "error", err)
		return
	}
	if metas, err := s.stores.snaps.List(); err == nil && len(metas) > 0 {
		// A snapshot costs a write of the whole state: with a state
		// larger than the limit, the log may grow as large as the state
		// between two, so that no more is written in snapshots than in
		// the log itself.
		limit = max(limit, metas[0].Size)
	}
	if size <= limit {
		return
	}
	first, ferr := s.stores.log.FirstIndex()
	last, lerr := s.stores.log.LastIndex()
	if ferr != nil || lerr != nil || last < first {
		return
	}
	per := max(uint64(size)/(last-first+1), 1)
	rc := s.raft.ReloadableConfig()
	trimmed := rc
	trimmed.TrailingLogs = min(uint64(limit/4)/per, rc.TrailingLogs)
	if err := s.raft.ReloadConfig(trimmed); err != nil {
		s.log.Warn("cannot trim the raft log", "error", err)
		return
	}
	err = s.raft.Snapshot().Error()
	if rerr := s.raft.ReloadConfig(rc); rerr != nil {
		s.log.Error("cannot restore raft's trailing-log setting after trimming the log", "error", rerr)
	}
	switch {
	case errors.Is(err, raft.ErrNothingNewToSnapshot), errors.Is(err, raft.ErrRaftShutdown):
		// Nothing applied since the last snapshot (a start, before the
		// log's entries are applied): the next look tries again.
		return
	case err != nil:
		s.log.Warn("the raft log is over its size limit, and a snapshot to compact it failed",
			"size", sizeText(size), "limit", sizeText(limit), "error", err)
		return
	}
	after, _ := s.stores.size()
	s.log.Info("the raft log was over its size limit: took a snapshot and compacted it",
		"before", sizeText(size), "after", sizeText(after), "limit", sizeText(limit), "entries_kept", trimmed.TrailingLogs)
}

// segmentBytes is the size of the raft log's segment files in dir.
func segmentBytes(dir string) (int64, error) {
	segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range segs {
		st, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted by a compaction meanwhile
		}
		if err != nil {
			return 0, err
		}
		n += st.Size()
	}
	return n, nil
}

// sizeText writes a byte count for a log line: "2.1 GiB", "640 MiB",
// "12 KiB", "300 B".
func sizeText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
