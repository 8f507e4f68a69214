package state_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// lockDelayFx: s1 (with the given LockDelay and behaviour) holds k and is
// destroyed at the stamped time it returns; s2 is left to try the key.
func lockDelayFx(t *testing.T, delay time.Duration, behavior string) (*fx, time.Time) {
	f := newFx(t)
	f.session("s1", func(s *state.Session) { s.LockDelay = delay; s.Behavior = behavior })
	f.session("s2", nil)
	f.lock("k", "s1", "v")
	f.now = f.now.Add(7*time.Minute + 3*time.Nanosecond)
	if err := f.s.SessionDestroy(f.next(), f.now, "s1"); err != nil {
		t.Fatal(err)
	}
	return f, f.now
}

// tryAcquire acquires k for s2 at the stamped time at and reports whether
// it worked; a refusal must write nothing.
func tryAcquire(t *testing.T, f *fx, at time.Time) bool {
	t.Helper()
	f.now = at
	before, tables := f.get("k"), f.indexes()
	ok, err := f.kvs(state.OpLock, state.DirEntry{Key: "k", Session: "s2", Value: []byte("mine")})
	if err != nil {
		t.Fatalf("acquire at %v: %v", at, err)
	}
	if !ok {
		assertEntry(t, "k after refused acquire", f.get("k"), before)
		f.assertNoWrite(tables)
	}
	return ok
}

func TestLockDelayToTheNanosecond(t *testing.T) {
	for _, behavior := range []string{state.BehaviorRelease, state.BehaviorDelete} {
		t.Run(behavior, func(t *testing.T) {
			f, T := lockDelayFx(t, 15*time.Second, behavior)
			if got := f.s.KVLockDelay("k"); !got.Equal(T.Add(15 * time.Second)) {
				t.Fatalf("KVLockDelay = %v, want %v", got, T.Add(15*time.Second))
			}
			if tryAcquire(t, f, T) {
				t.Fatal("acquired at the invalidation time")
			}
			if tryAcquire(t, f, T.Add(15*time.Second-time.Nanosecond)) {
				t.Fatal("acquired 1ns before the lock-delay ended")
			}
			// Plain writes are not held back by a lock-delay.
			f.set("k", "plain")
			if !tryAcquire(t, f, T.Add(15*time.Second)) {
				t.Fatal("refused once the lock-delay ended")
			}
			e := f.get("k")
			if e.Session != "s2" || string(e.Value) != "mine" || e.ModifyIndex != f.idx {
				t.Fatalf("k after acquire: %s", fmtEntry(e))
			}
		})
	}
}

func TestLockDelayZeroMeansNone(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		f, T := lockDelayFx(t, d, state.BehaviorRelease)
		if got := f.s.KVLockDelay("k"); !got.IsZero() {
			t.Fatalf("LockDelay %v: KVLockDelay = %v", d, got)
		}
		if !tryAcquire(t, f, T) {
			t.Fatalf("LockDelay %v: acquire refused", d)
		}
	}
}

func TestLockDelayClampedTo60s(t *testing.T) {
	f, T := lockDelayFx(t, 90*time.Second, state.BehaviorRelease)
	if got := f.s.KVLockDelay("k"); !got.Equal(T.Add(state.MaxLockDelay)) {
		t.Fatalf("KVLockDelay = %v, want %v", got, T.Add(state.MaxLockDelay))
	}
	if tryAcquire(t, f, T.Add(60*time.Second-time.Nanosecond)) {
		t.Fatal("acquired before the clamped delay ended")
	}
	if !tryAcquire(t, f, T.Add(60*time.Second)) {
		t.Fatal("refused after the clamped delay ended")
	}
	// The session keeps the LockDelay it was given.
	f.session("s3", func(s *state.Session) { s.LockDelay = 90 * time.Second })
	if _, s := f.s.SessionGet(nil, "s3"); s.LockDelay != 90*time.Second {
		t.Fatalf("stored LockDelay %v", s.LockDelay)
	}
}

