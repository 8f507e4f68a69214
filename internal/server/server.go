package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	metrics "github.com/hashicorp/go-metrics/compat"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/types"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/gossip"
	"github.com/holdfast/holdfast/internal/logsample"
	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/ttl"
)

// Config configures a Server. The zero value of each field has a default.
type Config struct {
	// NodeName names this node in the catalog and in raft. Default: host name.
	NodeName string
	// Datacenter name. Default "dc1".
	Datacenter string
	// DataDir holds the raft log and snapshots. Empty means in memory
	// (nothing survives a restart; for -dev and tests).
	DataDir string
	// RaftAddr is the address raft listens on (default 127.0.0.1:8300).
	// Ignored when Transport is set.
	RaftAddr string
	// Transport overrides the raft transport (tests use in-memory ones).
	Transport raft.Transport
	// AdvertiseAddr is the address registered for this node in the catalog.
	// Default 127.0.0.1.
	AdvertiseAddr string
	// HTTPAddr is reported by /v1/agent/self.
	HTTPAddr string
	// Clock drives session TTLs, lock-delay checks and the stamps on
	// commands. Default clock.Real().
	Clock clock.Clock
	// Logger for the server and raft. Default: hclog to stderr at INFO.
	Logger hclog.Logger

	// SessionTTLMin and SessionTTLMax bound session TTLs (default 10s, 24h).
	SessionTTLMin, SessionTTLMax time.Duration
	// SessionTTLMultiplier stretches every TTL timer: 1 (the default) means
	// a session that is not renewed is invalidated at its TTL; Consul uses 2.
	SessionTTLMultiplier float64

	// ApplyTimeout bounds how long the leadership barrier waits to be
	// enqueued in raft, and after how long a shutdown says that it is
	// still waiting for writes in raft. Writes themselves pass the apply
	// gate, which never lets in more than the apply channel holds, so
	// they need no such bound.
	ApplyTimeout time.Duration
	// ReapInterval is how often the leader drops old tombstones and ended
	// lock-delays (default 15m). Tombstones live one to two intervals.
	ReapInterval time.Duration
	// LogSizeLimit bounds the raft log's segment files on the disk: past
	// it the server takes a snapshot and compacts the log to a quarter of
	// it (see logsize.go). Default 512 MiB; negative: raft's entry counts
	// alone.
	LogSizeLimit int64
	// RaftTuning, if set, edits the raft configuration before use (tests
	// shorten timeouts with it).
	RaftTuning func(*raft.Config)

	// Gossip, if set, makes the server a member of a gossip pool with this
	// configuration (its Name is NodeName; role, dc, raft and http tags
	// are added), and the leader keeps the catalog in step with the pool
	// (see serf.go). Nil: no gossip.
	Gossip *gossip.Config

	// Bootstrap says how a server with no raft state forms its cluster
	// (see cluster.go): alone by default, with BootstrapExpect servers
	// of its gossip pool, or not at all (it waits to be added).
	Bootstrap BootstrapMode
	// BootstrapExpect is the number of servers a BootstrapExpect server
	// waits for, at least 2.
	BootstrapExpect int
	// PeerInCluster asks a server of the pool whether it is in a cluster
	// already (a server expecting others bootstraps only if none is), and
	// PeerProgress asks one for its raft term, last log index and last
	// contact with a leader (the leader promotes a non-voter once it has
	// caught up, and reports the servers' health). The agent asks
	// over HTTP; tests ask the servers themselves. Without them a server
	// never bootstraps with others, and non-voters are never promoted.
	PeerInCluster func(context.Context, gossip.Member) (bool, error)
	PeerProgress  func(context.Context, gossip.Member) (Progress, error)

	// OnSelfRegistered, if set, is called, on a goroutine of its own,
	// each time the leader had to put this server's node back in the
	// catalog (someone deregistered it): the agent of this node then
	// writes its checks and services again, which went with the node.
	OnSelfRegistered func()

	// Metrics receives the server's gauges and samples (telemetry.go).
	// Default: go-metrics' global, where raft and memberlist emit too.
	Metrics *metrics.Metrics

	// logFS, if set, is the file system the raft log is written through
	// (tests inject faults with it); nil is the real one.
	logFS types.VFS
	// logSegmentSize, with logFS, sets the raft log's segment size (tests
	// make it small to reach a rotation); 0 is raft-wal's.
	logSegmentSize int
}

