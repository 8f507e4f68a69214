package gossip

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"

	"github.com/holdfast/holdfast/clock"
)

// DefaultPort is the gossip port assumed for a join address given without
// one, as in Consul (its serf LAN port).
const DefaultPort = 8301

// Profile names a set of failure-detector timings.
type Profile string

// Profiles.
const (
	// ProfileLAN is memberlist's LAN configuration: probe one member every
	// second with a 500ms timeout, suspect a silent member for 4 probe
	// intervals (scaled by log10 of the pool size) before declaring it
	// failed. The default.
	ProfileLAN Profile = "lan"
	// ProfileFast probes every 200ms with a 100ms timeout and suspects for
	// 3 intervals, so a killed agent is declared failed in about a second.
	// It is for tests on one machine; on a real network it will declare
	// healthy agents failed.
	ProfileFast Profile = "fast"
)

// ParseProfile checks a profile name ("" means ProfileLAN).
func ParseProfile(s string) (Profile, error) {
	switch Profile(s) {
	case "", ProfileLAN:
		return ProfileLAN, nil
	case ProfileFast:
		return ProfileFast, nil
	}
	return "", fmt.Errorf("gossip: unknown profile %q: use lan or fast", s)
}

// Status is a member's standing in the pool. The numbers are serf's, which
// Consul's /v1/agent/members reports.
type Status int

// Statuses.
const (
	StatusNone Status = iota
	// StatusAlive: the member answers probes (or is suspected but not yet
	// declared failed: memberlist does not report suspicion, so a suspect
	// member shows as alive, as in serf).
	StatusAlive
	// StatusLeaving: the member announced that it is leaving.
	StatusLeaving
	// StatusLeft: the member left gracefully.
	StatusLeft
	// StatusFailed: the failure detector declared the member dead.
	StatusFailed
)

func (s Status) String() string {
	switch s {
	case StatusAlive:
		return "alive"
	case StatusLeaving:
		return "leaving"
	case StatusLeft:
		return "left"
	case StatusFailed:
		return "failed"
	}
	return "none"
}

// Member is one agent of the pool as this pool sees it.
type Member struct {
	Name string
	// Addr and Port are where the member gossips.
	Addr string
	Port uint16
	// Tags are the member's own Config.Tags (role, http, raft, dc, ...).
	Tags   map[string]string
	Status Status
}

// Address is Addr:Port.
func (m Member) Address() string { return net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port))) }

// TagAddr is the host:port in the member's tag (its "http" or "raft"
// address), with an unspecified host (it listens everywhere) replaced by
// the address it gossips from, so that others can dial it.
func (m Member) TagAddr(tag string) string {
	addr := m.Tags[tag]
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return net.JoinHostPort(m.Addr, port)
	}
	return addr
}

func (m Member) clone() Member {
	if m.Tags != nil {
		t := make(map[string]string, len(m.Tags))
		for k, v := range m.Tags {
			t[k] = v
		}
		m.Tags = t
	}
	return m
}

// EventType says what happened to a member.
type EventType int

// Event types.
const (
	// EventJoin: a member appeared, or came back after failing or leaving.
	EventJoin EventType = iota + 1
	// EventUpdate: a member changed its tags or announced it is leaving.
	EventUpdate
	// EventLeave: a member left gracefully.
	EventLeave
	// EventFailed: the failure detector declared a member dead.
	EventFailed
	// EventReap: a failed or left member was forgotten (Config.ReapAfter
	// after it failed or left); it is no longer in Members.
	EventReap
)

func (t EventType) String() string {
	switch t {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeave:
		return "leave"
	case EventFailed:
		return "failed"
	case EventReap:
		return "reap"
	}
	return "unknown"
}

// Event is one membership change. Member is the member as it was just after
// the change; the receiver owns it.
type Event struct {
	Type   EventType
	Member Member
}

