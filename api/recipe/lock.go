package recipe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/api"
)

// LockFlagValue marks a lock key in its Flags. It is the value Consul's Go
// client uses, so that its Lock and this one recognise each other's keys.
const LockFlagValue uint64 = 0x2ddccbc058a50c18

// QueueDir is the directory, under a lock's key, of its waiting queue.
const QueueDir = ".queue"

// Errors of Lock.
var (
	// ErrLockHeld: this Lock already holds its key (Unlock first).
	ErrLockHeld = errors.New("recipe: lock already held")
	// ErrLockNotHeld: Unlock of a hold already given up.
	ErrLockNotHeld = errors.New("recipe: lock not held")
	// ErrLocked: TryLock found the key held by another session.
	ErrLocked = errors.New("recipe: lock is held by another session")
	// ErrLockBusy: TryLock while a Lock call of the same Lock waits.
	ErrLockBusy = errors.New("recipe: a Lock call of this Lock is in progress")
	// ErrLockConflict: the key exists and is not a lock (its Flags are
	// not LockFlagValue), e.g. a semaphore's or a plain key.
	ErrLockConflict = errors.New("recipe: existing key does not match lock use")
)

// LockDelayError is returned by TryLock when the key is free but inside the
// lock-delay that followed its last holder's invalidation. errors.Is(err,
// ErrLocked) holds for it.
type LockDelayError struct {
	Key       string
	Remaining time.Duration
}

func (e *LockDelayError) Error() string {
	return fmt.Sprintf("recipe: %q is in its lock-delay for another %v", e.Key, e.Remaining)
}

// Unwrap makes a LockDelayError an ErrLocked.
func (e *LockDelayError) Unwrap() error { return ErrLocked }

// LockOptions tune a Lock.
type LockOptions struct {
	// Value is written to the key while it is held (and kept after
	// release, as Consul's Lock does). Election sets it to the leader's
	// value.
	Value []byte
}

// Lock is a mutual-exclusion lock on one key, held by a Session. It
// interoperates with Consul's api.Lock on the same key: the same Flags
// marker, the same Value semantics, and either side waits for the other
// and takes over when the other lets go.
//
// # Fair and quiet waiting
//
// Waiters queue in arrival order and only the next one is woken when the
// lock changes hands. To wait, Lock first joins the queue: it acquires the
// key <key>/.queue/<session> with its session (so the entry dies with the
// session: released or deleted with it). The queue's order is the entries'
// CreateIndex, the server's global index at creation, hence arrival order.
// A waiter with a live entry before its own (its predecessor) blocks on
// that one entry and nothing else, as etcd's mutex waits on the deletion of
// its predecessor's key; a holder keeps its entry until Unlock, so the next
// waiter wakes exactly when the holder lets go or dies. Only the head of
// the queue looks at the lock key itself: it acquires the key when free,
// and while the key is held (by a Consul client, a TryLock, or a holder
// that lost its place) it is the only holdfast waiter with a blocking read
// on it. A release thus wakes one holdfast waiter, not all of them.
//
// Consul's lockers look only at the lock key, so the queue is invisible to
// them: they neither wait in it nor are blocked by it. Between holdfast
// waiters the order is strict; a Consul waiter may still win the race for
// a released key against the head of the queue, exactly as it would
// against another Consul waiter. Entries whose session died (left with no
// session by Behavior "release") are skipped and deleted by the waiter
// that finds them.
//
// A refused acquire whose answer says the key is in its lock-delay (the
// X-Holdfast-Lock-Delay header) waits exactly the remaining delay on the
// session's clock, no blind 5 s. Against a server that does not say
// (Consul), a refusal on a free key is retried after 250ms, doubling up to
// 4s.
//
// A Lock holds at most one hold at a time. Use one Lock per key per
// session: two Locks of one session on one key would both succeed.
type Lock struct {
	s     *Session
	key   string
	value []byte
	kv    *api.KV

	acq  sync.Mutex // serialises Lock and TryLock
	mu   sync.Mutex // guards hold
	hold *Hold

	hook func(string) // tests: a line per waiting step
}

