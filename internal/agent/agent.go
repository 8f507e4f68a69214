package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/state"
)

// CatalogWriter commits catalog changes; a server implements it. Both
// methods may be called concurrently and return once the change is
// applied (or failed).
type CatalogWriter interface {
	Register(ctx context.Context, req *state.RegisterRequest) error
	Deregister(ctx context.Context, req *state.DeregisterRequest) error
}

// Dialer opens TCP connections for TCP checks (and for HTTP checks when
// Config.HTTPClient is nil). *net.Dialer implements it.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Defaults for Config.
const (
	DefaultMinInterval          = time.Second
	DefaultTimeout              = 10 * time.Second
	DefaultOutputUpdateInterval = 5 * time.Minute
	// MaxOutput bounds the output kept for a check (an HTTP body, a
	// note), as Consul's 4 KiB.
	MaxOutput = 4096
)

// Config configures an Agent. Node and Catalog are required; every other
// zero field takes its default.
type Config struct {
	// Node is the agent's own node: every check and service it registers
	// lives there.
	Node string
	// Clock drives TTLs, probe intervals and timeouts. Default clock.Real().
	Clock clock.Clock
	// Catalog receives every change.
	Catalog CatalogWriter
	// Logger receives failed catalog writes. Nil discards.
	Logger *slog.Logger
	// HTTPClient runs HTTP checks. Default: a client that dials with
	// Dialer, follows no proxy and keeps no connections alive. An injected
	// client is used as it is (TLSSkipVerify then has no effect).
	HTTPClient *http.Client
	// Dialer runs TCP checks. Default: a zero net.Dialer.
	Dialer Dialer
	// MinInterval is the smallest Interval (and TTL) a check may have.
	// Default 1s.
	MinInterval time.Duration
	// DefaultTimeout is a probe's timeout when the check gives none.
	// Default 10s.
	DefaultTimeout time.Duration
	// OutputUpdateInterval spaces catalog writes that change only a
	// check's output (a new note with the same status), as Consul's
	// check_update_interval does: a status change is written at once, a
	// new output at most once per interval (the first output after
	// registration at once). Default 5m; negative writes every change at
	// once.
	OutputUpdateInterval time.Duration
	// StateFile keeps the agent's services and checks across restarts
	// (see Restore); it is rewritten after every change. Empty keeps
	// nothing.
	StateFile string
}

// Errors. ErrNotFound and ErrClosed are sentinels for errors.Is; bad input
// wraps state.ErrInvalidRequest, so that it reads as the request's fault at
// the HTTP edge.
var (
	// ErrNotFound: no such check or service on this agent. Errors that
	// wrap it also have a NotFound() bool method that returns true.
	ErrNotFound = errors.New("agent: not found")
	// ErrClosed: the agent was closed.
	ErrClosed = errors.New("agent: closed")
)

type notFoundError struct{ msg string }

func (e *notFoundError) Error() string        { return e.msg }
func (e *notFoundError) NotFound() bool       { return true }
func (e *notFoundError) Is(target error) bool { return target == ErrNotFound }

func notFoundf(format string, args ...interface{}) error {
	return &notFoundError{msg: fmt.Sprintf(format, args...)}
}

func invalidf(format string, args ...interface{}) error {
	return fmt.Errorf("%w: "+format, append([]interface{}{state.ErrInvalidRequest}, args...)...)
}

// Agent runs the checks of one node and keeps its services. Its methods
// are safe for concurrent use; the registry changes one registration at a
// time.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	http     *http.Client // for checks that verify certificates
	insecure *http.Client // for TLSSkipVerify checks

	// regMu serialises changes of the registry (and their catalog
	// writes), so that the catalog sees them in the order they were made.
	regMu sync.Mutex

	mu       sync.Mutex // guards the fields below, never held while writing
	checks   map[string]*runner
	services map[string]*state.Service
	closed   bool
	pending  *savedState // read from StateFile, not restored yet

	saveMu    sync.Mutex  // one write of StateFile at a time
	restoring atomic.Bool // Restore runs: it saves once at the end
}

