package recipe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/clock"
)

// LockFlagValue marks a lock key in its Flags. It is the value Consul's Go
// client uses, so that its Lock and this one recognise each other's keys.
const LockFlagValue uint64 = 0x2ddccbc058a50c18

// QueueDir is the directory, under a lock's key, of its waiting queue.
const QueueDir = ".queue"

// The Flags of a queue entry: LockFlagValue while its waiter waits,
// queueHolding once it holds the lock. The change of Flags (a write that
// changes nothing is not a write) is what wakes the waiter behind.
const queueHolding = LockFlagValue + 1

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
	Key string
	// Remaining is how long the delay has to run, 0 if the server did
	// not say (Consul does not).
	Remaining time.Duration
}

func (e *LockDelayError) Error() string {
	if e.Remaining == 0 {
		return fmt.Sprintf("recipe: %q is in its lock-delay", e.Key)
	}
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
// Waiters queue in arrival order and a hand-off wakes only the next one.
// To wait, Lock first joins the queue: it acquires the key
// <key>/.queue/<session> with its session, so the entry dies with the
// session (released or deleted with it). The queue's order is the
// entries' CreateIndex, the server's global index at creation, hence
// arrival order. A waiter sleeps on one key only: the entry of the live
// waiter just before it (its predecessor), as etcd's mutex waits on its
// predecessor's key, or, once that predecessor holds the lock, the lock
// key itself (read with the queue, so that the answer that hands it the
// lock also says who waits behind it; this one waiter also wakes when
// others join or leave); the head of the queue, when the lock is held by
// someone outside the queue, sleeps on the lock key too.
//
// Taking the lock is one transaction: the key must be as the taker last
// saw it (check-index, so a key that stopped being a lock is never
// overwritten), it is locked, and the taker's entry is marked as holding
// (its Flags change), which wakes the waiter behind it once so that it
// knows its predecessor now holds and sleeps on the lock key instead.
//
// Unlock hands the lock on directly. It reads the queue, and in one
// transaction releases the key (fenced by the hold's LockIndex), deletes
// its own entry, and locks the key for the next live waiter, with the
// value that waiter put in its entry, on condition that the entry still
// belongs to that waiter's session; the waiter's entry is marked as
// holding in the same step. The next waiter, asleep on the key, wakes
// already holding it, and knows from the same answer whom to hand it to
// in turn: a hand-off costs one write (and a read of the queue when the
// next waiter is not known or has left), where a
// release followed by the next waiter's acquire (Consul's Lock, or a
// queue without hand-off) costs two writes and a wake-up in between, and
// it wakes one waiter instead of every one. If the waiter left between the
// read and the transaction, the server refuses the hand-off and the key is
// released plainly; the waiter behind takes it as after any release. A
// Lock call that gives up deletes its entry first (so that no hand-off can
// reach it afterwards) and then releases the key if one had; it returns
// once that is done, or after a fifth of the TTL if the server does not
// answer. What it could not do then is retried in the background until
// done or the session ends, and the Lock's next Lock call takes it over.
//
// Consul's lockers look only at the lock key, so the queue is invisible to
// them: they neither wait in it nor are held up by it, and the lock key
// itself is used exactly as they use it. Between holdfast waiters the
// order is strict; a Consul waiter may still win the race for a released
// key, exactly as it would against another Consul waiter, and the holdfast
// waiter then waits on the key at the head of the queue. Entries whose
// session died (left without a session by Behavior "release") are
// skipped, and deleted by the next waiter that reads the queue.
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

	// What a Lock or TryLock that gave up could not take back (its queue
	// entry, the key). Guarded by acq.
	left leftover

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

// Hold is one holding of a lock, from acquisition to Unlock. Its Lost
// channel is closed the moment the hold is lost: the key was released,
// deleted or taken by another session, or the session's policy says its
// holds are gone (Suspended under LoseOnSuspended, Lost under either). It
// is also closed by Unlock.
type Hold struct {
	holding
	l     *Lock
	queue string // our queue entry, "" for TryLock
	// next is the waiter that followed us in the queue when the lock was
	// handed to us (nil: unknown), so that Unlock can hand it on without
	// reading the queue again. Waiters only join at the back, so it is
	// still the next one unless it left, which the hand-off checks.
	next *api.KVPair
}

// Errors a Hold's Err may return.
var (
	ErrKeyChanged = errors.New("recipe: the lock key changed hands")
	ErrUntrusted  = errors.New("recipe: the session can no longer be trusted")
	ErrReleased   = errors.New("recipe: released")
)

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
	if err := l.reclaimLeft(ctx); err != nil {
		return nil, ctxErr(ctx, l.s, err)
	}
	qkey := l.queueKey()

	h, err := func() (*Hold, error) {
		pairs, err := l.joinQueue(ctx, qkey)
		if err != nil {
			return nil, err
		}
		return l.waitInQueue(ctx, qkey, pairs)
	}()
	if err != nil {
		// Leave the queue, even though ctx may be over. This goes for a
		// failed join too: the server may have made the entry although
		// its answer never came, and an entry left behind, owned by a
		// live session, would be handed the lock by the holder before.
		l.giveBack(ctx, qkey)
		return nil, ctxErr(ctx, l.s, err)
	}
	return h, nil
}

