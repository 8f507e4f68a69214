package state_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

// TestKVIndexTable walks the index table of the spec (§2) row by row. Each
// case starts from a store with sessions s1 and s2, runs its setup, applies
// one KV write at index idx and checks the answer and the key afterwards.
// A case whose key ends up as it was must not move the KV table index (no
// write, no wake-up); any other must move it to exactly idx.
func TestKVIndexTable(t *testing.T) {
	// Placeholders for a CAS index: the key's ModifyIndex before the
	// write, and one less than it.
	const casCurrent, casStale = ^uint64(0), ^uint64(0) - 1
	type expect func(before *state.DirEntry, idx uint64) *state.DirEntry
	same := expect(func(b *state.DirEntry, _ uint64) *state.DirEntry { return b })
	gone := expect(func(*state.DirEntry, uint64) *state.DirEntry { return nil })
	with := func(change func(e *state.DirEntry, idx uint64)) expect {
		return func(b *state.DirEntry, idx uint64) *state.DirEntry {
			c := *b
			change(&c, idx)
			return &c
		}
	}
	v := func(s string) []byte {
		if s == "" {
			return nil
		}
		return []byte(s)
	}
	put := func(val string, flags uint64) func(*fx) {
		return func(f *fx) {
			f.mustKVS(state.OpSet, state.DirEntry{Key: "k", Value: v(val), Flags: flags}, true)
		}
	}
	held := func(sess, val string) func(*fx) {
		return func(f *fx) { f.lock("k", sess, val) }
	}
	steps := func(fs ...func(*fx)) func(*fx) {
		return func(f *fx) {
			for _, s := range fs {
				s(f)
			}
		}
	}
	release := func(sess string) func(*fx) {
		return func(f *fx) {
			f.mustKVS(state.OpUnlock, state.DirEntry{Key: "k", Session: sess, Value: []byte("r")}, true)
		}
	}

	cases := []struct {
		name    string
		setup   func(*fx)
		op      state.KVOp
		e       state.DirEntry // Key is "k" unless set
		ok      bool
		err     error
		errText string
		want    expect
	}{
		// ---- PUT ----
		{name: "put new key", op: state.OpSet, e: state.DirEntry{Value: v("v"), Flags: 7}, ok: true,
			want: func(_ *state.DirEntry, idx uint64) *state.DirEntry { return ent("k", "v", 7, 0, "", idx, idx) }},
		{name: "put new key ignores Session and LockIndex in the request", op: state.OpSet,
			e: state.DirEntry{Value: v("v"), Session: "s1", LockIndex: 9}, ok: true,
			want: func(_ *state.DirEntry, idx uint64) *state.DirEntry { return ent("k", "v", 0, 0, "", idx, idx) }},
		{name: "put existing changed value", setup: put("v1", 0), op: state.OpSet, e: state.DirEntry{Value: v("v2")}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Value, e.ModifyIndex = v("v2"), idx })},
		{name: "put existing changed flags", setup: put("v1", 0), op: state.OpSet, e: state.DirEntry{Value: v("v1"), Flags: 3}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Flags, e.ModifyIndex = 3, idx })},
		{name: "put existing identical", setup: put("v1", 5), op: state.OpSet, e: state.DirEntry{Value: v("v1"), Flags: 5}, ok: true,
			want: same},
		{name: "put existing identical empty value", setup: put("", 0), op: state.OpSet, e: state.DirEntry{Value: []byte{}}, ok: true,
			want: same},
		{name: "put on locked key keeps Session and LockIndex", setup: held("s1", "v1"), op: state.OpSet,
			e: state.DirEntry{Value: v("v2"), Flags: 1}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Value, e.Flags, e.ModifyIndex = v("v2"), 1, idx })},
		{name: "put on locked key cannot steal or drop the lock", setup: held("s1", "v1"), op: state.OpSet,
			e: state.DirEntry{Value: v("v2"), Session: "s2", LockIndex: 0}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Value, e.ModifyIndex = v("v2"), idx })},
		{name: "put identical on locked key", setup: held("s1", "v1"), op: state.OpSet, e: state.DirEntry{Value: v("v1")}, ok: true,
			want: same},

		// ---- CAS ----
		{name: "cas 0 on absent", op: state.OpCAS, e: state.DirEntry{Value: v("v")}, ok: true,
			want: func(_ *state.DirEntry, idx uint64) *state.DirEntry { return ent("k", "v", 0, 0, "", idx, idx) }},
		{name: "cas 0 on absent ignores Session in the request", op: state.OpCAS, e: state.DirEntry{Value: v("v"), Session: "s1", LockIndex: 4}, ok: true,
			want: func(_ *state.DirEntry, idx uint64) *state.DirEntry { return ent("k", "v", 0, 0, "", idx, idx) }},
		{name: "cas 0 on present", setup: put("v1", 0), op: state.OpCAS, e: state.DirEntry{Value: v("v2")}, ok: false, want: same},
		{name: "cas N matching", setup: put("v1", 0), op: state.OpCAS, ok: true,
			e:    state.DirEntry{Value: v("v2"), ModifyIndex: casCurrent},
			want: with(func(e *state.DirEntry, idx uint64) { e.Value, e.ModifyIndex = v("v2"), idx })},
		{name: "cas N mismatching", setup: put("v1", 0), op: state.OpCAS, e: state.DirEntry{Value: v("v2"), ModifyIndex: casStale}, ok: false, want: same},
		{name: "cas N absent", op: state.OpCAS, e: state.DirEntry{Value: v("v2"), ModifyIndex: 2}, ok: false, want: gone},
		{name: "cas N on locked key keeps Session and LockIndex", setup: held("s1", "v1"), op: state.OpCAS, ok: true,
			e:    state.DirEntry{Value: v("v2"), ModifyIndex: casCurrent},
			want: with(func(e *state.DirEntry, idx uint64) { e.Value, e.ModifyIndex = v("v2"), idx })},
		{name: "cas N mismatching on locked key", setup: held("s1", "v1"), op: state.OpCAS,
			e: state.DirEntry{Value: v("v2"), ModifyIndex: casStale}, ok: false, want: same},

		// ---- acquire ----
		{name: "acquire absent", op: state.OpLock, e: state.DirEntry{Session: "s1", Value: v("v"), Flags: 2}, ok: true,
			want: func(_ *state.DirEntry, idx uint64) *state.DirEntry { return ent("k", "v", 2, 1, "s1", idx, idx) }},
		{name: "acquire unlocked", setup: put("v1", 0), op: state.OpLock, e: state.DirEntry{Session: "s1", Value: v("v2")}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) {
				e.Value, e.Session, e.LockIndex, e.ModifyIndex = v("v2"), "s1", 1, idx
			})},
		{name: "acquire unlocked, identical value, still moves", setup: put("v1", 0), op: state.OpLock, e: state.DirEntry{Session: "s1", Value: v("v1")}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Session, e.LockIndex, e.ModifyIndex = "s1", 1, idx })},
		{name: "acquire after two releases", setup: steps(held("s1", "a"), release("s1"), held("s2", "b"), release("s2")),
			op: state.OpLock, e: state.DirEntry{Session: "s1", Value: v("c")}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) {
				e.Value, e.Session, e.LockIndex, e.ModifyIndex = v("c"), "s1", 3, idx
			})},
		{name: "acquire held by self, value changed", setup: held("s1", "v1"), op: state.OpLock, e: state.DirEntry{Session: "s1", Value: v("v2")}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Value, e.ModifyIndex = v("v2"), idx })},
		{name: "acquire held by self, flags changed", setup: held("s1", "v1"), op: state.OpLock, e: state.DirEntry{Session: "s1", Value: v("v1"), Flags: 9}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Flags, e.ModifyIndex = 9, idx })},
		{name: "acquire held by self, identical", setup: held("s1", "v1"), op: state.OpLock, e: state.DirEntry{Session: "s1", Value: v("v1")}, ok: true,
			want: same},
		{name: "acquire held by other", setup: held("s1", "v1"), op: state.OpLock, e: state.DirEntry{Session: "s2", Value: v("v2")}, ok: false,
			want: same},
		{name: "acquire with empty session", setup: put("v1", 0), op: state.OpLock, e: state.DirEntry{Value: v("v2")},
			err: state.ErrMissingSession, errText: "missing session", want: same},
		{name: "acquire with unknown session", setup: put("v1", 0), op: state.OpLock, e: state.DirEntry{Session: "nope", Value: v("v2")},
			err: state.ErrInvalidSession, errText: `invalid session "nope"`, want: same},
		{name: "acquire absent with unknown session", op: state.OpLock, e: state.DirEntry{Session: "nope"},
			err: state.ErrInvalidSession, errText: `invalid session "nope"`, want: gone},

		// ---- release ----
		{name: "release by holder", setup: held("s1", "v1"), op: state.OpUnlock, e: state.DirEntry{Session: "s1", Value: v("v2"), Flags: 4}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Session, e.Value, e.Flags, e.ModifyIndex = "", v("v2"), 4, idx })},
		{name: "release by holder, same value, still moves", setup: held("s1", "v1"), op: state.OpUnlock, e: state.DirEntry{Session: "s1", Value: v("v1")}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Session, e.ModifyIndex = "", idx })},
		{name: "release with empty body wipes the value", setup: held("s1", "v1"), op: state.OpUnlock, e: state.DirEntry{Session: "s1"}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Session, e.Value, e.ModifyIndex = "", nil, idx })},
		{name: "release by wrong session", setup: held("s1", "v1"), op: state.OpUnlock, e: state.DirEntry{Session: "s2"}, ok: false, want: same},
		{name: "release by unknown session", setup: held("s1", "v1"), op: state.OpUnlock, e: state.DirEntry{Session: "nope"}, ok: false, want: same},
		{name: "release unlocked", setup: put("v1", 0), op: state.OpUnlock, e: state.DirEntry{Session: "s1"}, ok: false, want: same},
		{name: "release absent", op: state.OpUnlock, e: state.DirEntry{Session: "s1"}, ok: false, want: gone},
		{name: "release with empty session", setup: held("s1", "v1"), op: state.OpUnlock, e: state.DirEntry{},
			err: state.ErrMissingSession, errText: "missing session", want: same},
		{name: "fenced release at the current LockIndex", setup: steps(held("s1", "a"), release("s1"), held("s1", "b")),
			op: state.OpUnlock, e: state.DirEntry{Session: "s1", LockIndex: 2}, ok: true,
			want: with(func(e *state.DirEntry, idx uint64) { e.Session, e.Value, e.ModifyIndex = "", nil, idx })},
		{name: "fenced release refused after re-acquire", setup: steps(held("s1", "a"), release("s1"), held("s1", "b")),
			op: state.OpUnlock, e: state.DirEntry{Session: "s1", LockIndex: 1}, ok: false, want: same},

		// ---- DELETE ----
		{name: "delete", setup: put("v1", 0), op: state.OpDelete, ok: true, want: gone},
		{name: "delete locked key (locks are advisory)", setup: held("s1", "v1"), op: state.OpDelete, ok: true, want: gone},
		{name: "delete absent", op: state.OpDelete, ok: true, want: gone},
		{name: "delete cas matching", setup: put("v1", 0), op: state.OpDeleteCAS, e: state.DirEntry{ModifyIndex: casCurrent}, ok: true, want: gone},
		{name: "delete cas mismatching", setup: put("v1", 0), op: state.OpDeleteCAS, e: state.DirEntry{ModifyIndex: casStale}, ok: false, want: same},
		{name: "delete cas 0 on present", setup: put("v1", 0), op: state.OpDeleteCAS, e: state.DirEntry{ModifyIndex: 0}, ok: false, want: same},
		{name: "delete cas absent", op: state.OpDeleteCAS, e: state.DirEntry{ModifyIndex: 7}, ok: true, want: gone},

		// ---- bad requests ----
		{name: "empty key", op: state.OpSet, e: state.DirEntry{Key: "", Value: v("x")},
			err: state.ErrMissingKey, errText: "Missing key name", want: gone},
		{name: "unknown verb", op: state.KVOp("frob"), err: state.ErrInvalidRequest, want: gone},
		{name: "read verb is not a write", op: state.OpGet, err: state.ErrInvalidRequest, want: gone},
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFx(t)
			f.session("s1", nil)
			f.session("s2", nil)
			if c.setup != nil {
				c.setup(f)
			}
			e := c.e
			if e.Key == "" && c.name != "empty key" {
				e.Key = "k"
			}
			before := f.get("k")
			switch e.ModifyIndex {
			case casCurrent:
				e.ModifyIndex = before.ModifyIndex
			case casStale:
				e.ModifyIndex = before.ModifyIndex - 1
			}
			tables := f.indexes()
			idx := f.idx + 1
			ok, err := f.kvs(c.op, e)
			switch {
			case c.err != nil:
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				if c.errText != "" && err.Error() != c.errText {
					t.Fatalf("err text = %q, want %q", err.Error(), c.errText)
				}
				if ok {
					t.Fatalf("ok = true with an error")
				}
			case err != nil:
				t.Fatalf("unexpected err %v", err)
			case ok != c.ok:
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			want := c.want(before, idx)
			assertEntry(t, "entry after", f.get("k"), want)

			wantTables := tables
			if !sameEntry(before, want) {
				wantTables = map[string]uint64{}
				for k, v := range tables {
					wantTables[k] = v
				}
				wantTables["kvs"] = idx
			}
			if got := f.indexes(); !reflect.DeepEqual(got, wantTables) {
				t.Fatalf("table indexes = %v, want %v", got, wantTables)
			}
		})
	}
}

