package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/gossip"
	"github.com/holdfast/holdfast/internal/httpapi"
	"github.com/holdfast/holdfast/internal/server"
)

// Forwarding. A client agent sends what it does not answer itself to a
// server of its pool; a server that does not lead sends writes and the
// leader's reads to its leader (leaderRouter). Both go through
// clientAgent.forward: one reverse proxy, the same transports
// (forwardTransport), the same bounds.
//
// A forward waits for the server's answer at most its bound (forwardBound):
// 30 s, or a blocking query's wait and 30 s more. A server that stops
// answering without closing its connections (frozen, or cut off by the
// network) would hold every forward that long, while the pool or the
// cluster has long moved on: the gossip pool declares such a server failed
// within a few seconds, and a cluster elects a new leader within one or
// two. So the forwards also watch their server (watchTargets): once it has
// stopped being the one to ask, the forwards still waiting for its answer
// are given up. A read (GET or HEAD without a body) is then sent again, to
// the server now asked, and its caller sees only the delay; a write is
// answered 500, saying it may or may not have been applied: the server may
// have received it, and may yet apply it (or have done so already without
// answering), so sending it again could apply it twice.

// forwardRetries is how many times a read is sent again after its server
// stopped being the one to ask.
const forwardRetries = 2

// targetWatchEvery is how often watchTargets looks at the servers that
// forwards wait on. Leaders change and servers are declared failed in
// seconds; a fifth of one adds little.
const targetWatchEvery = 200 * time.Millisecond

var (
	errTargetMoved = errors.New("the server stopped being the one to ask")
	errNoAnswer    = errors.New("no answer in time")
	errNoLeader    = errors.New(`the server answered "No cluster leader"`)
)

// forwardRoute is where an agent's forwards go, and what its answers say.
type forwardRoute struct {
	// pick chooses the server to forward to, and says whether it is held
	// alive; "" when there is none.
	pick func() (addr string, live bool)
	// moved gives, for one look of watchTargets, the test of whether a
	// server forwards wait on has stopped being the one to ask.
	moved func() func(target string) bool
	// noServer answers a request that finds no server; who names the
	// agent in a failed forward's answer; movedWords says why forwards
	// to a server were given up.
	noServer, who, movedWords string
	// setsAside: a server that answers "No cluster leader" is set aside,
	// so that the next request goes to another (see noteNoLeader).
	setsAside bool
	// resendNoLeader, if set, says whether a request the server target
	// refused with "No cluster leader" is sent again (if its body can be
	// had again): to another server, or to the next leader, once one is
	// known. The server applied nothing: a write it took and then could
	// not confirm is answered "may or may not have been applied" instead
	// (server.OutcomeUnknownError).
	resendNoLeader func(target string) bool
}

// poolRoute is a client agent's route: a live server of its datacenter
// from the gossip pool (pickPoolServer). A server forwards wait on has
// stopped being the one to ask once the pool holds it failed, or has
// forgotten it, while another is alive.
func (c *clientAgent) poolRoute() forwardRoute {
	return forwardRoute{
		pick: c.pickPoolServer,
		moved: func() func(string) bool {
			alive, _ := c.poolServers()
			return func(t string) bool { return len(alive) > 0 && !slices.Contains(alive, t) }
		},
		noServer:   "No known Consul servers", // Consul's words
		who:        "holdfast client agent",
		movedWords: "was declared failed by the gossip pool",
		setsAside:  true,
		// To another live server, if there is one: the server held the
		// request for a leader before it refused it, so asking it again
		// would only wait as long once more.
		resendNoLeader: func(target string) bool {
			alive, _ := c.poolServers()
			return slices.ContainsFunc(alive, func(a string) bool { return a != target })
		},
	}
}

// forwarding is one forward under way, carried in its request's context.
type forwarding struct {
	target    *url.URL
	caller    context.Context // the caller's request context
	headerDue *time.Timer     // gives up when no answer's header comes
	unwatch   func() bool     // stops the watch on target
	mayRetry  bool            // a read that may be sent again
	mayResend bool            // a request that may be sent again if it was never sent
	retry     bool            // set by forwardFailed: send it again, nothing was written
	unsent    bool            // with retry: the connection failed, the server got nothing
}

