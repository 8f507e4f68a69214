package recipe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/clock"
)

// SemaphoreFlagValue marks a semaphore's keys in their Flags. It is the
// value Consul's Go client uses.
const SemaphoreFlagValue uint64 = 0xe0f69a2baa414de0

// DefaultSemaphoreKey is the name, under the prefix, of the key that holds
// the semaphore's limit and holders.
const DefaultSemaphoreKey = ".lock"

// Errors of Semaphore.
var (
	// ErrSemaphoreHeld: this Semaphore already holds a permit.
	ErrSemaphoreHeld = errors.New("recipe: semaphore already held")
	// ErrSemaphoreNotHeld: Release of a permit already given up.
	ErrSemaphoreNotHeld = errors.New("recipe: semaphore not held")
	// ErrSemaphoreFull: TryAcquire found every slot taken.
	ErrSemaphoreFull = errors.New("recipe: every slot of the semaphore is taken")
	// ErrSemaphoreBusy: TryAcquire while an Acquire of the same Semaphore
	// waits.
	ErrSemaphoreBusy = errors.New("recipe: an Acquire call of this Semaphore is in progress")
	// ErrSemaphoreConflict: the prefix's .lock key is not a semaphore's.
	ErrSemaphoreConflict = errors.New("recipe: existing key does not match semaphore use")
	// ErrSemaphoreInUse: Destroy while the semaphore has live holders.
	ErrSemaphoreInUse = errors.New("recipe: semaphore in use")
)

// SemaphoreOptions tune a Semaphore.
type SemaphoreOptions struct {
	// Value is written to this contender's key, for people reading the
	// store.
	Value []byte
}

// Semaphore lets up to a limit of sessions hold a permit at once. It is the
// recipe of Consul's semaphore guide, and interoperates with Consul's
// api.Semaphore on the same prefix:
//
//   - each contender acquires the key <prefix>/<session> with its session
//     (Flags SemaphoreFlagValue), so the key dies with the session;
//   - the key <prefix>/.lock holds {"Limit":N,"Holders":{"<session>":true,…}};
//   - a contender reads the whole prefix, prunes the holders that have no
//     live contender key, and if a slot is free adds itself with a
//     check-and-set on .lock's ModifyIndex; otherwise it waits with a
//     blocking read of the prefix and tries again.
//
// The session should have Behavior "delete" (as Consul's semaphore
// sessions do) so that a dead holder's contender key disappears with its
// session; with "release" the key stays, unlocked: it is pruned all the
// same, and deleted by the next contender that is granted a slot.
//
// Unlike Lock, waiting is not queued: every change under the prefix wakes
// every waiter, as with Consul's.
//
// An Acquire that gives up deletes its contender entry, which gives back
// a slot it may have taken without hearing so. If the server does not
// answer then, the delete is retried in the background until done or the
// session ends, and the Semaphore's next Acquire takes the entry over.
//
// A slot belongs to a session, not to a Semaphore: use one Semaphore per
// prefix per session. Two Semaphores of one session on one prefix share
// its contender entry and its slot, so both get a permit for it.
type Semaphore struct {
	s      *Session
	prefix string
	limit  int
	value  []byte
	kv     *api.KV

	acq    sync.Mutex
	left   leftover // a contender entry an Acquire that gave up left; guarded by acq
	mu     sync.Mutex
	permit *Permit
}

// NewSemaphore returns a Semaphore of limit slots at prefix for session s.
// All contenders on a prefix must agree on the limit.
func NewSemaphore(s *Session, prefix string, limit int, opts *SemaphoreOptions) (*Semaphore, error) {
	if s == nil {
		return nil, errors.New("recipe: nil Session")
	}
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix == "" || strings.HasPrefix(prefix, "/") {
		return nil, fmt.Errorf("recipe: invalid semaphore prefix %q", prefix)
	}
	if limit <= 0 {
		return nil, errors.New("recipe: semaphore limit must be positive")
	}
	sem := &Semaphore{s: s, prefix: prefix, limit: limit, kv: s.c.KV()}
	if opts != nil {
		sem.value = opts.Value
	}
	return sem, nil
}

// Prefix is the semaphore's prefix.
func (sem *Semaphore) Prefix() string { return sem.prefix }

// Limit is the number of slots.
func (sem *Semaphore) Limit() int { return sem.limit }

func (sem *Semaphore) lockKey() string      { return sem.prefix + "/" + DefaultSemaphoreKey }
func (sem *Semaphore) contenderKey() string { return sem.prefix + "/" + sem.s.id }

// semaphoreLock is the value of the .lock key.
type semaphoreLock struct {
	Limit   int
	Holders map[string]bool
}

