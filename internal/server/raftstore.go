package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
	raftDirName  = "raft"
	raftLockName = "holdfast.lock"
	logCacheSize = 512
	// maxCachedEntry is the largest entry (data and extensions) the log
	// cache keeps: 512 of them are at most 8 MiB. A bigger one is read
	// back from the log when raft needs it again, which a lone server
	// seldom does: it applies what it writes from memory.
	maxCachedEntry = 16 << 10
	// growStep is how much data the log takes between two looks at its
	// size on the disk (see Server.trimLog).
	growStep          = 16 << 20
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
	// failed delivers, once, the error that leaves the log unable to take
	// another write until it is opened again (see checkedLog); nil for
	// in-memory stores.
	failed <-chan error
	// growth signals each step of data written to the log (its step may
	// be set before raft starts), and size says how many bytes the log
	// holds now: its segment files, or its entries in memory.
	growth *growth
	size   func() (int64, error)
}

// growth signals on ch (capacity 1) each time the data written to the log
// passes another step (default growStep), so that the server looks at the
// log's size (see Server.trimLog) a few times per limit's worth of writes
// and not at every write.
type growth struct {
	ch      chan struct{}
	step    int64
	written atomic.Int64
}

func newGrowth() *growth { return &growth{ch: make(chan struct{}, 1)} }

// add counts the data of ls, which have been stored.
func (g *growth) add(ls []*raft.Log) {
	n := int64(0)
	for _, l := range ls {
		n += int64(len(l.Data))
	}
	step := g.step
	if step <= 0 {
		step = growStep
	}
	if w := g.written.Add(n); w/step != (w-n)/step {
		select {
		case g.ch <- struct{}{}:
		default:
		}
	}
}

// memLog is the in-memory log store with a count of the bytes its entries
// hold, which a durable store's segment files give: an in-memory server
// (-dev) bounds its log's size too, or a burst of large values would hold
// gigabytes of memory until raft's entry counts came round.
type memLog struct {
	*raft.InmemStore
	held atomic.Int64
}

func (m *memLog) StoreLog(l *raft.Log) error { return m.StoreLogs([]*raft.Log{l}) }

func (m *memLog) StoreLogs(ls []*raft.Log) error {
	if err := m.InmemStore.StoreLogs(ls); err != nil {
		return err
	}
	for _, l := range ls {
		m.held.Add(int64(len(l.Data)))
	}
	return nil
}

// DeleteRange subtracts the entries it deletes from the count: a walk of
// the range, which compaction makes once per snapshot.
func (m *memLog) DeleteRange(min, max uint64) error {
	var gone int64
	var l raft.Log
	for i := min; i <= max && i >= min; i++ { // (i >= min: no wrap at the top)
		if m.InmemStore.GetLog(i, &l) == nil {
			gone += int64(len(l.Data))
		}
	}
	if err := m.InmemStore.DeleteRange(min, max); err != nil {
		return err
	}
	m.held.Add(-gone)
	return nil
}

// openStores opens raft's storage under dir: the raft-wal log store in
// dir/raft/ (it is the StableStore too), fronted by a cache of the last 512
// entries (boundedCache), and a file snapshot store keeping 2 snapshots in dir/snapshots/.
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
	return openDiskStores(dir, logger, fs.New(), 0)
}

func openInmemStores() (*stores, error) {
	mem := raft.NewInmemStore()
	ml := &memLog{InmemStore: mem}
	// The cache adds nothing to an in-memory store, but keeping it means -dev
	// and the tests exercise the same LogStore stack as a real server.
	cached := newBoundedCache(ml, newGrowth())
	return &stores{
		log:    cached,
		stable: mem,
		snaps:  raft.NewInmemSnapshotStore(),
		close:  func() error { return nil },
		growth: cached.growth,
		size:   func() (int64, error) { return ml.held.Load(), nil },
	}, nil
}

// openDiskStores is openStores for a real directory. vfs is the file system
// raft-wal writes its segments through: fs.New() in production, a wrapper in
// tests that checks every write is synced before StoreLogs returns.
// segSize is the segment size, 0 for raft-wal's (64 MiB); tests make it
// small to reach a rotation.
// dataFormat is the data directory format this build writes, kept in the
// raft meta store under formatKey. A build whose replay or snapshots would
// read a directory of this build differently (a state-machine rule that
// changes what replaying a log gives, as 30c94e9's LockIndex rule did)
// raises it, so that an older build refuses that directory by name rather
// than serve it changed. Command types and snapshot versions a build does
// not know are refused anyway (refuseNewer).
const dataFormat = 1

