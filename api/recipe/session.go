package recipe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/clock"
)

// State is the connection state of a Session, as its keeper sees it.
type State int

const (
	// Connected: the session was created and its renews succeed.
	Connected State = iota + 1
	// Suspended: a renew failed or went unanswered. The session may still
	// be alive on the server; the keeper keeps trying until its deadline.
	Suspended
	// Reconnected: a renew succeeded again after Suspended. Listeners may
	// treat it as Connected.
	Reconnected
	// Lost: the server said the session is gone, or the local deadline
	// passed. Final: the keeper stops, and every lock of the session must
	// be taken as lost.
	Lost
)

func (s State) String() string {
	switch s {
	case Connected:
		return "Connected"
	case Suspended:
		return "Suspended"
	case Reconnected:
		return "Reconnected"
	case Lost:
		return "Lost"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Event is one change of a Session's state.
type Event struct {
	State State
	// At is the keeper's clock when the change happened.
	At time.Time
	// Err says why, for Suspended (the failed renew) and Lost
	// (ErrSessionExpired or ErrDeadlinePassed). A session ended by Close
	// keeps its last State, with Err ErrSessionClosed: that is the first
	// and only Event of a Listen after Close.
	Err error
}

// Errors that end a session.
var (
	// ErrSessionExpired: the server no longer knows the session (renew
	// answered 404): it was destroyed, its TTL ran out, or a check it was
	// bound to failed.
	ErrSessionExpired = errors.New("recipe: the server no longer knows the session")
	// ErrDeadlinePassed: no renew succeeded in time, and the keeper's
	// deadline rule declared the session lost.
	ErrDeadlinePassed = errors.New("recipe: session deadline passed without a successful renew")
	// ErrSessionClosed: Close was called.
	ErrSessionClosed = errors.New("recipe: session closed")
)

// Policy says when the holds of a session (locks, permits, leadership)
// count as lost.
type Policy int

const (
	// LoseOnSuspended, the default, gives up every hold at the first
	// Suspended, as Curator's standard connection-handling policy does:
	// while the server cannot be reached nobody can tell whether the
	// session still lives, so the safe reading is that it does not. Holds
	// taken after Reconnected are new holds.
	LoseOnSuspended Policy = iota
	// LoseOnLost keeps holds through Suspended and gives them up at Lost,
	// that is when the deadline rule says the server may have freed
	// them. With the safe deadline this rides out a renew that fails
	// during a leader election without ever trusting a hold the server
	// could already have handed to someone else.
	LoseOnLost
)

func (p Policy) String() string {
	switch p {
	case LoseOnSuspended:
		return "LoseOnSuspended"
	case LoseOnLost:
		return "LoseOnLost"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// Deadline is the rule that decides when a keeper that cannot renew
// declares its session Lost. The zero Deadline is the safe rule with the
// default margin. Make others with SafeDeadline and CuratorDeadline.
type Deadline struct {
	curator bool
	percent int
	margin  time.Duration
	set     bool // margin given explicitly
}

// SafeDeadline is the default rule: the session is Lost at the send time
// of the last renew that succeeded, plus the TTL, minus margin.
//
// The server restarts a session's TTL when it receives a renew, which is
// no earlier than the client sent it, and invalidates the session no
// earlier than a TTL after that (holdfast exactly at the TTL, Consul at
// twice the TTL, and a new leader grants a fresh TTL). So as long as the
// client's clock does not run slow against the server's by more than
// margin over one TTL, this deadline passes before the server can free
// the session's locks, whatever happened on the network: lost requests,
// lost answers, a paused server. margin must also cover what the
// application needs to act on Lost (stop writing, kill a child).
func SafeDeadline(margin time.Duration) Deadline {
	return Deadline{margin: margin, set: true}
}

// CuratorDeadline is Apache Curator's rule: a timer of percent% of the TTL
// started at Suspended; if no renew succeeds before it fires, the session
// is Lost. Curator offers 100 (its default) and 33.
//
// Neither is safe in general. The timer starts only when a failure is
// noticed, up to half a TTL (the renew interval) plus the renew timeout
// after the last renew the server saw, so with 100 the keeper may report
// Lost well after the server freed the locks; 33 assumes the failure was
// noticed within two thirds of a TTL, which a server that goes silent
// defeats with the default renew timing (noticed at 0.7 of a TTL; see
// docs/sessions.md). It is here for programs that want Curator's
// behaviour.
func CuratorDeadline(percent int) Deadline {
	return Deadline{curator: true, percent: percent}
}

func (d Deadline) String() string {
	if d.curator {
		return fmt.Sprintf("Curator(%d%%)", d.percent)
	}
	if !d.set {
		return "Safe(default margin)"
	}
	return fmt.Sprintf("Safe(margin %v)", d.margin)
}

// DefaultDriftMargin is the margin of the zero Deadline: 1% of the TTL
// plus 50ms (200ms for the default TTL of 15s).
//
// The 1% bounds how much slower the client's clock may run than the
// server's over one TTL: crystal oscillators are specified to ±100 ppm and
// NTP keeps rates far closer, so 1% (10,000 ppm) leaves two orders of
// magnitude for ill-kept virtual machines. The 50ms is for delivering Lost:
// the keeper's goroutine waking from its timer and the listeners' goroutines
// being scheduled under load. Pauses longer than that (a stop-the-world
// stall of the whole process) cannot be bounded by any margin; fence the
// resource with the hold's sequencer for those.
func DefaultDriftMargin(ttl time.Duration) time.Duration {
	return ttl/100 + 50*time.Millisecond
}

// Defaults of SessionOptions.
const (
	DefaultSessionTTL = 15 * time.Second
)

// SessionOptions configure a Session. The zero value (or nil) gives a
// session of TTL 15s bound to the agent node's serfHealth check, with the
// server's default lock-delay (15s) and behaviour (release), the safe
// deadline and the LoseOnSuspended policy, on the real clock.
type SessionOptions struct {
	// Name, Node, Behavior, LockDelay, NodeChecks and ServiceChecks are
	// sent to the server as api.Session.Create sends them: empty means the
	// server's default, a negative LockDelay means none, a non-nil empty
	// NodeChecks binds to no check.
	Name          string
	Node          string
	Behavior      string
	LockDelay     time.Duration
	NodeChecks    []string
	ServiceChecks []api.ServiceCheck

	// TTL of the session; 0 means DefaultSessionTTL. The server enforces
	// its own bounds (10s to 24h by default).
	TTL time.Duration

	// Deadline is the rule for Lost; the zero value is the safe rule with
	// DefaultDriftMargin.
	Deadline Deadline

	// Policy decides when holds count as lost; the zero value is
	// LoseOnSuspended.
	Policy Policy

	// RenewTimeout bounds one renew request; an unanswered renew counts
	// as failed when it passes. 0 means TTL/5.
	RenewTimeout time.Duration

	// RetryInterval is the wait before retrying after a failed renew.
	// 0 means the lesser of 1s and TTL/10.
	RetryInterval time.Duration

	// Clock drives renews, timeouts and deadlines; nil means clock.Real().
	Clock clock.Clock
}

// Session is a session on the server and the keeper that renews it: one
// goroutine that owns the renew loop and the connection state. It renews at
// half the TTL, reports state changes to listeners, and decides, by its
// Deadline rule, when the session must be taken as lost.
//
// The methods of a Session are safe for concurrent use.
type Session struct {
	c        *api.Client
	clk      clock.Clock
	id       string
	policy   Policy
	deadline Deadline
	renewTO  time.Duration
	retry    time.Duration

	closeReq chan struct{} // closed by Close
	exited   chan struct{} // closed when the keeper goroutine returns
	results  chan renewResult
	probe    chan chan struct{} // tests: wait until the keeper is idle
	trace    func(string)       // tests: a line per step of the keeper
	start    time.Time          // creation's send time, the origin of trace times
	loop     *keeperLoop        // the keeper goroutine's own state

	mu        sync.Mutex
	state     State
	ttl       time.Duration
	lastOK    time.Time // send time of the last successful renew (or create)
	localDL   time.Time // when the keeper will declare Lost, zero if none armed
	err       error     // why Lost
	done      chan struct{}
	untrusted chan struct{}
	listeners []*listener
	closeErr  error
	closeOnce sync.Once
}

// NewSession creates a session on the server and starts its keeper. The
// session is Connected when NewSession returns. ctx bounds the creation
// only; the keeper runs until the session is Lost or closed.
func NewSession(ctx context.Context, c *api.Client, opts *SessionOptions) (*Session, error) {
	return newSession(ctx, c, opts, nil)
}

// newSession is NewSession with a trace hook for tests.
func newSession(ctx context.Context, c *api.Client, opts *SessionOptions, trace func(string)) (*Session, error) {
	if c == nil {
		return nil, errors.New("recipe: nil api.Client")
	}
	var o SessionOptions
	if opts != nil {
		o = *opts
	}
	if o.TTL == 0 {
		o.TTL = DefaultSessionTTL
	}
	if o.TTL < 0 {
		return nil, fmt.Errorf("recipe: negative session TTL %v", o.TTL)
	}
	if o.Clock == nil {
		o.Clock = clock.Real()
	}
	if o.RenewTimeout <= 0 {
		o.RenewTimeout = o.TTL / 5
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = min(time.Second, o.TTL/10)
	}
	if !o.Deadline.curator && !o.Deadline.set {
		o.Deadline = SafeDeadline(DefaultDriftMargin(o.TTL))
	}
	if o.Deadline.curator && o.Deadline.percent <= 0 {
		return nil, fmt.Errorf("recipe: Curator deadline of %d%% of the TTL", o.Deadline.percent)
	}
	if !o.Deadline.curator && (o.Deadline.margin < 0 || o.Deadline.margin >= o.TTL/2) {
		return nil, fmt.Errorf("recipe: safe-deadline margin %v must be at least 0 and less than half the TTL (%v)",
			o.Deadline.margin, o.TTL)
	}
	if o.Policy != LoseOnSuspended && o.Policy != LoseOnLost {
		return nil, fmt.Errorf("recipe: unknown %v", o.Policy)
	}
	se := &api.SessionEntry{
		Name: o.Name, Node: o.Node, Behavior: o.Behavior, LockDelay: o.LockDelay,
		TTL: o.TTL.String(), NodeChecks: o.NodeChecks, ServiceChecks: o.ServiceChecks,
	}
	sent := o.Clock.Now()
	id, _, err := c.Session().Create(ctx, se, nil)
	if err != nil {
		return nil, fmt.Errorf("failed to create session: %w", err)
	}
	s := newKeeper(c, id, sent, &o, trace)
	go s.run()
	return s, nil
}

// newKeeper builds the keeper of an existing session whose last renew (or
// creation) was sent at sent. trace, if set, is called for each step.
func newKeeper(c *api.Client, id string, sent time.Time, o *SessionOptions, trace func(string)) *Session {
	s := &Session{
		c: c, clk: o.Clock, id: id, policy: o.Policy, deadline: o.Deadline,
		renewTO: o.RenewTimeout, retry: o.RetryInterval,
		closeReq: make(chan struct{}), exited: make(chan struct{}),
		results: make(chan renewResult, 1), probe: make(chan chan struct{}),
		trace: trace, start: sent,
		state: Connected, ttl: o.TTL, lastOK: sent,
		done: make(chan struct{}), untrusted: make(chan struct{}),
	}
	// The timers are made here, before the keeper goroutine starts, so
	// that they count from the creation even if the goroutine is slow to
	// run.
	k := &keeperLoop{s: s, cancelReq: func() {}}
	k.renewT = s.clk.NewTimer(sent.Add(s.ttl / 2).Sub(s.clk.Now()))
	k.attemptT = s.clk.NewTimer(time.Hour)
	k.attemptT.Stop()
	k.deadlineT = s.clk.NewTimer(time.Hour)
	k.deadlineT.Stop()
	if !s.deadline.curator {
		s.localDL = sent.Add(s.ttl - s.deadline.margin)
		k.deadlineT.Reset(s.localDL.Sub(s.clk.Now()))
	}
	s.loop = k
	return s
}

// ID is the session's ID on the server.
func (s *Session) ID() string { return s.id }

// Client is the client the session was created with.
func (s *Session) Client() *api.Client { return s.c }

// Clock is the clock the keeper runs on.
func (s *Session) Clock() clock.Clock { return s.clk }

// Policy is the session's policy for holds.
func (s *Session) Policy() Policy { return s.policy }

// TTL is the session's TTL, as last confirmed by the server.
func (s *Session) TTL() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ttl
}

// State is the current state.
func (s *Session) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Deadline is when the keeper will declare the session Lost unless a renew
// succeeds first; the zero time when no deadline is armed (Curator's rule
// while not Suspended).
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.localDL
}

// Err is why the session ended (ErrSessionExpired, ErrDeadlinePassed or
// ErrSessionClosed), nil while it lives.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Done is closed when the session is Lost or closed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Untrusted returns a channel closed as soon as, under the session's
// Policy, whatever the session holds now must be taken as lost: at the
// next Suspended (LoseOnSuspended; a channel already closed if the session
// is Suspended now) or at Lost. A hold keeps the channel it got when it
// was acquired; after Reconnected, new calls return a fresh channel.
func (s *Session) Untrusted() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.untrusted
}

// Listen returns a channel of the session's state changes. The first
// Event is the state at the time of the call; after it come the changes,
// each exactly once and in the order they happened. The channel is closed
// after Lost has been delivered, when the session is closed, or when ctx
// is done.
//
// Listeners never block the keeper: each has its own goroutine and an
// unbounded queue, so a slow reader only delays its own events. A reader
// should still keep up; the events are few (a handful per outage).
func (s *Session) Listen(ctx context.Context) <-chan Event {
	l := &listener{ch: make(chan Event), wake: make(chan struct{}, 1)}
	s.mu.Lock()
	l.push(Event{State: s.state, At: s.clk.Now(), Err: s.err}, s.state == Lost || s.err != nil)
	if s.err == nil {
		s.listeners = append(s.listeners, l)
	}
	s.mu.Unlock()
	go func() {
		l.run(ctx)
		s.unlisten(l)
		close(l.ch)
	}()
	return l.ch
}

// unlisten forgets l, whose channel is closed: a listener whose ctx ended
// would otherwise stay in the list, and be pushed every later event, for
// as long as the session lives.
func (s *Session) unlisten(l *listener) {
	l.finish()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.listeners {
		if x == l {
			s.listeners = append(s.listeners[:i], s.listeners[i+1:]...)
			return
		}
	}
}

// Close stops the keeper and destroys the session on the server, which
// releases (or deletes) every key it holds. Close waits for the keeper to
// stop; ctx bounds the wait and the destroy. A session Lost to its local
// deadline is destroyed too, in case the server still has it; one the
// server said is gone is not. Close may be called more than once; later
// calls return the first result.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		close(s.closeReq)
		select {
		case <-s.exited:
		case <-ctx.Done():
			s.closeErr = ctx.Err()
			return
		}
		s.mu.Lock()
		expired := s.err == ErrSessionExpired
		s.mu.Unlock()
		if expired {
			return // nothing left to destroy
		}
		if _, err := s.c.Session().Destroy(ctx, s.id, nil); err != nil {
			s.closeErr = fmt.Errorf("recipe: destroying session %s: %w", s.id, err)
		}
	})
	return s.closeErr
}

