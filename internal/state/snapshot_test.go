package state_test

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// reads is everything a client can read out of a store, table by table.
type reads struct {
	Tables     map[string]uint64
	KVs        []*state.DirEntry
	KVIndex    map[string]uint64 // prefix -> KVList index
	Keys       map[string][]string
	Delays     map[string]time.Time
	Sessions   []*state.Session
	NodeSess   map[string][]*state.Session
	Nodes      []*state.Node
	NodeInfo   map[string][]*state.Service
	NodeChecks map[string][]*state.HealthCheck
	Queries    []*state.PreparedQuery
	Tombstones map[string]uint64
}

func readAll(t testing.TB, s *state.Store) *reads {
	r := &reads{Tables: map[string]uint64{}, KVIndex: map[string]uint64{}, Keys: map[string][]string{},
		Delays: map[string]time.Time{}, NodeSess: map[string][]*state.Session{},
		NodeInfo: map[string][]*state.Service{}, NodeChecks: map[string][]*state.HealthCheck{}}
	for _, tb := range []string{"kvs", "sessions", "nodes", "services", "checks", "prepared_queries"} {
		r.Tables[tb] = s.TableIndex(tb)
	}
	_, r.KVs = s.KVList(nil, "")
	for _, p := range []string{"", "a", "a/", "b/", "gone/", "x"} {
		r.KVIndex[p], _ = s.KVList(nil, p)
		_, r.Keys[p] = s.KVKeys(nil, p, "/")
	}
	for _, e := range r.KVs {
		r.Delays[e.Key] = s.KVLockDelay(e.Key)
	}
	for _, k := range []string{"gone/1", "eph"} {
		r.Delays[k] = s.KVLockDelay(k)
	}
	_, r.Sessions = s.SessionList(nil)
	_, r.Nodes = s.Nodes(nil)
	for _, n := range []string{"n1", "n2", "n3"} {
		_, r.NodeSess[n] = s.NodeSessions(nil, n)
		_, _, r.NodeInfo[n] = s.NodeInfo(nil, n)
		_, r.NodeChecks[n] = s.NodeChecks(nil, n)
	}
	_, r.Queries = s.QueryList(nil)
	r.Tombstones = tombstones(t, s)
	return r
}

// withoutKeyGraves drops from r the tombstones populate's delete-tree of
// "gone/" leaves for each key it deleted: snapshots written before
// 2026-11-22 have only the prefix's (testdata/snapshot-v1-*.jsonl), and
// restoring one must give the same store apart from those.
func withoutKeyGraves(r *reads) *reads {
	delete(r.Tombstones, "gone/1")
	delete(r.Tombstones, "gone/2")
	return r
}