func (c *Config) setDefaults() error {
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return fmt.Errorf("server: no node name given and the host name is unknown: %v", err)
		}
		c.NodeName = h
	}
	if c.Datacenter == "" {
		c.Datacenter = "dc1"
	}
	if c.LogSizeLimit == 0 {
		c.LogSizeLimit = defaultLogSizeLimit
	}
	if c.RaftAddr == "" {
		c.RaftAddr = "127.0.0.1:8300"
	}
	if c.AdvertiseAddr == "" {
		c.AdvertiseAddr = "127.0.0.1"
	}
	if c.Clock == nil {
		c.Clock = clock.Real()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.Default()
	}
	if c.Logger == nil {
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "holdfast", Level: hclog.Info, Output: os.Stderr})
	}
	if c.SessionTTLMin == 0 {
		c.SessionTTLMin = 10 * time.Second
	}
	if c.SessionTTLMax == 0 {
		c.SessionTTLMax = 24 * time.Hour
	}
	if c.SessionTTLMultiplier == 0 {
		c.SessionTTLMultiplier = 1
	}
	if c.SessionTTLMultiplier < 1 {
		return fmt.Errorf("server: session TTL multiplier %v is below 1: a session would expire before its TTL", c.SessionTTLMultiplier)
	}
	switch c.Bootstrap {
	case BootstrapAlone, BootstrapNone:
	case BootstrapExpect:
		if c.BootstrapExpect < 2 {
			return fmt.Errorf("server: expecting %d servers to bootstrap a cluster: expect at least 2, or bootstrap alone", c.BootstrapExpect)
		}
		if c.Gossip == nil {
			return errors.New("server: a server expecting others to bootstrap a cluster needs gossip to find them")
		}
	default:
		return fmt.Errorf("server: unknown bootstrap mode %d", c.Bootstrap)
	}
	if c.ApplyTimeout == 0 {
		c.ApplyTimeout = 30 * time.Second
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = 15 * time.Minute
	}
	return nil
}

// maxAppendEntries is raft's MaxAppendEntries: the most log entries in
// one batch, and the size of the apply channel.
const maxAppendEntries = 512

// Server is one holdfast server: a raft member with the state machine, and
// while it leads, the owner of session timers and the other leader duties.
// Its methods implement httpapi.Backend and are safe for concurrent use.
type Server struct {
	// gate lets one batch of commands into raft at a time.
	gate applyGate

	cfg    Config
	log    hclog.Logger
	clk    clock.Clock
	fsm    *fsm.FSM
	raft   *raft.Raft
	stores *stores
	trans  raft.Transport
	timers *ttl.Timers

	// readyForReads is set once a new leader has applied everything
	// committed before its term (after the leadership barrier).
	readyForReads atomic.Bool
	// replayed is set with readyForReads and never cleared: this
	// process's state has caught up with the log once (see Replayed).
	replayed atomic.Bool
	// reads coalesces the leadership checks of consistent reads.
	reads readBarrier
	// acks records the followers' answers to heartbeats, the proof
	// those checks rest on (leaderproof.go).
	acks ackTracker
	// handingOver counts the leadership transfers under way.
	handingOver atomic.Int32
	// health remembers, for autopilot's health, since when each server
	// has been as healthy as it is.
	health healthMemory

	leaderMu     sync.Mutex
	leaderCancel context.CancelFunc // stops the leader duties of the current term
	leaderDone   chan struct{}

	serf *serfState // gossip; nil without Config.Gossip

	// expMu orders session renewals against expiries; expiring holds the
	// sessions whose expiry has begun and whose destroy is not through.
	expMu    sync.Mutex
	expiring map[string]struct{}
	// expiredLog samples the log lines of TTL expiries: one per
	// expiredLogEvery.
	expiredLog logsample.Sampler

	// started is when New began, on the real clock (raft's LastContact
	// is on it too).
	started time.Time
	// stampBase and stampShift make the times stamped on commands (see
	// stamp).
	stampBase  time.Time
	stampShift atomic.Int64 // nanoseconds

	// logCheck (capacity 1) asks watchLogSize for a look at the log.
	logCheck chan struct{}

	shutdownOnce sync.Once
	shutdownCh   chan struct{}
	metrics      *metrics.Metrics // cfg.Metrics
	applySeq     atomic.Uint64    // writes begun, for applySampleEvery
	lockStats    lockStats        // acquires through KVS, for the lock.* counters
	restoring    chan struct{}    // capacity 1: held by the one RestoreSnapshot that runs
	wg           sync.WaitGroup
}