// Permit is one slot of a semaphore, from acquisition to Release. Its
// Lost channel is closed the moment the permit is lost: the session's
// holder entry left .lock (pruned after its contender key vanished, or
// removed by someone), .lock stopped being this semaphore's (rewritten
// with another Limit or other Flags, or a value that does not decode), or
// the session's policy says its holds are gone.
// Release closes it too. Its Sequencer is the .lock key, the session, and
// the .lock key's ModifyIndex right after this permit was recorded in it:
// a later permit has a larger index. holdfast's server checks it like a
// lock's (api.KV.Fence, api.KV.PutFenced): it is current while the session
// is among the holders in .lock and its contender entry is held and was
// not written again after the grant (each Acquire writes it first).
type Permit struct {
	holding
	sem *Semaphore
}

// Acquire blocks until it holds a permit, ctx is done, or the session ends
// (ErrSessionLost).
func (sem *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	sem.acq.Lock()
	defer sem.acq.Unlock()
	return sem.acquire(ctx, false)
}

// TryAcquire takes a permit if a slot is free, and returns ErrSemaphoreFull
// at once otherwise; ErrSemaphoreBusy while an Acquire of this Semaphore
// waits, or a background cleanup of one that gave up runs.
func (sem *Semaphore) TryAcquire(ctx context.Context) (*Permit, error) {
	if !sem.acq.TryLock() {
		return nil, ErrSemaphoreBusy
	}
	defer sem.acq.Unlock()
	return sem.acquire(ctx, true)
}

// Release gives up the current permit (see Permit.Release);
// ErrSemaphoreNotHeld if there is none.
func (sem *Semaphore) Release(ctx context.Context) error {
	sem.mu.Lock()
	p := sem.permit
	sem.mu.Unlock()
	if p == nil {
		return ErrSemaphoreNotHeld
	}
	return p.Release(ctx)
}

func (sem *Semaphore) acquire(ctx context.Context, once bool) (*Permit, error) {
	sem.mu.Lock()
	held := sem.permit != nil
	sem.mu.Unlock()
	if held {
		return nil, ErrSemaphoreHeld
	}
	if isClosed(sem.s.Done()) {
		return nil, sessionLost(sem.s)
	}
	ctx, stop := withSession(ctx, sem.s)
	defer stop()
	// A contender entry left by an Acquire before is ours again.
	sem.left.takeOver()
	p, err := func() (*Permit, error) {
		if err := sem.contend(ctx); err != nil {
			return nil, err
		}
		return sem.wait(ctx, once)
	}()
	if err != nil {
		// Delete our contender entry, even though ctx may be over. This
		// goes for a failed contend too: the server may have made the
		// entry although its answer never came.
		// While the entry stays, its live session counts as a holder if
		// our slot's write went through unheard: what the server did not
		// take now is retried in the background (see leftover).
		// The delete is conditioned on the entry as read (deleteOwn), so
		// that one that reaches the server late cannot remove the entry
		// of a later Acquire (its slot would be pruned under its Permit).
		leave := func(ctx context.Context) error {
			return deleteOwn(ctx, sem.kv, sem.contenderKey(), sem.s.id)
		}
		cctx, cancel := cleanupCtx(ctx, sem.s.clk, sem.s.renewTO)
		if leave(cctx) != nil {
			sem.left.later(sem.s, &sem.acq, leave)
		}
		cancel()
		return nil, ctxErr(ctx, sem.s, err)
	}
	return p, nil
}

// contend makes our contender entry.
func (sem *Semaphore) contend(ctx context.Context) error {
	made, _, err := sem.kv.Acquire(ctx, &api.KVPair{
		Key: sem.contenderKey(), Session: sem.s.id, Flags: SemaphoreFlagValue, Value: sem.value,
	}, nil)
	if err != nil {
		return fmt.Errorf("failed to make contender entry: %w", err)
	}
	if !made {
		return errors.New("failed to make contender entry: refused")
	}
	return nil
}

// semView is the semaphore as one read of its prefix shows it.
type semView struct {
	lockPair *api.KVPair    // the .lock entry (a synthetic one if absent)
	lk       *semaphoreLock // its value, decoded, dead holders pruned
	ours     bool           // our contender entry is there, held by us
	dead     []*api.KVPair  // contender entries whose session died (Behavior "release" leaves them)
}

// read reads the prefix.
// lockContentError is an error of read about what .lock holds (a value
// that does not decode, another Limit; ErrSemaphoreConflict, other Flags,
// is the third kind), as against a failure to read it: retrying does not
// mend it.
type lockContentError struct{ error }

func (e lockContentError) Unwrap() error { return e.error }