// reclaimLeft takes back, at the start of a Lock or TryLock, what a call
// before it gave up and could not: its queue entry, and perhaps a key a
// holder's Unlock handed to that entry. It takes them back rather than
// adopt them: a cleanup request of that call that timed out may still
// reach the server, and a release it carries names the LockIndex of that
// hand-off; a hold taken afresh has a new one, which it cannot free. The
// caller holds acq.
func (l *Lock) reclaimLeft(ctx context.Context) error {
	if !l.left.pending() {
		return nil
	}
	if err := l.abandon(ctx, l.queueKey()); err != nil {
		return err
	}
	l.left.takeOver()
	return nil
}

// giveBack abandons qkey (see abandon) for a call that gave up, within a
// bounded time; what it cannot do then is retried in the background (see
// leftover). The caller holds acq.
func (l *Lock) giveBack(ctx context.Context, qkey string) {
	cctx, cancel := cleanupCtx(ctx, l.s.clk, l.s.renewTO)
	err := l.abandon(cctx, qkey)
	cancel()
	if err != nil {
		l.left.later(l.s, &l.acq, func(ctx context.Context) error { return l.abandon(ctx, qkey) })
	}
}

// TryLock takes the lock if it is free and returns at once otherwise, with
// ErrLocked (held by another session) or a *LockDelayError (free but in
// its lock-delay). It does not queue. While a Lock call of the same Lock
// waits, or a background cleanup of one that gave up runs (see Lock), it
// returns ErrLockBusy.
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
	if err := l.reclaimLeft(ctx); err != nil {
		return nil, ctxErr(ctx, l.s, err)
	}
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
	h, delay, err := l.take(ctx, "", p)
	switch {
	case err == errDelayUnsaid:
		return nil, &LockDelayError{Key: l.key}
	case err != nil:
		// The acquire may have been applied without our hearing of it:
		// give the key back if the session has it, since no Hold will.
		l.giveBack(ctx, "")
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

// joinQueue makes (or keeps) our entry in the queue. It is one
// transaction that also reads the key and the queue as they are right
// after the join (a prefix read of the key: pairs), which saves the
// waiter a read; pairs is nil when the server would not read in the
// transaction.
func (l *Lock) joinQueue(ctx context.Context, qkey string) (pairs api.KVPairs, err error) {
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: qkey, Session: l.s.id, Flags: LockFlagValue, Value: l.value}},
		{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: l.key}},
	}
	ok, resp, _, err := l.s.c.Txn().Txn(ctx, ops, nil)
	if refused(err) {
		ok, _, err = l.kv.Acquire(ctx, &api.KVPair{Key: qkey, Session: l.s.id, Flags: LockFlagValue, Value: l.value}, nil)
		resp = nil
	}
	if err != nil {
		return nil, fmt.Errorf("recipe: joining the queue of %q: %w", l.key, err)
	}
	if !ok {
		why := "refused"
		if resp != nil && len(resp.Errors) > 0 {
			why = resp.Errors[0].What
		}
		return nil, fmt.Errorf("recipe: joining the queue of %q: entry %q %s", l.key, qkey, why)
	}
	if resp == nil || len(resp.Results) == 0 {
		return nil, nil
	}
	// The first result is the lock's, the rest the prefix read.
	for _, r := range resp.Results[1:] {
		if r.KV != nil {
			pairs = append(pairs, r.KV)
		}
	}
	return pairs, nil
}

