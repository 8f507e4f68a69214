package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/agent"
	"github.com/holdfast/holdfast/internal/httpapi"
	"github.com/holdfast/holdfast/internal/httpserve"
	"github.com/holdfast/holdfast/internal/logsample"
	"github.com/holdfast/holdfast/internal/server"
)

// The server must serve the HTTP API.
var _ httpapi.Backend = (*server.Server)(nil)

const agentUsage = `Usage: holdfast agent [options]

Runs a holdfast server: raft-replicated state (a single voter by default,
or one of a cluster of servers) and Consul's HTTP API.

  holdfast agent -dev                 in-memory, for trying things out
  holdfast agent -data-dir DIR        durable: every key and session survives a restart
  holdfast agent                      durable, in the default data directory
  holdfast agent -data-dir DIR -bootstrap-expect 3 -join ADDR
                                      one of three servers of a cluster: they
                                      bootstrap it once the pool holds all three
  holdfast agent -data-dir DIR -join ADDR
                                      a server that waits to be added to the
                                      cluster of ADDR's pool by its leader
  holdfast agent -server=false -join ADDR
                                      a client agent: gossip and HTTP only,
                                      forwarding to the servers of ADDR's pool

Options:
`

func runAgent(ctx context.Context, stdio Stdio, args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stdio.Err)
	fs.Usage = func() {
		fmt.Fprint(stdio.Err, agentUsage)
		fs.PrintDefaults()
	}
	var (
		dev        = fs.Bool("dev", false, "run in memory: nothing is written to disk")
		dataDir    = fs.String("data-dir", "", "directory for the raft log and snapshots (default $HOLDFAST_DATA_DIR or ~/.local/share/holdfast)")
		httpAddr   = fs.String("http-addr", "127.0.0.1:8500", "address of the HTTP API")
		raftAddr   = fs.String("server-addr", "127.0.0.1:8300", "address raft listens on")
		node       = fs.String("node", "", "node name (default: the host name)")
		dc         = fs.String("datacenter", "dc1", "datacenter name")
		logLevel   = fs.String("log-level", "info", "log level: trace, debug, info, warn or error")
		multiplier = fs.Float64("session-ttl-multiplier", 1, "how many TTLs an unrenewed session lives: 1 invalidates it at its TTL; Consul uses 2")
		ttlMin     = fs.Duration("session-ttl-min", 10*time.Second, "smallest session TTL accepted")
		debugAddr  = fs.String("debug-addr", "", "if set, serve Go's pprof profiles on this address (e.g. 127.0.0.1:8501)")
		serfAddr   = fs.String("serf-addr", "127.0.0.1:8301", "address the agent gossips on, TCP and UDP (port 0 picks a free one)")
		isServer   = fs.Bool("server", true, "run a server; -server=false runs a client agent: no raft, requests forwarded to a server learned through gossip")
		gossipProf = fs.String("gossip-profile", "lan", "failure detector timing: lan, or fast (for tests on one machine)")
		httpLoop   = fs.String("http-server", "holdfast", "HTTP server: holdfast (each request on its connection's goroutine) or stdlib (net/http's Server: a fallback that costs 10-20 % more CPU per request)")
		gcFloor    = fs.Uint("gc-floor", 8, "MiB the heap may grow by between garbage collections at least, while the live heap is small (0: GOGC alone)")
		gcBusy     = fs.Uint("gc-floor-busy", 64, "MiB the floor may rise to while the agent is busy: it follows what the agent allocates in a quarter of a second, and is back at -gc-floor within a second of the load ending (at most -gc-floor: a fixed floor)")
		expect     = fs.Int("bootstrap-expect", 0, "servers to wait for before bootstrapping a cluster of them; 0: bootstrap alone, unless -join is given (then wait to be added by the leader of the pool joined)")
		encrypt    = fs.String("encrypt", "", "gossip key (base64 of 16, 24 or 32 bytes; holdfast keygen makes one): gossip is encrypted and only agents with the key join the pool")
		encryptF   = fs.String("encrypt-file", "", "file holding the gossip key, as -encrypt takes it (keeps the key out of the process list)")
		joins      stringList
	)
	fs.Var(&joins, "join", "gossip `address` (host:port) of an agent whose pool to join; may be repeated; retried until it works")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &ExitError{Code: 1, Msg: err.Error(), Silent: true}
	}
	if fs.NArg() > 0 {
		return &ExitError{Code: 1, Msg: fmt.Sprintf("agent: unexpected argument %q", fs.Arg(0))}
	}
	if *httpLoop != "holdfast" && *httpLoop != "stdlib" {
		return &ExitError{Code: 1, Msg: fmt.Sprintf("agent: -http-server must be holdfast or stdlib, not %q", *httpLoop)}
	}
	if *gcFloor > maxFloorMiB || *gcBusy > maxFloorMiB {
		return &ExitError{Code: 1, Msg: fmt.Sprintf("agent: -gc-floor and -gc-floor-busy are MiB, at most %d (1 TiB); got %d and %d", maxFloorMiB, *gcFloor, *gcBusy)}
	}
	level := hclog.LevelFromString(*logLevel)
	if level == hclog.NoLevel {
		return &ExitError{Code: 1, Msg: fmt.Sprintf("agent: unknown -log-level %q: use trace, debug, info, warn or error", *logLevel)}
	}
	gopts, err := parseGossipFlags(*serfAddr, *gossipProf, joins)
	if err != nil {
		return &ExitError{Code: 1, Msg: err.Error()}
	}
	if gopts.key, err = parseGossipKey(*encrypt, *encryptF); err != nil {
		return &ExitError{Code: 1, Msg: err.Error()}
	}
	if *dev && *dataDir != "" {
		return &ExitError{Code: 1, Msg: "agent: -dev keeps everything in memory; it cannot be combined with -data-dir"}
	}
	dir := *dataDir
	if !*dev && dir == "" {
		dir = defaultDataDir(stdio)
		if dir == "" {
			return &ExitError{Code: 1, Msg: "agent: no -data-dir given and no home directory to put the default in"}
		}
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "holdfast", Level: level, Output: stdio.Err})
	defer startHeapFloor(uint64(*gcFloor)<<20, uint64(*gcBusy)<<20)()
	mode, clusterDesc, err := bootstrapMode(*expect, len(joins) > 0, *dev)
	if err != nil {
		return &ExitError{Code: 1, Msg: err.Error()}
	}
	if !*isServer {
		if *expect != 0 {
			return &ExitError{Code: 1, Msg: "agent: -bootstrap-expect is for servers; a client agent (-server=false) joins with -join"}
		}
		return runClientAgent(ctx, stdio, clientOptions{node: *node, datacenter: *dc, httpAddr: *httpAddr, gossip: gopts,
			logger: logger, dataDir: dir})
	}

	if from, to := raiseServerProcs(); to != from {
		logger.Info("raised GOMAXPROCS so that the raft log's fsync does not stall every request (set GOMAXPROCS to choose)",
			"from", from, "to", to)
	}

	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return &ExitError{Code: 1, Msg: fmt.Sprintf("agent: cannot listen for HTTP on %s: %v", *httpAddr, err)}
	}
	defer ln.Close()
	ln = limitHTTPConns(ln, logger)

	// The agent is made after the server it writes through; the server's
	// hook finds it here once it exists.
	var agentRef atomic.Pointer[agent.Agent]
	agentTelemetry() // before raft starts, so that its first metrics are kept
	srv, err := server.New(server.Config{
		NodeName: *node, Datacenter: *dc, DataDir: dir, RaftAddr: *raftAddr,
		HTTPAddr: ln.Addr().String(), Logger: logger,
		SessionTTLMultiplier: *multiplier, SessionTTLMin: *ttlMin,
		Gossip:    gopts.config(logger, nil),
		Bootstrap: mode, BootstrapExpect: *expect,
		PeerInCluster: peerInCluster, PeerProgress: peerProgress,
		OnSelfRegistered: func() {
			ag := agentRef.Load()
			if ag == nil {
				return
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := ag.Resync(rctx); err != nil && !errors.Is(err, agent.ErrClosed) {
				logger.Warn("writing the agent's checks and services again after the node was put back", "error", err)
			}
		},
	})
	if err != nil {
		return &ExitError{Code: 1, Msg: "agent: " + strings.TrimPrefix(err.Error(), "server: ")}
	}
	// The agent runs this node's checks and services, writing through the server.
	// With a data directory the agent keeps its checks and services
	// there, so that a restart brings them (and the sessions bound to
	// them) back, as Consul's agent does.
	stateFile := ""
	if dir != "" {
		stateFile = filepath.Join(dir, "agent-registrations.json")
	}
	ag := agent.New(agent.Config{Node: srv.NodeName(), Catalog: newLeaderCatalog(srv), Logger: slog.New(hclogHandler{logger.Named("agent")}), StateFile: stateFile})
	defer ag.Close()
	agentRef.Store(ag)
	go restoreAgentChecks(ctx, srv, ag, logger)
	// Done at shutdown, so that parked blocking queries (a client agent
	// keeps one open all the time) answer at once instead of holding the
	// shutdown for up to its five seconds.
	httpStop, stopHTTP := context.WithCancel(context.Background())
	defer stopHTTP()
	handler := httpapi.New(srv, httpapi.Options{
		Stop:   httpStop,
		Agent:  ag,
		Logger: slog.New(hclogHandler{logger}),
		Jitter: func(max time.Duration) time.Duration {
			if max <= 0 {
				return 0
			}
			return rand.N(max)
		},
	})
	// httpserve by default rather than net/http's Server: the same parser
	// and handlers, 9-18 % less CPU per request (see its package doc).
	var hs interface {
		Serve(net.Listener) error
		Shutdown(context.Context) error
		Close() error
	}
	leave := newAgentLeave(func() error {
		if err := srv.TransferLeadership(leaveTimeout); err != nil {
			logger.Warn("leaving without handing the leadership over: the others elect a leader when they miss this one", "error", err)
		}
		return srv.Gossip().Leave(leaveTimeout)
	})
	router := newLeaderRouter(srv, withLeave(leave, withAgentRoutes(srv.Gossip(), withOperatorRoutes(srv, handler))), ln.Addr().String(), logger)
	router.fwd.stopping = httpStop
	var root http.Handler = router
	if *httpLoop == "stdlib" {
		hs = &http.Server{Handler: root, ReadHeaderTimeout: readHeaderTimeout}
		// Its writers cannot be reached: the stall bound goes on the
		// connections, every write of theirs.
		ln = httpserve.StallConns(ln, streamStallTimeout)
	} else {
		hs = &httpserve.Server{
			Handler:            root,
			ReadHeaderTimeout:  readHeaderTimeout,
			StreamStallTimeout: streamStallTimeout,
			ErrorLog:           func(msg string) { logger.Error(msg) },
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()

	if *debugAddr != "" {
		dl, err := net.Listen("tcp", *debugAddr)
		if err != nil {
			hs.Close()
			srv.Shutdown()
			return &ExitError{Code: 1, Msg: fmt.Sprintf("agent: cannot listen for -debug-addr on %s: %v", *debugAddr, err)}
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		ds := &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout}
		go ds.Serve(dl)
		defer ds.Close()
	}

	storage := "in memory (-dev): nothing survives a restart"
	if dir != "" {
		storage = "durable, in " + dir
	}
	fmt.Fprintf(stdio.Out, "holdfast agent running\n  node:    %s\n  http:    http://%s\n  raft:    %s\n  gossip:  %s\n  storage: %s\n  cluster: %s\n",
		srv.NodeName(), ln.Addr(), srv.RaftAddr(), gopts.describe(srv.Gossip().Addr()), storage, clusterDesc)
	warnExposed(logger, listener{name: "http", addr: ln.Addr().String()}, listener{name: "raft", addr: srv.RaftAddr()},
		listener{name: "gossip", addr: srv.Gossip().Addr(), guarded: gopts.key != nil}, listener{name: "debug", addr: *debugAddr})
	fatal := make(chan error, 1) // the name is taken
	startJoin(ctx, srv.Gossip(), gopts.joins, logger, fatal)
	// A server that does not lead keeps its node's checks and services
	// in the leader's catalog as a client agent does (the leader puts
	// its own back through OnSelfRegistered).
	go router.fwd.keepRegistered(ctx, ag, clock.Real())
	go router.fwd.watchTargets(ctx, clock.Real())

	var runErr error
	select {
	case <-ctx.Done():
		fmt.Fprintln(stdio.Out, "holdfast agent shutting down")
	case err := <-errc:
		runErr = &ExitError{Code: 1, Msg: "agent: HTTP server stopped: " + err.Error()}
	case err := <-fatal:
		runErr = &ExitError{Code: 1, Msg: "agent: " + strings.TrimPrefix(err.Error(), "gossip: ")}
	case err := <-srv.Failed():
		logger.Error("stopping: " + err.Error())
		runErr = &ExitError{Code: 1, Msg: "agent: " + err.Error()}
	case <-leave.done:
		fmt.Fprintln(stdio.Out, "holdfast agent left its pool; shutting down")
	}
	// Leading a cluster, hand the leadership over first: the others need
	// not wait out an election timeout, and requests that arrive here
	// meanwhile are forwarded to the new leader.
	if err := srv.TransferLeadership(5 * time.Second); err != nil {
		logger.Warn("stopping without handing the leadership over: the others elect a leader when they miss this one", "error", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stopHTTP()
	hs.Shutdown(sctx)
	if err := srv.Shutdown(); err != nil && runErr == nil {
		runErr = &ExitError{Code: 1, Msg: "agent: shutdown: " + err.Error()}
	}
	return runErr
}

// fdReserve is how many of its open-file limit the agent keeps from HTTP
// clients for its own files and sockets: raft log segments (about ten at
// the log's size bound), snapshots, the meta store, raft's and gossip's
// sockets, and the sockets of the health checks it runs.
const fdReserve = 128

// limitHTTPConns caps the agent's HTTP connections below its open-file
// limit (ulimit -n), fdReserve short of it (or at half of a limit too
// small for that), and logs refusals once per 10 s. Clients that took
// every descriptor stopped a server at its next log segment, and failed
// its TCP checks, which took the sessions bound to them.
func limitHTTPConns(ln net.Listener, logger hclog.Logger) net.Listener {
	limit := openFileLimit()
	if limit <= 0 {
		return ln
	}
	most := max(limit-fdReserve, limit/2)
	warn := func(open, refused int) {
		logger.Warn(fmt.Sprintf("refusing HTTP connections: %d are open, the most this agent takes "+
			"(its open-file limit, ulimit -n, is %d, and it keeps %d for its own files); "+
			"raise the limit, or look for a client that leaks connections", open, limit, limit-most), "refused", refused)
	}
	sample := &logsample.Sampler{Every: 10 * time.Second, Clock: clock.Real(), Flush: func(n int) { warn(most, n) }}
	return httpserve.LimitConns(ln, most, func(open int) {
		if n := sample.Note(); n > 0 {
			warn(open, n)
		}
	})
}

// readHeaderTimeout bounds the time a client may take to send a request
// header to the agent's HTTP listeners.
const readHeaderTimeout = 10 * time.Second

// streamStallTimeout is how long a large answer (a snapshot, a big
// listing) may wait while its client takes none of it before the
// connection is closed: a client that stopped reading would otherwise hold
// the request, and the snapshot file a save streams from, for as long as it
// kept the connection open. A client that reads, however slowly, is not
// cut.
const streamStallTimeout = time.Minute

func defaultDataDir(stdio Stdio) string {
	if d := stdio.getenv("HOLDFAST_DATA_DIR"); d != "" {
		return d
	}
	if d := stdio.getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "holdfast")
	}
	if h := stdio.getenv("HOME"); h != "" {
		return filepath.Join(h, ".local", "share", "holdfast")
	}
	return ""
}

// hclogHandler lets the HTTP layer's slog output go through the agent's
// hclog logger, so there is one log format.
type hclogHandler struct{ l hclog.Logger }

func (h hclogHandler) Enabled(_ context.Context, lv slog.Level) bool {
	switch {
	case lv >= slog.LevelError:
		return h.l.IsError()
	case lv >= slog.LevelWarn:
		return h.l.IsWarn()
	case lv >= slog.LevelInfo:
		return h.l.IsInfo()
	}
	return h.l.IsDebug()
}

func (h hclogHandler) Handle(_ context.Context, r slog.Record) error {
	args := make([]interface{}, 0, 2*r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		args = append(args, a.Key, a.Value.Any())
		return true
	})
	switch {
	case r.Level >= slog.LevelError:
		h.l.Named("http").Error(r.Message, args...)
	case r.Level >= slog.LevelWarn:
		h.l.Named("http").Warn(r.Message, args...)
	case r.Level >= slog.LevelInfo:
		h.l.Named("http").Info(r.Message, args...)
	default:
		h.l.Named("http").Debug(r.Message, args...)
	}
	return nil
}

func (h hclogHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h hclogHandler) WithGroup(string) slog.Handler      { return h }

// restoreAgentChecks, once a leader is known, registers again the checks
// and services the agent kept from its last run, then drops the agent
// checks an earlier run left in the catalog that nothing runs now.
func restoreAgentChecks(ctx context.Context, srv *server.Server, ag *agent.Agent, logger hclog.Logger) {
	if err := waitForClusterLeader(ctx, srv); err != nil {
		return // no leader (yet): the next start of this agent tries again
	}
	if err := ag.Restore(ctx); err != nil {
		// What failed stays in the state file and is not forgotten below.
		logger.Error("could not register again the checks and services of the last run", "error", err)
	}
	_, checks := srv.State().NodeChecks(nil, srv.NodeName())
	if err := ag.ForgetStale(ctx, checks); err != nil {
		logger.Warn("could not drop checks left by an earlier run", "error", err)
	}
}

// bootstrapMode maps -bootstrap-expect and -join to how a server with no
// raft state forms its cluster, and says it in words for the banner.
func bootstrapMode(expect int, joins, dev bool) (server.BootstrapMode, string, error) {
	switch {
	case expect < 0:
		return 0, "", fmt.Errorf("agent: -bootstrap-expect must be 0 or more, not %d", expect)
	case dev && (expect >= 2 || expect == 0 && joins):
		// A voter that forgets its log and its vote at a restart can
		// lose writes a quorum acknowledged.
		return 0, "", errors.New("agent: -dev keeps the raft state in memory, which a server of a cluster must not lose at a restart; give each server a -data-dir (a -dev server may still be joined by client agents)")
	case expect >= 2:
		return server.BootstrapExpect, fmt.Sprintf("a new data directory waits for %d servers in the gossip pool, then bootstraps a cluster of them (-bootstrap-expect)", expect), nil
	case dev:
		return server.BootstrapAlone, "in memory: a single voter", nil
	case expect == 0 && joins:
		return server.BootstrapNone, "a new data directory waits to be added by the leader of the pool it joins (-bootstrap-expect 1 bootstraps it alone)", nil
	}
	return server.BootstrapAlone, "a new data directory bootstraps a single voter; servers that join later are added", nil
}