// New returns an agent with no checks and no services running; those kept
// in Config.StateFile are registered again by Restore. Close stops it.
func New(cfg Config) *Agent {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{}
	}
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = DefaultMinInterval
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = DefaultTimeout
	}
	if cfg.OutputUpdateInterval == 0 {
		cfg.OutputUpdateInterval = DefaultOutputUpdateInterval
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, checks: map[string]*runner{}, services: map[string]*state.Service{}}
	if cfg.StateFile != "" {
		if err := a.load(); err != nil {
			a.log.Error(err.Error())
		}
	}
	if cfg.HTTPClient != nil {
		a.http, a.insecure = cfg.HTTPClient, cfg.HTTPClient
	} else {
		a.http = newHTTPClient(cfg.Dialer, false)
		a.insecure = newHTTPClient(cfg.Dialer, true)
	}
	return a
}

func newHTTPClient(d Dialer, skipVerify bool) *http.Client {
	tr := &http.Transport{
		DialContext:       d.DialContext,
		DisableKeepAlives: true,
		Proxy:             nil,
	}
	if skipVerify {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
	}
	return &http.Client{Transport: tr}
}

// Node is the agent's node.
func (a *Agent) Node() string { return a.cfg.Node }

// Close stops every check. It does not touch the catalog: what the agent
// registered stays there with its last status. Calls after the first do
// nothing; registrations after Close fail with ErrClosed.
func (a *Agent) Close() error {
	a.regMu.Lock() // let a registration under way finish first
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		a.regMu.Unlock()
		return nil
	}
	a.closed = true
	runners := make([]*runner, 0, len(a.checks))
	for _, r := range a.checks {
		runners = append(runners, r)
	}
	a.mu.Unlock()
	a.regMu.Unlock()
	for _, r := range runners {
		r.shutdown()
	}
	return nil
}

// ---- checks ----

// checkKind says how a check is run.
type checkKind string

const (
	kindTTL  checkKind = "ttl"
	kindHTTP checkKind = "http"
	kindTCP  checkKind = "tcp"
)

// validate fills a check definition's defaults and refuses what cannot be
// run, with a sentence that says why. def is modified.
func (a *Agent) validate(def *state.CheckDefinition) (checkKind, error) {
	if def.ID == "" {
		def.ID = def.Name
	}
	if def.ID == "" {
		return "", invalidf("Missing check name: give the check a Name (its ID defaults to it)")
	}
	if def.Name == "" {
		def.Name = def.ID
	}
	name := def.ID
	switch def.Status {
	case "":
		def.Status = state.HealthCritical
	case state.HealthPassing, state.HealthWarning, state.HealthCritical:
	default:
		return "", invalidf("Invalid initial status %q of check %q: use passing, warning or critical", def.Status, name)
	}
	var kinds []checkKind
	if def.TTL != 0 {
		kinds = append(kinds, kindTTL)
	}
	if def.HTTP != "" {
		kinds = append(kinds, kindHTTP)
	}
	if def.TCP != "" {
		kinds = append(kinds, kindTCP)
	}
	switch len(kinds) {
	case 0:
		return "", invalidf("Check %q has no type: give one of TTL, HTTP (with Interval) or TCP (with Interval); holdfast runs no script, Docker, gRPC, UDP, H2PING, OS-service or alias checks", name)
	case 1:
	default:
		return "", invalidf("Check %q has more than one type (%s): give only one of TTL, HTTP and TCP", name, joinKinds(kinds))
	}
	kind := kinds[0]
	floor := a.cfg.MinInterval
	if def.Timeout < 0 {
		return "", invalidf("Timeout %v of check %q is negative", def.Timeout, name)
	}
	switch kind {
	case kindTTL:
		if def.TTL < floor {
			return "", invalidf("TTL %v of check %q is below the minimum of %v", def.TTL, name, floor)
		}
		return kind, nil
	case kindHTTP:
		u, err := url.Parse(def.HTTP)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", invalidf("HTTP %q of check %q is not an http:// or https:// URL", def.HTTP, name)
		}
		if def.Method == "" {
			def.Method = http.MethodGet
		}
		def.Method = strings.ToUpper(def.Method)
		// Refused here rather than failing every probe: such a check
		// could never pass.
		if def.Method == "" || strings.IndexFunc(def.Method, func(r rune) bool { return !httpguts.IsTokenRune(r) }) >= 0 {
			return "", invalidf("Method %q of check %q is not an HTTP method", def.Method, name)
		}
		for k, vs := range def.Header {
			if !httpguts.ValidHeaderFieldName(k) {
				return "", invalidf("Header %q of check %q is not a valid header name", k, name)
			}
			for _, v := range vs {
				if strings.ContainsAny(v, "\r\n\x00") {
					return "", invalidf("Header %q of check %q has a value with a line break or NUL in it", k, name)
				}
			}
		}
	case kindTCP:
		if _, _, err := net.SplitHostPort(def.TCP); err != nil {
			return "", invalidf("TCP %q of check %q is not host:port: %v", def.TCP, name, err)
		}
	}
	if def.Interval == 0 {
		return "", invalidf("Check %q needs an Interval: how often to probe %s", name, strings.ToUpper(string(kind)))
	}
	if def.Interval < floor {
		return "", invalidf("Interval %v of check %q is below the minimum of %v", def.Interval, name, floor)
	}
	if def.Timeout == 0 {
		def.Timeout = a.cfg.DefaultTimeout
	}
	return kind, nil
}