type forwardKey struct{}

// forwardTransport carries every agent's forwards (a client agent's to a
// server, a follower's to its leader): holdfast's own api.Transport, which
// writes a request in one system call and reads the answer on the
// forwarding goroutine, and streamTransport for what it does not carry.
// net/http's Transport flushed a forwarded request's header and then wrote
// its body (two writes, each waking the server), and passed every
// exchange through a writing and a reading goroutine of its connection.
var forwardTransport http.RoundTripper = forwardRoundTripper{
	small: &api.Transport{MaxIdleConnsPerHost: forwardIdleConns, Fallback: streamTransport},
}

// forwardIdleConns is how many idle connections to each server the
// forwards keep. net/http's default keeps two: with more callers than
// that, each forward beyond two dialled a new connection and closed it
// after one request. Runs of 32 clients through a follower left 14,282
// sockets in TIME-WAIT, and the pool took the follower from 6,162 to 9,893
// PUT/s and from 9,576 to 17,689 ?consistent GET/s (bench/README.md, "A
// cluster of three").
const forwardIdleConns = 512

// streamTransport carries the forwards api.Transport does not (bodies over
// 64 KiB or of unknown length, Expect headers), and snapshots, whose
// archive streams through in either direction rather than be held in
// memory. It ignores HTTP_PROXY and its kin (a forward goes to a server of
// the pool, never through a proxy), and passes bodies through as they
// come, compressed or not.
var streamTransport = &http.Transport{
	DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	MaxIdleConns:          2 * forwardIdleConns,
	MaxIdleConnsPerHost:   forwardIdleConns,
	IdleConnTimeout:       90 * time.Second,
	ExpectContinueTimeout: time.Second,
	DisableCompression:    true,
}

// forwardRoundTripper sends through small the requests whose answers are
// small (see smallAnswer), and the rest through streamTransport.
// api.Transport reads an answer in full before it returns: the forward's
// bound then covers the whole answer, and the answer waits in memory for
// a slow caller. An answer of unbounded size (a recursive listing, a
// catalog, a snapshot's archive) streams instead, bounded only until its
// header, as fast as its caller reads it.
type forwardRoundTripper struct {
	small http.RoundTripper
}

func (f forwardRoundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	if smallAnswer(r) {
		return f.small.RoundTrip(r)
	}
	return streamTransport.RoundTrip(r)
}

// smallAnswer reports whether the answer to r is small: that of a write
// (true or false, a session's ID, a transaction's results), or of a read
// of one key (its value is at most 512 KiB).
func smallAnswer(r *http.Request) bool {
	switch {
	case r.URL.Path == "/v1/snapshot":
		return false
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		return true
	case !strings.HasPrefix(r.URL.Path, "/v1/kv/"):
		return false
	}
	q := r.URL.Query()
	_, recurse := q["recurse"]
	_, keys := q["keys"]
	return !recurse && !keys
}

// noteNoLeader, for a client agent, sets aside the server at host, which
// answered "No cluster leader", so that the next request goes to another
// one: a server of a cluster that lost its majority, or not yet added to
// one, would otherwise get every request for as long as it lived (the
// cluster audit: 20 of 20 requests failed for 30 s through a client agent
// whose server had been taken out of its cluster). It is called for an
// answer not sent again (route.resendNoLeader), which goes back to the
// caller.
func (c *clientAgent) noteNoLeader(host string) {
	if !c.route.setsAside {
		return
	}
	c.mu.Lock()
	c.skip = host
	c.mu.Unlock()
}

