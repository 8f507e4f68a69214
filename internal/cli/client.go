package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/agent"
	"github.com/holdfast/holdfast/internal/gossip"
	"github.com/holdfast/holdfast/internal/httpapi"
	"github.com/holdfast/holdfast/internal/httpserve"
	"github.com/holdfast/holdfast/internal/server"
	"github.com/holdfast/holdfast/internal/state"
)

// The client agent (holdfast agent -server=false): no raft and no
// replicated state, only gossip, the HTTP API and its own checks. It joins
// a server's pool, which makes the leader register its node with a
// serfHealth check, and forwards every HTTP request to a server it learned
// from the pool (a member with role=server and an http tag). What it
// answers or amends itself:
//
//   - PUT /v1/session/create without a Node gets this agent's node, so
//     sessions made through it live and die with it;
//   - /v1/agent/self describes this agent, and /v1/agent/members lists its
//     view of the pool;
//   - the agent's check and service endpoints are served here: the checks
//     run on this agent, for this node, and their results are written to
//     the catalog through a server (forwarded, a server would apply them to
//     its own node). When it starts, it registers again what its data
//     directory kept, if it has one, and drops from the catalog the checks
//     of an earlier run that nothing runs now (settleChecks).
//
// When the agent is stopped (SIGINT or SIGTERM) it leaves the pool
// gracefully, so its node is deregistered; when it is killed, the pool
// declares it failed and the sessions bound to its serfHealth check are
// invalidated.

// Join retry backoff of an agent's -join addresses.
const (
	joinRetryFirst = 500 * time.Millisecond
	joinRetryMax   = 30 * time.Second
)

// maxSessionBody bounds a session-create body the client agent rewrites.
const maxSessionBody = 1 << 20

// gossipOptions are the agent's gossip flags, checked.
type gossipOptions struct {
	bindAddr string
	bindPort int
	profile  gossip.Profile
	joins    []string
	key      []byte // -encrypt; nil: gossip in the clear
}

// describe is the gossip address for the agent's banner, saying whether
// the pool is encrypted.
func (o gossipOptions) describe(addr string) string {
	if o.key != nil {
		return addr + " (encrypted)"
	}
	return addr
}

