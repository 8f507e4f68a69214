package state_test

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// fired reports, without waiting, whether any channel of ws is closed.
// A write closes its channels inside Commit, so once a write method has
// returned its wake-ups have already happened.
func fired(ws watch.Set) bool {
	for ch := range ws {
		select {
		case <-ch:
			return true
		default:
		}
	}
	return false
}

func TestWatchKVGet(t *testing.T) {
	f := newFx(t)
	f.session("s1", nil)
	f.set("a", "1")
	f.set("b", "1")

	arm := func(key string) watch.Set {
		ws := watch.NewSet()
		f.s.KVGet(ws, key)
		if fired(ws) {
			t.Fatalf("watch on %q fired before any write", key)
		}
		return ws
	}
	expect := func(what string, ws watch.Set, want bool) {
		t.Helper()
		if got := fired(ws); got != want {
			t.Fatalf("%s: fired = %v, want %v", what, got, want)
		}
	}

	ws := arm("a")
	f.set("zzz", "x")
	expect("write to another key", ws, false)
	f.set("a", "1")
	expect("identical write (no write, no wake-up)", ws, false)
	f.set("a", "2")
	expect("write to the key", ws, true)

	// The same as a blocking reader would do it: WatchCtx returns nil once
	// a channel has fired, and the context's error while none has.
	ws = arm("a")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ws.WatchCtx(cancelled); err != context.Canceled {
		t.Fatalf("WatchCtx before a write = %v", err)
	}
	f.lock("a", "s1", "2")
	expect("acquire", ws, true)
	if err := ws.WatchCtx(context.Background()); err != nil {
		t.Fatalf("WatchCtx after a write = %v", err)
	}

	ws = arm("a")
	if err := f.s.SessionDestroy(f.next(), f.now, "s1"); err != nil {
		t.Fatal(err)
	}
	expect("release by invalidation", ws, true)

	ws = arm("missing")
	f.set("missin", "x")
	f.set("missing/child", "x")
	f.set("missing2", "x")
	expect("writes next to a missing key", ws, false)
	f.set("missing", "now")
	expect("creation of a missing key", ws, true)

	ws = arm("b")
	f.mustKVS(state.OpDelete, state.DirEntry{Key: "b"}, true)
	expect("delete", ws, true)

	ws = arm("a")
	f.mustKVS(state.OpDeleteTree, state.DirEntry{Key: ""}, true)
	expect("delete-tree of everything", ws, true)
}

func TestWatchKVListPrefix(t *testing.T) {
	f := newFx(t)
	f.set("a/x", "1")
	f.set("b/x", "1")
	for _, read := range []struct {
		name string
		arm  func(ws watch.Set)
	}{
		{"KVList", func(ws watch.Set) { f.s.KVList(ws, "a/") }},
		{"KVKeys", func(ws watch.Set) { f.s.KVKeys(ws, "a/", "/") }},
	} {
		arm := func() watch.Set {
			ws := watch.NewSet()
			read.arm(ws)
			if fired(ws) {
				t.Fatalf("%s: fired before any write", read.name)
			}
			return ws
		}
		// A write wakes exactly the watches of its key and of the watched
		// prefixes of its key (up to a collision of their slots in
		// kvWatch, which these keys do not have, and blocking readers
		// absorb by re-checking the index).
		writes := []struct {
			name string
			do   func()
			want bool
		}{
			{"write outside the prefix", func() { f.set("b/y", f.now.String()) }, false},
			{"write next to the prefix", func() { f.set("ab", f.now.String()) }, false},
			{"write to the prefix's parent", func() { f.set("a", f.now.String()) }, false},
			{"new key under the prefix", func() { f.set("a/new"+f.now.String(), "1") }, true},
			{"change under the prefix", func() { f.set("a/x", f.now.String()) }, true},
			{"delete under the prefix", func() { f.mustKVS(state.OpDelete, state.DirEntry{Key: "a/x"}, true) }, true},
			{"delete-tree of the prefix", func() { f.mustKVS(state.OpDeleteTree, state.DirEntry{Key: "a/"}, true) }, true},
			{"first key under an empty prefix", func() { f.set("a/x", "back") }, true},
		}
		for _, w := range writes {
			ws := arm()
			f.now = f.now.Add(time.Nanosecond) // makes each value distinct
			w.do()
			if got := fired(ws); got != w.want {
				t.Fatalf("%s, %s: fired = %v, want %v", read.name, w.name, got, w.want)
			}
		}
	}
}

func TestWatchSessionsAndAbandon(t *testing.T) {
	f := newFx(t)
	f.session("s1", nil)
	ws := watch.NewSet()
	f.s.SessionGet(ws, "s1")
	list := watch.NewSet()
	f.s.SessionList(list)
	f.check("n1", "c1", state.HealthWarning)
	if fired(ws) || fired(list) {
		t.Fatal("session watch fired on a catalog write")
	}
	if err := f.s.SessionDestroy(f.next(), f.now, "s1"); err != nil {
		t.Fatal(err)
	}
	if !fired(ws) || !fired(list) {
		t.Fatal("session watches did not fire on destroy")
	}

	// Every read's watch set carries the store's abandon channel.
	ws = watch.NewSet()
	f.s.KVGet(ws, "k")
	f.s.Abandon()
	if !fired(ws) {
		t.Fatal("abandoning the store did not wake its readers")
	}
	select {
	case <-f.s.AbandonCh():
	default:
		t.Fatal("AbandonCh not closed")
	}
}