// renewResult is the outcome of one renew attempt.
type renewResult struct {
	attempt uint64
	sent    time.Time
	ttl     time.Duration // the TTL the server answered with, 0 if unknown
	err     error
}

// errRenewTimeout is what an unanswered renew counts as.
var errRenewTimeout = errors.New("recipe: renew unanswered within the renew timeout")

// run is the keeper: the only goroutine that renews and changes state.
func (s *Session) run() {
	k := s.loop
	defer func() {
		k.renewT.Stop()
		k.attemptT.Stop()
		k.deadlineT.Stop()
		k.cancelReq()
		close(s.exited)
	}()
	for {
		var stop bool
		// A deadline that is due wins over anything else that is.
		select {
		case <-k.deadlineT.C():
			k.onDeadline()
			return
		default:
		}
		select {
		case <-k.renewT.C():
			stop = k.onRenewTimer()
		case <-k.attemptT.C():
			stop = k.onAttemptTimeout()
		case <-k.deadlineT.C():
			stop = k.onDeadline()
		case r := <-s.results:
			stop = k.onResult(r)
		case reply := <-s.probe:
			// Handle whatever is already due before answering, so that
			// a test that moved the clock sees its effect.
			stop = k.drainDue()
			close(reply)
		case <-s.closeReq:
			s.tracef("closed")
			s.setState(0, ErrSessionClosed)
			return
		}
		if stop {
			return
		}
	}
}