// TestLockIndexNeverGoesBackwards is holdfast's deliberate difference from
// Consul: plain writes keep the LockIndex (and the holder), so a sequencer
// (key, LockIndex, session) is never handed out twice while the key lives.
func TestLockIndexNeverGoesBackwards(t *testing.T) {
	f := newFx(t)
	f.session("s1", nil)
	f.session("s2", nil)
	var last uint64
	step := func(name string, op state.KVOp, e state.DirEntry, wantLI uint64, wantSess string) {
		t.Helper()
		e.Key = "k"
		if _, err := f.kvs(op, e); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := f.get("k")
		if got.LockIndex < last {
			t.Fatalf("%s: LockIndex went back from %d to %d", name, last, got.LockIndex)
		}
		if got.LockIndex != wantLI || got.Session != wantSess {
			t.Fatalf("%s: LockIndex %d Session %q, want %d %q", name, got.LockIndex, got.Session, wantLI, wantSess)
		}
		last = got.LockIndex
	}
	step("acquire s1", state.OpLock, state.DirEntry{Session: "s1", Value: []byte("a")}, 1, "s1")
	step("plain put", state.OpSet, state.DirEntry{Value: []byte("b")}, 1, "s1")
	step("cas", state.OpCAS, state.DirEntry{Value: []byte("c"), ModifyIndex: f.get("k").ModifyIndex}, 1, "s1")
	step("re-acquire s1", state.OpLock, state.DirEntry{Session: "s1", Value: []byte("d")}, 1, "s1")
	step("acquire s2 refused", state.OpLock, state.DirEntry{Session: "s2"}, 1, "s1")
	step("release s1", state.OpUnlock, state.DirEntry{Session: "s1", Value: []byte("e")}, 1, "")
	step("plain put unlocked", state.OpSet, state.DirEntry{Value: []byte("f")}, 1, "")
	step("acquire s2", state.OpLock, state.DirEntry{Session: "s2"}, 2, "s2")
	step("put with LockIndex 0 in request", state.OpSet, state.DirEntry{Value: []byte("g"), LockIndex: 0}, 2, "s2")
	step("cas with LockIndex 0 in request", state.OpCAS, state.DirEntry{Value: []byte("h"), ModifyIndex: f.get("k").ModifyIndex}, 2, "s2")
	step("release s2", state.OpUnlock, state.DirEntry{Session: "s2"}, 2, "")
	step("acquire s1 again", state.OpLock, state.DirEntry{Session: "s1"}, 3, "s1")
}

