package fsm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/state"
)

var t0 = time.Date(2031, 3, 4, 5, 6, 7, 891011121, time.UTC)

// applier feeds commands to an FSM as raft would: one log entry per
// command, at increasing indexes.
type applier struct {
	t   *testing.T
	f   *fsm.FSM
	idx uint64
	now time.Time
}

func newApplier(t *testing.T) *applier { return &applier{t: t, f: fsm.New(), now: t0} }

func (a *applier) apply(typ fsm.Type, body interface{}) *fsm.Result {
	a.t.Helper()
	data, err := fsm.Encode(typ, a.now, body)
	if err != nil {
		a.t.Fatal(err)
	}
	a.idx++
	out := a.f.Apply(&raft.Log{Index: a.idx, Term: 1, Type: raft.LogCommand, Data: data})
	res, ok := out.(*fsm.Result)
	if !ok {
		a.t.Fatalf("Apply returned %T", out)
	}
	return res
}

func (a *applier) ok(typ fsm.Type, body interface{}) *fsm.Result {
	a.t.Helper()
	res := a.apply(typ, body)
	if !res.OK || res.Err != nil || res.TxnErrors != nil {
		a.t.Fatalf("command %d: %+v", typ, res)
	}
	return res
}

func TestApplyEachType(t *testing.T) {
	a := newApplier(t)
	s := a.f.State()

	a.ok(fsm.TypeRegister, &state.RegisterRequest{Node: "n1", Address: "10.0.0.1",
		Service: &state.Service{ID: "web1", Service: "web"},
		Checks: []*state.HealthCheck{{CheckID: state.SerfCheckID, Status: state.HealthPassing},
			{CheckID: "svc", ServiceID: "web1", Status: state.HealthPassing}}})
	if _, n, svcs := s.NodeInfo(nil, "n1"); n == nil || n.CreateIndex != a.idx || len(svcs) != 1 {
		t.Fatalf("register: node %+v services %v", n, svcs)
	}

	a.ok(fsm.TypeSessionCreate, &state.Session{ID: "s1", Node: "n1", LockDelay: 15 * time.Second,
		NodeChecks: []string{state.SerfCheckID}, ServiceChecks: []state.ServiceCheck{{ID: "svc"}}})
	if _, sess := s.SessionGet(nil, "s1"); sess == nil || sess.CreateIndex != a.idx || sess.Behavior != state.BehaviorRelease {
		t.Fatalf("session create: %+v", sess)
	}
	res := a.apply(fsm.TypeSessionCreate, &state.Session{ID: "s2", Node: "n9"})
	if res.OK || !errors.Is(res.Err, state.ErrMissingNode) {
		t.Fatalf("session create on unknown node: %+v", res)
	}

	a.ok(fsm.TypeKVS, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: "s1", Value: []byte("v"), Flags: 3}})
	if _, e := s.KVGet(nil, "k"); e == nil || e.Session != "s1" || string(e.Value) != "v" || e.Flags != 3 || e.ModifyIndex != a.idx {
		t.Fatalf("kvs lock: %+v", e)
	}
	res = a.apply(fsm.TypeKVS, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "k", Session: "nope"}})
	if res.OK || !errors.Is(res.Err, state.ErrInvalidSession) {
		t.Fatalf("lock with unknown session: %+v", res)
	}
	res = a.apply(fsm.TypeKVS, &state.KVRequest{Op: state.OpCAS, Entry: state.DirEntry{Key: "k", ModifyIndex: 1}})
	if res.OK || res.Err != nil {
		t.Fatalf("stale cas: %+v", res)
	}

	res = a.ok(fsm.TypeTxn, []*state.TxnOp{
		{KV: &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "t", Value: []byte("x")}}},
		{KV: &state.KVRequest{Op: state.OpCheckLock, Entry: state.DirEntry{Key: "k", Session: "s1", LockIndex: 1}}},
	})
	if len(res.TxnResult) != 2 || res.TxnResult[0].KV.Key != "t" || res.TxnResult[0].KV.ModifyIndex != a.idx {
		t.Fatalf("txn results %+v", res.TxnResult)
	}
	res = a.apply(fsm.TypeTxn, []*state.TxnOp{
		{KV: &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "u", Value: []byte("x")}}},
		{KV: &state.KVRequest{Op: state.OpCheckLock, Entry: state.DirEntry{Key: "k", Session: "s1", LockIndex: 2}}},
	})
	if res.OK || res.TxnResult != nil || len(res.TxnErrors) != 1 || res.TxnErrors[0].OpIndex != 1 {
		t.Fatalf("failed txn: %+v", res)
	}
	if _, e := s.KVGet(nil, "u"); e != nil {
		t.Fatal("failed txn wrote u")
	}

	a.ok(fsm.TypeQuerySet, &state.PreparedQuery{ID: "q1", Session: "s1", Service: state.ServiceQuery{Service: "web"}})
	a.ok(fsm.TypeQuerySet, &state.PreparedQuery{ID: "q2", Service: state.ServiceQuery{Service: "web"}})
	if _, q := s.QueryGet(nil, "q1"); q == nil || q.Session != "s1" {
		t.Fatalf("query set: %+v", q)
	}
	a.ok(fsm.TypeQueryDelete, &fsm.QueryDelete{ID: "q2"})
	if _, q := s.QueryGet(nil, "q2"); q != nil {
		t.Fatal("query delete left q2")
	}
	res = a.apply(fsm.TypeQueryDelete, &fsm.QueryDelete{ID: "q2"})
	if res.OK || !errors.Is(res.Err, state.ErrQueryNotFound) {
		t.Fatalf("delete of missing query: %+v", res)
	}

	// The stamped time in the envelope reaches the store to the nanosecond.
	a.now = t0.Add(time.Hour)
	a.ok(fsm.TypeSessionDestroy, &fsm.SessionDestroy{ID: "s1"})
	if got := s.KVLockDelay("k"); !got.Equal(a.now.Add(15 * time.Second)) {
		t.Fatalf("lock-delay until %v, want %v", got, a.now.Add(15*time.Second))
	}
	if _, q := s.QueryGet(nil, "q1"); q != nil {
		t.Fatal("destroy left the session's query")
	}
	destroyed := a.idx

	a.ok(fsm.TypeKVS, &state.KVRequest{Op: state.OpDelete, Entry: state.DirEntry{Key: "t"}})
	a.now = a.now.Add(15 * time.Second)
	a.ok(fsm.TypeReap, &fsm.Reap{TombstonesUpTo: a.idx})
	if got := s.KVLockDelay("k"); !got.IsZero() {
		t.Fatalf("reap left the ended lock-delay: %v", got)
	}

	a.ok(fsm.TypeDeregister, &state.DeregisterRequest{Node: "n1"})
	if _, n, _ := s.NodeInfo(nil, "n1"); n != nil {
		t.Fatal("deregister left the node")
	}
	if got := s.TableIndex("sessions"); got != destroyed {
		t.Fatalf("sessions index %d, want %d", got, destroyed)
	}
}

