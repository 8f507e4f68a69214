// Package fsm is the glue between hashicorp/raft and the state store: a
// versioned command envelope, the dispatch of committed commands to state
// methods, and snapshot/restore.
//
// A command is: one version byte, one type byte, the leader-stamped time as
// eight bytes of big-endian Unix nanoseconds, then the JSON body. Apply
// reads no clock and no randomness; a command it does not know panics rather
// than let replicas diverge.
package fsm

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/internal/state"
)

// Version is the envelope version this code writes.
//
// An entry is: the version (1 byte), the command's Type (1 byte), the
// leader's time in Unix nanoseconds (8 bytes, big-endian), and the body.
// Version 2, written by a few development builds, added the CRC-32C of all
// that after it (4 bytes, little-endian); it is still read, and checked.
// Entries are checksummed where raft stores them instead (the server's
// log store), which covers raft's own fields (index, term, type) too and
// leaves the envelope as older builds read it.
const Version = 1

// crcLen is the length of a version 2 entry's checksum.
const crcLen = 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Type says what a command's body is.
type Type uint8

// Command types. Values are part of the log format: never renumber.
const (
	TypeKVS            Type = 1  // state.KVRequest
	TypeSessionCreate  Type = 2  // state.Session
	TypeSessionDestroy Type = 3  // SessionDestroy
	TypeRegister       Type = 4  // state.RegisterRequest
	TypeDeregister     Type = 5  // state.DeregisterRequest
	TypeTxn            Type = 6  // []*state.TxnOp
	TypeReap           Type = 7  // Reap
	TypeQuerySet       Type = 8  // state.PreparedQuery
	TypeQueryDelete    Type = 9  // QueryDelete
	TypeKVSBinary      Type = 10 // state.KVRequest, binary (EncodeKVS)
	TypeTxnBinary      Type = 11 // []*state.TxnOp, binary (EncodeTxn)
)

// lastType is the highest command type this build applies.
const lastType = TypeTxnBinary

// ErrNewer marks a log entry this build cannot apply because a newer
// holdfast wrote it (an envelope version or a command type it does not
// know).
var ErrNewer = errors.New("written by a newer holdfast")

// CheckEntry says whether this build can apply the command data (a log
// entry's Data): an error wrapping ErrNewer names an envelope version or
// command type it does not know. It reads only the envelope; a start
// checks the entries after its snapshot with it, so that a log from a
// newer holdfast is refused before the agent serves, not by a panic in
// the state machine once it does.
func CheckEntry(data []byte) error {
	switch {
	case len(data) > 0 && data[0] != 1 && data[0] != 2:
		return fmt.Errorf("envelope version %d, which this holdfast does not know: %w", data[0], ErrNewer)
	case len(data) < headerLen:
		return fmt.Errorf("a command of %d bytes, shorter than its envelope", len(data))
	}
	if t := Type(data[1]); t == 0 || t > lastType {
		return fmt.Errorf("command type %d, which this holdfast does not know: %w", t, ErrNewer)
	}
	return nil
}

// SessionDestroy is the body of TypeSessionDestroy.
type SessionDestroy struct{ ID string }

// Reap is the body of TypeReap.
type Reap struct{ TombstonesUpTo uint64 }

// QueryDelete is the body of TypeQueryDelete.
type QueryDelete struct{ ID string }

const headerLen = 10

// Encode builds a command.
func Encode(t Type, now time.Time, body interface{}) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("fsm: encoding command: %w", err)
	}
	return append(header(t, now, len(b)), b...), nil
}

// header starts a command of type t stamped now, with room for a body of n
// bytes.
func header(t Type, now time.Time, n int) []byte {
	out := make([]byte, headerLen, headerLen+n)
	out[0] = Version
	out[1] = byte(t)
	binary.BigEndian.PutUint64(out[2:], uint64(now.UnixNano()))
	return out
}

// Result is what Apply returns for a command (raft hands it to the
// proposer's future). Err is a request error from the state store.
type Result struct {
	OK        bool
	Err       error
	TxnResult []*state.TxnResult
	TxnErrors []*state.TxnError
}

// FSM implements raft.FSM and raft.BatchingFSM over a state.Store. Apply, Snapshot and Restore
// are called by raft from one goroutine; State may be called from any.
type FSM struct {
	store atomic.Pointer[state.Store]
}

// New returns an FSM over an empty store.
func New() *FSM {
	f := &FSM{}
	f.store.Store(state.New())
	return f
}

// State returns the current store. After a Restore a new store is returned
// and the old one's AbandonCh is closed.
func (f *FSM) State() *state.Store { return f.store.Load() }

func decode(data []byte, v interface{}) {
	if err := json.Unmarshal(data, v); err != nil {
		panic(fmt.Sprintf("fsm: undecodable command body: %v", err))
	}
}

// Apply applies one committed log entry.
func (f *FSM) Apply(l *raft.Log) interface{} {
	if l.Type != raft.LogCommand {
		return nil
	}
	t, now, body := envelope(l)
	return Dispatch(f.State(), l.Index, now, t, body)
}