// NewLock returns a Lock on key for session s. key must not be empty or
// start with "/".
func NewLock(s *Session, key string, opts *LockOptions) (*Lock, error) {
	if s == nil {
		return nil, errors.New("recipe: nil Session")
	}
	if key == "" || strings.HasPrefix(key, "/") {
		return nil, fmt.Errorf("recipe: invalid lock key %q", key)
	}
	l := &Lock{s: s, key: key, kv: s.c.KV()}
	if opts != nil {
		l.value = opts.Value
	}
	return l, nil
}

// Key is the lock's key.
func (l *Lock) Key() string { return l.key }

// Session is the session the lock is held with.
func (l *Lock) Session() *Session { return l.s }

// Hold is one holding of a lock, from acquisition to Unlock.
type Hold struct {
	l     *Lock
	seq   Sequencer
	queue string // our queue entry, "" for TryLock
	lost  chan struct{}

	lostOnce sync.Once
	stop     context.CancelFunc
	monitor  chan struct{} // closed when the monitor has stopped

	mu       sync.Mutex
	released bool
	why      error
}

// Sequencer names this hold; hand it to the resources the lock guards.
func (h *Hold) Sequencer() Sequencer { return h.seq }

// Lost is closed the moment the hold is lost: the key was released,
// deleted or taken by another session, or the session's policy says its
// holds are gone (Suspended under LoseOnSuspended, Lost under either). It
// is also closed by Unlock.
func (h *Hold) Lost() <-chan struct{} { return h.lost }

// Err says why the hold was lost, nil while it is held.
func (h *Hold) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.why
}

// Errors a Hold's Err may return.
var (
	ErrKeyChanged = errors.New("recipe: the lock key changed hands")
	ErrUntrusted  = errors.New("recipe: the session can no longer be trusted")
	ErrReleased   = errors.New("recipe: released")
)

func (h *Hold) markLost(why error) {
	h.lostOnce.Do(func() {
		h.mu.Lock()
		h.why = why
		h.mu.Unlock()
		close(h.lost)
	})
}

// Lock blocks until it holds the lock, ctx is done, or the session ends
// (ErrSessionLost). See the type's comment for how it waits.
func (l *Lock) Lock(ctx context.Context) (*Hold, error) {
	l.acq.Lock()
	defer l.acq.Unlock()
	if l.current() != nil {
		return nil, ErrLockHeld
	}
	if isClosed(l.s.Done()) {
		return nil, sessionLost(l.s)
	}
	ctx, stop := withSession(ctx, l.s)
	defer stop()

	qkey := l.queueKey()
	if err := l.joinQueue(ctx, qkey); err != nil {
		return nil, ctxErr(ctx, l.s, err)
	}
	h, err := l.waitInQueue(ctx, qkey)
	if err != nil {
		// Leave the queue, even though ctx may be over.
		cctx, cancel := cleanupCtx(ctx, l.s.clk, l.s.renewTO)
		l.kv.Delete(cctx, qkey, nil)
		cancel()
		return nil, ctxErr(ctx, l.s, err)
	}
	return h, nil
}

// TryLock takes the lock if it is free and returns at once otherwise, with
// ErrLocked (held by another session) or a *LockDelayError (free but in
// its lock-delay). It does not queue. While a Lock call of the same Lock
// waits, it returns ErrLockBusy.
func (l *Lock) TryLock(ctx context.Context) (*Hold, error) {
	if !l.acq.TryLock() {
		return nil, ErrLockBusy
	}
	defer l.acq.Unlock()
	if l.current() != nil {
		return nil, ErrLockHeld
	}
	if isClosed(l.s.Done()) {
		return nil, sessionLost(l.s)
	}
	ctx, stop := withSession(ctx, l.s)
	defer stop()
	p, _, err := l.kv.Get(ctx, l.key, nil)
	if err != nil {
		return nil, ctxErr(ctx, l.s, err)
	}
	if p != nil && p.Flags != LockFlagValue {
		return nil, ErrLockConflict
	}
	if p != nil && p.Session != "" && p.Session != l.s.id {
		return nil, ErrLocked
	}
	h, delay, err := l.acquire(ctx, "")
	switch {
	case err != nil:
		return nil, ctxErr(ctx, l.s, err)
	case h != nil:
		return h, nil
	case delay > 0:
		return nil, &LockDelayError{Key: l.key, Remaining: delay}
	}
	return nil, ErrLocked
}