func TestApplyIgnoresNonCommands(t *testing.T) {
	a := newApplier(t)
	for _, typ := range []raft.LogType{raft.LogNoop, raft.LogBarrier, raft.LogConfiguration} {
		if out := a.f.Apply(&raft.Log{Index: 1, Type: typ, Data: []byte{0xff}}); out != nil {
			t.Fatalf("log type %v: Apply = %v", typ, out)
		}
	}
	if got := a.f.State().TableIndex("kvs", "sessions", "nodes"); got != 0 {
		t.Fatalf("non-commands wrote at %d", got)
	}
}

func mustPanic(t *testing.T, what, contains string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("%s: no panic", what)
		}
		if msg, _ := r.(string); !strings.Contains(msg, contains) {
			t.Fatalf("%s: panic %v does not mention %q", what, r, contains)
		}
	}()
	f()
}

func TestApplyPanicsOnWhatItDoesNotKnow(t *testing.T) {
	good, err := fsm.Encode(fsm.TypeKVS, t0, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	with := func(i int, b byte) []byte {
		c := append([]byte(nil), good...)
		c[i] = b
		return c
	}
	f := fsm.New()
	log := func(data []byte) *raft.Log { return &raft.Log{Index: 7, Type: raft.LogCommand, Data: data} }

	mustPanic(t, "unknown type", "unknown command type 200", func() { f.Apply(log(with(1, 200))) })
	mustPanic(t, "type zero", "unknown command type 0", func() { f.Apply(log(with(1, 0))) })
	mustPanic(t, "unknown version", "unknown envelope", func() { f.Apply(log(with(0, 3))) })
	mustPanic(t, "version zero", "unknown envelope", func() { f.Apply(log(with(0, 0))) })
	mustPanic(t, "short entry", "unknown envelope", func() { f.Apply(log(good[:5])) })
	mustPanic(t, "empty entry", "unknown envelope", func() { f.Apply(log(nil)) })
	mustPanic(t, "bad body", "undecodable", func() { f.Apply(log(append(append([]byte(nil), good[:10]...), "{nope"...))) })
	// Version 2 entries (written by a few development builds) carry a
	// checksum, which is checked.
	v2 := append([]byte(nil), good...)
	v2[0] = 2
	v2 = sealed(v2)
	flipped := append([]byte(nil), v2...)
	flipped[len(flipped)/2] ^= 0x20
	mustPanic(t, "a changed byte of a version 2 entry", "fails its checksum", func() { f.Apply(log(flipped)) })
	mustPanic(t, "short version 2 entry", "unknown envelope", func() { f.Apply(log(v2[:12])) })

	mustPanic(t, "Dispatch of unknown type", "unknown command type 99", func() {
		fsm.Dispatch(state.New(), 1, t0, fsm.Type(99), []byte("{}"))
	})
	if got := f.State().TableIndex("kvs"); got != 0 {
		t.Fatalf("a panicking Apply wrote at %d", got)
	}
	// The good entry still applies.
	if res := f.Apply(log(good)).(*fsm.Result); !res.OK {
		t.Fatalf("good entry: %+v", res)
	}
	// A good version 2 entry applies.
	if res := f.Apply(log(v2)).(*fsm.Result); !res.OK {
		t.Fatalf("version 2 entry: %+v", res)
	}
}

func TestEncodeHeader(t *testing.T) {
	data, err := fsm.Encode(fsm.TypeReap, t0, &fsm.Reap{TombstonesUpTo: 9})
	if err != nil {
		t.Fatal(err)
	}
	if data[0] != fsm.Version || data[1] != byte(fsm.TypeReap) {
		t.Fatalf("header %v", data[:2])
	}
	if body := string(data[10:]); body != `{"TombstonesUpTo":9}` {
		t.Fatalf("body %q", body)
	}
	if _, err := fsm.Encode(fsm.TypeKVS, t0, func() {}); err == nil {
		t.Fatal("Encode of an unencodable body succeeded")
	}
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
	failWrite         bool
	closed, cancelled bool
}

func (s *memSink) Write(p []byte) (int, error) {
	if s.failWrite {
		return 0, errors.New("disk full")
	}
	return s.Buffer.Write(p)
}
func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Close() error  { s.closed = true; return nil }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }

type readCloser struct {
	io.Reader
	closed bool
}

func (r *readCloser) Close() error { r.closed = true; return nil }

func populated(t *testing.T) *applier {
	a := newApplier(t)
	a.ok(fsm.TypeRegister, &state.RegisterRequest{Node: "n1", Check: &state.HealthCheck{CheckID: "c1", Status: state.HealthPassing}})
	a.ok(fsm.TypeSessionCreate, &state.Session{ID: "s1", Node: "n1", LockDelay: time.Second, NodeChecks: []string{"c1"}})
	a.ok(fsm.TypeSessionCreate, &state.Session{ID: "s2", Node: "n1", LockDelay: time.Second})
	a.ok(fsm.TypeKVS, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "a", Session: "s1", Value: []byte("1")}})
	a.ok(fsm.TypeKVS, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: "b", Session: "s2", Value: []byte("2")}})
	a.ok(fsm.TypeKVS, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "c", Value: []byte("3")}})
	a.ok(fsm.TypeSessionDestroy, &fsm.SessionDestroy{ID: "s2"})
	return a
}

type view struct {
	KVs      []*state.DirEntry
	Sessions []*state.Session
	Nodes    []*state.Node
	Checks   []*state.HealthCheck
	Delay    time.Time
	Index    uint64
}

func look(s *state.Store) view {
	var v view
	_, v.KVs = s.KVList(nil, "")
	_, v.Sessions = s.SessionList(nil)
	_, v.Nodes = s.Nodes(nil)
	_, v.Checks = s.NodeChecks(nil, "n1")
	v.Delay = s.KVLockDelay("b")
	v.Index = s.TableIndex("kvs", "sessions", "nodes", "checks")
	return v
}

