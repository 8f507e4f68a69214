package state_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/state"
)

// FuzzKVModel decodes the fuzz input into a sequence of commands over a
// small alphabet of keys, sessions and checks, applies each to a Store
// through fsm.Dispatch (so every command also makes the JSON trip a log
// entry makes) and to a dumb map-based model of the spec, and after every
// step compares the two: every key's Value, Flags, Session, LockIndex,
// CreateIndex and ModifyIndex, the index each read reports, lock-delays,
// sessions and table indexes. It also checks the invariants on their own:
// a key is held by at most one session and that session exists; a key that
// was not deleted never sees its LockIndex or ModifyIndex go down.
func FuzzKVModel(f *testing.F) {
	for _, seed := range fuzzSeeds {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		runModel(t, data)
	})
}

var (
	fzKeys     = []string{"a", "a/b", "a/c", "ab", "b"}
	fzPrefixes = []string{"", "a", "a/", "b", "zz"}
	fzIDs      = []string{"s0", "s1", "s2"}
	fzSessRefs = []string{"s0", "s1", "s2", "", "nope"} // sessions as requests name them
	fzValues   = []string{"", "x", "y"}
	fzChecks   = []string{"c0", "c1"}
	fzAdvance  = []time.Duration{time.Nanosecond, time.Second, 15*time.Second - time.Nanosecond,
		15 * time.Second, 60 * time.Second, 0}
	fzDelays   = []time.Duration{0, time.Nanosecond, 15 * time.Second, 90 * time.Second}
	fzStatuses = []string{state.HealthPassing, state.HealthWarning, state.HealthCritical, ""}
)

const fzNode = "n1"

// ---- the model ----

type mEntry struct {
	Value                  string
	Flags                  uint64
	Session                string
	LockIndex, Create, Mod uint64
}

type mSession struct {
	delay    time.Duration
	behavior string
	checks   []string
}

type model struct {
	now      time.Time
	kv       map[string]mEntry
	tombs    map[string]uint64
	delays   map[string]time.Time
	sessions map[string]mSession
	checks   map[string]string // registered check -> status
	node     bool
	kvsIdx   uint64
	sessIdx  uint64
	// lockFloor is the highest LockIndex of a deleted key: a key's first
	// acquisition counts on from it.
	lockFloor uint64
}

func newModel() *model {
	return &model{now: t0, kv: map[string]mEntry{}, tombs: map[string]uint64{},
		delays: map[string]time.Time{}, sessions: map[string]mSession{}, checks: map[string]string{}}
}

func (m *model) clone() *model {
	c := *m
	c.kv = map[string]mEntry{}
	for k, v := range m.kv {
		c.kv[k] = v
	}
	c.tombs = map[string]uint64{}
	for k, v := range m.tombs {
		c.tombs[k] = v
	}
	c.delays = map[string]time.Time{}
	for k, v := range m.delays {
		c.delays[k] = v
	}
	c.sessions = map[string]mSession{}
	for k, v := range m.sessions {
		c.sessions[k] = v
	}
	c.checks = map[string]string{}
	for k, v := range m.checks {
		c.checks[k] = v
	}
	return &c
}

func (m *model) set(idx uint64, k, v string, flags uint64) bool {
	old, ok := m.kv[k]
	if ok && old.Value == v && old.Flags == flags {
		return true
	}
	if ok {
		old.Value, old.Flags, old.Mod = v, flags, idx
		m.kv[k] = old
	} else {
		m.kv[k] = mEntry{Value: v, Flags: flags, Create: idx, Mod: idx}
	}
	m.kvsIdx = idx
	return true
}

func (m *model) cas(idx uint64, k, v string, flags, cas uint64) bool {
	old, ok := m.kv[k]
	if (cas == 0 && ok) || (cas != 0 && (!ok || old.Mod != cas)) {
		return false
	}
	return m.set(idx, k, v, flags)
}

func (m *model) delayed(k string) bool {
	until, ok := m.delays[k]
	return ok && m.now.Before(until)
}