// New starts a server. With no existing raft state it bootstraps a cluster
// of one voter (itself), so a lone server elects itself at once, unless
// Config.Bootstrap says otherwise (see cluster.go).
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, clk: cfg.Clock, fsm: fsm.New(), shutdownCh: make(chan struct{}), restoring: make(chan struct{}, 1),
		expiring: make(map[string]struct{}), started: time.Now(), logCheck: make(chan struct{}, 1)}
	var (
		st  *stores
		err error
	)
	if cfg.logFS != nil && cfg.DataDir != "" {
		st, err = openDiskStores(cfg.DataDir, cfg.Logger.Named("raft-store"), cfg.logFS, cfg.logSegmentSize)
	} else {
		st, err = openStores(cfg.DataDir, cfg.Logger.Named("raft-store"))
	}
	if err != nil {
		return nil, err
	}
	s.stores = st
	s.expiredLog = logsample.Sampler{Every: expiredLogEvery, Clock: s.clk, Flush: func(n int) {
		s.log.Info("sessions invalidated: their TTL lapsed", "count", n)
	}}
	s.stampBase = cfg.Clock.Now()
	if st.growth != nil && cfg.LogSizeLimit > 0 {
		// Look at the log's size a few times per limit's worth of writes.
		st.growth.step = min(growStep, cfg.LogSizeLimit/8)
	}

	trans := cfg.Transport
	if trans == nil {
		addr, err := net.ResolveTCPAddr("tcp", cfg.RaftAddr)
		if err != nil {
			st.close()
			return nil, fmt.Errorf("server: bad raft address %q: %w", cfg.RaftAddr, err)
		}
		var advertise net.Addr = addr
		if addr.Port == 0 {
			advertise = nil // let the transport advertise the port it was given
		}
		tt, err := raft.NewTCPTransportWithLogger(cfg.RaftAddr, advertise, 8, 10*time.Second, cfg.Logger.Named("raft-net"))
		if err != nil {
			st.close()
			return nil, fmt.Errorf("server: raft cannot listen on %s: %w", cfg.RaftAddr, err)
		}
		trans = tt
	}
	s.trans = trans

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeName)
	rc.Logger = cfg.Logger.Named("raft")
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = maxAppendEntries
	rc.SnapshotThreshold = 16384
	rc.TrailingLogs = 10240
	rc.HeartbeatTimeout = 500 * time.Millisecond
	rc.ElectionTimeout = 500 * time.Millisecond
	rc.LeaderLeaseTimeout = 250 * time.Millisecond
	rc.NoSnapshotRestoreOnStart = false
	if cfg.RaftTuning != nil {
		cfg.RaftTuning(rc)
	}

	has, err := raft.HasExistingState(st.log, st.stable, st.snaps)
	if err != nil {
		s.closeStores()
		return nil, fmt.Errorf("server: reading raft state: %w", err)
	}
	if !has && cfg.Bootstrap == BootstrapAlone {
		conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: trans.LocalAddr()}}}
		if err := raft.BootstrapCluster(rc, st.log, st.stable, st.snaps, trans, conf); err != nil {
			s.closeStores()
			return nil, fmt.Errorf("server: bootstrapping raft: %w", err)
		}
	}
	if has {
		if err := refuseNewer(st); err != nil {
			s.closeStores()
			return nil, fmt.Errorf("server: %w", err)
		}
		if err := dropLogBehindSnapshot(st, s.log); err != nil {
			s.closeStores()
			return nil, fmt.Errorf("server: %w", err)
		}
		if err := recoverPeers(&cfg, rc, s.fsm, st, trans); err != nil {
			s.closeStores()
			return nil, fmt.Errorf("server: %w", err)
		}
	}
	r, err := newRaft(rc, s.fsm, st, withAcks(trans, &s.acks), cfg.DataDir)
	if err != nil {
		s.closeStores()
		return nil, fmt.Errorf("server: starting raft: %w", err)
	}
	if has {
		if err := checkMember(r, rc.LocalID, cfg.DataDir); errors.Is(err, errNotMember) && cfg.Bootstrap != BootstrapAlone {
			// A server that left or was removed, started again to join
			// its pool: the leader adds it as a new member, and raft
			// brings its log in line (it never stands for election
			// while it is out of the configuration).
			s.log.Warn("this server is not in the raft configuration it last knew (it left, or was removed): "+
				"it waits for the leader of the pool it joins to add it again", "node", cfg.NodeName)
		} else if err != nil {
			r.Shutdown().Error()
			s.closeStores()
			return nil, err
		}
	}
	s.raft = r
	s.reads.verify = s.verifyLeader
	if has {
		s.logReplay(st)
	}
	if err := s.startGossip(); err != nil {
		r.Shutdown().Error()
		s.closeStores()
		return nil, err
	}
	if !has && cfg.Bootstrap == BootstrapExpect {
		s.wg.Add(1)
		go s.bootstrapLoop()
	}
	s.timers = ttl.New(s.clk, s.onSessionExpired, ttl.WithIntern(s.storedSessionID))

	s.metrics = cfg.Metrics
	s.wg.Add(2)
	go s.monitorLeadership()
	go s.statsLoop()
	if st.growth != nil {
		s.wg.Add(1)
		go s.watchLogSize()
	}
	return s, nil
}