// populate fills a store with a bit of everything.
func populate(t *testing.T) *fx {
	f := newFx(t)
	f.register(&state.RegisterRequest{Node: "n3", ID: "0b1e", Address: "10.0.0.3", Datacenter: "dc1",
		TaggedAddresses: map[string]string{"lan": "10.0.0.3"}, NodeMeta: map[string]string{"rack": "r1"},
		Service: &state.Service{ID: "web1", Service: "web", Tags: []string{"a", "b"}, Port: 80,
			Meta: map[string]string{"v": "1"}},
		Checks: []*state.HealthCheck{
			{CheckID: state.SerfCheckID, Status: state.HealthPassing, Output: "Agent alive and reachable"},
			{CheckID: "http", ServiceID: "web1", Status: state.HealthWarning, Notes: "n",
				Definition: state.HealthCheckDefinition{HTTP: "http://x", Interval: "10s"}},
			{CheckID: "down"},
		}})
	f.session("rel", func(s *state.Session) {
		s.Name, s.TTL, s.NodeChecks = "lock", "30s", []string{state.SerfCheckID, "c1"}
	})
	f.session("del", func(s *state.Session) {
		s.Node, s.Behavior, s.LockDelay = "n3", state.BehaviorDelete, 0
		s.ServiceChecks = []state.ServiceCheck{{ID: "http", Namespace: "default"}}
	})
	f.session("gone", func(s *state.Session) { s.NodeChecks = []string{"c2"} })
	f.lock("a/1", "rel", "one")
	f.lock("a/2", "del", "")
	f.lock("eph", "gone", "e")
	f.mustKVS(state.OpSet, state.DirEntry{Key: "b/1", Value: []byte{0, 1, 2}, Flags: 42}, true)
	f.mustKVS(state.OpSet, state.DirEntry{Key: "b/empty", Value: []byte{}}, true)
	f.set("gone/1", "x")
	f.set("gone/2", "x")
	f.mustKVS(state.OpDeleteTree, state.DirEntry{Key: "gone/"}, true)
	f.set("x", "y")
	f.mustKVS(state.OpDelete, state.DirEntry{Key: "x"}, true)
	if err := f.s.QuerySet(f.next(), &state.PreparedQuery{ID: "q1", Name: "Q-one", Session: "rel",
		Service: state.ServiceQuery{Service: "web", OnlyPassing: true, Tags: []string{"a"}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.s.QuerySet(f.next(), &state.PreparedQuery{ID: "q2", Service: state.ServiceQuery{Service: "db"}}); err != nil {
		t.Fatal(err)
	}
	f.check("n1", "c2", state.HealthCritical) // invalidates "gone": eph released, lock-delay set
	return f
}

func roundTrip(t *testing.T, sn *state.Snapshot) *state.Store {
	t.Helper()
	var buf bytes.Buffer
	if err := sn.Persist(&buf); err != nil {
		t.Fatal(err)
	}
	s, err := state.Restore(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSnapshotRoundTrip(t *testing.T) {
	f := populate(t)
	want := readAll(t, f.s)
	if len(want.KVs) != 5 || len(want.Sessions) != 2 || len(want.Tombstones) != 4 || want.Delays["eph"].IsZero() {
		t.Fatalf("populate did not build what the test expects: %d keys, %d sessions, %v tombstones, delays %v",
			len(want.KVs), len(want.Sessions), want.Tombstones, want.Delays)
	}

	// The snapshot is of the moment it was taken, whatever happens before
	// Persist runs.
	sn := f.s.Snapshot()
	f.set("later", "x")
	if err := f.s.SessionDestroy(f.next(), f.now, "rel"); err != nil {
		t.Fatal(err)
	}
	got := roundTrip(t, sn)
	if r := readAll(t, got); !reflect.DeepEqual(r, want) {
		t.Fatalf("restored store differs:\n got  %+v\n want %+v", r, want)
	}

	// The restored store behaves like the original: the same commands give
	// the same state (session-check bindings, lock-delays, indexes).
	f = populate(t)
	g := &fx{t: t, s: roundTrip(t, f.s.Snapshot()), idx: f.idx, now: f.now}
	for _, h := range []*fx{f, g} {
		h.now = h.now.Add(time.Second)
		h.check("n1", "c1", state.HealthCritical)                             // invalidates rel
		h.deregister(&state.DeregisterRequest{Node: "n3", ServiceID: "web1"}) // invalidates del
		h.session("new", nil)
		h.mustKVS(state.OpLock, state.DirEntry{Key: "eph", Session: "new"}, false) // lock-delay
		h.mustKVS(state.OpLock, state.DirEntry{Key: "a/1", Session: "new"}, false) // lock-delay
		h.now = h.now.Add(15 * time.Second)
		h.mustKVS(state.OpLock, state.DirEntry{Key: "eph", Session: "new"}, true)
	}
	if a, b := readAll(t, f.s), readAll(t, g.s); !reflect.DeepEqual(a, b) {
		t.Fatalf("original and restored diverged:\n orig     %+v\n restored %+v", a, b)
	}
}

func TestRestoreRefusesBadSnapshots(t *testing.T) {
	var good bytes.Buffer
	if err := populate(t).s.Snapshot().Persist(&good); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitN(good.String(), "\n", 2)
	cases := map[string]string{
		"unknown version": `{"Version":2}` + "\n" + lines[1],
		"version zero":    `{"Version":0}` + "\n",
		"no header":       "",
		"garbage":         "not json",
		"unknown table":   lines[0] + "\n" + `{"T":"frobs","V":{}}` + "\n",
		"bad record":      lines[0] + "\n" + `{"T":"kvs","V":{"Key":7}}` + "\n",
		"truncated":       good.String()[:good.Len()/2],
	}
	for name, in := range cases {
		if s, err := state.Restore(strings.NewReader(in)); err == nil || s != nil {
			t.Errorf("%s: Restore = %v, %v; want an error", name, s, err)
		}
	}
	if _, err := state.Restore(strings.NewReader(`{"Version":2}`)); err == nil ||
		!strings.Contains(err.Error(), "version 2") {
		t.Errorf("unknown version error %v does not name the version", err)
	}
}

// TestRestoreSnapshotWithSessionChecks restores a snapshot written before
// session-check bindings were derived from the sessions (testdata, written
// by the store of that time from populate and populateSessions): it has a
// "session_checks" record per binding. A data directory whose newest
// snapshot is of that kind must still start: the restored store is the one
// the same snapshot gives without those records, and it invalidates the
// same sessions for the same commands.
func TestRestoreSnapshotWithSessionChecks(t *testing.T) {
	old, err := os.ReadFile("testdata/snapshot-v1-session-checks.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(old, []byte(`{"T":"session_checks",`)) {
		t.Fatal("the testdata has no session_checks records")
	}
	got, err := state.Restore(bytes.NewReader(old))
	if err != nil {
		t.Fatalf("restoring a snapshot with session_checks records: %v", err)
	}
	f := populate(t)
	populateSessions(f)
	if a, b := readAll(t, got), withoutKeyGraves(readAll(t, f.s)); !reflect.DeepEqual(a, b) {
		t.Fatalf("restored store differs:\n got  %+v\n want %+v", a, b)
	}
	g := &fx{t: t, s: got, idx: f.idx, now: f.now}
	for _, h := range []*fx{f, g} {
		h.now = h.now.Add(time.Second)
		h.check("n1", "c1", state.HealthCritical)                           // rel, dup
		h.deregister(&state.DeregisterRequest{Node: "n3", CheckID: "http"}) // del, multi
	}
	if a, b := withoutKeyGraves(readAll(t, f.s)), readAll(t, g.s); !reflect.DeepEqual(a, b) {
		t.Fatalf("original and restored diverged:\n orig     %+v\n restored %+v", a, b)
	}
	// A snapshot of the restored store is today's format.
	var now bytes.Buffer
	if err := got.Snapshot().Persist(&now); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(now.Bytes(), []byte("session_checks")) {
		t.Fatal("a new snapshot still writes session_checks records")
	}
}

// A backup restored over live state never hands back a LockIndex the live
// state gave: locked keys come back above the live high-water mark, keys
// never locked stay at 0, and a key first locked after the restore counts
// on from the mark.
func TestRaiseLockIndexesAboveLiveState(t *testing.T) {
	f := newFx(t)
	f.session("s1", nil)
	f.lock("held", "s1", "v")                                                   // LockIndex 1, held
	f.lock("free", "s1", "v")                                                   // LockIndex 1
	f.mustKVS(state.OpUnlock, state.DirEntry{Key: "free", Session: "s1"}, true) // released
	f.set("plain", "p")
	var backup bytes.Buffer
	if err := f.s.Snapshot().Persist(&backup); err != nil {
		t.Fatal(err)
	}

	// The live state goes on: "free" is locked and released 5 more times,
	// and a key locked 9 times is deleted.
	for i := 0; i < 5; i++ {
		f.lock("free", "s1", "v")
		f.mustKVS(state.OpUnlock, state.DirEntry{Key: "free", Session: "s1"}, true)
	}
	for i := 0; i < 9; i++ {
		f.lock("gone/1", "s1", "v")
		f.mustKVS(state.OpUnlock, state.DirEntry{Key: "gone/1", Session: "s1"}, true)
	}
	f.mustKVS(state.OpDelete, state.DirEntry{Key: "gone/1"}, true)
	hw := f.s.LockHighWater()
	if hw != 9 {
		t.Fatalf("LockHighWater = %d, want 9 (the deleted key's)", hw)
	}

	plain, err := state.Restore(bytes.NewReader(backup.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if _, e := plain.KVGet(nil, "free"); e.LockIndex != 1 {
		t.Fatalf("Restore changed a LockIndex: %+v", e)
	}
	if got, want := plain.MaxIndex(), f.s.MaxIndex(); got >= want || got == 0 {
		t.Fatalf("backup's MaxIndex %d, live %d: want the backup's lower and not 0", got, want)
	}

	s, err := state.Restore(bytes.NewReader(backup.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckHeld(); err != nil {
		t.Fatal(err)
	}
	s.RaiseLockIndexes(hw)
	for key, want := range map[string]uint64{"held": 10, "free": 10, "plain": 0} {
		if _, e := s.KVGet(nil, key); e == nil || e.LockIndex != want {
			t.Fatalf("%s after RaiseLockIndexes(%d) = %+v, want LockIndex %d", key, hw, e, want)
		}
	}
	if _, e := s.KVGet(nil, "held"); e.Session != "s1" || string(e.Value) != "v" {
		t.Fatalf("held after restore = %+v, want still held by s1 with its value", e)
	}
	if got := s.LockHighWater(); got != 10 {
		t.Fatalf("restored LockHighWater = %d, want 10", got)
	}
	g := &fx{t: t, s: s, idx: 1000, now: t0}
	g.lock("free", "s1", "v")
	g.lock("plain", "s1", "v")
	g.lock("new", "s1", "v")
	for key, want := range map[string]uint64{"free": 11, "plain": 10, "new": 10} {
		if e := g.get(key); e.LockIndex != want {
			t.Fatalf("%s acquired after the restore: LockIndex %d, want %d (above the live state's %d)", key, e.LockIndex, want, hw)
		}
	}
}

// A store whose key is held by a session it does not have (only an archive
// made by hand has one) is named by CheckHeld.
func TestCheckHeldNamesAnOrphanLock(t *testing.T) {
	f := newFx(t)
	f.session("s1", nil)
	f.lock("k", "s1", "v")
	var buf bytes.Buffer
	if err := f.s.Snapshot().Persist(&buf); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if !strings.HasPrefix(line, `{"T":"sessions"`) {
			kept = append(kept, line)
		}
	}
	s, err := state.Restore(strings.NewReader(strings.Join(kept, "")))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckHeld(); err == nil || !strings.Contains(err.Error(), `key "k" is locked by session s1`) {
		t.Fatalf("CheckHeld = %v", err)
	}
}