// parseGossipFlags checks -serf-addr, -gossip-profile and -join, so that a
// bad value stops the agent before anything starts.
func parseGossipFlags(serfAddr, profile string, joins []string) (gossipOptions, error) {
	var o gossipOptions
	host, port, err := net.SplitHostPort(serfAddr)
	if err != nil {
		return o, fmt.Errorf("agent: bad -serf-addr %q: want host:port, such as 127.0.0.1:8301", serfAddr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return o, fmt.Errorf("agent: bad -serf-addr %q: port %q is not a number from 0 to 65535", serfAddr, port)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	o.bindAddr, o.bindPort = host, p
	if o.profile, err = gossip.ParseProfile(profile); err != nil {
		return o, fmt.Errorf("agent: bad -gossip-profile: %s", strings.TrimPrefix(err.Error(), "gossip: "))
	}
	for _, j := range joins {
		a, err := gossip.CheckJoinAddr(j)
		if err != nil {
			return o, fmt.Errorf("agent: bad -join: %s", strings.TrimPrefix(err.Error(), "gossip: "))
		}
		o.joins = append(o.joins, a)
	}
	return o, nil
}

func (o gossipOptions) config(logger hclog.Logger, tags map[string]string) *gossip.Config {
	return &gossip.Config{BindAddr: o.bindAddr, BindPort: o.bindPort, Profile: o.profile, Tags: tags,
		SecretKey: o.key, Logger: logger.Named("gossip")}
}

// startJoin joins the -join addresses in the background, retrying with
// backoff until it works, ctx ends or the pool stops. Every failure is
// logged by the pool. It is not waited for: a dial in flight when the
// agent stops ends on its own within the gossip TCP timeout.
//
// Once joined, it joins the -join addresses again whenever the pool holds
// no live server (looking every reconnect interval): a server that left or
// restarted, or was forgotten after a long outage, does not know this
// agent any more, and would otherwise deregister its node, and drop its
// sessions, though it lives.
//
// It sends on taken, if it is empty, the error that must stop the agent: a
// member of the pool already uses this agent's name.
func startJoin(ctx context.Context, pool *gossip.Pool, joins []string, logger hclog.Logger, taken chan<- error) {
	if len(joins) == 0 {
		return
	}
	go func() {
		n, err := pool.RetryJoin(ctx, joins, joinRetryFirst, joinRetryMax)
		if err != nil {
			var nc *gossip.NameConflictError
			switch {
			case errors.As(err, &nc):
				select {
				case taken <- err:
				default: // guardName found it first
				}
			case !errors.Is(err, context.Canceled) && !errors.Is(err, gossip.ErrShutdown):
				logger.Error("giving up joining the gossip pool", "error", err)
			}
			return
		}
		logger.Info("joined the gossip pool", "agents_contacted", n)
		keepJoined(ctx, pool, joins, clock.Real(), logger)
	}()
}

// keepJoined joins the -join addresses again whenever, at a look every
// reconnect interval on clk, no server is alive in the pool, until ctx
// ends or the pool stops. A name conflict such a join meets is left to
// guardName.
func keepJoined(ctx context.Context, pool *gossip.Pool, joins []string, clk clock.Clock, logger hclog.Logger) {
	failures := 0
	for {
		if clock.Sleep(ctx, clk, pool.Timing().Reconnect) != nil {
			return
		}
		if hasLiveServer(pool.Members()) {
			failures = 0
			continue
		}
		_, err := pool.Join(joins)
		var nc *gossip.NameConflictError
		switch {
		case err == nil:
			failures = 0
			logger.Info("no live server was known: joined the -join addresses again")
		case errors.As(err, &nc):
			// Not this join's to judge: this agent may be the one the
			// servers keep under the name. guardName, woken by the
			// same conflict, asks them.
			failures = 0
			logger.Warn("joined again, and another agent claims this agent's name", "other", nc.Other)
		case errors.Is(err, gossip.ErrShutdown):
			return
		default:
			// Every interval while the servers are away: say so once.
			if failures++; failures == 1 {
				logger.Warn("no live server is known, and the -join addresses do not answer; will keep trying", "error", err.Error())
			}
		}
	}
}

// hasLiveServer reports whether ms has a server that is alive.
func hasLiveServer(ms []gossip.Member) bool {
	for _, m := range ms {
		if memberType(m.Tags) == "server" && m.Status == gossip.StatusAlive {
			return true
		}
	}
	return false
}

// guardName watches for another agent claiming this agent's name after
// it joined (the pool reports it; see gossip.Pool.Conflicts). The servers'
// pool keeps one of the two under the name, and sessions bound to the name
// follow that one's health: if it is the other one, this agent must stop,
// or it would serve sessions whose fate it does not decide. It asks a
// server which address holds the name, again every reconnect interval
// until the answer is clear, and sends the error that stops this agent to
// fatal. The agent that holds the name carries on.
func (c *clientAgent) guardName(ctx context.Context, pool *gossip.Pool, clk clock.Clock, fatal chan<- error) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-pool.Conflicts():
		}
		for {
			holder, err := c.nameHolder(ctx)
			switch {
			case err != nil:
				c.log.Warn("another agent claims this agent's name; cannot ask a server which one keeps it yet", "error", err)
			case holder == pool.Addr():
				c.log.Info("another agent claims this agent's name; the servers keep this one", "other", pool.Conflict())
			case holder != "":
				select {
				case fatal <- &gossip.NameConflictError{Name: c.node, Other: holder}:
				default:
				}
				return
			}
			if err == nil && holder != "" {
				break
			}
			if clock.Sleep(ctx, clk, pool.Timing().Reconnect) != nil {
				return
			}
		}
	}
}

// nameHolder asks a server's gossip pool which address holds this agent's
// name: "" if no live member has it there (yet).
func (c *clientAgent) nameHolder(ctx context.Context) (string, error) {
	cl, srv, err := c.serverClient()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ms, err := cl.Agent().Members(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the members from %s: %w", srv, err)
	}
	for _, m := range ms {
		if m.Name == c.node && gossip.Status(m.Status) == gossip.StatusAlive {
			return net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port))), nil
		}
	}
	return "", nil
}

// clientOptions configure a client agent.
type clientOptions struct {
	node       string
	datacenter string
	httpAddr   string
	gossip     gossipOptions
	logger     hclog.Logger
	// dataDir, if set, keeps the agent's checks and services across
	// restarts, as a server agent keeps them in its data directory.
	dataDir string
}