// Unlock gives up the current hold (see Hold.Unlock); ErrLockNotHeld if
// there is none.
func (l *Lock) Unlock(ctx context.Context) error {
	h := l.current()
	if h == nil {
		return ErrLockNotHeld
	}
	return h.Unlock(ctx)
}

func (l *Lock) current() *Hold {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hold
}

func (l *Lock) queuePrefix() string { return l.key + "/" + QueueDir + "/" }
func (l *Lock) queueKey() string    { return l.queuePrefix() + l.s.id }

func (l *Lock) tracef(format string, args ...any) {
	if l.hook != nil {
		l.hook(fmt.Sprintf(format, args...))
	}
}

// joinQueue makes (or keeps) our entry in the queue.
func (l *Lock) joinQueue(ctx context.Context, qkey string) error {
	ok, _, err := l.kv.Acquire(ctx, &api.KVPair{Key: qkey, Session: l.s.id, Flags: LockFlagValue}, nil)
	if err != nil {
		return fmt.Errorf("recipe: joining the queue of %q: %w", l.key, err)
	}
	if !ok {
		return fmt.Errorf("recipe: joining the queue of %q: entry %q refused", l.key, qkey)
	}
	return nil
}

// waitInQueue waits for our turn and takes the lock.
func (l *Lock) waitInQueue(ctx context.Context, qkey string) (*Hold, error) {
	errs := 0
	retry := func(err error) error {
		if !api.IsRetryable(err) || ctx.Err() != nil {
			return err
		}
		errs++
		return sleep(ctx, l.s.clk, backoff(errs))
	}
	for {
		pred, err := l.predecessor(ctx, qkey)
		if err != nil {
			if err := retry(err); err != nil {
				return nil, err
			}
			continue
		}
		if pred != nil {
			l.tracef("wait for %s", strings.TrimPrefix(pred.Key, l.queuePrefix()))
			if err := l.waitChange(ctx, pred); err != nil {
				if err := retry(err); err != nil {
					return nil, err
				}
			}
			continue
		}
		l.tracef("head")
		h, err := l.acquireAsHead(ctx, qkey)
		if err != nil {
			return nil, err
		}
		return h, nil
	}
}

// predecessor reads the queue and returns the live entry just before ours,
// nil if we are at the head. It puts our entry back if it is missing, and
// deletes entries whose session died.
func (l *Lock) predecessor(ctx context.Context, qkey string) (*api.KVPair, error) {
	for attempt := 0; ; attempt++ {
		pairs, _, err := l.kv.List(ctx, l.queuePrefix(), nil)
		if err != nil {
			return nil, err
		}
		var own *api.KVPair
		live := make([]*api.KVPair, 0, len(pairs))
		for _, p := range pairs {
			switch {
			case p.Key == qkey:
				own = p
			case p.Session == "":
				// Its session died (Behavior release leaves the key).
				l.kv.DeleteCAS(ctx, p, nil)
			default:
				live = append(live, p)
			}
		}
		if own == nil || own.Session != l.s.id {
			if attempt > 0 {
				return nil, fmt.Errorf("recipe: our entry in the queue of %q keeps disappearing", l.key)
			}
			if err := l.joinQueue(ctx, qkey); err != nil {
				return nil, err
			}
			continue
		}
		var pred *api.KVPair
		for _, p := range live {
			if before(p, own) && (pred == nil || before(pred, p)) {
				pred = p
			}
		}
		return pred, nil
	}
}