func TestVoluntaryReleaseSetsNoDelay(t *testing.T) {
	f := newFx(t)
	f.session("s1", func(s *state.Session) { s.LockDelay = time.Minute })
	f.session("s2", nil)
	f.lock("k", "s1", "v")
	f.mustKVS(state.OpUnlock, state.DirEntry{Key: "k", Session: "s1"}, true)
	if got := f.s.KVLockDelay("k"); !got.IsZero() {
		t.Fatalf("release set a lock-delay until %v", got)
	}
	if !tryAcquire(t, f, f.now) {
		t.Fatal("acquire right after a release refused")
	}
	// A released key is not delayed when its former holder goes later.
	f.mustKVS(state.OpUnlock, state.DirEntry{Key: "k", Session: "s2"}, true)
	if err := f.s.SessionDestroy(f.next(), f.now, "s1"); err != nil {
		t.Fatal(err)
	}
	if got := f.s.KVLockDelay("k"); !got.IsZero() {
		t.Fatalf("destroying a former holder set a lock-delay until %v", got)
	}
}

// TestLockDelayLaterDeadlineWins: a second invalidation extends the delay.
func TestLockDelaySecondInvalidation(t *testing.T) {
	f, T := lockDelayFx(t, 15*time.Second, state.BehaviorRelease)
	if !tryAcquire(t, f, T.Add(15*time.Second)) {
		t.Fatal("acquire after delay refused")
	}
	f.now = T.Add(20 * time.Second)
	if err := f.s.SessionDestroy(f.next(), f.now, "s2"); err != nil { // s2 has 15s
		t.Fatal(err)
	}
	if got := f.s.KVLockDelay("k"); !got.Equal(T.Add(35 * time.Second)) {
		t.Fatalf("KVLockDelay = %v, want %v", got, T.Add(35*time.Second))
	}
}

// TestNoLockDelayNeverRefuses: a key without a lock-delay can be acquired
// whatever the stamped time, including times before 1970.
func TestNoLockDelayNeverRefuses(t *testing.T) {
	for _, at := range []time.Time{time.Unix(0, 0), time.Unix(-1, 0), time.Unix(0, -1)} {
		f := newFx(t)
		f.session("s1", nil)
		f.now = at
		ok, err := f.kvs(state.OpLock, state.DirEntry{Key: "k", Session: "s1"})
		if err != nil || !ok {
			t.Fatalf("acquire at %v: (%v, %v)", at, ok, err)
		}
		res, errs := f.s.Txn(f.next(), at, []*state.TxnOp{{KV: &state.KVRequest{Op: state.OpLock,
			Entry: state.DirEntry{Key: "k2", Session: "s1"}}}})
		if len(errs) != 0 || len(res) != 1 {
			t.Fatalf("txn lock at %v: %v %v", at, res, errs[0])
		}
	}
}