// ApplyBatch applies a run of committed entries (raft.BatchingFSM). Runs of
// commands that write nothing when they fail share one state transaction;
// Register and Txn, which must roll back on failure, each get their own.
// The results are the same as applying the entries one by one.
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	st := f.State()
	out := make([]interface{}, len(logs))
	var b *state.Batch
	flush := func() {
		if b != nil {
			b.Commit()
			b = nil
		}
	}
	defer func() { // on a panic, release the store's writer lock
		if b != nil {
			b.Abort()
		}
	}()
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		t, now, body := envelope(l)
		switch t {
		case TypeRegister, TypeTxn, TypeTxnBinary:
			flush()
			out[i] = Dispatch(st, l.Index, now, t, body)
		default:
			if b == nil {
				b = st.Batch()
			}
			out[i] = dispatchBatch(b, l.Index, now, t, body)
		}
	}
	flush()
	return out
}

func envelope(l *raft.Log) (Type, time.Time, []byte) {
	data := l.Data
	switch {
	case len(data) >= headerLen && data[0] == 1:
	case len(data) >= headerLen+crcLen && data[0] == 2:
		n := len(data) - crcLen
		if crc32.Checksum(data[:n], castagnoli) != binary.LittleEndian.Uint32(data[n:]) {
			panic(fmt.Sprintf("fsm: log entry %d fails its checksum: the raft log is damaged (restore it from a backup); the state machine stops rather than apply it", l.Index))
		}
		data = data[:n]
	default:
		panic(fmt.Sprintf("fsm: log entry %d has an unknown envelope: the raft log is damaged, or was written by a newer holdfast; the state machine stops rather than diverge", l.Index))
	}
	now := time.Unix(0, int64(binary.BigEndian.Uint64(data[2:headerLen])))
	return Type(data[1]), now, data[headerLen:]
}

// dispatchBatch applies one command that may share a transaction.
func dispatchBatch(b *state.Batch, idx uint64, now time.Time, t Type, body []byte) *Result {
	switch t {
	case TypeKVS, TypeKVSBinary:
		var req state.KVRequest
		if t == TypeKVS {
			decode(body, &req)
		} else {
			decodeKVS(idx, body, &req)
		}
		ok, err := b.KVS(idx, now, &req)
		return kvResult(ok, err)
	case TypeSessionCreate:
		var sess state.Session
		decode(body, &sess)
		err := b.SessionCreate(idx, &sess)
		return &Result{OK: err == nil, Err: err}
	case TypeSessionDestroy:
		var req SessionDestroy
		decode(body, &req)
		b.SessionDestroy(idx, now, req.ID)
		return &Result{OK: true}
	case TypeDeregister:
		var req state.DeregisterRequest
		decode(body, &req)
		err := b.Deregister(idx, now, &req)
		return &Result{OK: err == nil, Err: err}
	case TypeReap:
		var req Reap
		decode(body, &req)
		b.Reap(idx, now, req.TombstonesUpTo)
		return &Result{OK: true}
	case TypeQuerySet:
		var q state.PreparedQuery
		decode(body, &q)
		err := b.QuerySet(idx, &q)
		return &Result{OK: err == nil, Err: err}
	case TypeQueryDelete:
		var req QueryDelete
		decode(body, &req)
		err := b.QueryDelete(idx, req.ID)
		return &Result{OK: err == nil, Err: err}
	}
	panic(fmt.Sprintf("fsm: unknown command type %d at index %d: the raft log is damaged, or was written by a newer holdfast; the state machine stops rather than diverge", t, idx))
}

// DispatchCommand applies one encoded command (as Encode, EncodeKVS or
// EncodeTxn build it) to s, as log entry idx. It is exported for tests that
// drive a store without raft.
func DispatchCommand(s *state.Store, idx uint64, data []byte) *Result {
	t, now, body := envelope(&raft.Log{Index: idx, Data: data})
	return Dispatch(s, idx, now, t, body)
}

// Dispatch applies one decoded command to s. It is exported for tests that
// drive a store without raft.
func Dispatch(s *state.Store, idx uint64, now time.Time, t Type, body []byte) *Result {
	switch t {
	case TypeRegister:
		var req state.RegisterRequest
		decode(body, &req)
		err := s.Register(idx, now, &req)
		return &Result{OK: err == nil, Err: err}
	case TypeTxn, TypeTxnBinary:
		var ops []*state.TxnOp
		if t == TypeTxnBinary {
			ops = decodeTxn(idx, body)
		} else {
			decode(body, &ops)
		}
		res, errs := s.Txn(idx, now, ops)
		return &Result{OK: len(errs) == 0, TxnResult: res, TxnErrors: errs}
	}
	// Every other command writes nothing when it fails, so it may run as a
	// batch of one: one code path for Apply and ApplyBatch.
	b := s.Batch()
	defer b.Abort() // a panic on an unknown command must not keep the writer lock
	res := dispatchBatch(b, idx, now, t, body)
	b.Commit()
	return res
}

// Snapshot captures the state for raft; Persist runs later, concurrently
// with further Applies, on the immutable copy.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &snapshot{sn: f.State().Snapshot()}, nil
}

// Restore replaces the state with the snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	s, err := state.Restore(rc)
	if err != nil {
		return err
	}
	old := f.store.Swap(s)
	old.Abandon()
	return nil
}

type snapshot struct{ sn *state.Snapshot }

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.sn.Persist(sink); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *snapshot) Release() {}

var _ raft.BatchingFSM = (*FSM)(nil)