// before orders queue entries: by CreateIndex, then by key.
func before(a, b *api.KVPair) bool {
	if a.CreateIndex != b.CreateIndex {
		return a.CreateIndex < b.CreateIndex
	}
	return a.Key < b.Key
}

// waitChange blocks until entry p is deleted, replaced, or loses its
// session.
func (l *Lock) waitChange(ctx context.Context, p *api.KVPair) error {
	idx := p.ModifyIndex
	for {
		cur, qm, err := l.kv.Get(ctx, p.Key, &api.QueryOptions{WaitIndex: idx})
		if err != nil {
			return err
		}
		if cur == nil || cur.Session == "" || cur.CreateIndex != p.CreateIndex || cur.Session != p.Session {
			return nil
		}
		idx = nextIndex(idx, qm.LastIndex)
	}
}

// acquireAsHead takes the lock key once it is free; we are at the head of
// the queue, so no other holdfast waiter is looking at it.
func (l *Lock) acquireAsHead(ctx context.Context, qkey string) (*Hold, error) {
	var (
		idx     uint64 // blocking index on the key; 0 reads at once
		errs    int
		refused int // refusals on a free key with no lock-delay said
	)
	for {
		p, qm, err := l.kv.Get(ctx, l.key, &api.QueryOptions{WaitIndex: idx})
		if err != nil {
			if !api.IsRetryable(err) || ctx.Err() != nil {
				return nil, err
			}
			errs++
			if err := sleep(ctx, l.s.clk, backoff(errs)); err != nil {
				return nil, err
			}
			idx = 0
			continue
		}
		errs = 0
		if p != nil && p.Flags != LockFlagValue {
			return nil, ErrLockConflict
		}
		if p != nil && p.Session != "" && p.Session != l.s.id {
			l.tracef("held by %s", p.Session)
			idx = nextIndex(idx, qm.LastIndex)
			refused = 0
			continue
		}
		if refused > 0 {
			// Refused on a free key without being told why: a lock-delay
			// on a server that does not say how long.
			if err := sleep(ctx, l.s.clk, backoff(refused)); err != nil {
				return nil, err
			}
		}
		h, delay, err := l.acquire(ctx, qkey)
		if err != nil {
			return nil, err
		}
		if h != nil {
			return h, nil
		}
		idx = 0
		if delay > 0 {
			t := l.s.clk.NewTimer(delay)
			l.tracef("lock-delay %v", delay)
			select {
			case <-t.C():
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
			continue
		}
		refused++
	}
}

// acquire tries once to lock the key. It returns the hold, or nil and the
// lock-delay the server said remains (0 if it said nothing).
func (l *Lock) acquire(ctx context.Context, qkey string) (*Hold, time.Duration, error) {
	// The hold is judged by the trust the session had before the
	// acquire was sent: a Suspended in between loses it at once.
	untrusted := l.s.Untrusted()
	ok, wm, err := l.kv.Acquire(ctx, &api.KVPair{Key: l.key, Session: l.s.id, Flags: LockFlagValue, Value: l.value}, nil)
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		if wm != nil {
			return nil, wm.LockDelayRemaining, nil
		}
		return nil, 0, nil
	}
	// Learn the hold's LockIndex. Nobody else can have acquired the key
	// since, unless someone released it behind our back; the monitor then
	// reports the hold lost right away.
	p, qm, err := l.kv.Get(ctx, l.key, &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		return nil, 0, err
	}
	h := &Hold{l: l, queue: qkey, lost: make(chan struct{}), monitor: make(chan struct{})}
	var idx uint64
	if p != nil && p.Session == l.s.id {
		h.seq = Sequencer{Key: l.key, Session: l.s.id, LockIndex: p.LockIndex}
		idx = qm.LastIndex
	} else {
		h.seq = Sequencer{Key: l.key, Session: l.s.id}
		h.markLost(ErrKeyChanged)
	}
	l.tracef("acquired %d", h.seq.LockIndex)
	l.mu.Lock()
	l.hold = h
	l.mu.Unlock()
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.stop = cancel
	go h.watch(mctx, idx, untrusted)
	return h, 0, nil
}