// clientStateFile is the client agent's registrations file in its data
// directory (named apart from a server agent's, in case both share one).
const clientStateFile = "client-agent-registrations.json"

// clientLockFile, in the data directory, is held while a client agent runs.
const clientLockFile = "client-agent.lock"

func runClientAgent(ctx context.Context, stdio Stdio, o clientOptions) error {
	if o.node == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return &ExitError{Code: 1, Msg: "agent: no -node given and the host name is unknown"}
		}
		o.node = h
	}
	ln, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return &ExitError{Code: 1, Msg: fmt.Sprintf("agent: cannot listen for HTTP on %s: %v", o.httpAddr, err)}
	}
	defer ln.Close()
	ln = limitHTTPConns(ln, o.logger)

	agentTelemetry() // before gossip starts, so that its first metrics are kept
	gc := o.gossip.config(o.logger, map[string]string{"role": "client", "dc": o.datacenter, "http": ln.Addr().String()})
	gc.Name = o.node
	pool, err := gossip.New(*gc)
	if err != nil {
		return &ExitError{Code: 1, Msg: "agent: " + strings.TrimPrefix(err.Error(), "gossip: ")}
	}
	c := newClientAgent(o.node, o.datacenter, ln.Addr().String(), pool, o.logger)
	stateFile := ""
	if o.dataDir != "" {
		if err := os.MkdirAll(o.dataDir, 0o700); err != nil {
			pool.Shutdown()
			return &ExitError{Code: 1, Msg: fmt.Sprintf("agent: cannot create the data directory: %v", err)}
		}
		// Two client agents on one directory would overwrite each
		// other's registrations file, and each restart would bring back
		// the other's services under its own node.
		lock, err := server.LockFile(filepath.Join(o.dataDir, clientLockFile), "the client agent's data directory "+o.dataDir)
		if err != nil {
			pool.Shutdown()
			return &ExitError{Code: 1, Msg: "agent: " + err.Error() + "; give each client agent a -data-dir of its own"}
		}
		defer lock.Close()
		stateFile = filepath.Join(o.dataDir, clientStateFile)
	}
	// The agent's own checks and services run here, on this node, and are
	// written to the catalog through a server's HTTP API.
	ag := agent.New(agent.Config{Node: o.node, Logger: slog.New(hclogHandler{o.logger.Named("agent")}),
		StateFile: stateFile,
		Catalog: &agent.HTTPCatalog{Base: func() (string, error) {
			if srv := c.server(); srv != "" {
				return "http://" + srv, nil
			}
			return "", errors.New("No known Consul servers")
		}}})
	defer ag.Close()
	c.local = httpapi.AgentHandler(ag, o.datacenter, httpapi.Options{})
	c.leave = newAgentLeave(func() error { return pool.Leave(leaveTimeout) })
	// Blocking queries forwarded to a server end when the agent stops,
	// rather than hold the shutdown for their wait; other requests (a
	// write on its way) are let finish.
	stopping, stopRequests := context.WithCancel(context.Background())
	defer stopRequests()
	c.stopping = stopping
	hs := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	// net/http's server under the reverse proxy: the stall bound goes on
	// the connections, every write of theirs (streamStallTimeout).
	go func() { errc <- hs.Serve(httpserve.StallConns(ln, streamStallTimeout)) }()

	warnExposed(o.logger, listener{name: "http", addr: ln.Addr().String()},
		listener{name: "gossip", addr: pool.Addr(), guarded: o.gossip.key != nil})
	jctx, stopJoin := context.WithCancel(ctx)
	defer stopJoin()
	// The name is taken: found when joining, or later (guardName).
	nameTaken := make(chan error, 1)
	startJoin(jctx, pool, o.gossip.joins, o.logger, nameTaken)
	go c.guardName(jctx, pool, clock.Real(), nameTaken)
	go c.watchTargets(jctx, clock.Real())
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		c.settleChecks(jctx, ag, clock.Real())
		c.keepRegistered(jctx, ag, clock.Real())
	}()

	fmt.Fprintf(stdio.Out, "holdfast agent running (client: no raft; requests go to a server learned through gossip)\n  node:    %s\n  http:    http://%s\n  gossip:  %s\n  join:    %s\n",
		o.node, ln.Addr(), o.gossip.describe(pool.Addr()), strings.Join(o.gossip.joins, ", "))
	if o.dataDir != "" {
		fmt.Fprintf(stdio.Out, "  data:    %s (the agent's checks and services)\n", o.dataDir)
	}

	var (
		runErr       error
		nameTakenErr bool // the name is another agent's
	)
	select {
	case <-ctx.Done():
		fmt.Fprintln(stdio.Out, "holdfast agent shutting down")
	case err := <-errc:
		runErr = &ExitError{Code: 1, Msg: "agent: HTTP server stopped: " + err.Error()}
	case err := <-nameTaken:
		runErr, nameTakenErr = &ExitError{Code: 1, Msg: "agent: " + strings.TrimPrefix(err.Error(), "gossip: ")}, true
	case <-c.leave.done:
		fmt.Fprintln(stdio.Out, "holdfast agent left its pool; shutting down")
	}
	stopJoin()
	<-settled
	// Leave first, so the servers deregister this node rather than wait to
	// declare it failed. Not when the name is another agent's: a goodbye
	// under it would be taken as that agent's (its sessions invalidated,
	// its node deregistered).
	if !nameTakenErr {
		if err := pool.Leave(5 * time.Second); err != nil {
			o.logger.Warn("leaving the gossip pool", "error", err)
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stopRequests()
	hs.Shutdown(sctx)
	pool.Shutdown()
	return runErr
}

// settleChecks runs once when the client agent starts. As soon as it
// knows a server, it registers again what its state file kept, then
// deregisters the checks that an earlier run of this node left in the
// catalog and that this run does not know (agent.ForgetStale): nothing
// runs them any more, and one left passing would keep the sessions bound
// to it alive for ever. A server agent does the same once it leads. Until
// it has done both it retries, waiting on clk from joinRetryFirst up to
// joinRetryMax; it gives up when ctx ends.
func (c *clientAgent) settleChecks(ctx context.Context, ag *agent.Agent, clk clock.Clock) {
	wait := joinRetryFirst
	for attempt := 1; ; attempt++ {
		err := c.settleOnce(ctx, ag)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			return
		}
		if attempt > 1 || !errors.Is(err, errNoServer) {
			c.log.Warn("could not bring the agent's checks in line with the catalog yet; will retry",
				"attempt", attempt, "retry_in", wait, "error", err)
		}
		if clock.Sleep(ctx, clk, wait) != nil {
			return
		}
		wait = min(2*wait, joinRetryMax)
	}
}