func joinKinds(ks []checkKind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = strings.ToUpper(string(k))
	}
	return strings.Join(s, ", ")
}

// catalogCheck is the catalog's view of a check defined by def.
func (a *Agent) catalogCheck(def *state.CheckDefinition, kind checkKind, status, output string) *state.HealthCheck {
	hc := &state.HealthCheck{
		Node: a.cfg.Node, CheckID: def.ID, Name: def.Name, Status: status, Notes: def.Notes,
		Output: output, ServiceID: def.ServiceID, Type: string(kind),
	}
	d := &hc.Definition
	switch kind {
	case kindTTL:
		d.TTL = def.TTL.String()
	case kindHTTP:
		d.HTTP, d.Method = def.HTTP, def.Method
	case kindTCP:
		d.TCP = def.TCP
	}
	if kind != kindTTL {
		d.Interval, d.Timeout = def.Interval.String(), def.Timeout.String()
	}
	return hc
}

// RegisterCheck registers a check on the agent's node and starts running
// it, replacing a check with the same ID. The check is written to the
// catalog with its initial status (critical unless def.Status says
// otherwise) before this returns; if that write fails nothing changes and
// the error comes back. A check with a ServiceID must belong to a service
// registered on this agent. def is not retained.
func (a *Agent) RegisterCheck(ctx context.Context, def *state.CheckDefinition) error {
	return a.registerCheck(ctx, def, restoredCheck{})
}

// registerCheck is RegisterCheck for a TTL that started at start (a
// restored check's), or at registration if start is zero.
func (a *Agent) registerCheck(ctx context.Context, def *state.CheckDefinition, rs restoredCheck) error {
	d := *def
	keep := d.Status == ""
	kind, err := a.validate(&d)
	if err != nil {
		return err
	}
	a.regMu.Lock()
	defer a.regMu.Unlock()
	a.mu.Lock()
	closed := a.closed
	_, svcOK := a.services[d.ServiceID]
	a.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if d.ServiceID != "" && !svcOK {
		return invalidf("ServiceID %q of check %q is not a service registered on this agent", d.ServiceID, d.ID)
	}
	if d.ID == state.SerfCheckID {
		return invalidf("Check ID %q is reserved for the agent's gossip health", d.ID)
	}
	p := a.prepare(&d, kind, rs, keep)
	holds, err := a.holdRunners(ctx, []string{d.ID})
	if err != nil {
		return err
	}
	err = a.cfg.Catalog.Register(ctx, &state.RegisterRequest{Node: a.cfg.Node, SkipNodeUpdate: true, Check: p.hc})
	a.finish(holds, []*prepared{p}, err == nil)
	if err == nil {
		err = a.persist()
	}
	return err
}