func (m *model) lock(idx uint64, k, s, v string, flags uint64) (bool, error) {
	if s == "" {
		return false, state.ErrMissingSession
	}
	if _, ok := m.sessions[s]; !ok {
		return false, state.ErrInvalidSession
	}
	if m.delayed(k) {
		return false, nil
	}
	old, ok := m.kv[k]
	switch {
	case !ok:
		m.kv[k] = mEntry{Value: v, Flags: flags, Session: s, LockIndex: m.lockFloor + 1, Create: idx, Mod: idx}
	case old.Session == s:
		if old.Value == v && old.Flags == flags {
			return true, nil
		}
		old.Value, old.Flags, old.Mod = v, flags, idx
		m.kv[k] = old
	case old.Session != "":
		return false, nil
	default:
		base := old.LockIndex
		if base == 0 {
			base = m.lockFloor
		}
		old.Value, old.Flags, old.Session, old.LockIndex, old.Mod = v, flags, s, base+1, idx
		m.kv[k] = old
	}
	m.kvsIdx = idx
	return true, nil
}

func (m *model) unlock(idx uint64, k, s, v string, flags, fence uint64) (bool, error) {
	if s == "" {
		return false, state.ErrMissingSession
	}
	old, ok := m.kv[k]
	if !ok || old.Session != s || (fence != 0 && fence != old.LockIndex) {
		return false, nil
	}
	old.Value, old.Flags, old.Session, old.Mod = v, flags, "", idx
	m.kv[k] = old
	m.kvsIdx = idx
	return true, nil
}

func (m *model) del(idx uint64, k string) bool {
	if _, ok := m.kv[k]; ok {
		m.drop(idx, k)
		m.kvsIdx = idx
	}
	return true
}

// drop deletes k, leaving its tombstone and raising the lock floor.
func (m *model) drop(idx uint64, k string) {
	if li := m.kv[k].LockIndex; li > m.lockFloor {
		m.lockFloor = li
	}
	delete(m.kv, k)
	m.tombs[k] = idx
}

func (m *model) delCAS(idx uint64, k string, cas uint64) bool {
	old, ok := m.kv[k]
	if !ok {
		return true
	}
	if old.Mod != cas {
		return false
	}
	return m.del(idx, k)
}

func (m *model) delTree(idx uint64, p string) bool {
	any := false
	for k := range m.kv {
		if strings.HasPrefix(k, p) {
			m.drop(idx, k)
			any = true
		}
	}
	if any {
		if p != "" {
			m.tombs[p] = idx
		}
		m.kvsIdx = idx
	}
	return true
}

func (m *model) create(idx uint64, id string, s mSession) error {
	if _, ok := m.sessions[id]; ok {
		return state.ErrInvalidRequest
	}
	if !m.node {
		return state.ErrMissingNode
	}
	for _, c := range s.checks {
		st, ok := m.checks[c]
		if !ok {
			return state.ErrMissingCheck
		}
		if st == state.HealthCritical {
			return state.ErrCriticalCheck
		}
	}
	m.sessions[id] = s
	m.sessIdx = idx
	return nil
}

func (m *model) invalidate(idx uint64, id string) {
	sess, ok := m.sessions[id]
	if !ok {
		return
	}
	delete(m.sessions, id)
	m.sessIdx = idx
	for k, e := range m.kv {
		if e.Session != id {
			continue
		}
		if sess.behavior == state.BehaviorDelete {
			m.drop(idx, k)
		} else {
			e.Session, e.Mod = "", idx
			m.kv[k] = e
		}
		m.kvsIdx = idx
		if d := sess.delay; d > 0 {
			if d > 60*time.Second {
				d = 60 * time.Second
			}
			until := m.now.Add(d)
			if cur, ok := m.delays[k]; !ok || until.After(cur) {
				m.delays[k] = until
			}
		}
	}
}

func (m *model) invalidateCheck(idx uint64, c string) {
	for id, s := range m.sessions {
		for _, sc := range s.checks {
			if sc == c {
				m.invalidate(idx, id)
				break
			}
		}
	}
}

func (m *model) setCheck(idx uint64, c, status string) {
	if status == "" {
		status = state.HealthCritical
	}
	m.node = true
	m.checks[c] = status
	if status == state.HealthCritical {
		m.invalidateCheck(idx, c)
	}
}