func (sem *Semaphore) read(ctx context.Context, q *api.QueryOptions) (*semView, *api.QueryMeta, error) {
	pairs, qm, err := sem.kv.List(ctx, sem.prefix+"/", q)
	if err != nil {
		return nil, nil, err
	}
	v := &semView{lockPair: &api.KVPair{Key: sem.lockKey(), Flags: SemaphoreFlagValue}}
	alive := map[string]bool{}
	for _, p := range pairs {
		if p.Key == sem.lockKey() {
			v.lockPair = p
		}
		if p.Session != "" {
			alive[p.Session] = true
		}
		if p.Key == sem.contenderKey() && p.Session == sem.s.id {
			v.ours = true
		}
		if p.Session == "" && p.Key != sem.lockKey() && p.Flags == SemaphoreFlagValue &&
			!strings.Contains(strings.TrimPrefix(p.Key, sem.prefix+"/"), "/") {
			v.dead = append(v.dead, p)
		}
	}
	if v.lockPair.Flags != SemaphoreFlagValue {
		return nil, qm, ErrSemaphoreConflict
	}
	v.lk = &semaphoreLock{Limit: sem.limit, Holders: map[string]bool{}}
	if v.lockPair.Value != nil {
		v.lk = &semaphoreLock{}
		if err := json.Unmarshal(v.lockPair.Value, v.lk); err != nil {
			return nil, qm, lockContentError{fmt.Errorf("lock decoding failed: %w", err)}
		}
		if v.lk.Holders == nil {
			v.lk.Holders = map[string]bool{}
		}
	}
	if v.lk.Limit != sem.limit {
		return nil, qm, lockContentError{fmt.Errorf("semaphore limit conflict (lock: %d, local: %d)", v.lk.Limit, sem.limit)}
	}
	for h := range v.lk.Holders {
		if !alive[h] {
			delete(v.lk.Holders, h)
		}
	}
	return v, qm, nil
}

func (sem *Semaphore) wait(ctx context.Context, once bool) (*Permit, error) {
	var (
		idx    uint64
		errs   int
		rejoin bool
	)
	for {
		v, qm, err := sem.read(ctx, &api.QueryOptions{WaitIndex: idx})
		if err == nil && !v.ours {
			// Our entry went away (deleted by someone); put it back once.
			if rejoin {
				return nil, errors.New("failed to make contender entry: it keeps disappearing")
			}
			rejoin = true
			if err = sem.contend(ctx); err == nil {
				idx = 0
				continue
			}
		}
		if err != nil {
			if !api.IsRetryable(err) || ctx.Err() != nil {
				return nil, err
			}
			errs++
			if err := clock.Sleep(ctx, sem.s.clk, backoff(errs)); err != nil {
				return nil, err
			}
			idx = 0
			continue
		}
		errs = 0
		lk := v.lk
		if !lk.Holders[sem.s.id] && len(lk.Holders) >= lk.Limit {
			if once {
				return nil, ErrSemaphoreFull
			}
			idx = nextIndex(idx, qm.LastIndex)
			continue
		}
		untrusted := sem.s.Untrusted()
		lk.Holders[sem.s.id] = true
		enc, err := json.Marshal(lk)
		if err != nil {
			return nil, err
		}
		ok, resp, _, err := sem.s.c.Txn().Txn(ctx, api.TxnOps{{KV: &api.KVTxnOp{
			Verb: api.KVCAS, Key: sem.lockKey(), Value: enc, Flags: SemaphoreFlagValue, Index: v.lockPair.ModifyIndex,
		}}}, nil)
		if err != nil {
			if !api.IsRetryable(err) || ctx.Err() != nil {
				return nil, fmt.Errorf("failed to update lock: %w", err)
			}
			errs++
			if err := clock.Sleep(ctx, sem.s.clk, backoff(errs)); err != nil {
				return nil, err
			}
			idx = 0
			continue
		}
		if !ok || len(resp.Results) == 0 || resp.Results[0].KV == nil {
			// Another contender changed .lock first: look again at once.
			// Every lost race is someone else's write, so even TryAcquire
			// goes round again: only a read that finds every slot taken
			// makes it answer ErrSemaphoreFull.
			idx = 0
			continue
		}
		// The write that pruned dead holders out of .lock is done; now
		// delete the contender entries they left behind (a session of
		// Behavior "delete" leaves none). Only the contender that got a
		// slot does it, so a change that wakes every waiter does not make
		// each of them write. An entry that changed since the read stays.
		for _, d := range v.dead {
			sem.kv.DeleteCAS(ctx, d, nil)
		}
		return sem.granted(ctx, resp.Results[0].KV.ModifyIndex, untrusted), nil
	}
}