// newRaft is raft.NewRaft, except that a log which does not continue from
// a snapshot, or that raft cannot read, is an error rather than a panic. raft.NewRaft restores the
// newest snapshot it can read and then reads every log entry after it (from
// entry 1 if it restored none); it panics if one is missing. That is what a
// data directory looks like whose log was compacted into a snapshot that
// has since been lost or damaged: the state cannot be rebuilt, and the
// operator needs to be told so, and where, rather than shown a stack trace.
// raft starts no goroutine before that point, so nothing is left running.
func newRaft(rc *raft.Config, f raft.FSM, st *stores, trans raft.Transport, dir string) (r *raft.Raft, err error) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		if e, ok := p.(error); ok && errors.Is(e, raft.ErrLogNotFound) {
			r, err = nil, logGapError(st, dir)
			return
		}
		// Anything else raft cannot read at start (an entry that does
		// not decode) is a damaged log too: say where, not how deep.
		where := "the in-memory log"
		if dir != "" {
			where = filepath.Join(dir, raftDirName)
		}
		r, err = nil, fmt.Errorf("raft could not start from the log and snapshots in %s (%v; raft's own errors are logged above): "+
			"most likely the data directory is damaged, and should be restored from a backup", where, p)
	}()
	r, err = raft.NewRaft(rc, f, st.log, st.stable, st.snaps, trans)
	if err != nil && dir != "" && strings.Contains(err.Error(), "failed to load any existing snapshots") {
		// raft logs why each snapshot failed (a CRC mismatch, a state that
		// does not decode); its error names neither the reason nor where.
		err = fmt.Errorf("%w in %s (each one's error is logged above): the data directory is damaged, "+
			"or was written by a newer holdfast", err, filepath.Join(dir, snapshotDirName))
	}
	return r, err
}