func (m *model) reap(upTo uint64) {
	for k, i := range m.tombs {
		if i <= upTo {
			delete(m.tombs, k)
		}
	}
	for k, until := range m.delays {
		if !m.now.Before(until) {
			delete(m.delays, k)
		}
	}
}

// nextDelayEnd is the earliest lock-delay end after now.
func (m *model) nextDelayEnd() (time.Time, bool) {
	var next time.Time
	for _, until := range m.delays {
		if until.After(m.now) && (next.IsZero() || until.Before(next)) {
			next = until
		}
	}
	return next, !next.IsZero()
}

// listIndex is the index a KVList/KVKeys of prefix p must report.
func (m *model) listIndex(p string) uint64 {
	if p == "" {
		return m.kvsIdx
	}
	var max uint64
	for k, e := range m.kv {
		if strings.HasPrefix(k, p) && e.Mod > max {
			max = e.Mod
		}
	}
	for k, i := range m.tombs {
		if strings.HasPrefix(k, p) && i > max {
			max = i
		}
	}
	if max == 0 {
		return m.kvsIdx
	}
	return max
}

// txnOp applies one transaction operation to the model and reports
// whether it succeeded.
func (m *model) txnOp(idx uint64, op *state.KVRequest) bool {
	e := op.Entry
	cur, ok := m.kv[e.Key]
	switch op.Op {
	case state.OpGet:
		return ok
	case state.OpCheckIndex:
		return ok && cur.Mod == e.ModifyIndex
	case state.OpCheckSession:
		return ok && cur.Session == e.Session
	case state.OpCheckLock, state.OpCheckSequencer: // no semaphore flags here: both check a lock
		return ok && e.Session != "" && cur.Session == e.Session && cur.LockIndex == e.LockIndex
	case state.OpCheckNotExists:
		return !ok
	case state.OpSet:
		return m.set(idx, e.Key, string(e.Value), e.Flags)
	case state.OpCAS:
		return m.cas(idx, e.Key, string(e.Value), e.Flags, e.ModifyIndex)
	case state.OpLock:
		ok, err := m.lock(idx, e.Key, e.Session, string(e.Value), e.Flags)
		return ok && err == nil
	case state.OpUnlock:
		ok, err := m.unlock(idx, e.Key, e.Session, string(e.Value), e.Flags, e.LockIndex)
		return ok && err == nil
	case state.OpDelete:
		return m.del(idx, e.Key)
	case state.OpDeleteCAS:
		return m.delCAS(idx, e.Key, e.ModifyIndex)
	case state.OpDeleteTree:
		return m.delTree(idx, e.Key)
	}
	panic("model: unknown txn verb " + string(op.Op))
}

// ---- decoding and running ----

type fzReader struct{ b []byte }

func (r *fzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fzReader) pick(n int) int { return int(r.byte()) % n }

type runner struct {
	t    *testing.T
	s    *state.Store
	m    *model
	idx  uint64
	log  []string
	prev map[string]*state.DirEntry
	// seqs maps every sequencer seen, "key\x00LockIndex\x00session", to
	// the CreateIndex of the key's life that gave it: a sequencer must
	// never come back in a later life of the key.
	seqs map[string]uint64
}

func (r *runner) failf(format string, args ...interface{}) {
	r.t.Helper()
	r.t.Fatalf("step %d (%s): %s\nsteps:\n  %s", len(r.log), r.log[len(r.log)-1],
		fmt.Sprintf(format, args...), strings.Join(r.log, "\n  "))
}

// apply sends one command through fsm.Dispatch at the next index.
func (r *runner) apply(t fsm.Type, body interface{}) *fsm.Result {
	b, err := json.Marshal(body)
	if err != nil {
		r.t.Fatal(err)
	}
	r.idx++
	return fsm.Dispatch(r.s, r.idx, r.m.now, t, b)
}

