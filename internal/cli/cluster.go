package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/agent"
	"github.com/holdfast/holdfast/internal/gossip"
	"github.com/holdfast/holdfast/internal/server"
	"github.com/holdfast/holdfast/internal/state"
)

// A server of a cluster that does not lead answers what it can from its
// own state and forwards the rest to the leader over HTTP, as a client
// agent forwards to a server: writes, and reads of the leader's kind
// (the default and ?consistent). What it answers itself:
//
//   - the agent endpoints (/v1/agent/...): they are about this agent, its
//     node's checks and services (written to the leader through
//     leaderCatalog), its gossip pool and metrics;
//   - /v1/status/leader and /v1/status/peers, from its own raft;
//   - ?stale reads, from its state, unless ?max_stale is given and its
//     last contact with the leader is older than that;
//   - anything already forwarded once (forwardedHeader), so that two
//     servers that each think the other leads (for a moment, around an
//     election) do not pass a request back and forth: the second answers
//     it, with "No cluster leader" if it does not lead.
//
// A session created through it without a node is bound to its node, as
// through a client agent.

// forwardedHeader marks a request a server forwarded to its leader, with
// the forwarding server's node name.
const forwardedHeader = "X-Holdfast-Forwarded-By"

// leaderRouter is a server agent's HTTP root: local, or forward to the
// leader.
type leaderRouter struct {
	srv   *server.Server
	local http.Handler
	fwd   *clientAgent
	clk   clock.Clock

	mu     sync.Mutex
	leader chan struct{} // closed when a leader is known (leaderKnown); nil when nobody waits
}

// leaderHold is how long a request that needs the leader waits for one
// while none is known (an election), before it is answered "No cluster
// leader": Consul's rpc_hold_timeout. Clients then see an election as a
// delay, not as an error: a 500 during an election is what killed
// `consul lock`'s child and stopped RenewPeriodic's renewals
// (hashicorp/consul#1162, #912).
const leaderHold = 7 * time.Second

// leaderPoll is how often a server waiting for a leader looks.
const leaderPoll = 10 * time.Millisecond

func newLeaderRouter(srv *server.Server, local http.Handler, httpAddr string, logger hclog.Logger) *leaderRouter {
	var pool poolView
	if p := srv.Gossip(); p != nil {
		pool = p
	}
	fwd := newClientAgent(srv.NodeName(), srv.Datacenter(), httpAddr, pool, logger)
	fwd.route = leaderRoute(srv)
	return &leaderRouter{srv: srv, local: local, fwd: fwd, clk: clock.Real()}
}

// leaderRoute is a follower server's route: its leader. Forwards waiting
// on a leader that no longer leads (frozen, or cut off from this server)
// are given up once another leader is known, or this server leads.
func leaderRoute(srv *server.Server) forwardRoute {
	return forwardRoute{
		pick: func() (string, bool) { return leaderHTTP(srv) },
		moved: func() func(string) bool {
			return func(target string) bool {
				if srv.IsLeader() {
					return true
				}
				a, _ := leaderHTTP(srv)
				return a != "" && a != target
			}
		},
		noServer:       server.ErrNoLeader.Error(),
		who:            "holdfast server " + srv.NodeName() + " (not the leader)",
		movedWords:     "lost the leadership",
		resendNoLeader: func(string) bool { return true },
	}
}

func (l *leaderRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if l.srv.HandingOver() && l.needsLeader(r) {
		// raft refuses writes while this server hands its leadership
		// over. A request another server forwarded here is refused at
		// once, untouched: that server sends it again to the new leader
		// (held here, it would wait on this one, and might give it up
		// as "may or may not have been applied"). Any other is held
		// until the transfer is over, then sent on to the new leader (or
		// answered here, if the transfer failed).
		if r.Header.Get(forwardedHeader) != "" {
			http.Error(w, server.ErrNoLeader.Error(), http.StatusInternalServerError)
			return
		}
		pollUntil(r.Context(), l.clk, leaderPoll, leaderHold, func() bool { return !l.srv.HandingOver() })
	}
	if !l.leaderKnown() && l.needsLeader(r) {
		l.waitForLeader(r.Context())
	}
	if l.servesLocally(r) {
		l.local.ServeHTTP(w, r)
		return
	}
	if l.fwd.answerHere(w, r) {
		return
	}
	// A read whose leader lost the leadership before answering is sent
	// again, here if this server leads now; so is a request whose
	// connection to the leader failed (killed: it got nothing), or that
	// the leader refused with "No cluster leader" (handing its leadership
	// over, or deposed: it applied nothing), once another leader is known.
	rewind := resendable(r)
	for attempt := 0; ; attempt++ {
		if rewind != nil {
			rewind()
		}
		r.Header.Set(forwardedHeader, l.srv.NodeName())
		to, _ := leaderHTTP(l.srv)
		retry, unsent := l.fwd.forward(w, r, attempt < forwardRetries, rewind != nil)
		if !retry {
			return
		}
		r.Header.Del(forwardedHeader)
		if unsent {
			l.waitForLeaderOtherThan(r.Context(), to)
		}
		if l.servesLocally(r) {
			l.local.ServeHTTP(w, r)
			return
		}
	}
}