// refused reports a transaction the server would not take at all (a 4xx
// other than the 409 of failed operations): Consul, for one, knows neither
// a fenced unlock nor, in older versions, every verb.
func refused(err error) bool {
	var se *api.StatusError
	return errors.As(err, &se) && se.Code/100 == 4
}

// errAgain asks waitInQueue to read the queue and the key again.
var errAgain = errors.New("recipe: look again")

// errDelayUnsaid is a refusal on a free key without a lock-delay header
// (Consul): a lock-delay of unknown length.
var errDelayUnsaid = errors.New("recipe: refused for a lock-delay of unknown length")

// waitInQueue waits for our turn and takes the lock.
//
// Each round reads the key and the queue, then waits in one of three
// ways. A waiter whose predecessor waits too sleeps on the predecessor's
// entry; when the predecessor comes to hold the lock its entry is marked
// (in the transaction that gave it the lock), which wakes us once. A
// waiter whose predecessor holds the lock sleeps on the lock key: the
// holder's Unlock normally hands the key straight to us (see release), and
// the change of the key wakes us already holding it. If instead the key
// is freed without a hand-off (the holder's session died, or its hand-off
// failed), we take it on condition that it is still as freed. The head of
// the queue, with no predecessor, sleeps on the key while anyone outside
// the queue (a Consul locker) holds it, and takes it when free.
//
// pairs, if not nil, is the key and queue as read when we joined.
func (l *Lock) waitInQueue(ctx context.Context, qkey string, pairs api.KVPairs) (*Hold, error) {
	var errs, unsaid int
	for {
		key, pred, err := l.readQueue(ctx, qkey, pairs)
		pairs = nil
		var h *Hold
		if err == nil {
			h, err = l.queueStep(ctx, qkey, key, pred)
		}
		switch {
		case h != nil:
			return h, nil
		case err == errAgain, err == nil:
			errs, unsaid = 0, 0
			continue
		case err == errDelayUnsaid:
			unsaid++
			if err := clock.Sleep(ctx, l.s.clk, backoff(unsaid)); err != nil {
				return nil, err
			}
			continue
		}
		if !api.IsRetryable(err) || ctx.Err() != nil {
			return nil, err
		}
		errs++
		if err := clock.Sleep(ctx, l.s.clk, backoff(errs)); err != nil {
			return nil, err
		}
	}
}

// queueStep waits once, given the key and our predecessor as just read,
// and returns the hold, or errAgain (or nil) to read the queue again.
func (l *Lock) queueStep(ctx context.Context, qkey string, key, pred *api.KVPair) (*Hold, error) {
	switch {
	case key != nil && key.Flags != LockFlagValue:
		return nil, ErrLockConflict
	case key != nil && key.Session == l.s.id:
		// Handed to us while we were not looking.
		return l.adopt(ctx, qkey, key), nil
	case pred == nil:
		// At the head: nobody of ours holds the key; take it when it
		// is free.
		l.tracef("head")
		return l.takeWhenFree(ctx, qkey, key)
	case key != nil && key.Session == pred.Session:
		l.tracef("next after %s", strings.TrimPrefix(pred.Key, l.queuePrefix()))
		return l.waitHandOff(ctx, qkey, key)
	}
	l.tracef("wait for %s", strings.TrimPrefix(pred.Key, l.queuePrefix()))
	cur, err := l.waitChange(ctx, pred)
	switch {
	case err != nil:
		return nil, err
	case cur != nil && cur.Session == pred.Session && cur.CreateIndex == pred.CreateIndex:
		// It came to hold the lock (its entry was marked in the same
		// transaction, so the key changed no later than the entry):
		// now we are next.
		l.tracef("next after %s", strings.TrimPrefix(pred.Key, l.queuePrefix()))
		return l.waitHandOff(ctx, qkey, &api.KVPair{Key: l.key, Session: pred.Session, ModifyIndex: cur.ModifyIndex})
	}
	return nil, errAgain // a waiter before us left: look again
}

