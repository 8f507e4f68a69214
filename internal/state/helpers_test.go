package state_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// t0 is the leader-stamped time the fixtures start at. Nothing in these
// tests reads a clock: time moves only when a test moves fx.now.
var t0 = time.Date(2031, 3, 4, 5, 6, 7, 8, time.UTC)

// fx is a store plus the raft index and stamped time of the next command.
type fx struct {
	t   testing.TB
	s   *state.Store
	idx uint64 // index of the last command applied
	now time.Time
}

// newFx returns a store holding node n1 with passing checks serfHealth, c1
// and c2, and node n2 with a passing serfHealth.
func newFx(t testing.TB) *fx {
	t.Helper()
	f := &fx{t: t, s: state.New(), now: t0}
	f.register(&state.RegisterRequest{Node: "n1", Address: "10.0.0.1", Checks: []*state.HealthCheck{
		{CheckID: state.SerfCheckID, Status: state.HealthPassing},
		{CheckID: "c1", Status: state.HealthPassing},
		{CheckID: "c2", Status: state.HealthPassing},
	}})
	f.register(&state.RegisterRequest{Node: "n2", Address: "10.0.0.2", Checks: []*state.HealthCheck{
		{CheckID: state.SerfCheckID, Status: state.HealthPassing},
	}})
	return f
}

func (f *fx) next() uint64 { f.idx++; return f.idx }

func (f *fx) register(req *state.RegisterRequest) {
	f.t.Helper()
	if err := f.s.Register(f.next(), f.now, req); err != nil {
		f.t.Fatalf("register %s: %v", req.Node, err)
	}
}

func (f *fx) deregister(req *state.DeregisterRequest) {
	f.t.Helper()
	if err := f.s.Deregister(f.next(), f.now, req); err != nil {
		f.t.Fatalf("deregister %+v: %v", req, err)
	}
}

// check registers (or updates) one check on node.
func (f *fx) check(node, id, status string) {
	f.t.Helper()
	f.register(&state.RegisterRequest{Node: node, SkipNodeUpdate: true,
		Check: &state.HealthCheck{CheckID: id, Status: status}})
}

func (f *fx) kvs(op state.KVOp, e state.DirEntry) (bool, error) {
	return f.s.KVS(f.next(), f.now, &state.KVRequest{Op: op, Entry: e})
}

func (f *fx) mustKVS(op state.KVOp, e state.DirEntry, want bool) {
	f.t.Helper()
	ok, err := f.kvs(op, e)
	if err != nil || ok != want {
		f.t.Fatalf("%s %q: got (%v, %v), want (%v, nil)", op, e.Key, ok, err, want)
	}
}

func (f *fx) set(key, val string) {
	f.t.Helper()
	f.mustKVS(state.OpSet, state.DirEntry{Key: key, Value: []byte(val)}, true)
}

func (f *fx) lock(key, sess, val string) {
	f.t.Helper()
	f.mustKVS(state.OpLock, state.DirEntry{Key: key, Session: sess, Value: []byte(val)}, true)
}

// get returns a copy of the entry at key, or nil.
func (f *fx) get(key string) *state.DirEntry {
	_, e := f.s.KVGet(nil, key)
	if e == nil {
		return nil
	}
	c := *e
	return &c
}

// session creates a session on n1 with no checks and a 15s lock-delay;
// mod may change it first.
func (f *fx) session(id string, mod func(*state.Session)) {
	f.t.Helper()
	s := &state.Session{ID: id, Node: "n1", LockDelay: 15 * time.Second, Behavior: state.BehaviorRelease}
	if mod != nil {
		mod(s)
	}
	if err := f.s.SessionCreate(f.next(), s); err != nil {
		f.t.Fatalf("create session %s: %v", id, err)
	}
}

// indexes is every table index, for "nothing was written" checks.
func (f *fx) indexes() map[string]uint64 {
	out := map[string]uint64{}
	for _, t := range []string{"kvs", "sessions", "nodes", "services", "checks", "prepared_queries"} {
		out[t] = f.s.TableIndex(t)
	}
	return out
}

func (f *fx) assertNoWrite(before map[string]uint64) {
	f.t.Helper()
	if after := f.indexes(); !reflect.DeepEqual(before, after) {
		f.t.Fatalf("table indexes moved: before %v, after %v", before, after)
	}
}

func ent(key, val string, flags, lockIndex uint64, sess string, create, modify uint64) *state.DirEntry {
	e := &state.DirEntry{Key: key, Flags: flags, LockIndex: lockIndex, Session: sess,
		CreateIndex: create, ModifyIndex: modify}
	if val != "" {
		e.Value = []byte(val)
	}
	return e
}

func fmtEntry(e *state.DirEntry) string {
	if e == nil {
		return "<absent>"
	}
	return fmt.Sprintf("{Key:%q Value:%q Flags:%d LockIndex:%d Session:%q Create:%d Modify:%d}",
		e.Key, e.Value, e.Flags, e.LockIndex, e.Session, e.CreateIndex, e.ModifyIndex)
}

func sameEntry(a, b *state.DirEntry) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Key == b.Key && bytes.Equal(a.Value, b.Value) && a.Flags == b.Flags &&
		a.LockIndex == b.LockIndex && a.Session == b.Session &&
		a.CreateIndex == b.CreateIndex && a.ModifyIndex == b.ModifyIndex
}

func assertEntry(t testing.TB, what string, got, want *state.DirEntry) {
	t.Helper()
	if !sameEntry(got, want) {
		t.Fatalf("%s:\n got  %s\n want %s", what, fmtEntry(got), fmtEntry(want))
	}
}

// tombstones reads the tombstones out of a persisted snapshot: they have no
// reader of their own, and this is where "one tombstone, none for the empty
// prefix" can be seen.
func tombstones(t testing.TB, s *state.Store) map[string]uint64 {
	t.Helper()
	var buf bytes.Buffer
	if err := s.Snapshot().Persist(&buf); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&buf)
	var hdr map[string]int
	if err := dec.Decode(&hdr); err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for dec.More() {
		var rec struct {
			T string
			V json.RawMessage
		}
		if err := dec.Decode(&rec); err != nil {
			t.Fatal(err)
		}
		if rec.T != "tombstones" {
			continue
		}
		var ts struct {
			Key   string
			Index uint64
		}
		if err := json.Unmarshal(rec.V, &ts); err != nil {
			t.Fatal(err)
		}
		out[ts.Key] = ts.Index
	}
	return out
}