var errNoServer = errors.New("No known Consul servers")

// serverClient is an API client straight to a live server (see server),
// and the server's HTTP address; errNoServer if the pool knows none.
func (c *clientAgent) serverClient() (*api.Client, string, error) {
	srv := c.server()
	if srv == "" {
		return nil, "", errNoServer
	}
	cl, err := api.NewClient(&api.Config{Address: srv, HTTPClient: http.DefaultClient})
	return cl, srv, err
}

// Bounds of keepRegistered's blocking read and of its wait after a failure.
const (
	keepRegisteredWait     = 5 * time.Minute
	keepRegisteredRetryMax = 30 * time.Second
)

// keepRegistered is the client agent's anti-entropy, from when
// settleChecks is done until ctx ends. It watches this node's checks and
// services in the catalog with a blocking read and, when one the agent
// runs is missing there, writes them all again (agent.Resync). That is
// what brings them back after the node was deregistered through the
// catalog API and the leader registered it again from gossip (with its
// serfHealth alone), and after the server lost its state (a -dev server
// restarted). A server agent does the same for its own node through
// Config.OnSelfRegistered. Failed reads and writes are retried, waiting on
// clk from joinRetryFirst up to keepRegisteredRetryMax.
func (c *clientAgent) keepRegistered(ctx context.Context, ag *agent.Agent, clk clock.Clock) {
	var index uint64
	wait := joinRetryFirst
	failures := 0
	for ctx.Err() == nil {
		next, err := c.mendOnce(ctx, ag, index)
		if err == nil {
			index, wait, failures = next, joinRetryFirst, 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		// One failure is what a server restart looks like from here; say
		// something from the second on.
		if failures++; failures > 1 && !errors.Is(err, errNoServer) {
			c.log.Warn("could not compare the agent's checks and services with the catalog; will retry",
				"retry_in", wait, "error", err)
		}
		index = 0
		if clock.Sleep(ctx, clk, wait) != nil {
			return
		}
		wait = min(2*wait, keepRegisteredRetryMax)
	}
}

// mendOnce waits until this node's entry in the catalog has moved past
// index (at once if index is 0), writes the agent's checks and services
// again if the node is there but one of them is missing, and returns the
// index to wait on next.
func (c *clientAgent) mendOnce(ctx context.Context, ag *agent.Agent, index uint64) (uint64, error) {
	cl, srv, err := c.serverClient()
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, keepRegisteredWait+keepRegisteredWait/16+forwardTimeout)
	defer cancel()
	in, meta, err := cl.Health().Node(rctx, c.node, &api.QueryOptions{WaitIndex: index, WaitTime: keepRegisteredWait})
	if err != nil {
		return 0, fmt.Errorf("reading this node's checks from %s: %w", srv, err)
	}
	next := meta.LastIndex
	if next < index {
		next = 0 // the server's state went back (a restart without data): look again from the start
	}
	have := make(map[string]bool, len(in))
	for _, h := range in {
		have[h.CheckID] = true
	}
	if !have[state.SerfCheckID] {
		// The node itself is not (yet) back: the leader registers it,
		// with its address and serfHealth, from gossip. Written before
		// that, the checks would bring back a node with no address.
		return next, nil
	}
	missing := ""
	for _, ck := range ag.Checks() {
		if !have[ck.CheckID] {
			missing = "check " + ck.CheckID
			break
		}
	}
	if svcs := ag.Services(); missing == "" && len(svcs) > 0 {
		node, _, err := cl.Catalog().Node(rctx, c.node, nil)
		if err != nil {
			return 0, fmt.Errorf("reading this node's services from %s: %w", srv, err)
		}
		for _, s := range svcs {
			if node == nil || node.Services[s.ID] == nil {
				missing = "service " + s.ID
				break
			}
		}
	}
	if missing == "" {
		return next, nil
	}
	c.log.Info("the catalog lost what this agent runs: writing its checks and services again", "missing", missing)
	if err := ag.Resync(ctx); err != nil {
		return 0, err
	}
	return next, nil
}