// waitHandOff is the wait of the waiter right behind the holder: it
// sleeps on the key, which was last seen as held, until it changes. The
// holder's Unlock hands the key to us; a key freed otherwise (the holder
// died, or its hand-off failed) we take if it is still as freed; a key
// taken by anyone else sends us back to reading the queue.
//
// It sleeps on the key and its queue together (one prefix read), so that
// the answer that shows the key handed to us also shows who waits behind
// us: our Unlock can then hand on without reading the queue again. Only
// this one waiter sleeps so; it also wakes when waiters join or leave.
func (l *Lock) waitHandOff(ctx context.Context, qkey string, key *api.KVPair) (*Hold, error) {
	holder, idx := key.Session, key.ModifyIndex
	for {
		pairs, qm, err := l.kv.List(ctx, l.key, &api.QueryOptions{WaitIndex: idx})
		if err != nil {
			return nil, err
		}
		v := l.view(pairs, qkey)
		p := v.key
		switch {
		case p != nil && p.Flags != LockFlagValue:
			return nil, ErrLockConflict
		case p != nil && p.Session == l.s.id:
			h := l.adopt(ctx, qkey, p)
			h.next = v.next()
			return h, nil
		case p != nil && p.Session == holder:
			idx = nextIndex(idx, qm.LastIndex) // still held (or rewritten by its holder)
			continue
		case p != nil && p.Session != "":
			return nil, errAgain
		}
		if p != nil {
			l.tracef("released at %d", p.ModifyIndex)
		} else {
			l.tracef("released at %d", qm.LastIndex)
		}
		return l.takeFrom(ctx, qkey, p)
	}
}

// adopt makes a hold of the key p, which the server shows held by our
// session: handed to us by the previous holder.
//
// The hold is judged by the session's trust as it is now, after the read
// that showed it, not as it was when we began to wait: a waiter may sleep
// through a Suspended and a Reconnected, and a key handed over then is a
// hold taken after Reconnected. That is sound because a session the
// server renewed (Reconnected) was never invalidated, so the key the read
// shows is ours; and if the session is Suspended now, the channel taken
// here is already closed and the hold is lost at once.
func (l *Lock) adopt(ctx context.Context, qkey string, p *api.KVPair) *Hold {
	l.tracef("handed %d", p.LockIndex)
	return l.newHold(ctx, qkey, p.LockIndex, p.ModifyIndex, l.s.Untrusted())
}

// readQueue reads the key and its queue in one request (unless pairs is
// such a read, made already) and returns the key (nil if absent) and the
// live entry just before ours (nil if we are at the head). It puts our
// entry back if it is missing, and deletes entries whose session died.
func (l *Lock) readQueue(ctx context.Context, qkey string, pairs api.KVPairs) (key, pred *api.KVPair, err error) {
	for attempt := 0; ; attempt++ {
		// A prefix read of the key covers the key and its queue (and keys
		// that merely start with the same characters, which are skipped).
		if pairs == nil {
			if pairs, _, err = l.kv.List(ctx, l.key, nil); err != nil {
				return nil, nil, err
			}
		}
		v := l.view(pairs, qkey)
		for _, p := range v.dead {
			// Its session died (Behavior release leaves the key).
			l.kv.DeleteCAS(ctx, p, nil)
		}
		if v.own == nil || v.own.Session != l.s.id {
			if attempt > 0 {
				return nil, nil, fmt.Errorf("recipe: our entry in the queue of %q keeps disappearing", l.key)
			}
			if pairs, err = l.joinQueue(ctx, qkey); err != nil {
				return nil, nil, err
			}
			continue
		}
		return v.key, v.pred(), nil
	}
}

// queueView is a prefix read of a lock's key sorted out: the key, our
// queue entry, the entries of live waiters and those whose session died.
type queueView struct {
	key, own   *api.KVPair
	live, dead []*api.KVPair
}

// view sorts pairs out; keys that merely start with the lock key's
// characters are skipped.
func (l *Lock) view(pairs api.KVPairs, qkey string) queueView {
	var v queueView
	for _, p := range pairs {
		switch {
		case p.Key == l.key:
			v.key = p
		case !strings.HasPrefix(p.Key, l.queuePrefix()):
		case p.Key == qkey:
			v.own = p
		case p.Session == "":
			v.dead = append(v.dead, p)
		default:
			v.live = append(v.live, p)
		}
	}
	return v
}

// pred is the live entry just before ours, nil if we are at the head (or
// have no entry).
func (v queueView) pred() *api.KVPair {
	var pred *api.KVPair
	for _, p := range v.live {
		if v.own != nil && before(p, v.own) && (pred == nil || before(pred, p)) {
			pred = p
		}
	}
	return pred
}