// Config configures a Pool. Zero fields take the defaults given.
type Config struct {
	// Name is this agent's name in the pool, unique in it: the node name.
	// Required.
	Name string
	// BindAddr and BindPort are where the pool listens, on TCP and UDP.
	// Defaults: 127.0.0.1, and port 0 picks a free port (see Pool.Addr).
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what other members are told to
	// use; default: the bound address (with 0.0.0.0, a private IP of this
	// host) and port.
	AdvertiseAddr string
	AdvertisePort int
	// Tags are published to every member with this agent's presence.
	// Encoded, they must fit in memberlist's 512-byte limit.
	Tags map[string]string
	// Profile sets the failure detector's timing (default ProfileLAN).
	Profile Profile
	// Logger gets the pool's and memberlist's logs. Default: discard.
	Logger hclog.Logger
	// Clock drives the pool's own timers: reaping, reconnecting, join
	// retries. Default clock.Real(). (memberlist's probes run on real time.)
	Clock clock.Clock
	// Notify, if set, is called with every membership change, this agent's
	// own included, one at a time and in order, from a goroutine of the
	// pool. It should return promptly: later events wait for it. It is
	// never called once Shutdown has returned.
	Notify func(Event)
	// ReapAfter is how long a failed or left member is remembered before
	// EventReap forgets it. Default 24h (lan), 1m (fast).
	ReapAfter time.Duration
	// ReconnectInterval is how often the pool tries to reach one failed
	// member again, so that a pool split by a partition or a restart heals.
	// Default 30s (lan), 1s (fast).
	ReconnectInterval time.Duration
	// Anchor, if set, marks the members the pool tries to reach at every
	// reconnect round while they are failed, besides the one other failed
	// member of the round: the servers, which an agent must find again at
	// once after they restart (a restarted server knows no one, and drops
	// the agents that do not reach it in time), however many other members
	// are failed and not yet reaped. Default: the members tagged
	// role=server (or role=consul, as Consul's servers are).
	Anchor func(Member) bool
	// SecretKey, if set, encrypts and authenticates every gossip message
	// (AES-GCM, memberlist's keyring): 16, 24 or 32 bytes. A pool with a
	// key takes no message without it, so only agents given the same key
	// can join, or declare a member failed or left, which would invalidate
	// the sessions of its node.
	SecretKey []byte
}

// CheckKey says whether key makes a gossip key (AES-128, -192 or -256),
// as memberlist judges it (memberlist.ValidateKey), in a sentence.
func CheckKey(key []byte) error {
	if memberlist.ValidateKey(key) != nil {
		return fmt.Errorf("gossip: a key is 16, 24 or 32 bytes, not %d", len(key))
	}
	return nil
}

// isServer is the default Config.Anchor.
func isServer(m Member) bool { return m.Tags["role"] == "server" || m.Tags["role"] == "consul" }

// meta is what a member publishes through memberlist's node metadata.
type meta struct {
	Tags    map[string]string `json:"t,omitempty"`
	Leaving bool              `json:"l,omitempty"`
}

// Errors.
var (
	// ErrShutdown is returned by calls on a pool that was shut down.
	ErrShutdown = errors.New("gossip: the pool is shut down")
)

// Pool is this agent's membership in the gossip pool. Its methods are safe
// for concurrent use.
type Pool struct {
	name      string
	log       hclog.Logger
	clk       clock.Clock
	notify    func(Event)
	reapAfter time.Duration
	reconnect time.Duration
	anchor    func(Member) bool
	encrypted bool
	conflict  atomic.Pointer[string] // another agent's address, if it claims our name
	conflicts chan struct{}          // capacity 1: a conflict was noticed (Conflicts)
	profile   Profile
	timing    Timing
	ml        *memberlist.Memberlist

	mu      sync.Mutex
	meta    meta
	members map[string]*entry
	queue   []Event
	rr      int // round-robin position among failed members to reconnect

	wake         chan struct{}
	stop         chan struct{}
	wg           sync.WaitGroup
	lifeMu       sync.Mutex // orders Leave and Shutdown
	shut         atomic.Bool
	reconnecting atomic.Bool
}

type entry struct {
	m     Member
	since time.Time // when the status last changed, on the pool's clock
}

// Timing is the failure detector's timing of a pool, for callers that
// must wait for it (tests, and the server's grace period for members that
// a fresh pool has not heard of yet).
type Timing struct {
	ProbeInterval    time.Duration
	ProbeTimeout     time.Duration
	SuspicionMult    int
	PushPullInterval time.Duration
	GossipInterval   time.Duration
	TCPTimeout       time.Duration
	Reconnect        time.Duration
}

// Settle is how long after a pool starts before every live agent that
// knew it should have reached it again: two full state exchanges and a
// reconnect round.
func (t Timing) Settle() time.Duration {
	return 2*t.PushPullInterval + t.Reconnect
}

