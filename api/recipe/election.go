package recipe

import (
	"context"
	"errors"
	"sync"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/clock"
)

// Errors of Election.
var (
	// ErrNoLeader: Leader found the office vacant.
	ErrNoLeader = errors.New("recipe: no leader")
	// ErrNotLeader: Resign without a leadership.
	ErrNotLeader = errors.New("recipe: not the leader")
	// ErrAlreadyLeader: Campaign while this Election already leads (a
	// term that has not been resigned, even if it was lost).
	ErrAlreadyLeader = errors.New("recipe: already the leader")
	// ErrCampaigning: Campaign while another Campaign of this Election
	// waits.
	ErrCampaigning = errors.New("recipe: already campaigning")
)

// Election elects one leader among the sessions that campaign on a key.
// It is a Lock on that key whose value is the leader's: campaigners queue
// fairly, the leader holds the key, and everyone can read or observe who
// leads. A Consul Lock on the same key takes part as just another
// candidate.
//
// Leadership belongs to a session: use one Election per key per session.
// Two Elections of one session on one key would both be handed the term
// (as two Locks would, see Lock).
type Election struct {
	s   *Session
	key string
	// lock is the one Lock of every term, so that a term whose release
	// failed is still its current hold: Campaign cannot take the key
	// again under the old term's sequencer (see Lock.Lock, ErrLockHeld).
	lock *Lock

	mu   sync.Mutex
	lead *Leadership
	busy bool
}

// NewElection returns an Election on key for session s.
func NewElection(s *Session, key string) (*Election, error) {
	l, err := NewLock(s, key, nil)
	if err != nil {
		return nil, err
	}
	return &Election{s: s, key: key, lock: l}, nil
}

// Key is the election's key.
func (e *Election) Key() string { return e.key }

// Leader describes who leads, or that nobody does.
type Leader struct {
	// Vacant is true when nobody leads; the other fields are then zero,
	// except Sequencer.Key.
	Vacant bool
	// Value is the leader's value, as given to Campaign.
	Value []byte
	// Sequencer names the leader's term: a new term (even of the same
	// session) has a new LockIndex.
	Sequencer Sequencer
}

// Leadership is one term of office.
type Leadership struct {
	e    *Election
	hold *Hold
}

// Sequencer names this term; hand it to the resources the leader writes.
func (l *Leadership) Sequencer() Sequencer { return l.hold.Sequencer() }

// Lost is closed the moment the term ends: the key changed hands, or the
// session's policy says its holds are gone. Resign closes it too.
func (l *Leadership) Lost() <-chan struct{} { return l.hold.Lost() }

// Err says why the term ended, nil while it lasts.
func (l *Leadership) Err() error { return l.hold.Err() }

// Resign ends the term (see Hold.Unlock); call it also after Lost. If the
// release fails (the server did not answer) Resign returns the error and
// the term stays the Election's current one, so Campaign answers
// ErrAlreadyLeader until a Resign succeeds: the server may still hold the
// key for this term, and a new term must not begin under its sequencer.
func (l *Leadership) Resign(ctx context.Context) error {
	err := l.hold.Unlock(ctx)
	if err != nil && !errors.Is(err, ErrLockNotHeld) {
		return err
	}
	l.e.mu.Lock()
	if l.e.lead == l {
		l.e.lead = nil
	}
	l.e.mu.Unlock()
	if err != nil {
		return ErrNotLeader
	}
	return nil
}

// Campaign waits until the session leads, then returns the term, with
// value published as the leader's. It fails when ctx is done, and with
// ErrSessionLost as soon as the session's keeper reports it lost (a
// session the server invalidated is found at the keeper's next renewal,
// within half a TTL; a Campaign begun after that fails at once with the
// server's refusal).
func (e *Election) Campaign(ctx context.Context, value []byte) (*Leadership, error) {
	return e.campaignHook(ctx, value, nil)
}

// campaignHook is Campaign with the Lock's test hook.
func (e *Election) campaignHook(ctx context.Context, value []byte, hook func(string)) (*Leadership, error) {
	e.mu.Lock()
	switch {
	case e.lead != nil:
		e.mu.Unlock()
		return nil, ErrAlreadyLeader
	case e.busy:
		e.mu.Unlock()
		return nil, ErrCampaigning
	}
	e.busy = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.busy = false
		e.mu.Unlock()
	}()
	// busy makes this the only Campaign: nothing else uses the Lock's
	// value or hook now. Its acq orders this with a background cleanup.
	l := e.lock
	l.acq.Lock()
	l.value, l.hook = value, hook
	l.acq.Unlock()
	h, err := l.Lock(ctx)
	if err != nil {
		return nil, err
	}
	lead := &Leadership{e: e, hold: h}
	e.mu.Lock()
	e.lead = lead
	e.mu.Unlock()
	return lead, nil
}

// Resign ends the current term; ErrNotLeader if there is none.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	lead := e.lead
	e.mu.Unlock()
	if lead == nil {
		return ErrNotLeader
	}
	return lead.Resign(ctx)
}

// Leader reads who leads now; ErrNoLeader if nobody does.
func (e *Election) Leader(ctx context.Context) (*Leader, error) {
	p, _, err := e.s.c.KV().Get(ctx, e.key, &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		return nil, err
	}
	ld := e.leaderOf(p)
	if ld.Vacant {
		return nil, ErrNoLeader
	}
	return &ld, nil
}

func (e *Election) leaderOf(p *api.KVPair) Leader {
	if p == nil || p.Session == "" {
		return Leader{Vacant: true, Sequencer: Sequencer{Key: e.key}}
	}
	return Leader{Value: p.Value, Sequencer: Sequencer{Key: e.key, Session: p.Session, LockIndex: p.LockIndex}}
}

// Observe reports who leads: first the current state, then every change,
// each new term and each vacancy. Observe puts a vacancy between two
// different terms even when the office was never seen empty (a
// resignation hands the key to the next candidate in one step, and a
// short vacancy may fall between two reads): an observer sees leader,
// vacancy, leader, never two leaders in a row. An observer that falls behind may miss whole terms that began and
// ended while it was not reading, but never the vacancy before the term it
// sees next. A change of the leader's value within a term is not reported.
//
// The channel is closed when ctx is done. Observe does not need the
// session to live: it only reads.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	ch := make(chan Leader)
	go func() {
		defer close(ch)
		kv := e.s.c.KV()
		var (
			idx  uint64
			last *Leader
			errs int
		)
		send := func(ld Leader) bool {
			select {
			case ch <- ld:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for {
			p, qm, err := kv.Get(ctx, e.key, &api.QueryOptions{WaitIndex: idx})
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				errs++
				if clock.Sleep(ctx, e.s.clk, backoff(errs)) != nil {
					return
				}
				idx = 0
				continue
			}
			errs = 0
			idx = nextIndex(idx, qm.LastIndex)
			cur := e.leaderOf(p)
			switch {
			case last == nil:
			case last.Vacant && cur.Vacant:
				continue
			case !last.Vacant && !cur.Vacant && sameTerm(last, &cur):
				continue
			case !last.Vacant && !cur.Vacant:
				if !send(Leader{Vacant: true, Sequencer: Sequencer{Key: e.key}}) {
					return
				}
			}
			if !send(cur) {
				return
			}
			last = &cur
		}
	}()
	return ch
}

func sameTerm(a, b *Leader) bool {
	return a.Sequencer.Session == b.Sequencer.Session && a.Sequencer.LockIndex == b.Sequencer.LockIndex
}