func TestSnapshotRestore(t *testing.T) {
	src := populated(t)
	want := look(src.f.State())

	snap, err := src.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Writes after Snapshot are not in it.
	src.ok(fsm.TypeKVS, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "later", Value: []byte("x")}})
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	if !sink.closed || sink.cancelled {
		t.Fatalf("sink closed=%v cancelled=%v", sink.closed, sink.cancelled)
	}

	dst := populated(t)
	dst.ok(fsm.TypeKVS, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "only-here", Value: []byte("x")}})
	old := dst.f.State()
	rc := &readCloser{Reader: bytes.NewReader(sink.Bytes())}
	if err := dst.f.Restore(rc); err != nil {
		t.Fatal(err)
	}
	if !rc.closed {
		t.Fatal("Restore did not close its reader")
	}
	select {
	case <-old.AbandonCh():
	default:
		t.Fatal("old store's AbandonCh not closed")
	}
	cur := dst.f.State()
	if cur == old {
		t.Fatal("State() still returns the old store")
	}
	select {
	case <-cur.AbandonCh():
		t.Fatal("new store born abandoned")
	default:
	}
	if got := look(cur); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored state:\n got  %+v\n want %+v", got, want)
	}
	// The restored FSM keeps applying: session-check bindings came along.
	dst.idx = src.idx
	dst.ok(fsm.TypeRegister, &state.RegisterRequest{Node: "n1", SkipNodeUpdate: true,
		Check: &state.HealthCheck{CheckID: "c1", Status: state.HealthCritical}})
	if _, e := cur.KVGet(nil, "a"); e == nil || e.Session != "" {
		t.Fatalf("a after its session's check went critical on the restored FSM: %+v", e)
	}
}

func TestRestoreFailureKeepsState(t *testing.T) {
	a := populated(t)
	old := a.f.State()
	before := look(old)
	rc := &readCloser{Reader: strings.NewReader(`{"Version":99}` + "\n")}
	if err := a.f.Restore(rc); err == nil {
		t.Fatal("Restore of an unknown version succeeded")
	}
	if !rc.closed {
		t.Fatal("failed Restore did not close its reader")
	}
	if a.f.State() != old {
		t.Fatal("failed Restore replaced the store")
	}
	select {
	case <-old.AbandonCh():
		t.Fatal("failed Restore abandoned the store")
	default:
	}
	if got := look(old); !reflect.DeepEqual(got, before) {
		t.Fatal("failed Restore changed the state")
	}
}

func TestPersistFailureCancelsSink(t *testing.T) {
	a := populated(t)
	snap, err := a.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{failWrite: true}
	if err := snap.Persist(sink); err == nil {
		t.Fatal("Persist to a failing sink succeeded")
	}
	if !sink.cancelled || sink.closed {
		t.Fatalf("failing sink: cancelled=%v closed=%v", sink.cancelled, sink.closed)
	}
}

// sealed gives a version 2 entry (its header already in data) its
// checksum: the CRC-32C of the bytes before it, little-endian.
func sealed(data []byte) []byte {
	return binary.LittleEndian.AppendUint32(data, crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)))
}

func TestCheckEntry(t *testing.T) {
	ok, err := fsm.Encode(fsm.TypeSessionDestroy, time.Unix(0, 1), fsm.SessionDestroy{ID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := fsm.CheckEntry(ok); err != nil {
		t.Fatalf("a command of this build: %v", err)
	}
	newType := bytes.Clone(ok)
	newType[1] = 12 // one past TypeTxnBinary, the last
	newEnvelope := bytes.Clone(ok)
	newEnvelope[0] = 3
	for name, c := range map[string]struct {
		data  []byte
		newer bool
		says  string
	}{
		"type":     {newType, true, "command type 12, which this holdfast does not know"},
		"envelope": {newEnvelope, true, "envelope version 3"},
		"short":    {ok[:4], false, "shorter than its envelope"},
		"empty":    {nil, false, "a command of 0 bytes"},
	} {
		err := fsm.CheckEntry(c.data)
		if err == nil || errors.Is(err, fsm.ErrNewer) != c.newer || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