// casFor turns a selector byte into a CAS index for key k: 0, the key's
// ModifyIndex, one less, or a small raw number.
func (r *runner) casFor(rd *fzReader, k string) uint64 {
	cur := r.m.kv[k].Mod
	switch sel := rd.byte(); sel % 4 {
	case 0:
		return 0
	case 1:
		return cur
	case 2:
		return cur - 1
	default:
		return uint64(sel / 4)
	}
}

// lockIndexFor: 0, the key's LockIndex, one less, one more.
func (r *runner) lockIndexFor(rd *fzReader, k string) uint64 {
	cur := r.m.kv[k].LockIndex
	return [...]uint64{0, cur, cur - 1, cur + 1}[rd.pick(4)]
}

func (r *runner) kvReq(rd *fzReader) *state.KVRequest {
	k := fzKeys[rd.pick(len(fzKeys))]
	e := state.DirEntry{Key: k, Value: []byte(fzValues[rd.pick(len(fzValues))]), Flags: uint64(rd.pick(2))}
	verbs := []state.KVOp{state.OpSet, state.OpCAS, state.OpLock, state.OpUnlock, state.OpDelete,
		state.OpDeleteCAS, state.OpDeleteTree, state.OpGet, state.OpCheckIndex, state.OpCheckSession,
		state.OpCheckLock, state.OpCheckNotExists}
	op := verbs[rd.pick(len(verbs))]
	if op == state.OpCheckLock {
		// What the check-lock verb sends since permits could be fenced
		// (the corpus keeps its meaning: the pick is the same).
		op = state.OpCheckSequencer
	}
	switch op {
	case state.OpSet:
		// Junk a plain write must ignore.
		e.Session, e.LockIndex = fzSessRefs[rd.pick(len(fzSessRefs))], uint64(rd.pick(3))
	case state.OpCAS, state.OpDeleteCAS, state.OpCheckIndex:
		e.ModifyIndex = r.casFor(rd, k)
	case state.OpLock, state.OpCheckSession:
		e.Session = fzSessRefs[rd.pick(len(fzSessRefs))]
	case state.OpUnlock, state.OpCheckSequencer:
		e.Session = fzSessRefs[rd.pick(len(fzSessRefs))]
		e.LockIndex = r.lockIndexFor(rd, k)
	case state.OpDeleteTree:
		e.Key = fzPrefixes[rd.pick(len(fzPrefixes))]
	}
	return &state.KVRequest{Op: op, Entry: e}
}

func (r *runner) expectErr(what string, got, want error) {
	r.t.Helper()
	if want == nil && got != nil || want != nil && !errors.Is(got, want) {
		r.failf("%s: err = %v, want %v", what, got, want)
	}
}

