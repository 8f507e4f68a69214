package state_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

func kvOp(op state.KVOp, e state.DirEntry) *state.TxnOp {
	return &state.TxnOp{KV: &state.KVRequest{Op: op, Entry: e}}
}

func (f *fx) txn(ops ...*state.TxnOp) ([]*state.TxnResult, []*state.TxnError) {
	return f.s.Txn(f.next(), f.now, ops)
}

func TestTxnAllOrNothing(t *testing.T) {
	f := newFx(t)
	f.session("s1", nil)
	f.set("keep", "old")
	before := f.indexes()
	_, keysBefore := f.s.KVList(nil, "")
	res, errs := f.txn(
		kvOp(state.OpSet, state.DirEntry{Key: "a", Value: []byte("1")}),
		kvOp(state.OpLock, state.DirEntry{Key: "b", Session: "s1"}),
		kvOp(state.OpDelete, state.DirEntry{Key: "keep"}),
		kvOp(state.OpCAS, state.DirEntry{Key: "c", Value: []byte("3"), ModifyIndex: 99}), // fails
		kvOp(state.OpSet, state.DirEntry{Key: "keep", Value: []byte("new")}),
		kvOp(state.OpGet, state.DirEntry{Key: "zz"}), // fails
		kvOp(state.OpDeleteTree, state.DirEntry{Key: ""}),
	)
	if res != nil {
		t.Fatalf("results from a failed txn: %v", res)
	}
	if len(errs) != 2 || errs[0].OpIndex != 3 || errs[1].OpIndex != 5 {
		t.Fatalf("errors %+v", errs)
	}
	f.assertNoWrite(before)
	_, keysAfter := f.s.KVList(nil, "")
	if !reflect.DeepEqual(keysAfter, keysBefore) {
		t.Fatalf("failed txn left keys: %v", keysAfter)
	}
	if got := tombstones(t, f.s); len(got) != 0 {
		t.Fatalf("failed txn left tombstones %v", got)
	}

	// Later ops see the effects of earlier ones.
	res, errs = f.txn(
		kvOp(state.OpSet, state.DirEntry{Key: "a", Value: []byte("1")}),
		kvOp(state.OpCheckIndex, state.DirEntry{Key: "a", ModifyIndex: f.idx + 1}),
		kvOp(state.OpLock, state.DirEntry{Key: "a", Session: "s1", Value: []byte("2")}),
		kvOp(state.OpCheckLock, state.DirEntry{Key: "a", Session: "s1", LockIndex: 1}),
		kvOp(state.OpGet, state.DirEntry{Key: "a"}),
	)
	if errs != nil {
		t.Fatalf("errs %v", errs[0])
	}
	if len(res) != 5 || string(res[4].KV.Value) != "2" || res[2].KV.LockIndex != 1 {
		t.Fatalf("results %v", res)
	}
	if got := f.s.TableIndex("kvs"); got != f.idx {
		t.Fatalf("kvs index %d, want %d", got, f.idx)
	}
}