// refuseNewer refuses a data directory that a newer holdfast wrote: its
// newest snapshot in a newer format, or a log entry after it with a newer
// envelope or command type. Without it, the first made raft fall back to
// an older snapshot and then report the log as damaged ("log entries are
// missing"), and the second panicked in the state machine after the agent
// said it was running.
func refuseNewer(st *stores) error {
	metas, err := st.snaps.List()
	if err != nil {
		return nil // raft's start reports it
	}
	var from uint64
	if len(metas) > 0 {
		from = metas[0].Index + 1
		if rc, err := peekSnapshot(st, metas[0].ID); err == nil {
			err = state.CheckSnapshotVersion(rc)
			rc.Close()
			// A damaged snapshot is raft's to report: the whole read that
			// checks its CRC is made only for one that claims to be newer.
			if errors.Is(err, state.ErrNewerSnapshot) && snapshotReadBack(st, metas[0].ID) == nil {
				return fmt.Errorf("the newest snapshot, %s: %v (run that holdfast, or a newer one, on this data directory)", metas[0].ID, strings.TrimPrefix(err.Error(), "state: "))
			}
		}
	}
	first, ferr := st.log.FirstIndex()
	last, lerr := st.log.LastIndex()
	if ferr != nil || lerr != nil || last == 0 {
		return nil
	}
	for i := max(first, from); i <= last; i++ {
		var l raft.Log
		if err := st.log.GetLog(i, &l); err != nil {
			return nil // raft's start reports a log it cannot read
		}
		if l.Type != raft.LogCommand {
			continue
		}
		if err := fsm.CheckEntry(l.Data); errors.Is(err, fsm.ErrNewer) {
			return fmt.Errorf("raft log entry %d: %v (run that holdfast, or a newer one, on this data directory)", i, err)
		}
	}
	return nil
}

// snapshotStateFile is the file of a file snapshot that holds the state
// (raft's FileSnapshotStore layout: <snapshots>/<id>/state.bin).
const snapshotStateFile = "state.bin"

// peekSnapshot opens snapshot id's state for a look at its header, without
// the whole read a file snapshot's Open makes to check its CRC: raft reads
// the newest snapshot whole once more when it restores it.
func peekSnapshot(st *stores, id string) (io.ReadCloser, error) {
	if t, ok := st.snaps.(*tidySnapshots); ok {
		return os.Open(filepath.Join(t.dir, id, snapshotStateFile))
	}
	_, rc, err := st.snaps.Open(id)
	return rc, err
}

// snapshotReadBack opens snapshot id and says why it does not, which for
// a file snapshot means reading it whole to check its CRC (without the
// "snapshot read" line a restore logs).
func snapshotReadBack(st *stores, id string) error {
	open := st.snaps.Open
	if t, ok := st.snaps.(*tidySnapshots); ok {
		open = t.FileSnapshotStore.Open
	}
	_, rc, err := open(id)
	if err != nil {
		return err
	}
	return rc.Close()
}

