package state

import (
	"strings"
	"testing"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestKVWatchPrefixLengths covers the prefix lengths kvWatch.fire walks:
// the empty prefix, lengths in each word of the bit set, and prefixes
// longer than the bit set holds.
func TestKVWatchPrefixLengths(t *testing.T) {
	w := new(kvWatch)
	long := strings.Repeat("k", kvWatchLens+100)
	cases := []struct {
		prefix, write string
		want          bool
	}{
		{"", "anything", true},
		{"a", "a", true},
		{"a", "b", false},
		{strings.Repeat("x", 70), strings.Repeat("x", 80), true},
		{strings.Repeat("x", 70), strings.Repeat("x", 69), false},
		{strings.Repeat("x", 70), strings.Repeat("x", 69) + "y", false},
		{long[:kvWatchLens], long, true},
		{long[:kvWatchLens+50], long, true},
		{long[:kvWatchLens+50], long[:kvWatchLens+49], false},
	}
	for _, c := range cases {
		ch := w.prefix(c.prefix)
		w.fire(c.write)
		if got := closed(ch); got != c.want {
			t.Errorf("prefix %.8q (len %d), write %.8q (len %d): fired = %v, want %v",
				c.prefix, len(c.prefix), c.write, len(c.write), got, c.want)
		}
		w.fire(c.prefix) // empties the slot for the next case
	}
}

// TestKVWatchKey: a key's channel closes on a write to it, and a new one
// is made for the next reader.
func TestKVWatchKey(t *testing.T) {
	w := new(kvWatch)
	a1, a2 := w.key("a"), w.key("a")
	if a1 != a2 {
		t.Fatal("two readers of one key got different channels")
	}
	w.fire("b")
	if closed(a1) {
		t.Fatal("a write to b woke a")
	}
	w.fire("a")
	if !closed(a1) {
		t.Fatal("a write to a did not wake a")
	}
	if a3 := w.key("a"); closed(a3) {
		t.Fatal("the next reader of a got a closed channel")
	}
}