// waitForLeaderOtherThan waits until this server leads or knows a leader
// whose HTTP address is not old, leaderHold has passed, or ctx ends.
func (l *leaderRouter) waitForLeaderOtherThan(ctx context.Context, old string) {
	pollUntil(ctx, l.clk, leaderPoll, leaderHold, func() bool {
		if l.srv.IsLeader() {
			return true
		}
		a, _ := leaderHTTP(l.srv)
		return a != "" && a != old
	})
}

// pollUntil looks at cond every `every` on clk until it holds (true), hold
// has passed (0: no bound), or ctx ends (false for both).
func pollUntil(ctx context.Context, clk clock.Clock, every, hold time.Duration, cond func() bool) bool {
	until := clk.Now().Add(hold)
	for !cond() {
		if hold > 0 && !clk.Now().Before(until) {
			return false
		}
		if clock.Sleep(ctx, clk, every) != nil {
			return false
		}
	}
	return true
}

// leaderKnown reports whether this server leads or knows another leader.
func (l *leaderRouter) leaderKnown() bool {
	if l.srv.IsLeader() {
		return true // the common case, and the single server's: as cheap as servesLocally's first look
	}
	_, other := otherLeader(l.srv)
	return other
}

// needsLeader reports whether r is answered by the leader: not an agent or
// status endpoint, and not a ?stale or ?max_stale read (answered from this
// server's state, max_stale by its last contact with a leader). A request
// another server forwarded needs one too: it was sent to this server as
// the leader, which raft may have made leader a moment before it is
// ready to answer (its state caught up).
func (l *leaderRouter) needsLeader(r *http.Request) bool {
	if strings.HasPrefix(r.URL.Path, "/v1/agent/") || strings.HasPrefix(r.URL.Path, "/v1/status/") {
		return false
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		q := r.URL.Query()
		if _, stale := q["stale"]; stale {
			return false
		}
		if _, ms := q["max_stale"]; ms {
			return false
		}
	}
	return true
}

// waitForLeader waits until a leader is known, leaderHold has passed, or
// ctx ends. The requests waiting share one look every leaderPoll, which
// stops once a leader is known or after leaderHold.
func (l *leaderRouter) waitForLeader(ctx context.Context) {
	l.mu.Lock()
	ch := l.leader
	if ch == nil {
		ch = make(chan struct{})
		l.leader = ch
		go l.pollLeader(ch)
	}
	l.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// pollLeader closes ch when a leader is known, or after leaderHold.
func (l *leaderRouter) pollLeader(ch chan struct{}) {
	defer func() {
		l.mu.Lock()
		l.leader = nil
		l.mu.Unlock()
		close(ch)
	}()
	pollUntil(context.Background(), l.clk, leaderPoll, leaderHold, l.leaderKnown)
}

// servesLocally reports whether this server answers r itself.
func (l *leaderRouter) servesLocally(r *http.Request) bool {
	if l.srv.IsLeader() {
		return true // the common case, and the single server's: two atomic loads
	}
	if _, other := otherLeader(l.srv); !other {
		// Leading (or about to), or no leader known: the local handlers
		// answer, "No cluster leader" where a leader is needed.
		return true
	}
	if r.Header.Get(forwardedHeader) != "" {
		return true
	}
	if l.needsLeader(r) {
		return false
	}
	// An agent or status endpoint, or a ?stale or ?max_stale read.
	if v := r.URL.Query().Get("max_stale"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			if known, last := l.srv.LeaderStatus(); !known || last > d {
				return false // too stale here: the leader answers
			}
		}
	}
	return true
}