// dropLogBehindSnapshot deletes a log that ends before the newest
// snapshot. Only a restore of a backup cut short leaves one: raft stores
// the backup as a snapshot at an index past the log's end, on purpose, and
// deletes the log only once the state machine has loaded it. A crash in
// between left raft-wal, which appends only at its last index plus one,
// refusing the next entry ("non-monotonic log entries") at every election,
// for ever. Every entry of such a log is at or below the snapshot's index,
// so the snapshot holds all it says; raft would delete it too.
func dropLogBehindSnapshot(st *stores, logger hclog.Logger) error {
	if !monotonic(st.log) {
		return nil // raft keeps a gap in any other store
	}
	metas, err := st.snaps.List()
	if err != nil || len(metas) == 0 {
		return nil // raft's start reports unreadable snapshots
	}
	first, err := st.log.FirstIndex()
	if err != nil {
		return fmt.Errorf("reading the raft log: %w", err)
	}
	last, err := st.log.LastIndex()
	if err != nil {
		return fmt.Errorf("reading the raft log: %w", err)
	}
	if last == 0 || last >= metas[0].Index {
		return nil
	}
	// Only for a snapshot that reads back: were it damaged too, raft
	// would fall back to an older one, which needs the log.
	if err := snapshotReadBack(st, metas[0].ID); err != nil {
		logger.Warn("the raft log ends before the newest snapshot, which does not read back: keeping the log", "snapshot", metas[0].ID, "error", err)
		return nil
	}
	logger.Warn("the raft log ends before the newest snapshot (a restore of a backup was cut short): deleting the log, which the snapshot holds",
		"log_first", first, "log_last", last, "snapshot_index", metas[0].Index)
	if err := st.log.DeleteRange(first, last); err != nil {
		return fmt.Errorf("deleting the raft log behind the newest snapshot: %w", err)
	}
	return nil
}

// logReplay says, at a start on existing state, how many log entries
// follow the snapshot restored: they are applied once this server leads
// again, and requests are refused until then (a large log takes seconds).
func (s *Server) logReplay(st *stores) {
	last, err := st.log.LastIndex()
	if err != nil {
		return
	}
	var from uint64
	if metas, err := st.snaps.List(); err == nil && len(metas) > 0 {
		from = metas[0].Index // newest first
	}
	if last > from {
		s.log.Info("applying the raft log before serving: requests are refused until \"cluster leadership acquired\"",
			"entries", last-from, "after_snapshot_index", from)
	}
}

// checkMember refuses raft state whose configuration does not have this
// server in it. A server's raft ID is its node name, in the configuration
// it bootstrapped or the one a leader added it to. Raft state made under
// another node name (a renamed host, while -node defaults to
// the host name; a forgotten -node) leaves this server out of its own
// configuration, and raft would never elect it: it would run on, answering
// "No cluster leader" to everything.
func checkMember(r *raft.Raft, id raft.ServerID, dir string) error {
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("server: reading the raft configuration: %w", err)
	}
	servers := f.Configuration().Servers
	where := "the data directory " + dir
	if dir == "" {
		where = "the raft state"
	}
	if len(servers) == 0 {
		// Raft has a term or a snapshot but no configuration: the log
		// entries that held it are gone, and with no voter it would never
		// elect a leader (and with a snapshot, would serve it without the
		// writes after it).
		return fmt.Errorf("server: %s has raft state but no cluster configuration: its log is damaged or missing; "+
			"restore it from a backup, or move the directory aside to start empty", where)
	}
	var ids []string
	for _, srv := range servers {
		if srv.ID == id {
			return nil
		}
		ids = append(ids, strconv.Quote(string(srv.ID)))
	}
	if len(ids) == 1 {
		return fmt.Errorf("%w: %s belongs to node %s, and this server is node %q, which raft would never elect: "+
			"start it as node %s (-node), or give node %q a data directory of its own; "+
			"if it was taken out of a cluster (holdfast leave, remove-peer), start it with -join to be added again",
			errNotMember, where, ids[0], id, ids[0], id)
	}
	return fmt.Errorf("%w: %s belongs to a raft cluster of nodes %s, and this server is node %q, which is not one of them; "+
		"if it was taken out of that cluster (holdfast leave, remove-peer), start it with -join to be added again",
		errNotMember, where, strings.Join(ids, ", "), id)
}

// errNotMember is checkMember's error for raft state whose configuration
// does not hold this server; its text begins with "server:".
var errNotMember = errors.New("server")