// next is the live entry just after ours, nil if there is none (or we
// have no entry).
func (v queueView) next() *api.KVPair {
	var next *api.KVPair
	for _, p := range v.live {
		if v.own != nil && before(v.own, p) && (next == nil || before(p, next)) {
			next = p
		}
	}
	return next
}

// before orders queue entries: by CreateIndex, then by key.
func before(a, b *api.KVPair) bool {
	if a.CreateIndex != b.CreateIndex {
		return a.CreateIndex < b.CreateIndex
	}
	return a.Key < b.Key
}

// waitChange blocks until queue entry p changes in any way: deleted,
// replaced, its session gone, or marked as holding. It returns the entry
// as it is then, nil if deleted.
func (l *Lock) waitChange(ctx context.Context, p *api.KVPair) (*api.KVPair, error) {
	idx := p.ModifyIndex
	for {
		cur, qm, err := l.kv.Get(ctx, p.Key, &api.QueryOptions{WaitIndex: idx})
		if err != nil || cur == nil {
			return nil, err
		}
		if cur.ModifyIndex != p.ModifyIndex || cur.Session != p.Session {
			return cur, nil
		}
		idx = nextIndex(idx, qm.LastIndex)
	}
}

// takeWhenFree waits for the key to be free and takes it. key is the key
// as last read (nil if absent). It returns errAgain when the queue must be
// read again: the key was taken by someone else first, or a lock-delay was
// waited out.
func (l *Lock) takeWhenFree(ctx context.Context, qkey string, key *api.KVPair) (*Hold, error) {
	for key != nil && key.Session != "" {
		switch {
		case key.Flags != LockFlagValue:
			return nil, ErrLockConflict
		case key.Session == l.s.id:
			return l.adopt(ctx, qkey, key), nil
		}
		l.tracef("held by %s", key.Session)
		// Block on the key itself: among holdfast waiters only we do.
		p, qm, err := l.kv.Get(ctx, l.key, &api.QueryOptions{WaitIndex: key.ModifyIndex})
		if err != nil {
			return nil, err
		}
		if p != nil && p.ModifyIndex == key.ModifyIndex && qm.LastIndex >= key.ModifyIndex {
			continue // the wait ran out; nothing changed
		}
		key = p
	}
	if key != nil && key.Flags != LockFlagValue {
		return nil, ErrLockConflict
	}
	return l.takeFrom(ctx, qkey, key)
}

// takeFrom takes the key on condition that it is as last seen: absent if
// key is nil, else unchanged since key.ModifyIndex. It returns errAgain
// when the queue must be read again: the key changed first, or a
// lock-delay was waited out.
func (l *Lock) takeFrom(ctx context.Context, qkey string, key *api.KVPair) (*Hold, error) {
	h, delay, err := l.take(ctx, qkey, key)
	switch {
	case err != nil:
		return nil, err
	case h != nil:
		return h, nil
	case delay > 0:
		t := l.s.clk.NewTimer(delay)
		l.tracef("lock-delay %v", delay)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	return nil, errAgain
}

// take tries once to lock the key, which was last read as key (nil:
// absent) and looked free. It is one transaction: the key must be
// unchanged since that read (so a key that stopped being a lock is never
// overwritten), it is locked, and our queue entry, if any, is marked as
// holding, which wakes the waiter behind us so that it moves on to
// watching the key. It returns the hold; or nil and the lock-delay the
// server said remains; or nil, 0 and errDelayUnsaid for a lock-delay of
// unknown length; or nil, 0, nil when the key changed first.
func (l *Lock) take(ctx context.Context, qkey string, key *api.KVPair) (*Hold, time.Duration, error) {
	// The hold is judged by the trust the session had before the
	// acquire was sent: a Suspended in between loses it at once.
	untrusted := l.s.Untrusted()
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: l.key}}}
	if key != nil {
		ops = api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: l.key, Index: key.ModifyIndex}}}
	}
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{
		Verb: api.KVLock, Key: l.key, Session: l.s.id, Flags: LockFlagValue, Value: l.value,
	}})
	if qkey != "" {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{
			Verb: api.KVLock, Key: qkey, Session: l.s.id, Flags: queueHolding, Value: l.value,
		}})
	}
	ok, resp, _, err := l.s.c.Txn().Txn(ctx, ops, nil)
	if err != nil {
		return nil, 0, err
	}
	if ok {
		var got *api.KVPair
		for _, r := range resp.Results {
			if r.KV != nil && r.KV.Key == l.key {
				got = r.KV // the last one is the lock's
			}
		}
		if got == nil || got.Session != l.s.id {
			return nil, 0, fmt.Errorf("recipe: locking %q: the server's answer does not show the lock", l.key)
		}
		return l.newHold(ctx, qkey, got.LockIndex, got.ModifyIndex, untrusted), 0, nil
	}
	delayed := false
	for _, e := range resp.Errors {
		delayed = delayed || strings.Contains(e.What, "lock delay")
	}
	if !delayed {
		return nil, 0, nil // the key changed since we read it
	}
	// Refused for a lock-delay. Only a plain acquire says how long it has
	// to run (and it may succeed, if the delay just ended).
	ok, wm, err := l.kv.Acquire(ctx, &api.KVPair{Key: l.key, Session: l.s.id, Flags: LockFlagValue, Value: l.value}, nil)
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		if wm != nil && wm.LockDelayRemaining > 0 {
			return nil, wm.LockDelayRemaining, nil
		}
		return nil, 0, errDelayUnsaid
	}
	p, _, err := l.kv.Get(ctx, l.key, &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		return nil, 0, err
	}
	if p == nil || p.Session != l.s.id {
		return nil, 0, nil
	}
	if qkey != "" {
		l.kv.Acquire(ctx, &api.KVPair{Key: qkey, Session: l.s.id, Flags: queueHolding, Value: l.value}, nil)
	}
	return l.newHold(ctx, qkey, p.LockIndex, p.ModifyIndex, untrusted), 0, nil
}