// leaderHTTP is the HTTP address of the leader, learned through gossip,
// and whether the pool holds it alive; "" while no leader is known, while
// this server leads, or when the leader gives no HTTP address.
func leaderHTTP(srv *server.Server) (string, bool) {
	id, other := otherLeader(srv)
	if !other || srv.Gossip() == nil {
		return "", false
	}
	m, ok := srv.Gossip().Member(id)
	if !ok || m.Tags["http"] == "" {
		return "", false
	}
	return m.TagAddr("http"), m.Status == gossip.StatusAlive
}

// leaderCatalog writes the agent's checks and services through the server
// while it leads, and over HTTP to the leader otherwise.
type leaderCatalog struct {
	srv    *server.Server
	remote *agent.HTTPCatalog
}

func newLeaderCatalog(srv *server.Server) *leaderCatalog {
	return &leaderCatalog{srv: srv, remote: &agent.HTTPCatalog{Base: func() (string, error) {
		if a, _ := leaderHTTP(srv); a != "" {
			return "http://" + a, nil
		}
		return "", server.ErrNoLeader
	}}}
}

func (c *leaderCatalog) Register(ctx context.Context, req *state.RegisterRequest) error {
	if c.leads() {
		return c.srv.Register(ctx, req)
	}
	return c.remote.Register(ctx, req)
}

func (c *leaderCatalog) Deregister(ctx context.Context, req *state.DeregisterRequest) error {
	if c.leads() {
		return c.srv.Deregister(ctx, req)
	}
	return c.remote.Deregister(ctx, req)
}

// leads is true while this server leads, or while no other leader is
// known (the server then answers "No cluster leader" itself).
func (c *leaderCatalog) leads() bool {
	_, other := otherLeader(c.srv)
	return c.srv.IsLeader() || !other
}

// otherLeader is the leader's node name, and true, when another server
// leads; false while this one does, or no leader is known.
func otherLeader(srv *server.Server) (string, bool) {
	id, _ := srv.LeaderID()
	return id, id != "" && id != srv.NodeName()
}

// waitForClusterLeader blocks until a leader is known and this server's
// state has caught up with it (it leads, or it has heard from the leader),
// or ctx ends.
func waitForClusterLeader(ctx context.Context, srv *server.Server) error {
	if pollUntil(ctx, clock.Real(), 20*time.Millisecond, 0, func() bool {
		if srv.IsLeader() {
			return true
		}
		_, other := otherLeader(srv)
		a, _ := leaderHTTP(srv)
		return other && srv.Replayed() && a != ""
	}) {
		return nil
	}
	return ctx.Err()
}