// DeregisterCheck stops a check and removes it from the catalog, which
// invalidates every session bound to it. Deregistering a check this agent
// does not run still removes it from the agent's node in the catalog (and
// is not an error), so a check left behind by an earlier run can be
// cleaned up. If the catalog write fails the check keeps running.
func (a *Agent) DeregisterCheck(ctx context.Context, id string) error {
	if id == "" {
		return invalidf("Missing check ID")
	}
	if id == state.SerfCheckID {
		return invalidf("Check %q is the agent's gossip health; it cannot be deregistered", id)
	}
	a.regMu.Lock()
	defer a.regMu.Unlock()
	if a.isClosed() {
		return ErrClosed
	}
	holds, err := a.holdRunners(ctx, []string{id})
	if err != nil {
		return err
	}
	err = a.cfg.Catalog.Deregister(ctx, &state.DeregisterRequest{Node: a.cfg.Node, CheckID: id})
	a.finish(holds, nil, err == nil)
	if err == nil {
		a.forgetPending(id)
		err = a.persist()
	}
	return err
}

// UpdateCheck sets the status and output of a TTL check and restarts its
// TTL, as /v1/agent/check/pass|warn|fail|update do. A status change is
// written to the catalog before this returns; if that write fails the
// agent retries it and UpdateCheck still succeeds (the agent's own view is
// updated). ErrNotFound (with NotFound()) for an unknown check; a check
// that is not a TTL check, or a bad status, is invalid input.
func (a *Agent) UpdateCheck(ctx context.Context, id, status, output string) error {
	switch status {
	case state.HealthPassing, state.HealthWarning, state.HealthCritical:
	default:
		return invalidf("Invalid check status %q: use passing, warning or critical", status)
	}
	// The runner looked up may be replaced (the check re-registered) before
	// it takes the update: then the update goes to its successor.
	for {
		a.mu.Lock()
		r := a.checks[id]
		a.mu.Unlock()
		if r == nil {
			return notFoundf("Unknown check ID %q: no such check is registered on this agent", id)
		}
		if r.kind != kindTTL {
			article := "a"
			if r.kind == kindHTTP {
				article = "an"
			}
			return invalidf("Check %q is %s %s check, not a TTL check: only TTL checks can be updated", id, article, strings.ToUpper(string(r.kind)))
		}
		err := r.update(ctx, status, truncate(output))
		if err == nil {
			a.save() // the TTL's new deadline
		}
		if errors.Is(err, ErrNotFound) {
			a.mu.Lock()
			next := a.checks[id]
			a.mu.Unlock()
			if next != nil && next != r {
				continue
			}
		}
		return err
	}
}

// Checks returns the agent's view of its checks, ordered by ID: their
// current status and output, which the catalog has too unless a write is
// pending. The caller owns the result.
func (a *Agent) Checks() []*state.HealthCheck {
	a.mu.Lock()
	runners := make([]*runner, 0, len(a.checks))
	for _, r := range a.checks {
		runners = append(runners, r)
	}
	svcs := make(map[string]*state.Service, len(a.services))
	for id, s := range a.services {
		svcs[id] = s
	}
	a.mu.Unlock()
	out := make([]*state.HealthCheck, 0, len(runners))
	for _, r := range runners {
		st := r.status()
		hc := a.catalogCheck(&r.def, r.kind, st.Status, st.Output)
		if s := svcs[hc.ServiceID]; s != nil {
			hc.ServiceName, hc.ServiceTags = s.Service, append([]string(nil), s.Tags...)
		}
		out = append(out, hc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CheckID < out[j].CheckID })
	return out
}

// ---- services ----

// RegisterService registers a service on the agent's node with its checks
// (Consul's Check and Checks), replacing a service with the same ID.
// Service and checks are written to the catalog in one step; if that write
// fails nothing changes. The checks the service had before and does not
// list keep running, unless replaceChecks (Consul's
// ?replace-existing-checks): then they are deregistered afterwards, one
// write each, and the first failure is returned. A check without an ID is
// named "service:<id>" (with ":<n>" when there are several), one without a
// Name "Service '<name>' check". svc and checks are not retained.
func (a *Agent) RegisterService(ctx context.Context, svc *state.Service, checks []*state.CheckDefinition, replaceChecks bool) error {
	return a.registerService(ctx, svc, checks, replaceChecks, nil)
}