// newHold records a hold and starts watching it from index idx.
func (l *Lock) newHold(ctx context.Context, qkey string, lockIndex, idx uint64, untrusted <-chan struct{}) *Hold {
	h := &Hold{l: l, queue: qkey}
	h.init(Sequencer{Key: l.key, Session: l.s.id, LockIndex: lockIndex})
	l.tracef("acquired %d", lockIndex)
	l.mu.Lock()
	l.hold = h
	l.mu.Unlock()
	h.startMonitor(ctx, func(mctx context.Context) { h.watch(mctx, idx, untrusted) })
	return h
}

// watch closes Lost when the hold is lost. It stops when ctx is cancelled
// (Unlock).
func (h *Hold) watch(ctx context.Context, idx uint64, untrusted <-chan struct{}) {
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
			if clock.Sleep(ctx, l.s.clk, backoff(errs)) != nil {
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
				h.leaveQueue(ctx)
			}
			return
		}
		if isClosed(h.lost) {
			return
		}
		idx = nextIndex(idx, qm.LastIndex)
	}
}

// leaveQueue deletes the hold's queue entry after the hold was lost. Unlock
// cancels this request when it stops the monitor, and a cancelled request
// may still reach the server later, after the session has joined the
// queue again under the same key. So the delete is conditional: only the
// entry as it is now, still ours and still marked as holding (a new join
// is not marked until it holds, and every write moves the ModifyIndex the
// delete is conditioned on).
func (h *Hold) leaveQueue(ctx context.Context) {
	l := h.l
	e, _, err := l.kv.Get(ctx, h.queue, nil)
	if err != nil || e == nil || e.Session != h.seq.Session || e.Flags != queueHolding {
		return
	}
	l.kv.DeleteCAS(ctx, e, nil)
}