var formatKey = []byte("holdfast_data_format")

// checkFormat refuses a directory of a newer data format and records this
// build's on one that has none (every directory before the key existed is
// format 1).
func checkFormat(stable raft.StableStore, raftDir string) error {
	v, err := stable.GetUint64(formatKey)
	if err != nil {
		return fmt.Errorf("server: reading the data format from %s: %w", raftDir, err)
	}
	if v > dataFormat {
		return fmt.Errorf("server: %s is in data format %d, written by a newer holdfast; this one reads format %d: run that holdfast, or a newer one", raftDir, v, dataFormat)
	}
	if v < dataFormat {
		return stable.SetUint64(formatKey, dataFormat)
	}
	return nil
}

func openDiskStores(dir string, logger hclog.Logger, vfs types.VFS, segSize int) (*stores, error) {
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
	if err := checkLogFiles(raftDir, filepath.Join(dir, snapshotDirName), logger); err != nil {
		lock.Close()
		return nil, err
	}

	// The meta store is passed in, although it is the default one, because
	// WAL.Close in raft-wal (v0.4.0 and v0.4.1) never closes it: its bbolt file, and the
	// flock bbolt holds on it, would stay open until the process exits, and
	// the next wal.Open of this directory in the same process would block
	// on that flock forever. So we close it ourselves after the WAL.
	meta := &metadb.BoltMetaDB{}
	if segSize <= 0 {
		segSize = wal.DefaultSegmentSize
	}
	w, err := wal.Open(raftDir,
		wal.WithLogger(logger.Named("wal")),
		wal.WithMetaStore(meta),
		wal.WithSegmentFiler(segment.NewFiler(raftDir, vfs)),
		wal.WithSegmentSize(segSize),
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

	guard := &checkedLog{LogStore: w, dir: raftDir, failed: make(chan error, 1)}
	cached := newBoundedCache(guard, newGrowth())
	fss, err := raft.NewFileSnapshotStoreWithLogger(dir, snapshotsRetained, logger.Named("snapshot"))
	if err != nil {
		return fail(fmt.Errorf("server: open raft snapshots in %s: %w", dir, err))
	}
	snaps := &tidySnapshots{FileSnapshotStore: fss, dir: filepath.Join(dir, snapshotDirName), log: logger}

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
	stable := &loudStable{StableStore: w, dir: raftDir, log: logger}
	if err := checkFormat(stable, raftDir); err != nil {
		return fail(err)
	}
	return &stores{log: cached, stable: stable, snaps: snaps, close: closeFn, failed: guard.failed,
		growth: cached.growth, size: func() (int64, error) { return segmentBytes(raftDir) }}, nil
}

// boundedCache keeps the most recent log entries in memory, as raft's
// LogCache does, in a ring indexed by entry index, but not an entry bigger
// than maxCachedEntry: raft's cache held its last 512 entries whatever
// their size, so after a burst of 512 KiB values it kept 256 MiB alive
// until 512 newer writes came, long after the keys were deleted. It also
// tells growth of every batch stored, for the disk log and the in-memory
// one alike.
type boundedCache struct {
	raft.LogStore
	mu     sync.RWMutex
	ring   []*raft.Log
	growth *growth
}

func newBoundedCache(store raft.LogStore, g *growth) *boundedCache {
	return &boundedCache{LogStore: store, ring: make([]*raft.Log, logCacheSize), growth: g}
}

func (c *boundedCache) slot(index uint64) **raft.Log { return &c.ring[index%uint64(len(c.ring))] }

func (c *boundedCache) GetLog(index uint64, l *raft.Log) error {
	c.mu.RLock()
	e := *c.slot(index)
	c.mu.RUnlock()
	if e != nil && e.Index == index {
		*l = *e
		return nil
	}
	return c.LogStore.GetLog(index, l)
}

func (c *boundedCache) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores ls and then caches them; an entry too big to cache
// empties its slot, so that the slot never holds an older entry than
// the one stored last at its position.
func (c *boundedCache) StoreLogs(ls []*raft.Log) error {
	if err := c.LogStore.StoreLogs(ls); err != nil {
		return err
	}
	c.mu.Lock()
	for _, l := range ls {
		if len(l.Data)+len(l.Extensions) > maxCachedEntry {
			*c.slot(l.Index) = nil
		} else {
			*c.slot(l.Index) = l
		}
	}
	c.mu.Unlock()
	c.growth.add(ls)
	return nil
}

// DeleteRange empties the cache: raft deletes the log's head after a
// snapshot, and its tail when a new leader overwrites it.
func (c *boundedCache) DeleteRange(min, max uint64) error {
	c.mu.Lock()
	clear(c.ring)
	c.mu.Unlock()
	return c.LogStore.DeleteRange(min, max)
}

// IsMonotonic passes the store's answer through (see monotonic).
func (c *boundedCache) IsMonotonic() bool { return monotonic(c.LogStore) }

// monotonic is the answer of store, if it gives one, to raft's question
// whether it is monotonic: raft deletes the whole log after restoring a
// snapshot only from a store that says so (raft-wal does), and each
// wrapper of the log store passes the answer through.
func monotonic(store raft.LogStore) bool {
	m, ok := store.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// loudStable is the stable store (raft-wal's meta store, which keeps raft's
// term and vote) with its write failures said in one plain line first.
// raft cannot go on without recording a new term, and panics when that
// fails (a disk that went read-only, a full one): the line before the
// stack trace says what happened and where.
type loudStable struct {
	raft.StableStore
	dir string
	log hclog.Logger
}

func (s *loudStable) Set(k, v []byte) error { return s.loud(s.StableStore.Set(k, v)) }

func (s *loudStable) SetUint64(k []byte, v uint64) error {
	return s.loud(s.StableStore.SetUint64(k, v))
}

func (s *loudStable) loud(err error) error {
	if err != nil {
		s.log.Error("raft cannot record its term and vote in "+s.dir+", and will stop (a read-only or full disk?): "+
			"fix the disk and start the agent again; every acknowledged write is kept", "error", err)
	}
	return err
}

// checkedLog gives every log entry a checksum of its own, kept in the
// entry's Extensions (raft's field for what layers add to an entry) and
// checked whenever the entry is read back. raft-wal checks a checksum per
// batch, and only the last batch's when it opens the log: a byte of an
// older entry that changed on the disk would be read as written, a changed
// type turning a write into a no-op that raft skips, a changed value
// served to clients. The checksum (CRC-32C) covers the entry's index,
// term, type, data and any Extensions of its own; raft never sees it. An
// entry written without one (before it was added) is read as it is.
//
// It also makes one failure of raft-wal's loud. When the tail segment is
// full, raft-wal seals it and creates the next one in the background; if
// that fails (a full disk, a directory it may not write) it logs "rotate
// error" and never tries again, and every later write fails with ErrSealed
// until the log is opened again. The server would then hold an election
// every second for ever and answer "No cluster leader", even after the
// disk had room again. The first such failure is reported on failed (if
// not nil), and the agent stops saying what to do; a restart opens the log
// again, and raft-wal creates the segment it could not.
type checkedLog struct {
	raft.LogStore
	dir    string
	once   sync.Once
	failed chan error // capacity 1
}

// entryMark starts the Extensions of a checksummed entry; the checksum
// follows it (little-endian), then the entry's own Extensions.
var entryMark = [4]byte{'h', 'f', 'c', '1'}

const entryMarkLen = len(entryMark) + 4

func entrySum(l *raft.Log, ext []byte) uint32 {
	var h [17]byte
	binary.LittleEndian.PutUint64(h[0:], l.Index)
	binary.LittleEndian.PutUint64(h[8:], l.Term)
	h[16] = byte(l.Type)
	c := crc32.Update(0, castagnoli, h[:])
	c = crc32.Update(c, castagnoli, l.Data)
	return crc32.Update(c, castagnoli, ext)
}

func (c *checkedLog) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores copies of ls with their checksums: raft keeps the
// entries it passes (its cache serves them), and they must stay as raft
// made them.
func (c *checkedLog) StoreLogs(ls []*raft.Log) error {
	out := make([]*raft.Log, len(ls))
	copies := make([]raft.Log, len(ls))
	for i, l := range ls {
		copies[i] = *l
		ext := make([]byte, entryMarkLen+len(l.Extensions))
		copy(ext, entryMark[:])
		binary.LittleEndian.PutUint32(ext[len(entryMark):], entrySum(l, l.Extensions))
		copy(ext[entryMarkLen:], l.Extensions)
		copies[i].Extensions = ext
		out[i] = &copies[i]
	}
	err := c.LogStore.StoreLogs(out)
	if errors.Is(err, wal.ErrSealed) && c.failed != nil {
		c.once.Do(func() {
			c.failed <- fmt.Errorf("the raft log in %s could not start a new segment file (the \"rotate error\" logged above says why: "+
				"a full disk, a directory the agent may not write, or too many open files), and takes no more writes until it is opened again; "+
				"make room, fix the permissions or raise the open-file limit (ulimit -n), and start the agent again: every acknowledged write is kept", c.dir)
		})
	}
	return err
}

func (c *checkedLog) GetLog(index uint64, l *raft.Log) error {
	if err := c.LogStore.GetLog(index, l); err != nil {
		return err
	}
	ext := l.Extensions
	if len(ext) < entryMarkLen || [4]byte(ext[:4]) != entryMark {
		return nil // written before entries had checksums
	}
	own := ext[entryMarkLen:]
	if l.Index != index || entrySum(l, own) != binary.LittleEndian.Uint32(ext[len(entryMark):entryMarkLen]) {
		return fmt.Errorf("raft log entry %d in %s fails its checksum: the log is damaged (restore the data directory from a backup)", index, c.dir)
	}
	if len(own) == 0 {
		own = nil
	}
	l.Extensions = own
	return nil
}

// IsMonotonic passes raft-wal's answer through (see monotonic).
func (c *checkedLog) IsMonotonic() bool { return monotonic(c.LogStore) }

// tidySnapshots is raft's file snapshot store, except that a snapshot
// that fails part-way (a full disk) does not leave its unfinished copy
// behind: raft's sink returns on the write error before it removes its
// directory, and the copy, as big as the state, would take what room the
// disk had left until the next start.
type tidySnapshots struct {
	*raft.FileSnapshotStore
	dir string
	log hclog.Logger
}

func (t *tidySnapshots) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := t.FileSnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil {
		return nil, err
	}
	return &tidySink{SnapshotSink: sink, tmp: filepath.Join(t.dir, sink.ID()+".tmp"),
		snapTransfer: snapTransfer{log: t.log, what: "snapshot written", id: sink.ID(), began: time.Now()}}, nil
}

// Open opens a snapshot to restore, and says when it has been read how
// big it was and how long the restore took: raft's own lines give
// neither, and a restore of a large state takes seconds.
func (t *tidySnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := t.FileSnapshotStore.Open(id)
	if err != nil {
		return meta, rc, err
	}
	return meta, &timedReader{ReadCloser: rc, snapTransfer: snapTransfer{log: t.log, what: "snapshot read", id: id, began: time.Now()}}, nil
}

// snapTransfer counts the bytes of a snapshot written or read, and says
// once how many and how long it took: raft's own lines give neither, and a
// large state takes seconds. raft and the state machine each close a
// snapshot, so the second close says nothing.
type snapTransfer struct {
	log   hclog.Logger
	what  string // "snapshot written" or "snapshot read"
	id    string
	began time.Time
	n     int64
	said  bool
}

func (t *snapTransfer) say() {
	if !t.said {
		t.said = true
		t.log.Info(t.what, "id", t.id, "size", sizeText(t.n), "took", time.Since(t.began).Round(time.Millisecond))
	}
}

type timedReader struct {
	io.ReadCloser
	snapTransfer
}

func (r *timedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n += int64(n)
	return n, err
}

func (r *timedReader) Close() error {
	r.say()
	return r.ReadCloser.Close()
}

// tidySink is raft's snapshot sink, tidied up after a failure, and saying
// what it wrote.
type tidySink struct {
	raft.SnapshotSink
	tmp string
	snapTransfer
}

func (s *tidySink) Write(p []byte) (int, error) {
	n, err := s.SnapshotSink.Write(p)
	s.n += int64(n)
	return n, err
}

func (s *tidySink) Cancel() error {
	err := s.SnapshotSink.Cancel()
	s.removeTmp()
	return err
}

// Close finishes the snapshot; if that fails (writing its metadata, or
// the rename that makes it a snapshot), its copy goes too.
func (s *tidySink) Close() error {
	err := s.SnapshotSink.Close()
	if err != nil {
		s.removeTmp()
		return err
	}
	s.say()
	return nil
}

func (s *tidySink) removeTmp() {
	if err := os.RemoveAll(s.tmp); err != nil {
		s.log.Warn("could not remove a failed snapshot", "path", s.tmp, "error", err)
	}
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
// says which file is wrong. The one missing segment let through is a tail
// that was never created (see below), which raft-wal makes as it should.
// A new data directory (no meta store, no segment, no snapshot) passes.
// The tail segment itself is checked by checkTail.
func checkLogFiles(raftDir, snapDir string, logger hclog.Logger) error {
	segs, err := filepath.Glob(filepath.Join(raftDir, "*.wal"))
	if err != nil {
		return fmt.Errorf("server: listing %s: %w", raftDir, err)
	}
	snaps, newestSnap := finishedSnapshots(snapDir)
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
	ps, err := loadMeta(meta, raftDir)
	if errors.Is(err, os.ErrPermission) {
		// Not damage: moving the directory aside would throw its data away.
		return fmt.Errorf("server: reading %s: %w%s", metaPath, err, permissionHint(err))
	}
	if err != nil {
		return fmt.Errorf("server: reading %s: %w; %s", metaPath, err, aside)
	}
	changed, err := checkTail(raftDir, meta, ps, logger)
	if err != nil {
		return err
	}
	if changed {
		if ps, err = loadMeta(meta, raftDir); err != nil {
			return fmt.Errorf("server: reading %s: %w; %s", metaPath, err, aside)
		}
	}
	for i, si := range ps.Segments {
		p := filepath.Join(raftDir, segment.FileName(si))
		_, err := os.Stat(p)
		if err == nil {
			continue
		}
		if i > 0 && i == len(ps.Segments)-1 && si.SealTime.IsZero() && errors.Is(err, os.ErrNotExist) &&
			ps.Segments[i-1].MaxIndex+1 == si.BaseIndex && newestSnap < si.BaseIndex {
			// The tail, just after a sealed segment, and no snapshot
			// covers an entry of it: raft-wal records a new segment in
			// the meta store before it creates its file, and syncs the
			// directory before the first write to it is acknowledged,
			// so this is a segment that was never created (a crash in
			// between, or a rotation that failed on a full disk). It
			// held nothing, and raft-wal creates it again. (A tail that
			// held writes and was deleted by hand since would pass
			// too; one that is the only segment, or that a snapshot
			// reached into, does not.)
			continue
		}
		return fmt.Errorf("server: raft log segment %s, listed in %s, cannot be found (%v): "+
			"starting would lose the writes it holds; %s", p, metaPath, err, aside)
	}
	return nil
}

// finishedSnapshots counts the finished snapshots in snapDir and returns
// the highest raft index among them (raft.FileSnapshotStore names each
// "<term>-<index>-<ms>"; unfinished ones end in ".tmp"), 0 if there is
// none.
func finishedSnapshots(snapDir string) (count int, newest uint64) {
	entries, err := os.ReadDir(snapDir)
	if err != nil {
		return 0, 0
	}
	for _, e := range entries {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		count++
		parts := strings.Split(e.Name(), "-")
		if len(parts) != 3 {
			continue
		}
		if idx, err := strconv.ParseUint(parts[1], 10, 64); err == nil && idx > newest {
			newest = idx
		}
	}
	return count, newest
}

// loadMeta is meta.Load, with a memory fault turned into an error. The meta
// store is a bbolt file read through mmap: one cut short (a truncated copy,
// a damaged disk) makes bbolt read past its end, which is a SIGBUS, and Go
// kills the process with a stack trace that names no file.
func loadMeta(meta *metadb.BoltMetaDB, raftDir string) (ps types.PersistentState, err error) {
	var loadErr error
	if err := withFaults(func() { ps, loadErr = meta.Load(raftDir) }); err != nil {
		return ps, err
	}
	return ps, loadErr
}

// withFaults runs f, which reads a file through a memory mapping, and
// returns a memory fault in it (a file cut short under the mapping, a
// disk's read error) as an error instead of letting it kill the process.
// f runs on a goroutine of its own, the only one that SetPanicOnFault
// affects.
func withFaults(f func()) (err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		debug.SetPanicOnFault(true)
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("the file is damaged or cut short (reading it faulted: %v)", p)
			}
		}()
		f()
	}()
	<-done
	return err
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
	lock, err := LockFile(filepath.Join(raftDir, raftLockName), "raft storage "+raftDir)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return lock, nil
}

// LockFile takes an exclusive lock on the file at path (creating it), for
// as long as the returned file stays open, and writes this process's pid
// in it. what names the thing the lock guards, for the error when another
// holder has it: "<what> is already in use by pid N (lock file <path> is
// held)". The lock is flock's, per open file description: a second
// LockFile in this process is refused as well as one in another process.
func LockFile(path, what string) (*os.File, error) {
	lock, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cannot open the lock file of %s: %w%s", what, err, permissionHint(err))
	}
	err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		lock.Close()
		holder := ""
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
				holder = fmt.Sprintf(" by pid %d", pid)
			}
		}
		return nil, fmt.Errorf("%s is already in use%s (lock file %s is held)", what, holder, path)
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("locking %s: %w", what, err)
	}
	// The pid is only a hint for humans; failing to record it is not fatal.
	if err := lock.Truncate(0); err == nil {
		_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return lock, nil
}