// keeperLoop is the keeper goroutine's own state. Every method that
// handles a wake-up returns true when the session has ended and the
// keeper must stop.
type keeperLoop struct {
	s                           *Session
	renewT, attemptT, deadlineT clock.Timer
	attempt                     uint64 // number of the latest renew attempt
	inflight                    bool   // that attempt is unanswered
	cancelReq                   context.CancelFunc
}

func (k *keeperLoop) drainDue() bool {
	for {
		select {
		case <-k.deadlineT.C():
			return k.onDeadline()
		default:
		}
		select {
		case <-k.renewT.C():
			if k.onRenewTimer() {
				return true
			}
		case <-k.attemptT.C():
			if k.onAttemptTimeout() {
				return true
			}
		case <-k.deadlineT.C():
			if k.onDeadline() {
				return true
			}
		default:
			return false
		}
	}
}

func (k *keeperLoop) onRenewTimer() bool {
	if !k.inflight {
		k.startRenew()
	}
	return false
}

func (k *keeperLoop) onAttemptTimeout() bool {
	if k.inflight {
		k.fail(errRenewTimeout)
	}
	return false
}

func (k *keeperLoop) onDeadline() bool {
	k.s.tracef("deadline")
	k.s.setState(Lost, ErrDeadlinePassed)
	return true
}

