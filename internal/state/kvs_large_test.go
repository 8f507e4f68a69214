package state_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

// TestKVLargeBatches drives the KV store at a size where its trees have
// several levels (FuzzKVModel's five keys fit in one leaf): thousands of
// keys written, locked, deleted and deleted by prefix in batches of random
// length, as the FSM applies raft batches, with sessions invalidated in
// between. After every batch the store must match a map of what was
// written, by key, by listing and by prefix; a snapshot of the final store
// must restore to the same entries; and every snapshot taken on the way
// must still hold what it held (a batch never changes a committed
// version, though it changes its own new nodes in place).
func TestKVLargeBatches(t *testing.T) {
	f := newFx(t)
	for _, s := range []string{"s0", "s1", "s2"} {
		f.session(s, func(s *state.Session) { s.LockDelay = 0 })
	}
	r := rand.New(rand.NewPCG(5, 5))
	model := map[string]string{}  // key -> value
	holder := map[string]string{} // key -> session
	key := func() string { return fmt.Sprintf("k/%02d/%04d", r.IntN(40), r.IntN(200)) }
	type seen struct {
		snap *state.Snapshot
		vals map[string]string
	}
	var old []seen
	for round := range 400 {
		b := f.s.Batch()
		for range 1 + r.IntN(60) {
			now := f.now
			switch op := r.IntN(20); {
			case op < 12:
				k, v := key(), fmt.Sprint(round, op, r.Uint32())
				if _, err := b.KVS(f.next(), now, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: k, Value: []byte(v)}}); err != nil {
					t.Fatal(err)
				}
				model[k] = v
			case op < 15:
				k, s := key(), fmt.Sprintf("s%d", r.IntN(3))
				ok, err := b.KVS(f.next(), now, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: k, Session: s, Value: []byte("L")}})
				if err != nil {
					t.Fatal(err)
				}
				if want := holder[k] == "" || holder[k] == s; ok != want {
					t.Fatalf("round %d: lock %s by %s = %v, holder %q", round, k, s, ok, holder[k])
				}
				if ok {
					model[k], holder[k] = "L", s
				}
			case op < 19:
				k := key()
				if _, err := b.KVS(f.next(), now, &state.KVRequest{Op: state.OpDelete, Entry: state.DirEntry{Key: k}}); err != nil {
					t.Fatal(err)
				}
				delete(model, k)
				delete(holder, k)
			default:
				p := fmt.Sprintf("k/%02d/%d", r.IntN(40), r.IntN(3))
				if _, err := b.KVS(f.next(), now, &state.KVRequest{Op: state.OpDeleteTree, Entry: state.DirEntry{Key: p}}); err != nil {
					t.Fatal(err)
				}
				for k := range model {
					if len(k) >= len(p) && k[:len(p)] == p {
						delete(model, k)
						delete(holder, k)
					}
				}
			}
		}
		b.Commit()
		if round%50 == 49 {
			// Invalidate a session: its keys are released, and it comes back.
			s := fmt.Sprintf("s%d", r.IntN(3))
			if err := f.s.SessionDestroy(f.next(), f.now, s); err != nil {
				t.Fatal(err)
			}
			for k, h := range holder {
				if h == s {
					delete(holder, k)
				}
			}
			f.session(s, func(s *state.Session) { s.LockDelay = 0 })
		}
		_, list := f.s.KVList(nil, "")
		checkKVModel(t, round, f.s, list, model, holder)
		if round%40 == 0 {
			vals := map[string]string{}
			for k, v := range model {
				vals[k] = v
			}
			old = append(old, seen{f.s.Snapshot(), vals})
		}
	}
	if len(model) < 1100 {
		// A leaf holds 32 entries, a branch 32 children: three levels.
		t.Fatalf("only %d keys at the end: the tree stayed shallow", len(model))
	}
	for i, o := range old {
		_, list := roundTrip(t, o.snap).KVList(nil, "")
		if len(list) != len(o.vals) {
			t.Fatalf("version %d: %d entries now, %d when it was taken", i, len(list), len(o.vals))
		}
		for _, e := range list {
			if string(e.Value) != o.vals[e.Key] {
				t.Fatalf("version %d: %s is %q now, %q when it was taken", i, e.Key, e.Value, o.vals[e.Key])
			}
		}
	}
	restored := roundTrip(t, f.s.Snapshot())
	_, list := restored.KVList(nil, "")
	checkKVModel(t, -1, restored, list, model, holder)
	if a, b := f.s.TableIndex("kvs"), restored.TableIndex("kvs"); a != b {
		t.Fatalf("kvs index %d after restore, was %d", b, a)
	}
}

func checkKVModel(t *testing.T, round int, s *state.Store, list []*state.DirEntry, model, holder map[string]string) {
	t.Helper()
	keys := make([]string, 0, len(model))
	for k := range model {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(list) != len(keys) {
		t.Fatalf("round %d: %d entries listed, want %d", round, len(list), len(keys))
	}
	for i, e := range list {
		if e.Key != keys[i] || string(e.Value) != model[e.Key] || e.Session != holder[e.Key] {
			t.Fatalf("round %d: entry %d = %s=%q (session %q), want %s=%q (%q)",
				round, i, e.Key, e.Value, e.Session, keys[i], model[keys[i]], holder[keys[i]])
		}
		if _, g := s.KVGet(nil, e.Key); g != e {
			t.Fatalf("round %d: KVGet(%s) is not the listed entry", round, e.Key)
		}
	}
	// One prefix listing, against the model.
	p := "k/07/1"
	_, sub := s.KVList(nil, p)
	n := 0
	for _, k := range keys {
		if len(k) >= len(p) && k[:len(p)] == p {
			if n >= len(sub) || sub[n].Key != k {
				t.Fatalf("round %d: KVList(%s) differs at %d", round, p, n)
			}
			n++
		}
	}
	if n != len(sub) {
		t.Fatalf("round %d: KVList(%s) has %d entries, want %d", round, p, len(sub), n)
	}
}