// isNoLeader reports whether resp is the answer "No cluster leader",
// leaving its body to be read again.
func isNoLeader(resp *http.Response) bool {
	if resp.StatusCode != http.StatusInternalServerError || resp.ContentLength < 0 || resp.ContentLength > 256 {
		return false
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return err == nil && strings.TrimSpace(string(b)) == server.ErrNoLeader.Error()
}

func (c *clientAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if c.answerHere(w, r) {
		return
	}
	rewind := resendable(r)
	for attempt := 0; ; attempt++ {
		if rewind != nil {
			rewind()
		}
		// After a failed connection, the next attempt goes to another
		// server (forwardFailed set the failed one aside).
		if retry, _ := c.forward(w, r, attempt < forwardRetries, rewind != nil); !retry {
			return
		}
	}
}

// maxResendBody is the largest request body kept in memory so that the
// request can be sent again: 1 MiB, above every write the API takes (a
// value or a transaction is at most 512 KiB, 683 KiB as base64 in a
// transaction's JSON), so that any write whose connection failed is sent
// again. A larger body (a snapshot's archive) streams through once.
const maxResendBody = 1 << 20

// resendable reads r's body into memory if it is small, so that r can be
// sent again, and returns the function that puts the body back before
// each attempt; nil if r cannot be sent again (a large body, or one of
// unknown length, streams through once).
func resendable(r *http.Request) func() {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return func() {}
	}
	if r.ContentLength < 0 || r.ContentLength > maxResendBody {
		return nil
	}
	b := make([]byte, r.ContentLength)
	n, err := io.ReadFull(r.Body, b)
	if err != nil {
		// The caller sent less than it declared: the forward fails as
		// it would have with the body streamed.
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b[:n]), errReader{err}))
		return nil
	}
	return func() { r.Body = io.NopCloser(bytes.NewReader(b)) }
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// answerHere answers the requests that are the agent's own (its endpoints,
// its checks and services), amends a session's creation with the agent's
// node, and reports whether it has answered r.
func (c *clientAgent) answerHere(w http.ResponseWriter, r *http.Request) bool {
	switch r.URL.Path {
	case "/v1/agent/members":
		serveMembers(c.pool, w, r)
		return true
	case "/v1/agent/self":
		c.serveSelf(w, r)
		return true
	case "/v1/agent/metrics":
		agentTelemetry().serveMetrics(w, r)
		return true
	case "/v1/agent/leave":
		if c.leave == nil {
			http.Error(w, "This agent cannot be made to leave over HTTP", http.StatusNotImplemented)
			return true
		}
		c.leave.serveHTTP(w, r)
		return true
	case "/v1/session/create":
		if r.Method == http.MethodPut || r.Method == http.MethodPost {
			if err := c.defaultSessionNode(r); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return true
			}
		}
	}
	if localAgentPath(r.URL.Path) {
		// Forwarded, these would act on the server's node, not this one.
		if c.local == nil {
			http.Error(w, "This client agent runs no checks or services", http.StatusNotImplemented)
			return true
		}
		c.local.ServeHTTP(w, r)
		return true
	}
	return false
}

// forward sends r to a server and copies the answer to w. It returns
// retry, having written nothing, when mayRetry and either the server
// stopped being the one to ask before it answered and r is a read, or
// the connection to the server failed (unsent: it got nothing) and
// mayResend (r's body, if any, can be had again): the caller then sends
// it again.
func (c *clientAgent) forward(w http.ResponseWriter, r *http.Request, mayRetry, mayResend bool) (retry, unsent bool) {
	srv, live := c.route.pick()
	if srv == "" {
		// A 500, so that clients retry.
		http.Error(w, c.route.noServer, http.StatusInternalServerError)
		return false, false
	}
	f := &forwarding{target: &url.URL{Scheme: "http", Host: srv}, caller: r.Context(),
		mayRetry: mayRetry && isRead(r), mayResend: mayRetry && mayResend}
	// A server that takes the connection and never answers (stopped, or
	// wedged) must not hold the caller for ever: the forward is bounded
	// by what the request may legitimately take, and, to a server the pool
	// holds failed (tried in case it restarted), by failedServerTimeout.
	bound := c.forwardBound(r)
	if !live && bound > failedServerTimeout {
		bound = failedServerTimeout
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(r.Context(), forwardKey{}, f))
	defer cancel(nil)
	// The bound is on the answer's header, not its body, for an answer
	// that streams: a large listing read by a slow caller was cut at
	// forwardTimeout, whole or not (the stall bound's audit: a 34 MB
	// ?recurse read at 400 KiB/s). A small answer (smallAnswer) is read
	// whole within it.
	f.headerDue = time.AfterFunc(bound, func() { cancel(errNoAnswer) })
	defer f.headerDue.Stop()
	gone, leave := c.watch.enter(srv)
	defer leave()
	f.unwatch = context.AfterFunc(gone, func() { cancel(errTargetMoved) })
	defer f.unwatch()
	if c.stopping != nil && r.Method == http.MethodGet && r.URL.Query().Get("index") != "" {
		defer context.AfterFunc(c.stopping, func() { cancel(nil) })()
	}
	c.proxy.ServeHTTP(w, r.WithContext(ctx))
	return f.retry, f.unsent
}