// startRenew sends a renew in a goroutine of its own; its result comes
// back on s.results, tagged with the attempt's number.
func (k *keeperLoop) startRenew() {
	s := k.s
	k.attempt++
	k.inflight = true
	n, sent := k.attempt, s.clk.Now()
	ctx, cancel := context.WithCancel(context.Background())
	k.cancelReq = cancel
	k.attemptT.Reset(s.renewTO)
	s.tracef("renew %d sent", n)
	go func() {
		se, _, err := s.c.Session().Renew(ctx, s.id, nil)
		r := renewResult{attempt: n, sent: sent, err: err}
		if err == nil && se != nil {
			if d, perr := time.ParseDuration(se.TTL); perr == nil && d > 0 {
				r.ttl = d
			}
		}
		select {
		case s.results <- r:
		case <-ctx.Done():
		}
	}()
}

// fail handles a failed or unanswered renew: Suspended (once), and a retry.
// Timers are armed before anything is reported, here and everywhere in the
// keeper, so that whoever reacts to a report finds the keeper's next steps
// already scheduled.
func (k *keeperLoop) fail(err error) {
	s := k.s
	k.inflight = false
	k.attemptT.Stop()
	k.cancelReq()
	suspend := s.currentState() != Suspended
	if suspend && s.deadline.curator {
		d := s.TTL() * time.Duration(s.deadline.percent) / 100
		k.deadlineT.Reset(d)
		s.setLocalDeadline(s.clk.Now().Add(d))
	}
	timedOut := err == errRenewTimeout
	if !timedOut {
		k.renewT.Reset(s.retry)
	}
	s.tracef("renew %d failed: %v", k.attempt, err)
	if suspend {
		s.setState(Suspended, err)
	}
	if timedOut {
		// The attempt already waited the renew timeout; go again now.
		k.startRenew()
	}
}