func (c *Config) memberlistConfig() (*memberlist.Config, error) {
	mc := memberlist.DefaultLANConfig()
	switch c.Profile {
	case "", ProfileLAN:
		// A restarted agent may come back on another port; it may take
		// its name back once the old address has been dead this long
		// (Consul's LAN setting). Before that the pool keeps the dead
		// address, and sessions made meanwhile would follow it.
		mc.DeadNodeReclaimTime = 30 * time.Second
	case ProfileFast:
		mc.ProbeInterval = 200 * time.Millisecond
		mc.ProbeTimeout = 100 * time.Millisecond
		mc.SuspicionMult = 3
		mc.SuspicionMaxTimeoutMult = 2
		mc.AwarenessMaxMultiplier = 2
		mc.GossipInterval = 50 * time.Millisecond
		mc.GossipToTheDeadTime = 5 * time.Second
		mc.PushPullInterval = 5 * time.Second
		mc.TCPTimeout = 2 * time.Second
		// A restarted agent may come back on another port; let it
		// reclaim its name soon after it was declared dead.
		mc.DeadNodeReclaimTime = 500 * time.Millisecond
	default:
		return nil, fmt.Errorf("gossip: unknown profile %q: use lan or fast", c.Profile)
	}
	if c.SecretKey != nil {
		if err := CheckKey(c.SecretKey); err != nil {
			return nil, err
		}
		// Both on by default; set here so that no later default can
		// let plaintext in.
		mc.SecretKey = slices.Clone(c.SecretKey)
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.Name = c.Name
	mc.BindAddr = c.BindAddr
	mc.BindPort = c.BindPort
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = c.AdvertisePort
	if mc.AdvertiseAddr != "" && mc.AdvertisePort == 0 {
		mc.AdvertisePort = c.BindPort
	}
	return mc, nil
}

// New starts a pool of one: this agent, listening on BindAddr:BindPort.
// Join makes it part of a bigger one.
func New(cfg Config) (*Pool, error) {
	if cfg.Name == "" {
		return nil, errors.New("gossip: a pool member needs a name")
	}
	if cfg.BindAddr == "" {
		cfg.BindAddr = "127.0.0.1"
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Profile == "" {
		cfg.Profile = ProfileLAN
	}
	mc, err := cfg.memberlistConfig()
	if err != nil {
		return nil, err
	}
	if cfg.ReapAfter == 0 {
		cfg.ReapAfter = 24 * time.Hour
		if cfg.Profile == ProfileFast {
			cfg.ReapAfter = time.Minute
		}
	}
	if cfg.Anchor == nil {
		cfg.Anchor = isServer
	}
	if cfg.ReconnectInterval == 0 {
		cfg.ReconnectInterval = 30 * time.Second
		if cfg.Profile == ProfileFast {
			cfg.ReconnectInterval = time.Second
		}
	}
	p := &Pool{
		name:      cfg.Name,
		log:       cfg.Logger,
		clk:       cfg.Clock,
		notify:    cfg.Notify,
		reapAfter: cfg.ReapAfter,
		reconnect: cfg.ReconnectInterval,
		anchor:    cfg.Anchor,
		profile:   cfg.Profile,
		members:   make(map[string]*entry),
		wake:      make(chan struct{}, 1),
		conflicts: make(chan struct{}, 1),
		stop:      make(chan struct{}),
		meta:      meta{Tags: cloneTags(cfg.Tags)},
	}
	if b, err := json.Marshal(p.meta); err != nil {
		return nil, fmt.Errorf("gossip: encoding tags: %w", err)
	} else if len(b) > memberlist.MetaMaxSize-16 { // room for the leaving mark
		return nil, fmt.Errorf("gossip: the tags take %d bytes encoded; at most %d fit", len(b), memberlist.MetaMaxSize-16)
	}
	p.timing = Timing{
		ProbeInterval: mc.ProbeInterval, ProbeTimeout: mc.ProbeTimeout, SuspicionMult: mc.SuspicionMult,
		PushPullInterval: mc.PushPullInterval, GossipInterval: mc.GossipInterval, TCPTimeout: mc.TCPTimeout,
		Reconnect: cfg.ReconnectInterval,
	}
	d := &delegate{p: p}
	mc.Delegate = d
	mc.Events = d
	mc.Conflict = d
	mc.Logger = cfg.Logger.Named("memberlist").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})

	p.wg.Add(1)
	go p.deliver()
	ml, err := memberlist.Create(mc)
	if err != nil {
		close(p.stop)
		p.wg.Wait()
		return nil, fmt.Errorf("gossip: cannot listen on %s: %w", net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.BindPort)), err)
	}
	p.ml = ml
	p.wg.Add(1)
	go p.maintain()
	p.encrypted = cfg.SecretKey != nil
	p.log.Info("gossip pool started", "name", cfg.Name, "addr", p.Addr(), "profile", string(cfg.Profile), "encrypted", p.encrypted)
	return p, nil
}