// settleOnce is one attempt of settleChecks.
func (c *clientAgent) settleOnce(ctx context.Context, ag *agent.Agent) error {
	cl, srv, err := c.serverClient()
	if err != nil {
		return err
	}
	// What the state file holds but cannot be registered (a definition
	// the agent now refuses) stays pending, and is not retried here.
	if err := ag.Restore(ctx); err != nil && !errors.Is(err, state.ErrInvalidRequest) {
		return err
	}
	checks, err := c.nodeChecks(ctx, cl, srv)
	if err != nil {
		return err
	}
	return ag.ForgetStale(ctx, checks)
}

// nodeChecks reads this node's checks from the catalog of the server at
// srv, through cl.
func (c *clientAgent) nodeChecks(ctx context.Context, cl *api.Client, srv string) ([]*state.HealthCheck, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	in, _, err := cl.Health().Node(ctx, c.node, nil)
	if err != nil {
		return nil, fmt.Errorf("reading this node's checks from %s: %w", srv, err)
	}
	// What ForgetStale looks at.
	out := make([]*state.HealthCheck, len(in))
	for i, h := range in {
		out[i] = &state.HealthCheck{Node: h.Node, CheckID: h.CheckID, ServiceID: h.ServiceID, Type: h.Type}
	}
	return out, nil
}

// clientAgent is the HTTP side of a client agent.
type clientAgent struct {
	node, dc, httpAddr string
	pool               poolView
	log                hclog.Logger
	proxy              *httputil.ReverseProxy
	forwardBound       func(*http.Request) time.Duration // forwardBound; tests shorten it
	// local serves the agent's check and service endpoints; nil refuses them.
	local http.Handler
	// leave serves /v1/agent/leave; nil refuses it.
	leave *agentLeave

	// stopping, if set, is done when the agent shuts down: forwarded
	// blocking queries end then.
	stopping context.Context
	// route is where the forwards go: the pool's servers (poolRoute),
	// or, for a server that does not lead, its leader (leaderRoute).
	route forwardRoute
	watch targetWatch

	mu   sync.Mutex
	last string // the server's HTTP address used last
	skip string // a server whose last forward failed
}