func (r *runner) step(rd *fzReader) {
	m := r.m
	switch rd.pick(16) {
	case 0, 1, 2, 3, 4, 5, 6, 7: // a single KV write
		req := r.kvReq(rd)
		switch req.Op {
		case state.OpGet, state.OpCheckIndex, state.OpCheckSession, state.OpCheckSequencer, state.OpCheckNotExists:
			req.Op = state.OpSet // reads are not KVS writes; reuse the bytes
			req.Entry.Session = ""
		}
		r.log = append(r.log, fmt.Sprintf("@%d %s %q v=%q f=%d s=%q cas=%d li=%d", r.idx+1, req.Op, req.Entry.Key,
			req.Entry.Value, req.Entry.Flags, req.Entry.Session, req.Entry.ModifyIndex, req.Entry.LockIndex))
		res := r.apply(fsm.TypeKVS, req)
		e := req.Entry
		var ok bool
		var err error
		switch req.Op {
		case state.OpSet:
			ok = m.set(r.idx, e.Key, string(e.Value), e.Flags)
		case state.OpCAS:
			ok = m.cas(r.idx, e.Key, string(e.Value), e.Flags, e.ModifyIndex)
		case state.OpLock:
			ok, err = m.lock(r.idx, e.Key, e.Session, string(e.Value), e.Flags)
		case state.OpUnlock:
			ok, err = m.unlock(r.idx, e.Key, e.Session, string(e.Value), e.Flags, e.LockIndex)
		case state.OpDelete:
			ok = m.del(r.idx, e.Key)
		case state.OpDeleteCAS:
			ok = m.delCAS(r.idx, e.Key, e.ModifyIndex)
		case state.OpDeleteTree:
			ok = m.delTree(r.idx, e.Key)
		}
		r.expectErr("kvs", res.Err, err)
		if res.OK != ok {
			r.failf("kvs: ok = %v, want %v", res.OK, ok)
		}
	case 8: // session create
		id := fzIDs[rd.pick(len(fzIDs))]
		s := mSession{delay: fzDelays[rd.pick(len(fzDelays))],
			behavior: []string{state.BehaviorRelease, state.BehaviorDelete}[rd.pick(2)]}
		s.checks = [][]string{nil, {"c0"}, {"c1"}, {"c0", "c1"}}[rd.pick(4)]
		r.log = append(r.log, fmt.Sprintf("@%d create %s delay=%v %s checks=%v", r.idx+1, id, s.delay, s.behavior, s.checks))
		res := r.apply(fsm.TypeSessionCreate, &state.Session{ID: id, Node: fzNode, LockDelay: s.delay,
			Behavior: s.behavior, NodeChecks: s.checks})
		r.expectErr("session create", res.Err, m.create(r.idx, id, s))
	case 9: // session destroy
		id := fzSessRefs[rd.pick(len(fzSessRefs))]
		r.log = append(r.log, fmt.Sprintf("@%d destroy %q at %v", r.idx+1, id, m.now.Sub(t0)))
		res := r.apply(fsm.TypeSessionDestroy, &fsm.SessionDestroy{ID: id})
		r.expectErr("session destroy", res.Err, nil)
		m.invalidate(r.idx, id)
	case 10: // time passes: a fixed step, or to (or 1ns short of) the
		// end of the next lock-delay, where the boundaries are.
		var d time.Duration
		switch sel := rd.pick(len(fzAdvance) + 2); {
		case sel < len(fzAdvance):
			d = fzAdvance[sel]
		default:
			d = time.Nanosecond
			if next, ok := m.nextDelayEnd(); ok {
				d = next.Sub(m.now)
				if sel > len(fzAdvance) {
					d -= time.Nanosecond
				}
			}
		}
		r.log = append(r.log, fmt.Sprintf("advance %v", d))
		m.now = m.now.Add(d)
	case 11: // a check changes state
		c, st := fzChecks[rd.pick(len(fzChecks))], fzStatuses[rd.pick(len(fzStatuses))]
		r.log = append(r.log, fmt.Sprintf("@%d check %s %q at %v", r.idx+1, c, st, m.now.Sub(t0)))
		res := r.apply(fsm.TypeRegister, &state.RegisterRequest{Node: fzNode, SkipNodeUpdate: true,
			Check: &state.HealthCheck{CheckID: c, Status: st}})
		r.expectErr("register", res.Err, nil)
		m.setCheck(r.idx, c, st)
	case 12: // a check, or the whole node, goes away
		sel := rd.pick(len(fzChecks) + 1)
		req := &state.DeregisterRequest{Node: fzNode}
		if sel < len(fzChecks) {
			req.CheckID = fzChecks[sel]
		}
		r.log = append(r.log, fmt.Sprintf("@%d deregister %+v at %v", r.idx+1, *req, m.now.Sub(t0)))
		res := r.apply(fsm.TypeDeregister, req)
		r.expectErr("deregister", res.Err, nil)
		switch {
		case req.CheckID != "":
			if _, ok := m.checks[req.CheckID]; ok {
				delete(m.checks, req.CheckID)
				m.invalidateCheck(r.idx, req.CheckID)
			}
		case m.node:
			for id := range m.sessions {
				m.invalidate(r.idx, id)
			}
			m.checks = map[string]string{}
			m.node = false
		}
	case 13: // a transaction
		n := 1 + rd.pick(3)
		ops := make([]*state.TxnOp, n)
		descr := make([]string, n)
		for i := range ops {
			req := r.kvReq(rd)
			ops[i] = &state.TxnOp{KV: req}
			descr[i] = fmt.Sprintf("%s %q v=%q s=%q cas=%d li=%d", req.Op, req.Entry.Key, req.Entry.Value,
				req.Entry.Session, req.Entry.ModifyIndex, req.Entry.LockIndex)
		}
		r.log = append(r.log, fmt.Sprintf("@%d txn [%s]", r.idx+1, strings.Join(descr, "; ")))
		// Alternately as the JSON command of older logs and as the binary
		// one the server writes now.
		var res *fsm.Result
		if r.idx%2 == 0 {
			res = r.apply(fsm.TypeTxn, ops)
		} else {
			data, err := fsm.EncodeTxn(r.m.now, ops)
			if err != nil {
				r.t.Fatal(err)
			}
			r.idx++
			res = fsm.DispatchCommand(r.s, r.idx, data)
		}
		c := m.clone()
		var want []int
		for i, op := range ops {
			if !c.txnOp(r.idx, op.KV) {
				want = append(want, i)
			}
		}
		var got []int
		for _, e := range res.TxnErrors {
			got = append(got, e.OpIndex)
		}
		if !reflect.DeepEqual(got, want) {
			r.failf("txn: failing ops %v, want %v (%+v)", got, want, res.TxnErrors)
		}
		if len(want) == 0 {
			*m = *c
			if !res.OK {
				r.failf("txn: OK false without errors")
			}
		} else if res.TxnResult != nil {
			r.failf("txn: results from a failed txn")
		}
	case 14: // reap
		upTo := r.idx - uint64(rd.pick(8))
		r.log = append(r.log, fmt.Sprintf("@%d reap upTo=%d at %v", r.idx+1, upTo, m.now.Sub(t0)))
		r.apply(fsm.TypeReap, &fsm.Reap{TombstonesUpTo: upTo})
		m.reap(upTo)
	case 15: // snapshot and restore
		r.log = append(r.log, "snapshot+restore")
		var buf bytes.Buffer
		if err := r.s.Snapshot().Persist(&buf); err != nil {
			r.failf("persist: %v", err)
		}
		s, err := state.Restore(&buf)
		if err != nil {
			r.failf("restore: %v", err)
		}
		r.s = s
	}
	r.compare()
}