// registerService is RegisterService with, for each check, when its TTL
// started (restored[i].start, if there and not zero) rather than at
// registration, and starts with restored[i].output.
func (a *Agent) registerService(ctx context.Context, svc *state.Service, checks []*state.CheckDefinition, replaceChecks bool, restored []restoredCheck) (err error) {
	s := *svc
	s.Node = a.cfg.Node
	s.CreateIndex, s.ModifyIndex = 0, 0
	if s.Service == "" {
		return invalidf("Missing service name")
	}
	if s.ID == "" {
		s.ID = s.Service
	}
	s.Tags = append([]string(nil), s.Tags...)
	defs := make([]*state.CheckDefinition, 0, len(checks))
	kinds := make([]checkKind, 0, len(checks))
	keeps := make([]bool, 0, len(checks))
	seen := map[string]bool{}
	for i, c := range checks {
		d := *c
		keeps = append(keeps, d.Status == "")
		d.ServiceID = s.ID
		if d.ID == "" {
			d.ID = "service:" + s.ID
			if len(checks) > 1 {
				d.ID += fmt.Sprintf(":%d", i+1)
			}
		}
		if d.Name == "" {
			d.Name = fmt.Sprintf("Service '%s' check", s.Service)
		}
		kind, err := a.validate(&d)
		if err != nil {
			return fmt.Errorf("%w (in the definition of service %q)", err, s.ID)
		}
		if d.ID == state.SerfCheckID {
			return invalidf("Check ID %q is reserved for the agent's gossip health", d.ID)
		}
		if seen[d.ID] {
			return invalidf("Service %q lists check %q twice", s.ID, d.ID)
		}
		seen[d.ID] = true
		defs, kinds = append(defs, &d), append(kinds, kind)
	}
	a.regMu.Lock()
	defer a.regMu.Unlock()
	if a.isClosed() {
		return ErrClosed
	}
	ps := make([]*prepared, len(defs))
	ids := make([]string, len(defs))
	req := &state.RegisterRequest{Node: a.cfg.Node, SkipNodeUpdate: true, Service: &s}
	for i, d := range defs {
		var rs restoredCheck
		if i < len(restored) {
			rs = restored[i]
		}
		ps[i] = a.prepare(d, kinds[i], rs, keeps[i])
		ids[i] = d.ID
		req.Checks = append(req.Checks, ps[i].hc)
	}
	holds, err := a.holdRunners(ctx, ids)
	if err != nil {
		return err
	}
	err = a.cfg.Catalog.Register(ctx, req)
	if err == nil {
		a.mu.Lock()
		a.services[s.ID] = &s
		a.mu.Unlock()
	}
	a.finish(holds, ps, err == nil)
	if err != nil {
		return err
	}
	if !replaceChecks {
		return a.persist()
	}
	defer func() {
		if saveErr := a.persist(); err == nil {
			err = saveErr
		}
	}()
	var stale []string
	a.mu.Lock()
	for id, r := range a.checks {
		if r.def.ServiceID == s.ID && !seen[id] {
			stale = append(stale, id)
		}
	}
	a.mu.Unlock()
	sort.Strings(stale)
	for _, id := range stale {
		holds, err := a.holdRunners(ctx, []string{id})
		if err != nil {
			return err
		}
		err = a.cfg.Catalog.Deregister(ctx, &state.DeregisterRequest{Node: a.cfg.Node, CheckID: id})
		a.finish(holds, nil, err == nil)
		if err != nil {
			return err
		}
	}
	return nil
}

// DeregisterService stops a service's checks and removes the service and
// its checks from the catalog in one step (invalidating the sessions bound
// to them). A service kept in the state file that Restore has not brought
// back yet is removed too, and forgotten. ErrNotFound for a service this
// agent does not have. If the catalog write fails nothing changes.
func (a *Agent) DeregisterService(ctx context.Context, id string) error {
	if id == "" {
		return invalidf("Missing service ID")
	}
	a.regMu.Lock()
	defer a.regMu.Unlock()
	a.mu.Lock()
	closed := a.closed
	_, ok := a.services[id]
	pending := a.pendingServiceLocked(id)
	var ids []string
	for cid, r := range a.checks {
		if r.def.ServiceID == id {
			ids = append(ids, cid)
		}
	}
	a.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if !ok && !pending {
		return notFoundf("Unknown service ID %q: no such service is registered on this agent", id)
	}
	holds, err := a.holdRunners(ctx, ids)
	if err != nil {
		return err
	}
	err = a.cfg.Catalog.Deregister(ctx, &state.DeregisterRequest{Node: a.cfg.Node, ServiceID: id})
	if err == nil {
		a.mu.Lock()
		delete(a.services, id)
		// A saved copy not restored yet must not bring it back.
		a.forgetPendingServiceLocked(id)
		a.mu.Unlock()
	}
	a.finish(holds, nil, err == nil)
	if err == nil {
		err = a.persist()
	}
	return err
}