// Unlock gives the hold up: in one transaction it releases the key,
// naming the hold's LockIndex (a fenced release, which can never free a
// later hold of the same session), leaves the queue, and hands the key to
// the next live waiter in the queue, if there is one (see release). Call
// Unlock also after the hold was lost: the server may still have the key
// locked by the session, and the queue entry keeps the next waiter
// waiting. It returns ErrLockNotHeld if the hold was already given up. A
// release refused because the hold was no longer current is not an error.
// If the release fails (the server cannot be reached) Unlock returns the
// error and may be called again; until one succeeds the hold stays the
// Lock's current one, and Lock returns ErrLockHeld.
func (h *Hold) Unlock(ctx context.Context) error {
	l := h.l
	ok, err := h.giveUp(func() error {
		return l.release(ctx, h.seq.Session, h.seq.LockIndex, h.queue, h.next)
	})
	if !ok {
		return ErrLockNotHeld
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	if l.hold == h {
		l.hold = nil
	}
	l.mu.Unlock()
	return nil
}

// release frees the key held by session at lockIndex and deletes queue
// entry qkey ("": none), in one transaction. When qkey is given and a live
// waiter follows it in the queue, the same transaction hands the key to
// that waiter: on condition that its entry still belongs to its session,
// the key is locked by that session with the value from its entry, and
// the entry is marked, which wakes the waiter behind it. The waiter, which
// sleeps on the key, wakes holding it. A hand-off thus costs one read and
// one transaction, against the two transactions of a release followed by
// the next waiter's acquire. If the hand-off is refused (the waiter left
// in the meantime) the key is released plainly and the queue sorts itself
// out as it would after any release.
func (l *Lock) release(ctx context.Context, session string, lockIndex uint64, qkey string, hint *api.KVPair) error {
	next, fresh := hint, hint == nil
	if next == nil && qkey != "" {
		next = l.successor(ctx, qkey)
	}
	for {
		if next != nil {
			l.tracef("successor %s", strings.TrimPrefix(next.Key, l.queuePrefix()))
		}
		ops := api.TxnOps{{KV: &api.KVTxnOp{
			Verb: api.KVUnlock, Key: l.key, Session: session, LockIndex: lockIndex,
			Flags: LockFlagValue, Value: l.value,
		}}}
		if qkey != "" {
			ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: qkey}})
		}
		if next != nil {
			ops = append(ops,
				&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: next.Key, Session: next.Session}},
				&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: l.key, Session: next.Session, Flags: LockFlagValue, Value: next.Value}},
				&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: next.Key, Session: next.Session, Flags: queueHolding, Value: next.Value}},
			)
		}
		ok, _, _, err := l.s.c.Txn().Txn(ctx, ops, nil)
		if refused(err) {
			// A server that does not take a fenced unlock in a
			// transaction (Consul): a fenced release (which Consul
			// treats as a plain one) and then leave the queue.
			if _, _, err := l.kv.ReleaseFenced(ctx, &api.KVPair{
				Key: l.key, Session: session, Flags: LockFlagValue, Value: l.value,
			}, lockIndex, nil); err != nil {
				return fmt.Errorf("recipe: releasing %q: %w", l.key, err)
			}
			ok = false
			next = nil
		} else if err != nil {
			return fmt.Errorf("recipe: releasing %q: %w", l.key, err)
		}
		switch {
		case ok:
			if next != nil {
				l.tracef("handed to %s", strings.TrimPrefix(next.Key, l.queuePrefix()))
			}
			return nil
		case next != nil && !fresh:
			// The waiter we knew of left: look at the queue as it is.
			next, fresh = l.successor(ctx, qkey), true
			continue
		case next != nil:
			next = nil // the hand-off was refused: release plainly
			continue
		}
		if qkey != "" {
			// Not (or no longer) ours to release; leave the queue anyway.
			if _, err := l.kv.Delete(ctx, qkey, nil); err != nil {
				return fmt.Errorf("recipe: leaving the queue of %q: %w", l.key, err)
			}
		}
		return nil
	}
}

// successor reads the queue and returns the live entry right after ours
// (qkey), nil if there is none or the read fails: the hand-off is an
// optimisation, and its transaction checks the entry again.
func (l *Lock) successor(ctx context.Context, qkey string) *api.KVPair {
	pairs, _, err := l.kv.List(ctx, l.queuePrefix(), nil)
	if err != nil {
		return nil
	}
	return l.view(pairs, qkey).next()
}

// abandon leaves the queue after Lock gave up waiting. The entry goes
// first, so that no hand-off can reach us afterwards; one that came
// before is then found on the key and passed on with a plain release.
// With qkey "" (TryLock) it only gives back a key the session holds.
// It returns an error if a step could not be done (the server did not
// answer): the entry may still be there, or the key still ours.
func (l *Lock) abandon(ctx context.Context, qkey string) error {
	if qkey != "" {
		if err := deleteOwn(ctx, l.kv, qkey, l.s.id); err != nil {
			return err
		}
	}
	p, _, err := l.kv.Get(ctx, l.key, nil)
	if err != nil {
		return err
	}
	if p == nil || p.Session != l.s.id {
		return nil
	}
	return l.release(ctx, l.s.id, p.LockIndex, "", nil)
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