// compare checks the store against the model and the invariants.
func (r *runner) compare() {
	r.t.Helper()
	m, s := r.m, r.s
	for _, k := range fzKeys {
		idx, e := s.KVGet(nil, k)
		want, ok := m.kv[k]
		switch {
		case !ok && e != nil:
			r.failf("key %q exists in the store: %s", k, fmtEntry(e))
		case ok && e == nil:
			r.failf("key %q missing from the store, model %+v", k, want)
		case ok:
			got := mEntry{Value: string(e.Value), Flags: e.Flags, Session: e.Session, LockIndex: e.LockIndex,
				Create: e.CreateIndex, Mod: e.ModifyIndex}
			if got != want {
				r.failf("key %q:\n store %+v\n model %+v", k, got, want)
			}
			if idx != want.Mod {
				r.failf("KVGet %q index %d, want %d", k, idx, want.Mod)
			}
		default:
			if idx != m.kvsIdx {
				r.failf("KVGet absent %q index %d, want %d", k, idx, m.kvsIdx)
			}
		}
		if e != nil && e.Session != "" {
			sq := fmt.Sprintf("%s\x00%d\x00%s", k, e.LockIndex, e.Session)
			if c, seen := r.seqs[sq]; seen && c != e.CreateIndex {
				r.failf("sequencer (%q, %d, %s) of the key created at %d is handed out again by the key created at %d",
					k, e.LockIndex, e.Session, c, e.CreateIndex)
			}
			r.seqs[sq] = e.CreateIndex
			if _, sess := s.SessionGet(nil, e.Session); sess == nil {
				r.failf("key %q held by session %q, which does not exist", k, e.Session)
			}
		}
		if p := r.prev[k]; p != nil && e != nil {
			if e.ModifyIndex < p.ModifyIndex {
				r.failf("key %q ModifyIndex went back from %d to %d", k, p.ModifyIndex, e.ModifyIndex)
			}
			if e.CreateIndex == p.CreateIndex && e.LockIndex < p.LockIndex {
				r.failf("key %q LockIndex went back from %d to %d", k, p.LockIndex, e.LockIndex)
			}
		}
		if e == nil {
			delete(r.prev, k)
		} else {
			c := *e
			r.prev[k] = &c
		}
		if got, want := s.KVLockDelay(k), m.delays[k]; !got.Equal(want) {
			r.failf("lock-delay of %q until %v, want %v", k, got, want)
		}
	}
	for _, p := range fzPrefixes {
		idx, es := s.KVList(nil, p)
		kidx, keys := s.KVKeys(nil, p, "")
		var got, want []string
		for _, e := range es {
			got = append(got, e.Key)
		}
		for k := range m.kv {
			if strings.HasPrefix(k, p) {
				want = append(want, k)
			}
		}
		sort.Strings(want)
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(keys, want) {
			r.failf("list %q: KVList %q, KVKeys %q, want %q", p, got, keys, want)
		}
		if w := m.listIndex(p); idx != w || kidx != w {
			r.failf("list %q: KVList index %d, KVKeys index %d, want %d", p, idx, kidx, w)
		}
	}
	_, ss := s.SessionList(nil)
	var got, want []string
	for _, x := range ss {
		got = append(got, x.ID)
	}
	for id := range m.sessions {
		want = append(want, id)
	}
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		r.failf("sessions %v, want %v", got, want)
	}
	if i := s.TableIndex("kvs"); i != m.kvsIdx {
		r.failf("kvs table index %d, want %d", i, m.kvsIdx)
	}
	if i := s.TableIndex("sessions"); i != m.sessIdx {
		r.failf("sessions table index %d, want %d", i, m.sessIdx)
	}
}