func TestTxnVerbs(t *testing.T) {
	f := newFx(t)
	f.session("s1", nil)
	f.session("s2", nil)
	f.mustKVS(state.OpSet, state.DirEntry{Key: "t/a", Value: []byte("A"), Flags: 1}, true)
	ta := f.idx
	f.mustKVS(state.OpSet, state.DirEntry{Key: "t/b", Value: []byte("B")}, true)
	f.lock("held", "s1", "H")
	f.mustKVS(state.OpUnlock, state.DirEntry{Key: "held", Session: "s1", Value: []byte("H")}, true)
	f.lock("held", "s1", "H") // LockIndex 2
	held := f.get("held")

	// A read-only operation must answer the same through TxnRead, the
	// path of a transaction that only reads.
	sameRead := func(name string, op *state.TxnOp, res []*state.TxnResult, errs []*state.TxnError) {
		t.Helper()
		if op == nil || op.KV == nil || !op.KV.Op.ReadOnly() {
			return
		}
		idx, rres, rerrs := f.s.TxnRead([]*state.TxnOp{op})
		if !reflect.DeepEqual(rres, res) || !reflect.DeepEqual(rerrs, errs) || idx != f.s.TableIndex("kvs") {
			t.Fatalf("%s: TxnRead gave %v %v at %d, Txn %v %v", name, rres, rerrs, idx, res, errs)
		}
	}
	ok := func(name string, op *state.TxnOp, want ...*state.DirEntry) {
		t.Helper()
		res, errs := f.txn(op)
		sameRead(name, op, res, errs)
		if errs != nil {
			t.Fatalf("%s: %s", name, errs[0].What)
		}
		if len(res) != len(want) {
			t.Fatalf("%s: %d results, want %d", name, len(res), len(want))
		}
		for i := range want {
			assertEntry(t, name, res[i].KV, want[i])
		}
	}
	fail := func(name string, op *state.TxnOp, what string) {
		t.Helper()
		before := f.indexes()
		res, errs := f.txn(op)
		sameRead(name, op, res, errs)
		if res != nil || len(errs) != 1 || errs[0].OpIndex != 0 {
			t.Fatalf("%s: res %v errs %v", name, res, errs)
		}
		if errs[0].What != what {
			t.Fatalf("%s: What = %q, want %q", name, errs[0].What, what)
		}
		f.assertNoWrite(before)
	}
	noValue := func(e *state.DirEntry) *state.DirEntry { c := *e; c.Value = nil; return &c }

	// Reads keep the value; writes and checks return the entry without it.
	ok("get", kvOp(state.OpGet, state.DirEntry{Key: "t/a"}), f.get("t/a"))
	ok("get-tree", kvOp(state.OpGetTree, state.DirEntry{Key: "t/"}), f.get("t/a"), f.get("t/b"))
	ok("get-tree empty", kvOp(state.OpGetTree, state.DirEntry{Key: "nothing/"}))
	ok("check-index", kvOp(state.OpCheckIndex, state.DirEntry{Key: "t/a", ModifyIndex: ta}), noValue(f.get("t/a")))
	ok("check-session", kvOp(state.OpCheckSession, state.DirEntry{Key: "held", Session: "s1"}), noValue(held))
	ok("check-session unlocked", kvOp(state.OpCheckSession, state.DirEntry{Key: "t/a"}), noValue(f.get("t/a")))
	ok("check-lock", kvOp(state.OpCheckLock, state.DirEntry{Key: "held", Session: "s1", LockIndex: 2}), noValue(held))
	ok("check-not-exists", kvOp(state.OpCheckNotExists, state.DirEntry{Key: "nope"}))

	fail("get absent", kvOp(state.OpGet, state.DirEntry{Key: "nope"}), `key "nope" doesn't exist`)
	fail("check-index absent", kvOp(state.OpCheckIndex, state.DirEntry{Key: "nope", ModifyIndex: 1}),
		`failed to check index, key "nope" doesn't exist`)
	fail("check-index stale", kvOp(state.OpCheckIndex, state.DirEntry{Key: "t/a", ModifyIndex: ta - 1}),
		fmt.Sprintf(`failed index check for key "t/a", current modify index %d != %d`, ta, ta-1))
	fail("check-session absent", kvOp(state.OpCheckSession, state.DirEntry{Key: "nope", Session: "s1"}),
		`failed to check session, key "nope" doesn't exist`)
	fail("check-session other", kvOp(state.OpCheckSession, state.DirEntry{Key: "held", Session: "s2"}),
		`failed session check for key "held", current session "s1" != "s2"`)
	fail("check-not-exists present", kvOp(state.OpCheckNotExists, state.DirEntry{Key: "t/a"}), `key "t/a" exists`)

	// check-lock: the fencing check. Exactly that session at exactly that
	// LockIndex, nothing else.
	fail("check-lock absent", kvOp(state.OpCheckLock, state.DirEntry{Key: "nope", Session: "s1", LockIndex: 1}),
		`failed to check lock, key "nope" doesn't exist`)
	fail("check-lock stale LockIndex", kvOp(state.OpCheckLock, state.DirEntry{Key: "held", Session: "s1", LockIndex: 1}),
		`failed lock check for key "held": held by session "s1" at lock index 2, not "s1" at 1`)
	fail("check-lock other session", kvOp(state.OpCheckLock, state.DirEntry{Key: "held", Session: "s2", LockIndex: 2}),
		`failed lock check for key "held": held by session "s1" at lock index 2, not "s2" at 2`)
	fail("check-lock no session", kvOp(state.OpCheckLock, state.DirEntry{Key: "t/a", LockIndex: 0}),
		`failed lock check for key "t/a": held by session "" at lock index 0, not "" at 0`)

	// Writes and their refusals.
	fail("cas stale", kvOp(state.OpCAS, state.DirEntry{Key: "t/a", ModifyIndex: ta - 1}), `failed to set key "t/a", index is stale`)
	fail("cas 0 present", kvOp(state.OpCAS, state.DirEntry{Key: "t/a"}), `failed to set key "t/a", index is stale`)
	fail("lock held", kvOp(state.OpLock, state.DirEntry{Key: "held", Session: "s2"}), `failed to lock key "held", lock is already held`)
	fail("lock no session", kvOp(state.OpLock, state.DirEntry{Key: "held"}), "missing session")
	fail("lock unknown session", kvOp(state.OpLock, state.DirEntry{Key: "held", Session: "zz"}), `invalid session "zz"`)
	fail("unlock other", kvOp(state.OpUnlock, state.DirEntry{Key: "held", Session: "s2"}),
		`failed to unlock key "held", lock isn't held, or is held by another session`)
	fail("unlock fenced stale", kvOp(state.OpUnlock, state.DirEntry{Key: "held", Session: "s1", LockIndex: 1}),
		`failed to unlock key "held", lock isn't held, or is held by another session`)
	fail("delete-cas stale", kvOp(state.OpDeleteCAS, state.DirEntry{Key: "t/a", ModifyIndex: ta - 1}),
		`failed to delete key "t/a", index is stale`)
	fail("empty key", kvOp(state.OpSet, state.DirEntry{}), "Missing key name")
	fail("unknown verb", kvOp(state.KVOp("frob"), state.DirEntry{Key: "x"}), `unknown KV verb "frob"`)
	fail("no KV part", &state.TxnOp{}, "no operation specified")
	fail("nil op", nil, "no operation specified")

	idx := f.idx + 1
	ok("set", kvOp(state.OpSet, state.DirEntry{Key: "n", Value: []byte("v"), Flags: 3}), ent("n", "", 3, 0, "", idx, idx))
	idx++
	ok("cas", kvOp(state.OpCAS, state.DirEntry{Key: "n", Value: []byte("w"), ModifyIndex: idx - 1}), ent("n", "", 0, 0, "", idx-1, idx))
	idx++
	ok("lock", kvOp(state.OpLock, state.DirEntry{Key: "n", Session: "s2", Value: []byte("x")}), ent("n", "", 0, 1, "s2", idx-2, idx))
	idx++
	ok("unlock fenced", kvOp(state.OpUnlock, state.DirEntry{Key: "n", Session: "s2", LockIndex: 1}), ent("n", "", 0, 1, "", idx-3, idx))
	ok("delete-cas absent", kvOp(state.OpDeleteCAS, state.DirEntry{Key: "never", ModifyIndex: 3}))
	ok("delete-cas", kvOp(state.OpDeleteCAS, state.DirEntry{Key: "n", ModifyIndex: idx}))
	ok("delete", kvOp(state.OpDelete, state.DirEntry{Key: "held"}))
	ok("delete-tree", kvOp(state.OpDeleteTree, state.DirEntry{Key: "t/"}))
	if _, es := f.s.KVList(nil, ""); len(es) != 0 {
		t.Fatalf("keys left: %v", es)
	}
}