// Name is this agent's name in the pool.
func (p *Pool) Name() string { return p.name }

// Addr is the host:port this agent gossips on, as advertised to others.
func (p *Pool) Addr() string {
	n := p.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Profile is the pool's failure-detector profile.
func (p *Pool) Profile() Profile { return p.profile }

// Encrypted reports whether the pool's messages are encrypted (a key was
// given).
func (p *Pool) Encrypted() bool { return p.encrypted }

// Timing reports the failure detector's timing.
func (p *Pool) Timing() Timing { return p.timing }

// Members lists every member this pool knows, itself included, alive or
// not, ordered by name. Failed and left members stay listed until reaped.
// The caller owns the result.
func (p *Pool) Members() []Member {
	p.mu.Lock()
	out := make([]Member, 0, len(p.members))
	for _, e := range p.members {
		out = append(out, e.m.clone())
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Stats describes the pool in the shape of the "serf_lan" section of
// Consul's /v1/agent/self Stats: the members it lists (leaving, left and
// failed ones too, as serf counts them), how many failed and left, the failure
// detector's health score (0 is healthy; it rises while this member's own
// probes go unanswered) and whether gossip is encrypted (never, here).
func (p *Pool) Stats() map[string]string {
	members := p.Members()
	var failed, left int
	for _, m := range members {
		switch m.Status {
		case StatusFailed:
			failed++
		case StatusLeft:
			left++
		}
	}
	return map[string]string{
		"members":      strconv.Itoa(len(members)),
		"failed":       strconv.Itoa(failed),
		"left":         strconv.Itoa(left),
		"health_score": strconv.Itoa(p.ml.GetHealthScore()),
		"encrypted":    "false",
	}
}

// Member returns the named member, if known.
func (p *Pool) Member(name string) (Member, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.members[name]
	if !ok {
		return Member{}, false
	}
	return e.m.clone(), true
}

// CheckJoinAddr checks a join address and returns it as host:port,
// adding DefaultPort when it has none. It does not resolve or dial.
func CheckJoinAddr(addr string) (string, error) {
	a := strings.TrimSpace(addr)
	if a == "" {
		return "", errors.New("gossip: an empty join address")
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) && strings.Contains(ae.Err, "missing port") {
			host, port = strings.TrimSuffix(strings.TrimPrefix(a, "["), "]"), strconv.Itoa(DefaultPort)
		} else {
			return "", fmt.Errorf("gossip: bad join address %q: want host:port", addr)
		}
	}
	if host == "" {
		return "", fmt.Errorf("gossip: bad join address %q: no host", addr)
	}
	if strings.ContainsAny(host, " /") {
		return "", fmt.Errorf("gossip: bad join address %q: want host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("gossip: bad join address %q: port %q is not a number from 1 to 65535", addr, port)
	}
	return net.JoinHostPort(host, port), nil
}

// AddrError is why one join address could not be joined.
type AddrError struct {
	Addr   string
	Reason string // a sentence fragment for people
	Err    error  // memberlist's error
}

func (e AddrError) Error() string { return e.Addr + ": " + e.Reason }

// NameConflictError is returned by Join when another member of the pool
// already uses this agent's name: sessions bound to the name would follow
// the other agent's health, so this one must not stay.
type NameConflictError struct {
	Name  string
	Other string // the other agent's gossip address
}

func (e *NameConflictError) Error() string {
	return fmt.Sprintf("gossip: the agent at %s already uses the node name %q in this pool; give this agent another name (-node), "+
		"or, if that agent has just stopped, start this one again once the pool has declared it failed", e.Other, e.Name)
}

// JoinError is returned when no join address could be joined.
type JoinError struct {
	Failures []AddrError
}

func (e *JoinError) Error() string {
	if len(e.Failures) == 1 {
		return fmt.Sprintf("gossip: could not join the pool through %s: %s", e.Failures[0].Addr, e.Failures[0].Reason)
	}
	parts := make([]string, len(e.Failures))
	for i, f := range e.Failures {
		parts[i] = f.Error()
	}
	return fmt.Sprintf("gossip: could not join the pool through any of %d addresses: %s", len(e.Failures), strings.Join(parts, "; "))
}

// Join contacts each address (host:port, or host for DefaultPort) and
// exchanges state with the agent there, joining its pool. It returns how
// many addresses answered. The error is nil if at least one did; it is a
// *JoinError, naming each address and why it failed, if none did; and a
// plain error if an address is malformed (then nothing is contacted).
func (p *Pool) Join(addrs []string) (int, error) {
	if p.shut.Load() {
		return 0, ErrShutdown
	}
	if len(addrs) == 0 {
		return 0, errors.New("gossip: no join address given")
	}
	norm := make([]string, len(addrs))
	for i, a := range addrs {
		n, err := CheckJoinAddr(a)
		if err != nil {
			return 0, err
		}
		norm[i] = n
	}
	// Only a conflict seen in this join fails it: one noticed earlier was
	// for Conflicts' reader to judge.
	p.conflict.Store(nil)
	var je JoinError
	joined := 0
	for _, a := range norm {
		if _, err := p.ml.Join([]string{a}); err != nil {
			je.Failures = append(je.Failures, AddrError{Addr: a, Reason: explain(err, p.timing.TCPTimeout), Err: err})
			continue
		}
		joined++
		p.log.Info("joined the gossip pool", "through", a)
	}
	if c := p.conflict.Load(); c != nil {
		return 0, &NameConflictError{Name: p.name, Other: *c}
	}
	if joined == 0 {
		return 0, &je
	}
	for _, f := range je.Failures {
		p.log.Warn("one join address did not answer", "addr", f.Addr, "reason", f.Reason)
	}
	return joined, nil
}

// Conflicts is signalled (it has room for one signal) each time another
// agent is seen claiming this agent's name at another address, during a
// Join or at any time after. Join reports the first kind itself; after a
// join, the pool cannot tell which of the two the others follow, so the
// caller must find out (a client agent asks a server) and stop if it is
// not this one. Conflict says who the other is.
func (p *Pool) Conflicts() <-chan struct{} { return p.conflicts }

// Conflict returns the gossip address of the agent last seen claiming this
// agent's name, "" if none since the last Join began.
func (p *Pool) Conflict() string {
	if c := p.conflict.Load(); c != nil {
		return *c
	}
	return ""
}

// explain turns memberlist's join error into a reason people can act on.
// memberlist formats the dial error into a string, so this reads it.
func explain(err error, timeout time.Duration) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "connection refused"):
		return "nothing is listening there (connection refused: is an agent gossiping on that address?)"
	case strings.Contains(s, "no such host"), strings.Contains(s, "failed to resolve"):
		return "the host name does not resolve"
	case strings.Contains(s, "network is unreachable"), strings.Contains(s, "no route to host"):
		return "the network is unreachable from here"
	case strings.Contains(s, "i/o timeout"), strings.Contains(s, "timeout"):
		return fmt.Sprintf("no answer within %v (wrong address, or a firewall dropping packets?)", timeout)
	case strings.Contains(s, "remote state is encrypted and encryption is not configured"):
		return "the pool there is encrypted and this agent has no key (give it the pool's key with -encrypt)"
	case strings.Contains(s, "encryption is configured but remote state is not encrypted"):
		return "the pool there is not encrypted and this agent has a key (give every agent of the pool the same -encrypt key, or none)"
	case strings.Contains(s, "no installed keys could decrypt"):
		return "the pool there uses another key (every agent of a pool needs the same -encrypt key)"
	}
	// Unknown: give memberlist's own words, without its list framing.
	s = strings.TrimSpace(strings.TrimPrefix(s, "1 error occurred:"))
	s = strings.TrimSpace(strings.TrimPrefix(s, "*"))
	return s
}