// TestKVReadIndexes checks the index each read reports, tombstones
// included (§2, X-Consul-Index).
func TestKVReadIndexes(t *testing.T) {
	f := newFx(t)
	if idx, e := f.s.KVGet(nil, "nothing"); idx != 0 || e != nil {
		t.Fatalf("empty store KVGet = %d, %v", idx, e)
	}
	at := func(op state.KVOp, key, val string) uint64 {
		t.Helper()
		f.mustKVS(op, state.DirEntry{Key: key, Value: []byte(val)}, true)
		return f.idx
	}
	ax := at(state.OpSet, "a/x", "1")
	at(state.OpSet, "a/y", "2")
	at(state.OpSet, "b", "3")
	az := at(state.OpSet, "a/z", "4")
	c := at(state.OpSet, "c", "5")

	// A key reports its own ModifyIndex, not the table's.
	if idx, _ := f.s.KVGet(nil, "a/x"); idx != ax {
		t.Fatalf("KVGet a/x index = %d, want %d", idx, ax)
	}
	// An absent key reports the table index.
	if idx, _ := f.s.KVGet(nil, "nope"); idx != c {
		t.Fatalf("KVGet absent index = %d, want %d", idx, c)
	}
	list := func(prefix string, want uint64) {
		t.Helper()
		idx, _ := f.s.KVList(nil, prefix)
		kidx, _ := f.s.KVKeys(nil, prefix, "/")
		if idx != want || kidx != want {
			t.Fatalf("prefix %q: KVList index %d, KVKeys index %d, want %d", prefix, idx, kidx, want)
		}
	}
	list("a/", az)
	list("", c)
	list("q/", c) // nothing there: the table index

	del := at(state.OpDelete, "a/z", "")
	b2 := at(state.OpSet, "b", "changed")
	list("a/", del) // the tombstone of a/z
	if idx, _ := f.s.KVGet(nil, "a/z"); idx != b2 {
		t.Fatalf("KVGet deleted key = %d, want table index %d", idx, b2)
	}
	// Deleting an absent key writes nothing.
	at(state.OpDelete, "a/z", "")
	if got := f.s.TableIndex("kvs"); got != b2 {
		t.Fatalf("delete of absent key moved the table to %d", got)
	}

	// delete-tree leaves a tombstone for the prefix and one for each key.
	at(state.OpSet, "d/1", "x")
	at(state.OpSet, "d/2", "x")
	at(state.OpSet, "dz", "x")
	tree := at(state.OpDeleteTree, "d/", "")
	e := at(state.OpSet, "e", "x")
	if _, es := f.s.KVList(nil, "d/"); len(es) != 0 {
		t.Fatalf("d/ still has %d entries", len(es))
	}
	list("d/", tree)
	list("d", tree) // dz is older than the d/ tombstone
	if _, e := f.s.KVGet(nil, "dz"); e == nil {
		t.Fatal("delete-tree d/ removed dz")
	}
	if got, want := tombstones(t, f.s), map[string]uint64{"a/z": del, "d/": tree, "d/1": tree, "d/2": tree}; !reflect.DeepEqual(got, want) {
		t.Fatalf("tombstones = %v, want %v", got, want)
	}
	// delete-tree of a prefix with nothing under it writes nothing.
	at(state.OpDeleteTree, "zz/", "")
	if got := f.s.TableIndex("kvs"); got != e {
		t.Fatalf("empty delete-tree moved the table to %d", got)
	}

	// delete-tree "" empties the store and leaves a tombstone for every
	// key it deleted, so that every listing's index moves.
	all := at(state.OpDeleteTree, "", "")
	if _, es := f.s.KVList(nil, ""); len(es) != 0 {
		t.Fatalf("store still has %d entries", len(es))
	}
	if got := f.s.TableIndex("kvs"); got != all {
		t.Fatalf("delete-tree \"\" table index = %d, want %d", got, all)
	}
	if got, want := tombstones(t, f.s), map[string]uint64{"a/z": del, "d/": tree, "d/1": tree, "d/2": tree,
		"a/x": all, "a/y": all, "b": all, "c": all, "dz": all, "e": all}; !reflect.DeepEqual(got, want) {
		t.Fatalf("tombstones after delete-tree \"\" = %v, want %v", got, want)
	}
	list("a/", all)
	list("", all)

	// Reaping tombstones lets a prefix index fall back (documented).
	f.s.Reap(f.next(), f.now, del)
	list("a/", all)
	list("d/", tree)
	if got := f.s.TableIndex("kvs"); got != all {
		t.Fatalf("reap moved the kvs table index to %d", got)
	}
}