func runModel(t *testing.T, data []byte) {
	r := &runner{t: t, s: state.New(), m: newModel(), prev: map[string]*state.DirEntry{}, seqs: map[string]uint64{}}
	r.log = append(r.log, "@1 register n1 with c0, c1 passing")
	res := r.apply(fsm.TypeRegister, &state.RegisterRequest{Node: fzNode, Checks: []*state.HealthCheck{
		{CheckID: "c0", Status: state.HealthPassing}, {CheckID: "c1", Status: state.HealthPassing}}})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	r.m.setCheck(r.idx, "c0", state.HealthPassing)
	r.m.setCheck(r.idx, "c1", state.HealthPassing)
	rd := &fzReader{b: data}
	for steps := 0; len(rd.b) > 0 && steps < 200; steps++ {
		r.step(rd)
	}
	// Tombstones have no reader; compare them once at the end.
	if got := tombstones(t, r.s); !reflect.DeepEqual(got, r.m.tombs) {
		r.log = append(r.log, "end")
		r.failf("tombstones %v, want %v", got, r.m.tombs)
	}
	if testing.Verbose() && len(data) < 200 {
		t.Log(strings.Join(r.log, "\n  "))
	}
}

// Seed inputs, written with a small encoder that mirrors the decoder
// (runner.step, runner.kvReq); indexes are into the fz* alphabets.
const (
	vSet byte = iota
	vCAS
	vLock
	vUnlock
	vDelete
	vDeleteCAS
	vDeleteTree
	vGet
	vCheckIndex
	vCheckSession
	vCheckLock
	vCheckNotExists
)

// kvBody: key, value, flags, verb, then the verb's arguments (a session
// ref, a CAS selector, a LockIndex selector, a prefix...).
func kvBody(verb, key, val, flags byte, args ...byte) []byte {
	return append([]byte{key, val, flags, verb}, args...)
}
func sKV(verb, key, val, flags byte, args ...byte) []byte {
	return append([]byte{0}, kvBody(verb, key, val, flags, args...)...)
}
func sCreate(id, delay, behavior, checks byte) []byte { return []byte{8, id, delay, behavior, checks} }
func sDestroy(ref byte) []byte                        { return []byte{9, ref} }
func sAdvance(d byte) []byte                          { return []byte{10, d} }
func sCheck(c, status byte) []byte                    { return []byte{11, c, status} }
func sDeregister(sel byte) []byte                     { return []byte{12, sel} }
func sReap(back byte) []byte                          { return []byte{14, back} }
func sSnapshot() []byte                               { return []byte{15} }
func sTxn(ops ...[]byte) []byte {
	out := []byte{13, byte(len(ops) - 1)}
	for _, op := range ops {
		out = append(out, op...)
	}
	return out
}
func seed(steps ...[]byte) []byte {
	var out []byte
	for _, s := range steps {
		out = append(out, s...)
	}
	return out
}