// logGapError describes a log whose start is in no snapshot raft could use.
func logGapError(st *stores, dir string) error {
	first, ferr := st.log.FirstIndex()
	metas, lerr := st.snaps.List()
	var snaps []string
	for _, m := range metas {
		snaps = append(snaps, fmt.Sprintf("%s (up to index %d)", m.ID, m.Index))
	}
	found := "none"
	if len(snaps) > 0 {
		found = strings.Join(snaps, ", ")
	}
	if err := errors.Join(ferr, lerr); err != nil {
		found += fmt.Sprintf(" [%v]", err)
	}
	where := "the in-memory log"
	if dir != "" {
		where = "the data directory " + dir
	}
	return fmt.Errorf("log entries are missing in %s: the raft log starts at index %d, and no snapshot "+
		"that could be restored covers the entries before it (snapshots found: %s; raft's log above says why each it tried did not restore); "+
		"the state cannot be rebuilt from this directory, which is damaged (a snapshot lost, or one that does not read back)",
		where, first, found)
}

func (s *Server) closeStores() {
	if c, ok := s.trans.(interface{ Close() error }); ok && s.cfg.Transport == nil {
		c.Close()
	}
	if err := s.stores.close(); err != nil {
		s.log.Warn("closing raft stores", "error", err)
	}
}

// Shutdown stops leader duties and raft and closes storage. Safe to call
// more than once.
func (s *Server) Shutdown() error {
	var err error
	s.shutdownOnce.Do(func() {
		close(s.shutdownCh)
		// No write may be left in raft's apply channel when raft stops
		// (see applyGate.close). While raft runs, every future in that
		// channel is answered, so the batch in raft is always through:
		// within a store, at once if leadership is lost, or, on a disk
		// that stalls, when the disk answers, which raft.Shutdown would
		// wait for anyway.
		//
		// A restore of a backup holding the gate is waited for too, but
		// not for ever: stopped while the state machine loads the backup,
		// raft panics ("failed to restore snapshot: raft is already
		// shutdown"), and a restore that waits for a leadership this
		// server lost waits for the shutdown itself.
		restoring := s.gate.holding()
		drained := s.gate.close()
		if restoring {
			// ApplyTimeout, 30 s by default: a 313 MiB state loads in
			// about 6 s here.
			s.log.Info("shutdown is waiting for the restore of a backup to finish", "at_most", s.cfg.ApplyTimeout)
		}
		select {
		case <-drained:
		case <-time.After(s.cfg.ApplyTimeout):
			if !restoring {
				s.log.Warn("shutdown is waiting for writes still in raft")
				<-drained
			}
		}
		s.stopGossip()
		// The session timers start each expiry in a goroutine counted by
		// s.wg: they stop first, so that no expiry is added while Wait
		// runs (a WaitGroup reused during its Wait panics) or left to
		// write after raft has stopped. Expiries already started meet
		// the closed gate and end.
		s.timers.Close()
		s.wg.Wait()
		s.stopLeading()
		err = s.raft.Shutdown().Error()
		s.closeStores()
	})
	return err
}

// Failed delivers, once, an error that leaves this server unable to take
// writes until it is started again: its raft log could not start a new
// segment (see checkedLog). The agent stops on it. It never delivers for
// in-memory storage.
func (s *Server) Failed() <-chan error { return s.stores.failed }