func TestTxnLockDelay(t *testing.T) {
	f, T := lockDelayFx(t, 15*time.Second, state.BehaviorRelease)
	f.now = T.Add(15*time.Second - time.Nanosecond)
	before := f.indexes()
	_, errs := f.txn(
		kvOp(state.OpSet, state.DirEntry{Key: "other", Value: []byte("x")}),
		kvOp(state.OpLock, state.DirEntry{Key: "k", Session: "s2"}),
	)
	if len(errs) != 1 || errs[0].OpIndex != 1 || errs[0].What != `failed to lock key "k" due to lock delay` {
		t.Fatalf("errs %+v", errs)
	}
	f.assertNoWrite(before)
	f.now = T.Add(15 * time.Second)
	if res, errs := f.txn(kvOp(state.OpLock, state.DirEntry{Key: "k", Session: "s2"})); errs != nil || res[0].KV.Session != "s2" {
		t.Fatalf("lock after the delay: %v %v", res, errs)
	}
}

// TxnRead refuses an operation that writes, as an error of that operation,
// and writes nothing.
func TestTxnReadRefusesWrites(t *testing.T) {
	f := newFx(t)
	f.set("a", "1")
	before := f.indexes()
	_, res, errs := f.s.TxnRead([]*state.TxnOp{
		kvOp(state.OpGet, state.DirEntry{Key: "a"}),
		kvOp(state.OpSet, state.DirEntry{Key: "b", Value: []byte("2")}),
	})
	if res != nil || len(errs) != 1 || errs[0].OpIndex != 1 || errs[0].What != `"set" writes: not in a read-only transaction` {
		t.Fatalf("res %v errs %+v", res, errs)
	}
	f.assertNoWrite(before)
	if f.get("b") != nil {
		t.Fatal("b was written")
	}
}