// RetryJoin calls Join until it succeeds, ctx ends or the pool shuts
// down, waiting first, then twice as long each time up to max, between
// attempts (on the pool's clock) and logging every failure. A malformed
// address is returned at once: retrying cannot fix it.
func (p *Pool) RetryJoin(ctx context.Context, addrs []string, first, max time.Duration) (int, error) {
	if first <= 0 {
		first = time.Second
	}
	if max < first {
		max = first
	}
	wait := first
	for attempt := 1; ; attempt++ {
		n, err := p.Join(addrs)
		if err == nil {
			return n, nil
		}
		var je *JoinError
		if !errors.As(err, &je) {
			return 0, err
		}
		p.log.Warn("joining the gossip pool failed; will retry", "attempt", attempt, "retry_in", wait, "error", err.Error())
		t := p.clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-p.stop:
			t.Stop()
			return 0, ErrShutdown
		case <-t.C():
		}
		if wait *= 2; wait > max {
			wait = max
		}
	}
}

// Leave announces that this agent is leaving, so that the others record it
// as left rather than failed, and waits up to timeout (per step) for the
// announcement to go out. The pool keeps running until Shutdown.
func (p *Pool) Leave(timeout time.Duration) error {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.shut.Load() {
		return ErrShutdown
	}
	p.mu.Lock()
	already := p.meta.Leaving
	p.meta.Leaving = true
	p.mu.Unlock()
	if already {
		return nil
	}
	p.log.Info("leaving the gossip pool")
	// First say "leaving" through the metadata, then the goodbye itself:
	// memberlist's own leave message looks like a failure to the others
	// unless they know the member meant to go.
	if err := p.ml.UpdateNode(timeout); err != nil {
		p.log.Warn("announcing the leave took too long; leaving anyway", "error", err)
	}
	if err := p.ml.Leave(timeout); err != nil {
		return fmt.Errorf("gossip: leaving: %w", err)
	}
	return nil
}