func (k *keeperLoop) onResult(r renewResult) bool {
	s := k.s
	if !k.inflight || r.attempt != k.attempt {
		return false // an abandoned attempt no longer counts
	}
	if errors.Is(r.err, api.ErrSessionNotFound) {
		k.inflight = false
		k.attemptT.Stop()
		s.tracef("renew %d: session not found", r.attempt)
		s.setState(Lost, ErrSessionExpired)
		return true
	}
	if r.err != nil {
		k.fail(r.err)
		return false
	}
	k.inflight = false
	k.attemptT.Stop()
	s.mu.Lock()
	if r.sent.After(s.lastOK) {
		s.lastOK = r.sent
	}
	if r.ttl > 0 {
		s.ttl = r.ttl
	}
	lastOK, ttl := s.lastOK, s.ttl
	s.mu.Unlock()
	if s.deadline.curator {
		k.deadlineT.Stop()
		s.setLocalDeadline(time.Time{})
	} else {
		dl := lastOK.Add(ttl - s.deadline.margin)
		s.setLocalDeadline(dl)
		k.deadlineT.Reset(dl.Sub(s.clk.Now()))
	}
	k.renewT.Reset(lastOK.Add(ttl / 2).Sub(s.clk.Now()))
	s.tracef("renew %d ok", r.attempt)
	if s.currentState() == Suspended {
		s.setState(Reconnected, nil)
	}
	return false
}