func TestKVKeysSeparator(t *testing.T) {
	f := newFx(t)
	for _, k := range []string{"a/", "a/b", "a/c/d", "a/c/e", "a/f", "a0", "b/x", "c"} {
		f.set(k, "v")
	}
	cases := []struct {
		prefix, sep string
		want        []string
	}{
		{"", "", []string{"a/", "a/b", "a/c/d", "a/c/e", "a/f", "a0", "b/x", "c"}},
		{"", "/", []string{"a/", "a0", "b/", "c"}},
		{"a/", "/", []string{"a/", "a/b", "a/c/", "a/f"}},
		{"a/c", "/", []string{"a/c/"}},
		{"a/c/", "/", []string{"a/c/d", "a/c/e"}},
		{"zz", "/", nil},
	}
	for _, c := range cases {
		_, got := f.s.KVKeys(nil, c.prefix, c.sep)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("KVKeys(%q, %q) = %q, want %q", c.prefix, c.sep, got, c.want)
		}
	}
	_, es := f.s.KVList(nil, "a/c")
	if len(es) != 2 || es[0].Key != "a/c/d" || es[1].Key != "a/c/e" {
		t.Fatalf("KVList a/c = %v", es)
	}
}

// TestLockIndexNeverRepeatsAcrossLives: a key deleted (plainly, by a
// delete-tree, by a behaviour=delete invalidation, inside a transaction)
// and created anew never gives a (Key, LockIndex, Session) its earlier life
// gave; the floor it counts on from survives a snapshot and restore.
func TestLockIndexNeverRepeatsAcrossLives(t *testing.T) {
	f := newFx(t)
	f.session("s1", func(s *state.Session) { s.LockDelay = 0 })
	lockIndex := func(key string) uint64 {
		t.Helper()
		e := f.get(key)
		if e == nil {
			t.Fatalf("%s is missing", key)
		}
		return e.LockIndex
	}
	f.lock("k", "s1", "")
	f.mustKVS(state.OpUnlock, state.DirEntry{Key: "k", Session: "s1"}, true)
	f.lock("k", "s1", "")
	if li := lockIndex("k"); li != 2 {
		t.Fatalf("second acquisition: LockIndex %d, want 2", li)
	}
	f.mustKVS(state.OpDelete, state.DirEntry{Key: "k"}, true)
	f.lock("k", "s1", "")
	if li := lockIndex("k"); li != 3 {
		t.Fatalf("after a delete: LockIndex %d, want 3 (the earlier life gave 1 and 2)", li)
	}
	// A key created by a plain write and acquired later counts on too.
	f.mustKVS(state.OpDeleteTree, state.DirEntry{Key: "k"}, true)
	f.set("k", "plain")
	if li := lockIndex("k"); li != 0 {
		t.Fatalf("plain write of a new key: LockIndex %d, want 0", li)
	}
	f.lock("k", "s1", "")
	if li := lockIndex("k"); li != 4 {
		t.Fatalf("after a delete-tree and a plain write: LockIndex %d, want 4", li)
	}
	// A key that never existed starts at the floor too: the floor is one
	// number for the table, not one per key.
	f.lock("fresh", "s1", "")
	if li := lockIndex("fresh"); li != 4 {
		t.Fatalf("a new key: LockIndex %d, want 4", li)
	}

	// A session with behaviour delete takes its key with it.
	f.session("d", func(s *state.Session) { s.Behavior, s.LockDelay = state.BehaviorDelete, 0 })
	f.mustKVS(state.OpUnlock, state.DirEntry{Key: "k", Session: "s1"}, true)
	f.lock("k", "d", "")
	if li := lockIndex("k"); li != 5 {
		t.Fatalf("LockIndex %d, want 5", li)
	}
	if err := f.s.SessionDestroy(f.next(), f.now, "d"); err != nil {
		t.Fatal(err)
	}
	if f.get("k") != nil {
		t.Fatal("behaviour delete left k")
	}

	// The floor survives a snapshot.
	f.s = roundTrip(t, f.s.Snapshot())
	f.lock("k", "s1", "")
	if li := lockIndex("k"); li != 6 {
		t.Fatalf("after a snapshot and restore: LockIndex %d, want 6", li)
	}

	// Inside one transaction: lock, delete, lock gives two LockIndexes.
	res, errs := f.txn(
		kvOp(state.OpLock, state.DirEntry{Key: "t", Session: "s1"}),
		kvOp(state.OpDelete, state.DirEntry{Key: "t"}),
		kvOp(state.OpLock, state.DirEntry{Key: "t", Session: "s1"}),
	)
	if errs != nil {
		t.Fatalf("txn errors %+v", errs)
	}
	if len(res) != 2 {
		t.Fatalf("txn results %+v, want one per lock", res)
	}
	if a, b := res[0].KV.LockIndex, res[1].KV.LockIndex; a == b {
		t.Fatalf("lock, delete, lock in one transaction gave LockIndex %d twice", a)
	}
}