// Shutdown stops gossiping at once, without a goodbye (the others will
// declare this agent failed; call Leave first to leave gracefully). Safe to
// call more than once.
func (p *Pool) Shutdown() error {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.shut.Swap(true) {
		return nil
	}
	err := p.ml.Shutdown()
	close(p.stop)
	p.wg.Wait()
	return err
}

// ---- events from memberlist ----

// delegate receives memberlist's callbacks. memberlist calls the event
// methods one at a time, holding its node lock: they only record and
// queue, never call back into memberlist.
type delegate struct{ p *Pool }

func (d *delegate) NodeMeta(limit int) []byte {
	d.p.mu.Lock()
	b, err := json.Marshal(d.p.meta)
	d.p.mu.Unlock()
	if err != nil || len(b) > limit {
		return nil // checked in New; cannot happen
	}
	return b
}

func (d *delegate) NotifyMsg([]byte)                {}
func (d *delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (d *delegate) LocalState(bool) []byte          { return nil }
func (d *delegate) MergeRemoteState([]byte, bool)   {}

func (d *delegate) NotifyJoin(n *memberlist.Node) { d.p.observe(n, EventJoin) }

// NotifyConflict is memberlist's word that other claims the name of
// existing at another address. When the name is this agent's, the pool
// records it: Join then fails with a *NameConflictError.
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	if existing.Name == d.p.name {
		addr := other.Address()
		d.p.conflict.Store(&addr)
		d.p.log.Error("another agent uses this agent's name", "name", existing.Name, "other", addr)
		select {
		case d.p.conflicts <- struct{}{}:
		default:
		}
		return
	}
	d.p.log.Warn("two agents claim one name; the first keeps it", "name", existing.Name,
		"kept", existing.Address(), "refused", other.Address())
}
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.p.observe(n, EventUpdate) }
func (d *delegate) NotifyLeave(n *memberlist.Node)  { d.p.observe(n, EventLeave) }