// Services returns the agent's services ordered by ID. The caller owns the
// result.
func (a *Agent) Services() []*state.Service {
	a.mu.Lock()
	out := make([]*state.Service, 0, len(a.services))
	for _, s := range a.services {
		c := *s
		c.Tags = append([]string(nil), s.Tags...)
		out = append(out, &c)
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// ---- registry changes ----

// prepared is a check about to be started: its definition and the catalog
// entry that registers it.
// restoredCheck is what a check restored from the state file brings
// besides its definition: when its TTL started (zero: at registration) and
// its last output. The zero value is a new registration's.
type restoredCheck struct {
	start  time.Time
	output string
}

type prepared struct {
	def  state.CheckDefinition
	kind checkKind
	hc   *state.HealthCheck
	at   time.Time // when it was registered: the start of its TTL
}

// prepare makes the catalog entry of a check about to start. A TTL check
// restored from the state file passes when its TTL started (it gets only
// the rest of it); a zero start means now.
//
// With keep (the definition gave no Status), a check that replaces a
// running one of its ID starts with that one's status and output rather
// than the default critical, as in Consul: re-registering a service at
// every start of the application must not flap its checks, nor invalidate
// the sessions bound to them.
func (a *Agent) prepare(def *state.CheckDefinition, kind checkKind, rs restoredCheck, keep bool) *prepared {
	at := rs.start
	if at.IsZero() {
		at = a.cfg.Clock.Now()
	}
	status, output := def.Status, rs.output
	if keep {
		a.mu.Lock()
		r := a.checks[def.ID]
		a.mu.Unlock()
		if r != nil {
			st := r.status()
			status, output = st.Status, st.Output
		}
	}
	return &prepared{def: *def, kind: kind, hc: a.catalogCheck(def, kind, status, output), at: at}
}

// holdRunners holds still the runners of the given check IDs that exist,
// so that none of them writes while the caller does. The caller holds
// regMu and must pass the result to finish. A runner in the middle of a
// catalog write answers when the write ends (writeTimeout at most); if ctx
// ends first, the runners held so far are let go and ctx's error returned.
func (a *Agent) holdRunners(ctx context.Context, ids []string) (map[string]*runner, error) {
	held := map[string]*runner{}
	for _, id := range ids {
		a.mu.Lock()
		r := a.checks[id]
		a.mu.Unlock()
		if r == nil {
			continue
		}
		ok, err := r.hold(ctx)
		if err != nil {
			for _, h := range held {
				h.release(false)
			}
			return nil, err
		}
		if ok {
			held[id] = r
		}
	}
	return held, nil
}

// finish ends a registry change after its catalog write. If the write
// succeeded, the held runners stop and are removed, and the prepared checks
// start (each replacing the runner of its ID); if it failed, the held
// runners carry on and nothing starts.
func (a *Agent) finish(held map[string]*runner, ps []*prepared, ok bool) {
	if !ok {
		for _, r := range held {
			r.release(false)
		}
		return
	}
	// The successors go into the registry before the held runners stop
	// (held, these write nothing), so that an update that finds its runner
	// gone finds the successor already there.
	for _, p := range ps {
		r := a.start(p)
		a.mu.Lock()
		a.checks[p.def.ID] = r
		a.mu.Unlock()
	}
	for id, r := range held {
		a.mu.Lock()
		if a.checks[id] == r {
			delete(a.checks, id)
		}
		a.mu.Unlock()
		r.release(true)
	}
}

func (a *Agent) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

// truncate bounds a check's output to MaxOutput bytes, saying so.
func truncate(s string) string {
	if len(s) <= MaxOutput {
		return s
	}
	return fmt.Sprintf("Captured %d of %d bytes\n...\n%s", MaxOutput, len(s), s[len(s)-MaxOutput:])
}

// ForgetStale deregisters from the catalog the checks of this agent's node
// that an earlier run of the agent registered (their Type is ttl, http or
// tcp) and this run does not know. Nothing runs them any more: a TTL check
// left passing would otherwise keep the sessions bound to it alive forever.
// Deregistering invalidates those sessions, as losing the check should.
// Such a check of a service this run does not know either tells that the
// earlier run registered the service: the service is deregistered with its
// checks, rather than left in the catalog with none (and so healthy).
// inCatalog is the node's checks as the catalog has them; checks registered
// through the catalog API (no agent type) are left alone. Registrations
// wait while it runs, so that none made meanwhile is taken for stale.
func (a *Agent) ForgetStale(ctx context.Context, inCatalog []*state.HealthCheck) error {
	a.regMu.Lock()
	defer a.regMu.Unlock()
	known := make(map[string]bool)
	knownSvc := make(map[string]bool)
	a.mu.Lock()
	for id := range a.checks {
		known[id] = true
	}
	for id := range a.services {
		knownSvc[id] = true
	}
	if p := a.pending; p != nil { // kept for a Restore to come
		for _, s := range p.Services {
			knownSvc[savedServiceID(s)] = true
		}
	}
	a.mu.Unlock()
	for _, id := range a.pendingChecks() {
		known[id] = true
	}
	gone := make(map[string]bool) // services deregistered here
	for _, c := range inCatalog {
		if c.Node != a.cfg.Node || known[c.CheckID] || gone[c.ServiceID] {
			continue
		}
		switch checkKind(c.Type) {
		case kindTTL, kindHTTP, kindTCP:
		default:
			continue
		}
		if sid := c.ServiceID; sid != "" && !knownSvc[sid] {
			if err := a.cfg.Catalog.Deregister(ctx, &state.DeregisterRequest{Node: a.cfg.Node, ServiceID: sid}); err != nil {
				return fmt.Errorf("agent: forgetting stale service %q: %w", sid, err)
			}
			gone[sid] = true
			continue
		}
		if err := a.cfg.Catalog.Deregister(ctx, &state.DeregisterRequest{Node: a.cfg.Node, CheckID: c.CheckID}); err != nil {
			return fmt.Errorf("agent: forgetting stale check %q: %w", c.CheckID, err)
		}
	}
	return nil
}

// Resync writes every service and check this agent runs to the catalog
// again, with the checks' current status and output: after the node was
// deregistered (through the catalog API) and registered again, they are
// missing there although they run here. Consul's agent mends that by
// anti-entropy; the server calls this when it puts its node back. The
// runners are held while it writes, so that none of them writes an older
// status over a newer one.
func (a *Agent) Resync(ctx context.Context) error {
	a.regMu.Lock()
	defer a.regMu.Unlock()
	if a.isClosed() {
		return ErrClosed
	}
	a.mu.Lock()
	ids := make([]string, 0, len(a.checks))
	for id := range a.checks {
		ids = append(ids, id)
	}
	svcs := make([]*state.Service, 0, len(a.services))
	for _, s := range a.services {
		svcs = append(svcs, s)
	}
	a.mu.Unlock()
	sort.Strings(ids)
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].ID < svcs[j].ID })
	holds, err := a.holdRunners(ctx, ids)
	if err != nil {
		return err
	}
	defer a.finish(holds, nil, false) // let them carry on
	byService := map[string][]*state.HealthCheck{}
	for _, id := range ids {
		r := holds[id]
		if r == nil {
			continue
		}
		st := r.status()
		byService[r.def.ServiceID] = append(byService[r.def.ServiceID], a.catalogCheck(&r.def, r.kind, st.Status, st.Output))
	}
	for _, s := range svcs {
		svc := *s
		req := &state.RegisterRequest{Node: a.cfg.Node, SkipNodeUpdate: true, Service: &svc, Checks: byService[s.ID]}
		if err := a.cfg.Catalog.Register(ctx, req); err != nil {
			return fmt.Errorf("agent: writing service %q again: %w", s.ID, err)
		}
	}
	if cs := byService[""]; len(cs) > 0 {
		if err := a.cfg.Catalog.Register(ctx, &state.RegisterRequest{Node: a.cfg.Node, SkipNodeUpdate: true, Checks: cs}); err != nil {
			return fmt.Errorf("agent: writing checks again: %w", err)
		}
	}
	return nil
}
