package state_test

import (
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

// A semaphore as its recipe leaves it: s1 holds a permit granted by the
// write of p/.lock at index 10, after contending (writing p/s1) at 8.
func semaphoreKeys() map[string]*state.DirEntry {
	return map[string]*state.DirEntry{
		"p/.lock": {Key: "p/.lock", Flags: state.SemaphoreFlags, ModifyIndex: 10,
			Value: []byte(`{"Limit":2,"Holders":{"s1":true,"s2":true}}`)},
		"p/s1":    {Key: "p/s1", Flags: state.SemaphoreFlags, Session: "s1", LockIndex: 1, ModifyIndex: 8},
		"p/s2":    {Key: "p/s2", Flags: state.SemaphoreFlags, Session: "s2", LockIndex: 1, ModifyIndex: 5},
		"lk":      {Key: "lk", Session: "s1", LockIndex: 3, ModifyIndex: 7},
		"q/.lock": {Key: "q/.lock", Session: "s1", LockIndex: 2, ModifyIndex: 9}, // a lock named .lock
	}
}

func TestCheckSequencer(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(map[string]*state.DirEntry)
		key    string
		sess   string
		index  uint64
		reason string // "" = current
	}{
		{name: "permit", key: "p/.lock", sess: "s1", index: 10},
		{name: "permit of the other holder", key: "p/.lock", sess: "s2", index: 6},
		{name: "not a holder", key: "p/.lock", sess: "s3", index: 10, reason: `session "s3" holds no permit`},
		{name: "no session", key: "p/.lock", sess: "", index: 10, reason: `session "" holds no permit`},
		{name: "index ahead", key: "p/.lock", sess: "s1", index: 11, reason: "index 11 is ahead of the semaphore's 10"},
		{name: "contended again since", key: "p/.lock", sess: "s1", index: 7,
			reason: `session "s1" contended again at index 8, after the permit at 7`},
		{name: "contender released", key: "p/.lock", sess: "s1", index: 10,
			change: func(m map[string]*state.DirEntry) { m["p/s1"].Session = "" },
			reason: `the contender entry "p/s1" is not held by session "s1"`},
		{name: "contender gone", key: "p/.lock", sess: "s1", index: 10,
			change: func(m map[string]*state.DirEntry) { delete(m, "p/s1") },
			reason: `the contender entry "p/s1" is not held by session "s1"`},
		{name: "holders not JSON", key: "p/.lock", sess: "s1", index: 10,
			change: func(m map[string]*state.DirEntry) { m["p/.lock"].Value = []byte("x") },
			reason: "its value is not a semaphore's holder list"},
		{name: "semaphore at the root", key: ".lock", sess: "s1", index: 4,
			change: func(m map[string]*state.DirEntry) {
				m[".lock"] = &state.DirEntry{Key: ".lock", Flags: state.SemaphoreFlags, ModifyIndex: 4, Value: []byte(`{"Holders":{"s1":true}}`)}
				m["s1"] = &state.DirEntry{Key: "s1", Session: "s1", ModifyIndex: 3}
			}},
		{name: "lock", key: "lk", sess: "s1", index: 3},
		{name: "lock, stale index", key: "lk", sess: "s1", index: 2, reason: `held by session "s1" at lock index 3, not "s1" at 2`},
		{name: "lock named .lock", key: "q/.lock", sess: "s1", index: 2},
		{name: "lock, missing", key: "none", sess: "s1", index: 1, reason: `key "none" doesn't exist`},
		{name: "semaphore flags on another name: a lock check", key: "p/s1", sess: "s1", index: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := semaphoreKeys()
			if c.change != nil {
				c.change(m)
			}
			err := state.CheckSequencer(func(k string) *state.DirEntry { return m[k] }, c.key, c.sess, c.index)
			switch {
			case c.reason == "" && err != nil:
				t.Fatalf("not current: %v", err)
			case c.reason != "" && (err == nil || !strings.Contains(err.Error(), c.reason)):
				t.Fatalf("err = %v, want one saying %q", err, c.reason)
			}
		})
	}
}