func newClientAgent(node, dc, httpAddr string, pool poolView, logger hclog.Logger) *clientAgent {
	c := &clientAgent{node: node, dc: dc, httpAddr: httpAddr, pool: pool, log: logger.Named("client"),
		forwardBound: forwardBound}
	c.route = c.poolRoute()
	c.proxy = &httputil.ReverseProxy{
		Transport: forwardTransport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(forwardKey{}).(*forwarding).target)
		},
		ErrorHandler: c.forwardFailed,
		// The answer's header is in (a small answer's body too): the
		// forward's bound has done its work (a server that never
		// answers), so has the watch on its server (it answered), and
		// the body goes to the caller as fast as the caller reads it
		// (the HTTP server's stall bound cuts a caller that stops).
		ModifyResponse: func(resp *http.Response) error {
			f := resp.Request.Context().Value(forwardKey{}).(*forwarding)
			f.headerDue.Stop()
			f.unwatch()
			if !isNoLeader(resp) {
				return nil
			}
			if c.route.resendNoLeader != nil && f.mayResend && c.route.resendNoLeader(f.target.Host) {
				return errNoLeader // forwardFailed sets the server aside and has it sent again
			}
			c.noteNoLeader(f.target.Host)
			return nil
		},
	}
	return c
}

// defaultSessionNode adds "Node": this agent's node to a session-create
// body that names none (or an empty one). A body that is not a JSON
// object is left for the server to refuse.
func (c *clientAgent) defaultSessionNode(r *http.Request) error {
	var body []byte
	if r.Body != nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxSessionBody+1))
		r.Body.Close()
		if err != nil {
			return fmt.Errorf("reading the request body: %v", err)
		}
		if len(b) > maxSessionBody {
			return fmt.Errorf("request body too large: at most %d bytes", maxSessionBody)
		}
		body = b
	}
	out := body
	if len(bytes.TrimSpace(body)) == 0 {
		out, _ = json.Marshal(map[string]string{"Node": c.node})
	} else {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(body, &obj); err == nil && obj != nil {
			if rewritten, ok := setNodeIfEmpty(obj, c.node); ok {
				out = rewritten
			}
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(out))
	r.ContentLength = int64(len(out))
	r.Header.Set("Content-Length", strconv.Itoa(len(out)))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(out)), nil }
	return nil
}

// setNodeIfEmpty sets Node in a decoded session body unless it already
// names one (JSON field names match case-insensitively, as the server
// decodes them). ok is false when nothing changed.
func setNodeIfEmpty(obj map[string]json.RawMessage, node string) ([]byte, bool) {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !strings.EqualFold(k, "Node") {
			continue
		}
		var v *string
		if err := json.Unmarshal(obj[k], &v); err != nil {
			return nil, false // not a string: the server will say so
		}
		if v != nil && *v != "" {
			return nil, false
		}
		delete(obj, k)
	}
	obj["Node"], _ = json.Marshal(node)
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, false
	}
	return b, true
}

// serveSelf answers /v1/agent/self for this client agent, in the shape
// the servers use.
func (c *clientAgent) serveSelf(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, fmt.Sprintf("method %s not allowed", r.Method), http.StatusMethodNotAllowed)
		return
	}
	me, _ := c.pool.Member(c.node)
	tags := me.Tags
	if tags == nil {
		tags = map[string]string{}
	}
	stats := httpapi.RuntimeStats()
	if sp, ok := c.pool.(interface{ Stats() map[string]string }); ok { // the real pool; tests' fakes have none
		stats["serf_lan"] = sp.Stats()
	}
	c.mu.Lock()
	last := c.last
	c.mu.Unlock()
	// forwards_to: the HTTP address of the server the agent forwards to
	// now ("" before the first forward), for operators asking which one.
	stats["holdfast"] = map[string]string{"server": "false", "known_datacenters": "1", "acl": "disabled", "forwards_to": last}
	self := map[string]interface{}{
		"Stats": stats,
		"Config": map[string]interface{}{
			"NodeName":   c.node,
			"Datacenter": c.dc,
			"Server":     false,
			"Version":    "holdfast",
			"HTTPAddr":   c.httpAddr,
		},
		"Member": map[string]interface{}{
			"Name":   c.node,
			"Addr":   me.Addr,
			"Port":   me.Port,
			"Status": int(me.Status),
			"Tags":   tags,
		},
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(self)
}