func (sem *Semaphore) granted(ctx context.Context, modifyIndex uint64, untrusted <-chan struct{}) *Permit {
	p := &Permit{sem: sem}
	p.init(Sequencer{Key: sem.lockKey(), Session: sem.s.id, LockIndex: modifyIndex})
	sem.mu.Lock()
	sem.permit = p
	sem.mu.Unlock()
	p.startMonitor(ctx, func(mctx context.Context) { p.watch(mctx, untrusted) })
	return p
}

// watch closes Lost when the permit is lost; it stops at Release.
func (p *Permit) watch(ctx context.Context, untrusted <-chan struct{}) {
	sem := p.sem
	go func() {
		select {
		case <-untrusted:
			p.markLost(ErrUntrusted)
			// Nothing more to watch for: stop the blocking read too.
			p.stop()
		case <-ctx.Done():
		}
	}()
	var idx uint64
	errs := 0
	for {
		v, qm, err := sem.read(ctx, &api.QueryOptions{WaitIndex: idx, RequireConsistent: true})
		if ctx.Err() != nil {
			return
		}
		var content lockContentError
		if errors.As(err, &content) || errors.Is(err, ErrSemaphoreConflict) {
			// .lock is no longer this semaphore's as the permit was
			// granted (another Limit, other Flags, an unreadable value):
			// nothing it says can vouch for the permit.
			p.markLost(ErrKeyChanged)
			return
		}
		if err != nil {
			errs++
			if clock.Sleep(ctx, sem.s.clk, backoff(errs)) != nil {
				return
			}
			idx = 0
			continue
		}
		errs = 0
		if !v.ours || !v.lk.Holders[sem.s.id] {
			p.markLost(ErrKeyChanged)
			return
		}
		if isClosed(p.lost) {
			return
		}
		idx = nextIndex(idx, qm.LastIndex)
	}
}

// Release gives the permit up: it removes the session from .lock's holders
// (check-and-set, retried on races) and deletes the contender entry. Call
// it also after the permit was lost. ErrSemaphoreNotHeld if already
// released. If the server cannot be reached Release returns the error and
// may be called again; until one succeeds the permit stays the
// Semaphore's current one.
func (p *Permit) Release(ctx context.Context) error {
	sem := p.sem
	ok, err := p.giveUp(func() error { return sem.free(ctx, p.seq.Session) })
	if !ok {
		return ErrSemaphoreNotHeld
	}
	if err != nil {
		return err
	}
	sem.mu.Lock()
	if sem.permit == p {
		sem.permit = nil
	}
	sem.mu.Unlock()
	return nil
}

// free removes session from .lock's holders and deletes its contender
// entry. A .lock that does not decode holds no one this recipe can name,
// so there is nothing to remove from it.
func (sem *Semaphore) free(ctx context.Context, session string) error {
	for {
		pair, _, err := sem.kv.Get(ctx, sem.lockKey(), nil)
		if err != nil {
			return err
		}
		if pair == nil || pair.Value == nil {
			break
		}
		lk := &semaphoreLock{}
		if err := json.Unmarshal(pair.Value, lk); err != nil || !lk.Holders[session] {
			break
		}
		delete(lk.Holders, session)
		enc, err := json.Marshal(lk)
		if err != nil {
			return err
		}
		ok, _, err := sem.kv.CAS(ctx, &api.KVPair{
			Key: sem.lockKey(), Value: enc, Flags: SemaphoreFlagValue, ModifyIndex: pair.ModifyIndex,
		}, nil)
		if err != nil {
			return fmt.Errorf("failed to update lock: %w", err)
		}
		if ok {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if _, err := sem.kv.Delete(ctx, sem.prefix+"/"+session, nil); err != nil {
		return err
	}
	return nil
}

// Destroy deletes the .lock key if the semaphore has no live holder, as
// Consul's Semaphore.Destroy does; ErrSemaphoreInUse if it has. It is
// optional tidying. ErrSemaphoreHeld if this Semaphore holds a permit.
func (sem *Semaphore) Destroy(ctx context.Context) error {
	sem.mu.Lock()
	held := sem.permit != nil
	sem.mu.Unlock()
	if held {
		return ErrSemaphoreHeld
	}
	v, _, err := sem.read(ctx, nil)
	if err != nil {
		return err
	}
	if v.lockPair.ModifyIndex == 0 {
		return nil
	}
	if len(v.lk.Holders) > 0 {
		return ErrSemaphoreInUse
	}
	ok, _, err := sem.kv.DeleteCAS(ctx, v.lockPair, nil)
	if err != nil {
		return fmt.Errorf("failed to remove semaphore: %w", err)
	}
	if !ok {
		return ErrSemaphoreInUse
	}
	return nil
}