// watch closes Lost when the hold is lost. It stops when ctx is cancelled
// (Unlock).
func (h *Hold) watch(ctx context.Context, idx uint64, untrusted <-chan struct{}) {
	defer close(h.monitor)
	l := h.l
	go func() {
		select {
		case <-untrusted:
			h.markLost(ErrUntrusted)
			// Nothing more to watch for: stop the blocking read too.
			h.stop()
		case <-ctx.Done():
		}
	}()
	if isClosed(h.lost) {
		return
	}
	errs := 0
	for {
		p, qm, err := l.kv.Get(ctx, l.key, &api.QueryOptions{WaitIndex: idx, RequireConsistent: true})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// Whether the server is reachable is the keeper's to judge;
			// keep asking until it does.
			errs++
			if sleep(ctx, l.s.clk, backoff(errs)) != nil {
				return
			}
			idx = 0
			continue
		}
		errs = 0
		if p == nil || p.Session != h.seq.Session || p.LockIndex != h.seq.LockIndex {
			h.markLost(ErrKeyChanged)
			// Leave the queue now, so the next waiter need not wait for
			// Unlock to learn that we are gone.
			if h.queue != "" {
				l.kv.Delete(ctx, h.queue, nil)
			}
			return
		}
		if isClosed(h.lost) {
			return
		}
		idx = nextIndex(idx, qm.LastIndex)
	}
}

// Unlock gives the hold up: it releases the key with a fenced release
// (naming the hold's LockIndex, so that it can never free a later hold)
// and leaves the queue. Call it also after the hold was lost: the server
// may still have the key locked by the session, and the queue entry keeps
// the next waiter waiting. It returns ErrLockNotHeld if the hold was
// already given up. A release refused because the hold was no longer
// current is not an error.
func (h *Hold) Unlock(ctx context.Context) error {
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return ErrLockNotHeld
	}
	h.released = true
	h.mu.Unlock()
	h.stop()
	<-h.monitor
	h.markLost(ErrReleased)

	l := h.l
	var firstErr error
	if h.seq.LockIndex > 0 {
		_, _, err := l.kv.ReleaseFenced(ctx, &api.KVPair{
			Key: l.key, Session: h.seq.Session, Flags: LockFlagValue, Value: l.value,
		}, h.seq.LockIndex, nil)
		if err != nil {
			firstErr = fmt.Errorf("recipe: releasing %q: %w", l.key, err)
		}
	}
	if h.queue != "" {
		if _, err := l.kv.Delete(ctx, h.queue, nil); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("recipe: leaving the queue of %q: %w", l.key, err)
		}
	}
	l.mu.Lock()
	if l.hold == h {
		l.hold = nil
	}
	l.mu.Unlock()
	return firstErr
}

// ErrLockInUse is returned by Destroy while the key is held.
var ErrLockInUse = errors.New("recipe: lock in use")

// Destroy deletes the lock key if nobody holds it, as Consul's
// Lock.Destroy does: optional tidying once a lock is no longer needed. It
// returns ErrLockHeld while this Lock holds it, ErrLockInUse while anyone
// else does, and ErrLockConflict if the key is not a lock.
func (l *Lock) Destroy(ctx context.Context) error {
	if l.current() != nil {
		return ErrLockHeld
	}
	p, _, err := l.kv.Get(ctx, l.key, nil)
	if err != nil {
		return err
	}
	if p == nil {
		return nil
	}
	if p.Flags != LockFlagValue {
		return ErrLockConflict
	}
	if p.Session != "" {
		return ErrLockInUse
	}
	ok, _, err := l.kv.DeleteCAS(ctx, p, nil)
	if err != nil {
		return err
	}
	if !ok {
		return ErrLockInUse
	}
	return nil
}
