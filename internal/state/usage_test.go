package state_test

import (
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

func TestUsageCounts(t *testing.T) {
	f := newFx(t)
	want := state.Usage{Nodes: 2, Checks: 4}
	if got := f.s.Usage(); got != want {
		t.Fatalf("fixture: Usage = %+v, want %+v", got, want)
	}
	f.session("s1", nil)
	f.session("s2", nil)
	f.set("a", "1")
	f.set("b", "2")
	f.lock("c", "s1", "3")
	want = state.Usage{KVEntries: 3, KVLocked: 1, Sessions: 2, Nodes: 2, Checks: 4}
	if got := f.s.Usage(); got != want {
		t.Fatalf("after writes: Usage = %+v, want %+v", got, want)
	}
	// Deregistering n1 takes its checks and invalidates both sessions
	// (bound to its serfHealth): the lock is released, the key stays.
	f.deregister(&state.DeregisterRequest{Node: "n1"})
	want = state.Usage{KVEntries: 3, Nodes: 1, Checks: 1}
	if got := f.s.Usage(); got != want {
		t.Fatalf("after deregistering n1: Usage = %+v, want %+v", got, want)
	}
}