// observe records a change reported by memberlist and queues its event.
// For a departure, the member's last announcement decides between left
// (it said it was leaving) and failed.
func (p *Pool) observe(n *memberlist.Node, t EventType) {
	var md meta
	if len(n.Meta) > 0 {
		if err := json.Unmarshal(n.Meta, &md); err != nil {
			p.log.Warn("a member's metadata is not holdfast's; ignoring its tags", "member", n.Name, "error", err)
			md = meta{}
		}
	}
	m := Member{Name: n.Name, Addr: n.Addr.String(), Port: n.Port, Tags: cloneTags(md.Tags), Status: StatusAlive}
	if md.Leaving {
		m.Status = StatusLeaving
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	prev := p.members[n.Name]
	if t == EventLeave {
		m.Status = StatusFailed
		t = EventFailed
		if md.Leaving || (prev != nil && prev.m.Status == StatusLeaving) {
			m.Status, t = StatusLeft, EventLeave
		}
	}
	e := &entry{m: m, since: p.clk.Now()}
	if prev != nil && prev.m.Status == m.Status {
		e.since = prev.since
	}
	p.members[n.Name] = e
	if prev != nil && t == EventJoin && prev.m.Status == m.Status {
		t = EventUpdate
	}
	if t == EventFailed || t == EventLeave {
		p.log.Info("member "+map[EventType]string{EventFailed: "failed", EventLeave: "left"}[t], "member", m.Name, "addr", m.Address())
	} else if t == EventJoin {
		p.log.Info("member joined", "member", m.Name, "addr", m.Address())
	}
	p.enqueue(Event{Type: t, Member: m.clone()})
}

// enqueue queues ev for Notify. p.mu must be held.
func (p *Pool) enqueue(ev Event) {
	if p.notify == nil {
		return
	}
	p.queue = append(p.queue, ev)
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// deliver calls Notify with queued events, in order, until Shutdown.
func (p *Pool) deliver() {
	defer p.wg.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-p.wake:
		}
		for {
			p.mu.Lock()
			if len(p.queue) == 0 {
				p.mu.Unlock()
				break
			}
			ev := p.queue[0]
			p.queue[0] = Event{}
			p.queue = p.queue[1:]
			p.mu.Unlock()
			select {
			case <-p.stop:
				return
			default:
			}
			p.notify(ev)
		}
	}
}

// ---- upkeep on the pool's clock ----

// maintain forgets members that failed or left long ago and tries to
// reach failed ones again, every reconnect interval.
func (p *Pool) maintain() {
	defer p.wg.Done()
	t := p.clk.NewTimer(p.reconnect)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C():
		}
		p.reap()
		p.reconnectOne()
		t.Reset(p.reconnect)
	}
}

// reap forgets failed and left members older than reapAfter.
func (p *Pool) reap() {
	now := p.clk.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	names := make([]string, 0)
	for name, e := range p.members {
		if (e.m.Status == StatusFailed || e.m.Status == StatusLeft) && now.Sub(e.since) >= p.reapAfter {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		e := p.members[name]
		delete(p.members, name)
		p.log.Info("forgetting a member", "member", name, "status", e.m.Status.String())
		p.enqueue(Event{Type: EventReap, Member: e.m.clone()})
	}
}

// reconnectOne tries to join one failed member, round robin, and every
// failed anchor (Config.Anchor). It runs in a goroutine of its own (a dial
// may take the TCP timeout) and at most one runs at a time; Shutdown does
// not wait for it.
func (p *Pool) reconnectOne() {
	p.mu.Lock()
	var anchors, others []Member
	for _, e := range p.members {
		if e.m.Status != StatusFailed {
			continue
		}
		if p.anchor != nil && p.anchor(e.m) {
			anchors = append(anchors, e.m)
		} else {
			others = append(others, e.m)
		}
	}
	if len(anchors)+len(others) == 0 {
		p.mu.Unlock()
		return
	}
	sort.Slice(anchors, func(i, j int) bool { return anchors[i].Name < anchors[j].Name })
	sort.Slice(others, func(i, j int) bool { return others[i].Name < others[j].Name })
	tries := anchors
	if len(others) > 0 {
		tries = append(tries, others[p.rr%len(others)])
		p.rr++
	}
	p.mu.Unlock()
	if !p.reconnecting.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer p.reconnecting.Store(false)
		for _, m := range tries {
			if p.shut.Load() {
				return
			}
			p.log.Debug("trying to reach a failed member again", "member", m.Name, "addr", m.Address())
			if _, err := p.ml.Join([]string{m.Address()}); err != nil {
				p.log.Debug("failed member still unreachable", "member", m.Name, "reason", explain(err, p.timing.TCPTimeout))
			}
		}
	}()
}

func cloneTags(t map[string]string) map[string]string {
	if len(t) == 0 {
		return nil
	}
	out := make(map[string]string, len(t))
	for k, v := range t {
		out[k] = v
	}
	return out
}