// WaitForLeader blocks until this server is leader and ready for
// consistent reads, or ctx ends.
func (s *Server) WaitForLeader(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if s.raft.State() == raft.Leader && s.readyForReads.Load() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server: no leader elected: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// ---- errors ----

// tempError is transient server trouble; the HTTP layer maps it to 500 so
// that clients retry.
type tempError string

func (e tempError) Error() string   { return string(e) }
func (e tempError) Temporary() bool { return true }

// OutcomeUnknownError is a write that was not answered because leadership
// was lost or the log store failed while it was in flight: it may or may
// not have been applied, and may still be applied later. The HTTP API
// answers it with 500 and this sentence; a client should read before it
// retries a write that is not idempotent (a CAS, a create-if-absent).
type OutcomeUnknownError struct{ Cause error }

func (e *OutcomeUnknownError) Error() string {
	return "the write may or may not have been applied (" + e.Cause.Error() +
		"); read the current state before retrying it"
}

func (e *OutcomeUnknownError) Unwrap() error   { return e.Cause }
func (e *OutcomeUnknownError) Temporary() bool { return true }

// Transient errors.
var (
	ErrNoLeader     = tempError("No cluster leader")
	ErrShuttingDown = tempError("server is shutting down")
)

// ---- the propose path ----

// apply stamps a command with the leader's time, commits it through raft
// and returns the state machine's result.
func (s *Server) apply(t fsm.Type, body interface{}) (*fsm.Result, error) {
	b, err := fsm.Encode(t, s.stamp(), body)
	if err != nil {
		return nil, err
	}
	return s.applyCommand(b)
}

// applyCommand commits an encoded command through raft and returns the
// state machine's result. Every write ends here: a follower refuses it at
// once with ErrNoLeader (raft would too, after a trip through its loop).
func (s *Server) applyCommand(b []byte) (*fsm.Result, error) {
	return s.applyCommandAt(b, 0, false)
}

// applyAt is apply for a command decided on the state of gate epoch epoch
// (see applyGate.enterAt): refused with errStateReplaced if a restore has
// replaced that state since.
func (s *Server) applyAt(epoch uint64, t fsm.Type, body interface{}) (*fsm.Result, error) {
	b, err := fsm.Encode(t, s.stamp(), body)
	if err != nil {
		return nil, err
	}
	return s.applyCommandAt(b, epoch, true)
}

func (s *Server) applyCommandAt(b []byte, epoch uint64, pinned bool) (*fsm.Result, error) {
	if s.raft.State() != raft.Leader {
		return nil, ErrNoLeader
	}
	// The gate keeps at most gateBatch commands in raft's apply channel,
	// which BatchApplyCh buffers to MaxAppendEntries, so Apply never waits
	// for room there and needs no timeout (raft would arm a timer for it on
	// every call).
	var start time.Time
	sampled := s.applySeq.Add(1)%applySampleEvery == 0
	if sampled {
		start = s.clk.Now()
	}
	f, baton := s.gate.enterAt(s.raft, b, epoch, pinned)
	err := f.Error()
	if baton {
		s.gate.pass(s.raft)
	}
	if err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress),
			errors.Is(err, raft.ErrEnqueueTimeout):
			return nil, ErrNoLeader // refused before it reached the log
		case errors.Is(err, raft.ErrRaftShutdown):
			return nil, ErrShuttingDown
		case errors.Is(err, errStateReplaced):
			return nil, err
		}
		// Leadership lost while the entry was in flight, or the log
		// store failed: the entry may be in the log (raft-wal keeps the
		// bytes of a batch whose fsync failed), and then a later leader,
		// or this server after a restart, applies it.
		return nil, &OutcomeUnknownError{Cause: err}
	}
	if sampled {
		s.metrics.AddSample([]string{"apply"}, float32(clock.Since(s.clk, start))/float32(time.Millisecond))
	}
	res, ok := f.Response().(*fsm.Result)
	if !ok {
		return nil, fmt.Errorf("server: unexpected apply response %T", f.Response())
	}
	return res, nil
}

// newID returns a random UUID in Consul's format.
func newID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("server: generating an ID: %w", err)
	}
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// WaitForSelfRegistration blocks until this node is in the catalog with its
// serfHealth check, so sessions created with defaults succeed.
func (s *Server) WaitForSelfRegistration(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if c := s.State().Check(s.cfg.NodeName, "serfHealth"); c != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server: node %q never registered itself: %w", s.cfg.NodeName, ctx.Err())
		case <-t.C:
		}
	}
}