// sync waits until the keeper has handled every timer that is already due
// (tests).
func (s *Session) sync() {
	reply := make(chan struct{})
	select {
	case s.probe <- reply:
		<-reply
	case <-s.exited:
	}
}

func (s *Session) tracef(format string, args ...any) {
	if s.trace != nil {
		s.trace(fmt.Sprintf("+%v ", s.clk.Now().Sub(s.start)) + fmt.Sprintf(format, args...))
	}
}

func (s *Session) currentState() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

func (s *Session) setLocalDeadline(t time.Time) {
	s.mu.Lock()
	s.localDL = t
	s.mu.Unlock()
}

// setState moves to st (0 with ErrSessionClosed for Close) and tells the
// listeners. Only the keeper goroutine calls it.
func (s *Session) setState(st State, err error) {
	now := s.clk.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	final := st == Lost || st == 0
	if st != 0 {
		s.state = st
		s.tracef("state %v", st)
	}
	switch {
	case final:
		s.err = err
		s.localDL = time.Time{}
		close(s.done)
		select {
		case <-s.untrusted:
		default:
			close(s.untrusted)
		}
	case st == Suspended && s.policy == LoseOnSuspended:
		close(s.untrusted)
	case st == Reconnected && s.policy == LoseOnSuspended:
		s.untrusted = make(chan struct{})
	}
	for _, l := range s.listeners {
		if st != 0 {
			l.push(Event{State: st, At: now, Err: err}, final)
		} else {
			l.finish()
		}
	}
	if final {
		s.listeners = nil
	}
}

// listener is one Listen channel with its queue.
type listener struct {
	ch   chan Event
	wake chan struct{} // capacity 1: "the queue changed"

	mu    sync.Mutex
	q     []Event
	final bool // no events after those queued
}

func (l *listener) push(ev Event, final bool) {
	l.mu.Lock()
	if !l.final {
		l.q = append(l.q, ev)
		l.final = final
	}
	l.mu.Unlock()
	l.poke()
}

func (l *listener) finish() {
	l.mu.Lock()
	l.final = true
	l.mu.Unlock()
	l.poke()
}

func (l *listener) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run delivers l's queue until it is final and empty or ctx ends; its
// caller closes the channel.
func (l *listener) run(ctx context.Context) {
	for {
		l.mu.Lock()
		if len(l.q) == 0 {
			final := l.final
			l.mu.Unlock()
			if final {
				return
			}
			select {
			case <-l.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		ev := l.q[0]
		l.q = l.q[1:]
		l.mu.Unlock()
		select {
		case l.ch <- ev:
		case <-ctx.Done():
			return
		}
	}
}
