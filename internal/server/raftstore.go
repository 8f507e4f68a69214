package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// On-disk layout of raft's storage under a server's data directory:
//
//	<dir>/raft/                 raft-wal: 64 MiB segment files (*.wal) plus
//	                            wal-meta.db, which also holds the StableStore keys
//	<dir>/raft/holdfast.lock    held while a process has the stores open
//	<dir>/snapshots/            raft.FileSnapshotStore (a snapshot left unfinished,
//	                            <id>.tmp, by a killed run is removed at open)
//
// The log store is hashicorp/raft-wal; bench/logstore/README.md has the
// measurements that chose it over raft-boltdb. raft-wal has no switch to turn
// fsync off: every StoreLogs ends with one fsync of the tail segment (and, the
// first time a new segment is synced, of its directory) before it returns.
const (
	raftDirName       = "raft"
	raftLockName      = "holdfast.lock"
	logCacheSize      = 512
	snapshotsRetained = 2
	// snapshotDirName is the folder raft.FileSnapshotStore creates under its
	// base directory; it is made here first so it gets our permissions.
	snapshotDirName = "snapshots"
)

// stores is the durable (or in-memory) storage raft runs on.
type stores struct {
	log    raft.LogStore
	stable raft.StableStore
	snaps  raft.SnapshotStore
	close  func() error
}

// openStores opens raft's storage under dir: the raft-wal log store in
// dir/raft/ (it is the StableStore too), fronted by a raft.LogCache of 512
// entries, and a file snapshot store keeping 2 snapshots in dir/snapshots/.
// Directories it creates get mode 0700. A lock file in dir/raft/ makes a
// second opener of the same dir fail at once instead of waiting forever.
//
// dir == "" selects in-memory stores (for -dev and tests); nothing survives
// close then.
//
// The caller must call close once raft has shut down.
func openStores(dir string, logger hclog.Logger) (*stores, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if dir == "" {
		return openInmemStores()
	}
	return openDiskStores(dir, logger, fs.New())
}

func openInmemStores() (*stores, error) {
	mem := raft.NewInmemStore()
	// The cache adds nothing to an in-memory store, but keeping it means -dev
	// and the tests exercise the same LogStore stack as a real server.
	cached, err := raft.NewLogCache(logCacheSize, mem)
	if err != nil {
		return nil, fmt.Errorf("server: raft log cache: %w", err)
	}
	return &stores{
		log:    cached,
		stable: mem,
		snaps:  raft.NewInmemSnapshotStore(),
		close:  func() error { return nil },
	}, nil
}

// openDiskStores is openStores for a real directory. vfs is the file system
// raft-wal writes its segments through: fs.New() in production, a wrapper in
// tests that checks every write is synced before StoreLogs returns.
func openDiskStores(dir string, logger hclog.Logger, vfs types.VFS) (*stores, error) {
	raftDir := filepath.Join(dir, raftDirName)
	for _, d := range []string{dir, raftDir, filepath.Join(dir, snapshotDirName)} {
		if err := makeDir(d); err != nil {
			return nil, err
		}
	}

	lock, err := lockDir(raftDir)
	if err != nil {
		return nil, err
	}

	removeUnfinishedSnapshots(filepath.Join(dir, snapshotDirName), logger)
	if err := checkLogFiles(raftDir, filepath.Join(dir, snapshotDirName)); err != nil {
		lock.Close()
		return nil, err
	}

	// The meta store is passed in, although it is the default one, because
	// WAL.Close in raft-wal (v0.4.0 and v0.4.1) never closes it: its bbolt file, and the
	// flock bbolt holds on it, would stay open until the process exits, and
	// the next wal.Open of this directory in the same process would block
	// on that flock forever. So we close it ourselves after the WAL.
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(raftDir,
		wal.WithLogger(logger.Named("wal")),
		wal.WithMetaStore(meta),
		wal.WithSegmentFiler(segment.NewFiler(raftDir, vfs)),
	)
	if err != nil {
		meta.Close()
		lock.Close()
		return nil, fmt.Errorf("server: open raft log in %s: %w", raftDir, err)
	}
	fail := func(err error) (*stores, error) {
		w.Close()
		meta.Close()
		lock.Close()
		return nil, err
	}

	cached, err := raft.NewLogCache(logCacheSize, w)
	if err != nil {
		return fail(fmt.Errorf("server: raft log cache: %w", err))
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, snapshotsRetained, logger.Named("snapshot"))
	if err != nil {
		return fail(fmt.Errorf("server: open raft snapshots in %s: %w", dir, err))
	}

	var (
		once     sync.Once
		closeErr error
	)
	closeFn := func() error {
		once.Do(func() {
			// The WAL, then its meta store, then the lock, so the lock is
			// only released once every file under raftDir is closed.
			if err := w.Close(); err != nil {
				closeErr = fmt.Errorf("server: close raft log: %w", err)
			}
			if err := meta.Close(); err != nil {
				closeErr = errors.Join(closeErr, fmt.Errorf("server: close raft meta store: %w", err))
			}
			if err := lock.Close(); err != nil {
				closeErr = errors.Join(closeErr, fmt.Errorf("server: release raft lock: %w", err))
			}
		})
		return closeErr
	}
	return &stores{log: cached, stable: w, snaps: snaps, close: closeFn}, nil
}