// withOperatorRoutes serves /v1/operator/raft/{configuration,peer,
// transfer-leader} and /v1/operator/autopilot/{configuration,health,state}
// from srv, and passes the rest to next.
func withOperatorRoutes(srv *server.Server, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/operator/raft/configuration":
			serveRaftConfiguration(srv, w, r)
		case "/v1/operator/raft/peer":
			serveRemovePeer(srv, w, r)
		case "/v1/operator/raft/transfer-leader":
			serveTransferLeader(srv, w, r)
		case "/v1/operator/autopilot/configuration":
			serveAutopilotConfiguration(w, r)
		case "/v1/operator/autopilot/health":
			serveAutopilotHealth(srv, w, r)
		case "/v1/operator/autopilot/state":
			serveAutopilotState(srv, w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func serveRaftConfiguration(srv *server.Server, w http.ResponseWriter, r *http.Request) {
	if !allowMethods(w, r, "", http.MethodGet, http.MethodHead) {
		return
	}
	q := r.URL.Query()
	_, stale := q["stale"]
	if !stale && !srv.IsLeader() {
		http.Error(w, server.ErrNoLeader.Error(), http.StatusInternalServerError)
		return
	}
	servers, index, err := srv.RaftConfiguration()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	type raftServer struct {
		ID, Node, Address string
		Leader            bool
		ProtocolVersion   string
		Voter             bool
	}
	out := struct {
		Servers []raftServer
		Index   uint64
	}{Servers: []raftServer{}, Index: index}
	for _, s := range servers {
		out.Servers = append(out.Servers, raftServer{ID: s.ID, Node: s.Node, Address: s.Address, Leader: s.Leader, ProtocolVersion: "3", Voter: s.Voter})
	}
	known, last := srv.LeaderStatus()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Consul-Index", fmt.Sprint(max(index, 1)))
	w.Header().Set("X-Consul-KnownLeader", fmt.Sprint(known))
	w.Header().Set("X-Consul-LastContact", fmt.Sprint(last.Milliseconds()))
	json.NewEncoder(w).Encode(out)
}

// allowMethods reports whether r's method is one of methods; if not, it
// answers 405 with an Allow header and "method M not allowed", followed by
// why.
func allowMethods(w http.ResponseWriter, r *http.Request, why string, methods ...string) bool {
	if slices.Contains(methods, r.Method) {
		return true
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	http.Error(w, fmt.Sprintf("method %s not allowed%s", r.Method, why), http.StatusMethodNotAllowed)
	return false
}

// autopilotConfiguration is what GET /v1/operator/autopilot/configuration
// answers: holdfast's autopilot behaviour, which is fixed, in Consul's
// terms. A dead server is removed when a new one is promoted
// (CleanupDeadServers); a new server is promoted once caught up, with no
// stabilization time; health is judged with Consul's default thresholds.
var autopilotConfiguration = map[string]any{
	"CleanupDeadServers":      true,
	"LastContactThreshold":    server.HealthLastContact.String(),
	"MaxTrailingLogs":         server.HealthMaxTrailingLogs,
	"MinQuorum":               0,
	"ServerStabilizationTime": "0s",
	"RedundancyZoneTag":       "",
	"DisableUpgradeMigration": false,
	"UpgradeVersionTag":       "",
	"CreateIndex":             0,
	"ModifyIndex":             0,
}

func serveAutopilotConfiguration(w http.ResponseWriter, r *http.Request) {
	if !allowMethods(w, r, ": holdfast's autopilot settings are fixed "+
		"(a dead server is removed when a new one is promoted, and a new server is promoted once its log has caught up); "+
		"there is nothing to change", http.MethodGet, http.MethodHead) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(autopilotConfiguration)
}

// healthAskTimeout bounds the leader's questions to the followers for their
// health: a server that cannot say how far its raft is within a second is
// not healthy, and the answer should not wait on it for longer.
const healthAskTimeout = time.Second

// serveAutopilotHealth answers the servers' health as the leader judges it
// (server.AutopilotHealth): 200 when every server is healthy, 429 when
// one is not, as Consul does.
func serveAutopilotHealth(srv *server.Server, w http.ResponseWriter, r *http.Request) {
	h, ok := askHealth(srv, w, r)
	if !ok {
		return
	}
	type serverHealth struct {
		ID, Name, Address, SerfStatus, Version string
		Leader                                 bool
		LastContact                            *string
		LastTerm, LastIndex                    uint64
		Healthy, Voter                         bool
		StableSince                            time.Time
	}
	out := struct {
		Healthy          bool
		FailureTolerance int
		Servers          []serverHealth
	}{Healthy: h.Healthy, FailureTolerance: h.FailureTolerance, Servers: []serverHealth{}}
	for _, s := range h.Servers {
		out.Servers = append(out.Servers, serverHealth{ID: s.ID, Name: s.Name, Address: s.Address, SerfStatus: s.SerfStatus,
			Version: "holdfast", Leader: s.Leader, LastContact: lastContact(s.LastContact), LastTerm: s.LastTerm,
			LastIndex: s.LastIndex, Healthy: s.Healthy, Voter: s.Voter, StableSince: s.StableSince.UTC()})
	}
	w.Header().Set("Content-Type", "application/json")
	if !h.Healthy {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	json.NewEncoder(w).Encode(out)
}

// serveAutopilotState answers the servers' state as Consul's
// /v1/operator/autopilot/state gives it (Operator().AutopilotState): the
// same judgement as the health, keyed by server, with each one's role.
// holdfast has no read replicas, redundancy zones or upgrade migrations.
func serveAutopilotState(srv *server.Server, w http.ResponseWriter, r *http.Request) {
	h, ok := askHealth(srv, w, r)
	if !ok {
		return
	}
	type autopilotServer struct {
		ID, Name, Address, NodeStatus, Version string
		LastContact                            *string
		LastTerm, LastIndex                    uint64
		Healthy                                bool
		StableSince                            time.Time
		ReadReplica                            bool
		Status                                 string
		Meta                                   map[string]string
		NodeType                               string
	}
	out := struct {
		Healthy                    bool
		FailureTolerance           int
		OptimisticFailureTolerance int
		Servers                    map[string]autopilotServer
		Leader                     string
		Voters                     []string
	}{Healthy: h.Healthy, FailureTolerance: h.FailureTolerance, OptimisticFailureTolerance: h.OptimisticFailureTolerance,
		Servers: map[string]autopilotServer{}, Voters: []string{}}
	for _, s := range h.Servers {
		status := "non-voter"
		switch {
		case s.Leader:
			status = "leader"
			out.Leader = s.ID
		case s.Voter:
			status = "voter"
		}
		if s.Voter {
			out.Voters = append(out.Voters, s.ID)
		}
		out.Servers[s.ID] = autopilotServer{ID: s.ID, Name: s.Name, Address: s.Address, NodeStatus: s.SerfStatus,
			Version: "holdfast", LastContact: lastContact(s.LastContact), LastTerm: s.LastTerm, LastIndex: s.LastIndex,
			Healthy: s.Healthy, StableSince: s.StableSince.UTC(), Status: status, Meta: map[string]string{}, NodeType: "voter"}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// askHealth is the common part of the autopilot health and state
// endpoints: a GET, judged by the leader (server.AutopilotHealth); false
// when the answer has been written (a refused method, an error).
func askHealth(srv *server.Server, w http.ResponseWriter, r *http.Request) (*server.ClusterHealth, bool) {
	if !allowMethods(w, r, "", http.MethodGet, http.MethodHead) {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), healthAskTimeout)
	defer cancel()
	h, err := srv.AutopilotHealth(ctx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return nil, false
	}
	return h, true
}

// lastContact is a last contact as Consul's API writes it (a duration
// string), or null when unknown (negative).
func lastContact(d time.Duration) *string {
	if d < 0 {
		return nil
	}
	s := d.String()
	return &s
}

func serveRemovePeer(srv *server.Server, w http.ResponseWriter, r *http.Request) {
	if !allowMethods(w, r, "", http.MethodDelete) {
		return
	}
	q := r.URL.Query()
	id, addr := q.Get("id"), q.Get("address")
	if (id == "") == (addr == "") {
		http.Error(w, "Must specify either ?id with the server's ID or ?address with IP:port of peer to remove", http.StatusBadRequest)
		return
	}
	err := srv.RemovePeer(id, addr)
	switch {
	case err == nil:
		w.WriteHeader(http.StatusOK)
	case errors.Is(err, server.ErrNoSuchPeer):
		http.Error(w, strings.TrimPrefix(err.Error(), "server: "), http.StatusNotFound)
	case errors.Is(err, server.ErrRemoveLeader):
		http.Error(w, strings.TrimPrefix(err.Error(), "server: "), http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// serveTransferLeader hands the leadership to ?id, or to the most
// up-to-date follower (server.TransferLeadershipTo), and answers
// {"Success":true} as Consul does.
func serveTransferLeader(srv *server.Server, w http.ResponseWriter, r *http.Request) {
	if !allowMethods(w, r, "", http.MethodPost, http.MethodPut) {
		return
	}
	err := srv.TransferLeadershipTo(r.URL.Query().Get("id"))
	msg := func() string { return strings.TrimPrefix(err.Error(), "server: ") }
	switch {
	case err == nil:
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"Success":true}`+"\n")
	case errors.Is(err, server.ErrNoSuchPeer):
		http.Error(w, msg(), http.StatusNotFound)
	case errors.Is(err, server.ErrTransferToSelf), errors.Is(err, server.ErrTransferNonVoter):
		http.Error(w, msg(), http.StatusBadRequest)
	case errors.Is(err, server.ErrNoOtherVoter), errors.Is(err, server.ErrTransferInProgress):
		http.Error(w, msg(), http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// peerClient is an API client for server m's HTTP address (its http tag).
func peerClient(m gossip.Member) (*api.Client, error) {
	if m.Tags["http"] == "" {
		return nil, errors.New("it gives no HTTP address")
	}
	return api.NewClient(&api.Config{Address: m.TagAddr("http"), HTTPClient: http.DefaultClient})
}

// peerTimeout bounds each question one server asks another.
const peerTimeout = 5 * time.Second

// peerInCluster is server.Config.PeerInCluster over HTTP: server m is in a
// cluster if its /v1/status/peers lists any voter.
func peerInCluster(ctx context.Context, m gossip.Member) (bool, error) {
	cl, err := peerClient(m)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	peers, err := cl.Status().Peers(ctx)
	return len(peers) > 0, err
}

// peerProgress is server.Config.PeerProgress over HTTP: server m's raft
// term, last log index and last contact with a leader, from its
// /v1/agent/self (raft's own stats).
func peerProgress(ctx context.Context, m gossip.Member) (server.Progress, error) {
	cl, err := peerClient(m)
	if err != nil {
		return server.Progress{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	self, err := cl.Agent().Self(ctx)
	if err != nil {
		return server.Progress{}, err
	}
	stats, _ := self["Stats"]["raft"].(map[string]any)
	return server.ParseProgress(stats)
}