var fuzzSeeds = [][]byte{
	{},
	// Lock-delay: s0 (15s) holds a and is destroyed; s1 is refused until
	// 15s have passed (15s-1ns, then 1ns more).
	seed(sCreate(0, 2, 0, 0), sCreate(1, 0, 0, 0), sKV(vLock, 0, 1, 0, 0), sDestroy(0),
		sKV(vLock, 0, 2, 0, 1), sAdvance(2), sKV(vLock, 0, 2, 0, 1), sAdvance(0), sKV(vLock, 0, 2, 1, 1)),
	// A delete-behaviour session bound to c0 holding a/b; c0 goes critical.
	seed(sCreate(0, 3, 1, 1), sKV(vLock, 1, 1, 0, 0), sKV(vLock, 2, 1, 0, 0), sCheck(0, 2),
		sKV(vLock, 1, 0, 0, 1), sAdvance(4), sCreate(1, 0, 0, 1), sCheck(0, 0), sCreate(1, 0, 0, 1),
		sKV(vLock, 1, 0, 0, 1)),
	// Plain writes on a held key keep the lock; junk session on a new key.
	seed(sCreate(2, 0, 0, 0), sKV(vSet, 3, 1, 0, 2, 2), sKV(vLock, 3, 1, 0, 2), sKV(vSet, 3, 2, 1, 0, 0),
		sKV(vCAS, 3, 1, 0, 1), sKV(vUnlock, 3, 0, 0, 2, 2), sKV(vUnlock, 3, 0, 0, 2, 1),
		sKV(vLock, 3, 0, 0, 2), sKV(vUnlock, 3, 0, 0, 2, 0)),
	// Deletes, tombstones, list indexes, reap and a snapshot in between.
	seed(sKV(vSet, 0, 1, 0, 3, 0), sKV(vSet, 1, 1, 0, 3, 0), sKV(vSet, 2, 2, 0, 3, 0),
		sKV(vDeleteCAS, 1, 0, 0, 2), sKV(vDeleteCAS, 1, 0, 0, 1), sKV(vDelete, 4, 0, 0),
		sKV(vDeleteTree, 0, 0, 0, 2), sSnapshot(), sKV(vSet, 4, 1, 0, 3, 0), sReap(1), sKV(vDeleteTree, 0, 0, 0, 0)),
	// Transactions: a successful lock + check-lock, then one that fails
	// half-way and must leave nothing behind.
	seed(sCreate(1, 2, 0, 0), sTxn(kvBody(vLock, 0, 1, 0, 1), kvBody(vCheckLock, 0, 0, 0, 1, 3)),
		sTxn(kvBody(vSet, 4, 1, 0, 3, 0), kvBody(vCheckIndex, 0, 0, 0, 2), kvBody(vDelete, 0, 0, 0)),
		sDestroy(1), sCreate(0, 0, 0, 0), sTxn(kvBody(vLock, 0, 0, 0, 0)), sAdvance(3),
		sTxn(kvBody(vLock, 0, 0, 0, 0), kvBody(vCheckSession, 0, 0, 0, 0), kvBody(vCheckNotExists, 4, 0, 0))),
	// Node and check deregistration with sessions bound to both checks.
	seed(sCreate(0, 2, 0, 3), sCreate(1, 2, 1, 2), sCreate(2, 1, 0, 0), sKV(vLock, 0, 1, 0, 0),
		sKV(vLock, 4, 1, 0, 1), sKV(vLock, 2, 1, 0, 2), sDeregister(1), sDeregister(2), sCreate(0, 0, 0, 0),
		sCheck(0, 3), sCreate(0, 0, 0, 0)),
}