// isRead reports whether r may be sent to a server a second time: a GET or
// HEAD without a body.
func isRead(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.ContentLength == 0
}

// Bounds of a forwarded request, from its start to the server's answer's
// header (the body of an answer that streams then comes as fast as the
// caller reads it; a small answer is read whole within the bound): a plain
// one gets forwardTimeout; a blocking read its wait (the server's default and maximum, those of
// httpapi), the server's jitter (up to a sixteenth of it) and
// forwardTimeout on top.
//
// A snapshot's archive streams through in either direction as fast as the
// caller sends or reads it: 250 MB took 13 s here, and a slow link or a
// larger state would be cut at forwardTimeout (a save cut short, a restore
// answered 500 and then completed). It gets snapshotForwardTimeout.
const (
	snapshotForwardTimeout = 30 * time.Minute
	forwardTimeout         = 30 * time.Second
	failedServerTimeout    = 5 * time.Second
)

// forwardBound is how long a forward of r may take.
func forwardBound(r *http.Request) time.Duration {
	if r.URL.Path == "/v1/snapshot" {
		return snapshotForwardTimeout
	}
	q := r.URL.Query()
	if q.Get("index") == "" {
		return forwardTimeout
	}
	wait := httpapi.DefaultWait
	if d, err := time.ParseDuration(q.Get("wait")); err == nil && d > 0 {
		wait = d
	}
	if wait > httpapi.DefaultMaxWait {
		wait = httpapi.DefaultMaxWait
	}
	return wait + wait/16 + forwardTimeout
}

// localAgentPath reports whether path is one of the agent endpoints that
// act on the agent's own node (checks and services).
func localAgentPath(path string) bool {
	switch path {
	case "/v1/agent/checks", "/v1/agent/services":
		return true
	}
	return strings.HasPrefix(path, "/v1/agent/check/") || strings.HasPrefix(path, "/v1/agent/service/")
}

// server is the HTTP address of the server the next forward goes to; ""
// if there is none.
func (c *clientAgent) server() string {
	srv, _ := c.route.pick()
	return srv
}