// removeUnfinishedSnapshots removes the snapshots a killed process was
// writing: raft.FileSnapshotStore writes each into "<id>.tmp" and renames
// it once complete, skips .tmp directories when it lists snapshots, and
// never removes them, so each crash during a snapshot would leave a copy of
// the state behind for good. The caller holds the directory lock, so no
// snapshot is being written. Failing to remove one costs only disk space:
// it is logged.
func removeUnfinishedSnapshots(snapDir string, logger hclog.Logger) {
	entries, err := os.ReadDir(snapDir)
	if err != nil {
		return // a new directory; raft reports an unreadable one
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		p := filepath.Join(snapDir, e.Name())
		if err := os.RemoveAll(p); err != nil {
			logger.Warn("could not remove an unfinished snapshot", "path", p, "error", err)
			continue
		}
		logger.Info("removed a snapshot left unfinished by an earlier run", "path", p)
	}
}

// checkLogFiles refuses a raft directory that raft-wal would open wrongly.
// Without its meta store (wal-meta.db), raft-wal starts a new log and
// deletes the segment files it does not know, and the server would come up
// from the newest snapshot, or empty, without the writes after it; an
// empty meta store makes bbolt fail deep inside; and a segment the meta
// store lists but that is gone, raft-wal makes anew, empty. Each would lose
// acknowledged writes without a word, so the server refuses to start and
// says which file is wrong. A new data directory (no meta store, no
// segment, no snapshot) passes.
func checkLogFiles(raftDir, snapDir string) error {
	segs, err := filepath.Glob(filepath.Join(raftDir, "*.wal"))
	if err != nil {
		return fmt.Errorf("server: listing %s: %w", raftDir, err)
	}
	snaps := 0
	if entries, err := os.ReadDir(snapDir); err == nil {
		for _, e := range entries {
			if e.IsDir() && !strings.HasSuffix(e.Name(), ".tmp") {
				snaps++
			}
		}
	}
	metaPath := filepath.Join(raftDir, metadb.FileName)
	aside := "restore it from a backup, or move " + filepath.Dir(raftDir) + " aside to start empty"
	st, err := os.Stat(metaPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if len(segs) == 0 && snaps == 0 {
			return nil
		}
		return fmt.Errorf("server: %s is missing, but %s holds %d raft log segment(s) and %d snapshot(s): "+
			"without it the log cannot be read, and starting would drop the writes it holds; %s",
			metaPath, filepath.Dir(raftDir), len(segs), snaps, aside)
	case err != nil:
		return fmt.Errorf("server: %w", err)
	case st.Size() == 0:
		return fmt.Errorf("server: %s is empty: the raft log's index of segments is lost; %s", metaPath, aside)
	}
	meta := &metadb.BoltMetaDB{}
	defer meta.Close()
	ps, err := meta.Load(raftDir)
	if err != nil {
		return fmt.Errorf("server: reading %s: %w; %s", metaPath, err, aside)
	}
	for _, si := range ps.Segments {
		p := filepath.Join(raftDir, segment.FileName(si))
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("server: raft log segment %s, listed in %s, cannot be found (%v): "+
				"starting would lose the writes it holds; %s", p, metaPath, err, aside)
		}
	}
	return nil
}

// makeDir creates d with mode 0700 if it is missing and then syncs its parent,
// so the new directory entry survives a crash along with what is later
// written inside it. An existing directory is left as it is.
func makeDir(d string) error {
	if fi, err := os.Stat(d); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("server: %s exists and is not a directory", d)
		}
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("server: %w", err)
	}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return fmt.Errorf("server: cannot create the directory %s for the raft data: %w%s", d, err, permissionHint(err))
	}
	if err := syncDir(filepath.Dir(d)); err != nil {
		return fmt.Errorf("server: sync parent of %s: %w", d, err)
	}
	return nil
}

// permissionHint adds, to an error that is a refused permission, what the
// operator can do about it.
func permissionHint(err error) string {
	if errors.Is(err, os.ErrPermission) {
		return " (the agent's user may not write there: give it the directory, or choose another with -data-dir)"
	}
	return ""
}

func syncDir(d string) error {
	if runtime.GOOS == "windows" {
		// Directories cannot be opened for syncing there; NTFS journals
		// directory changes itself.
		return nil
	}
	f, err := os.Open(d)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// lockDir takes an exclusive, non-blocking lock on raftDir's lock file and
// writes our pid into it for the error message a second opener gets.
//
// The lock is needed because the bbolt file inside raft-wal (wal-meta.db) is
// opened with no lock timeout: without ours, a second process opening the
// same directory would block in wal.Open forever rather than fail. On Linux
// this is an open-file-description lock, so a second open from this same
// process is refused as well.
func lockDir(raftDir string) (*os.File, error) {
	path := filepath.Join(raftDir, raftLockName)
	lock, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("server: cannot open the lock file of the raft data in %s: %w%s", raftDir, err, permissionHint(err))
	}
	// flock is per open file description: a second open in this process is
	// refused as well as one in another process.
	err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		lock.Close()
		holder := ""
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
				holder = fmt.Sprintf(" by pid %d", pid)
			}
		}
		return nil, fmt.Errorf("server: raft storage %s is already in use%s (lock file %s is held)", raftDir, holder, path)
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("server: lock raft storage: %w", err)
	}
	// The pid is only a hint for humans; failing to record it is not fatal.
	if err := lock.Truncate(0); err == nil {
		_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return lock, nil
}