func TestLockDelaySurvivesSnapshot(t *testing.T) {
	f, T := lockDelayFx(t, 15*time.Second, state.BehaviorRelease)
	var buf bytes.Buffer
	if err := f.s.Snapshot().Persist(&buf); err != nil {
		t.Fatal(err)
	}
	restored, err := state.Restore(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := restored.KVLockDelay("k"); !got.Equal(T.Add(15 * time.Second)) {
		t.Fatalf("restored KVLockDelay = %v", got)
	}
	g := &fx{t: t, s: restored, idx: f.idx, now: f.now}
	if tryAcquire(t, g, T.Add(15*time.Second-time.Nanosecond)) {
		t.Fatal("restored store let the key be acquired during its lock-delay")
	}
	if !tryAcquire(t, g, T.Add(15*time.Second)) {
		t.Fatal("restored store refused after the lock-delay")
	}
}

func TestReap(t *testing.T) {
	f := newFx(t)
	f.session("short", func(s *state.Session) { s.LockDelay = 10 * time.Second })
	f.session("long", func(s *state.Session) { s.LockDelay = 30 * time.Second })
	f.session("s2", nil)
	f.lock("a", "short", "")
	f.lock("k", "long", "")
	f.set("t/1", "x")
	f.set("t/2", "x")
	f.set("u/1", "x")
	f.mustKVS(state.OpDelete, state.DirEntry{Key: "t/1"}, true)
	old := f.idx
	f.mustKVS(state.OpDelete, state.DirEntry{Key: "u/1"}, true)
	young := f.idx
	T := f.now
	for _, id := range []string{"short", "long"} {
		if err := f.s.SessionDestroy(f.next(), T, id); err != nil {
			t.Fatal(err)
		}
	}
	_, keysBefore := f.s.KVList(nil, "")
	_, sessBefore := f.s.SessionList(nil)
	tables := f.indexes()

	// At T+10s the short delay has ended (Until == now), the long has not.
	f.s.Reap(f.next(), T.Add(10*time.Second), old)
	f.assertNoWrite(tables)
	if got := f.s.KVLockDelay("a"); !got.IsZero() {
		t.Fatalf("ended delay on a not reaped: %v", got)
	}
	if got := f.s.KVLockDelay("k"); !got.Equal(T.Add(30 * time.Second)) {
		t.Fatalf("running delay on k reaped or changed: %v", got)
	}
	if got, want := tombstones(t, f.s), map[string]uint64{"u/1": young}; len(got) != 1 || got["u/1"] != want["u/1"] {
		t.Fatalf("tombstones after reap %v, want %v", got, want)
	}
	_, keysAfter := f.s.KVList(nil, "")
	_, sessAfter := f.s.SessionList(nil)
	if len(keysAfter) != len(keysBefore) || len(sessAfter) != len(sessBefore) {
		t.Fatalf("reap touched keys or sessions")
	}
	// Reaping does not lift a running delay.
	if tryAcquire(t, f, T.Add(30*time.Second-time.Nanosecond)) {
		t.Fatal("k acquired during its delay after a reap")
	}
}

// The holder re-acquiring its own key updates the value even while a
// lock-delay is recorded for the key (e.g. one stamped by a leader whose
// clock ran ahead): lock-delay keeps out new holders only.
func TestLockDelayDoesNotBlockHolderReacquire(t *testing.T) {
	s := state.New()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mustNil(t, s.Register(1, t0, &state.RegisterRequest{Node: "n1", Address: "127.0.0.1"}))
	mustNil(t, s.SessionCreate(2, &state.Session{ID: "a", Node: "n1", LockDelay: 15 * time.Second}))
	mustNil(t, s.SessionCreate(3, &state.Session{ID: "b", Node: "n1"}))
	if ok, err := s.KVS(4, t0, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: "a"}}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	mustNil(t, s.SessionDestroy(5, t0, "a"))
	// b takes the lock with a stamp behind the recorded delay's end.
	late := t0.Add(16 * time.Second)
	if ok, _ := s.KVS(6, late, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: "b"}}); !ok {
		t.Fatal("acquire after the delay failed")
	}
	mustNil(t, s.SessionDestroy(7, late, "b")) // b had no lock-delay: nothing new recorded
	mustNil(t, s.SessionCreate(8, &state.Session{ID: "c", Node: "n1", LockDelay: 30 * time.Second}))
	if ok, _ := s.KVS(9, late, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k2", Session: "c"}}); !ok {
		t.Fatal("acquire of k2 failed")
	}
	mustNil(t, s.SessionCreate(10, &state.Session{ID: "d", Node: "n1"}))
	mustNil(t, s.SessionDestroy(11, late, "c")) // k2 delayed until late+30s
	if ok, _ := s.KVS(12, late.Add(31*time.Second), &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k2", Session: "d"}}); !ok {
		t.Fatal("acquire of k2 by d failed")
	}
	// A stamp from a leader whose clock is behind: still inside the recorded
	// delay, yet d already holds k2, so its re-acquire must succeed.
	ok, err := s.KVS(13, late.Add(time.Second), &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k2", Session: "d", Value: []byte("v2")}})
	if !ok || err != nil {
		t.Fatalf("holder re-acquire during a recorded lock-delay = %v, %v", ok, err)
	}
	res, errs := s.Txn(14, late.Add(time.Second), []*state.TxnOp{{KV: &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k2", Session: "d", Value: []byte("v3")}}}})
	if len(errs) != 0 || len(res) != 1 {
		t.Fatalf("txn re-acquire by holder = %v, %v", res, errs)
	}
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