// pickPoolServer picks the HTTP address of a live server: the one used
// last while it is alive and has not failed a forward, else the first
// other one by name. With no live server it tries the failed ones (a
// restarted server answers HTTP before the pool has seen it again), and
// says so (live false). "" if the pool knows no server at all.
func (c *clientAgent) pickPoolServer() (string, bool) {
	alive, failed := c.poolServers()
	cands, live := alive, true
	if len(cands) == 0 {
		cands, live = failed, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(cands) == 0 {
		return "", false
	}
	for _, a := range cands {
		if a == c.last && a != c.skip {
			return a, live
		}
	}
	pick := cands[0]
	for _, a := range cands {
		if a != c.skip {
			pick = a
			break
		}
	}
	c.last, c.skip = pick, ""
	return pick, live
}

// poolServers is the HTTP addresses of the servers of the agent's
// datacenter that the pool holds alive, and of those it holds failed.
func (c *clientAgent) poolServers() (alive, failed []string) {
	for _, m := range c.pool.Members() {
		if memberType(m.Tags) != "server" || m.Tags["http"] == "" {
			continue
		}
		if dc := m.Tags["dc"]; dc != "" && c.dc != "" && dc != c.dc {
			continue // a server of another datacenter serves another catalog
		}
		switch m.Status {
		case gossip.StatusAlive:
			alive = append(alive, m.TagAddr("http"))
		case gossip.StatusFailed:
			failed = append(failed, m.TagAddr("http"))
		}
	}
	return alive, failed
}

func (c *clientAgent) forwardFailed(w http.ResponseWriter, r *http.Request, err error) {
	f := r.Context().Value(forwardKey{}).(*forwarding)
	if f.caller.Err() != nil {
		return // the caller went away
	}
	target := f.target.Host
	c.mu.Lock()
	c.skip = target
	c.mu.Unlock()
	who := c.route.who
	var oe *net.OpError
	switch cause := context.Cause(r.Context()); {
	case cause == nil && f.mayResend && errors.As(err, &oe) && oe.Op == "dial":
		// Refused, or no route: the request never left, so it can go
		// to the server asked next whatever it is (a killed leader's
		// port refuses until its followers notice it is gone).
		c.log.Debug("could not connect to a server: sending the request again", "server", target, "path", r.URL.Path, "error", err)
		f.retry, f.unsent = true, true
		return
	case errors.Is(err, errNoLeader):
		c.log.Debug("a server refused a request for want of a leader (it applied nothing): sending it again",
			"server", target, "path", r.URL.Path)
		f.retry, f.unsent = true, true
		return
	case errors.Is(cause, errTargetMoved) && f.mayRetry:
		c.log.Debug("a server stopped being the one to ask before it answered: sending the read again", "server", target, "path", r.URL.Path)
		f.retry = true
		return
	case errors.Is(cause, errTargetMoved):
		c.log.Warn("a server stopped being the one to ask before it answered a forwarded write", "server", target, "path", r.URL.Path)
		http.Error(w, fmt.Sprintf("%s: the server at %s %s before it answered; the request may or may not have been applied",
			who, target, c.route.movedWords), http.StatusInternalServerError)
		return
	case errors.Is(cause, errNoAnswer):
		err = errNoAnswer
	}
	c.log.Warn("forwarding a request to a server failed", "server", target, "path", r.URL.Path, "error", err)
	http.Error(w, fmt.Sprintf("%s: forwarding to the server at %s failed: %v", who, target, err), http.StatusInternalServerError)
}

// targetWatch counts the forwards waiting on each server, and gives each
// server a context that watchTargets cancels once the server has stopped
// being the one to ask.
type targetWatch struct {
	mu sync.Mutex
	on map[string]*watched
}

type watched struct {
	gone   context.Context
	cancel context.CancelFunc
	n      int // forwards waiting on it
}

// enter counts a forward to target, and returns the context done when
// target has stopped being the one to ask, and the function that uncounts
// the forward.
func (tw *targetWatch) enter(target string) (context.Context, func()) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	w := tw.on[target]
	if w == nil {
		if tw.on == nil {
			tw.on = make(map[string]*watched)
		}
		w = &watched{}
		w.gone, w.cancel = context.WithCancel(context.Background())
		tw.on[target] = w
	}
	w.n++
	return w.gone, func() {
		tw.mu.Lock()
		w.n--
		tw.mu.Unlock()
	}
}

// busy returns the servers that forwards wait on, and forgets the others.
func (tw *targetWatch) busy() []string {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	var out []string
	for t, w := range tw.on {
		if w.n > 0 {
			out = append(out, t)
			continue
		}
		w.cancel()
		delete(tw.on, t)
	}
	return out
}

// drop gives up the forwards waiting on target.
func (tw *targetWatch) drop(target string) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if w := tw.on[target]; w != nil {
		w.cancel()
		delete(tw.on, target)
	}
}

// watchTargets, until ctx ends, gives up the forwards waiting on a server
// that has stopped being the one to ask (see the top of this file).
func (c *clientAgent) watchTargets(ctx context.Context, clk clock.Clock) {
	for clock.Sleep(ctx, clk, targetWatchEvery) == nil {
		c.checkTargets()
	}
}

// checkTargets is one look of watchTargets.
func (c *clientAgent) checkTargets() {
	busy := c.watch.busy()
	if len(busy) == 0 {
		return
	}
	moved := c.route.moved()
	for _, t := range busy {
		if moved(t) {
			c.log.Info("giving up the forwards waiting on a server that stopped being the one to ask", "server", t, "why", c.route.movedWords)
			c.watch.drop(t)
		}
	}
}
