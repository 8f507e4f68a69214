package fsm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/internal/fsm"
	"github.com/holdfast/holdfast/internal/state"
)

// genLogs makes a deterministic, varied command stream: sessions with and
// without lock-delay, locks, releases, CAS, deletes, transactions that
// fail half-way, registrations with critical checks, destroys.
func genLogs(t *testing.T, seed uint64, n int) []*raft.Log {
	r := rand.New(rand.NewPCG(seed, 1))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var logs []*raft.Log
	add := func(typ fsm.Type, body interface{}) {
		data, err := fsm.Encode(typ, now, body)
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, &raft.Log{Index: uint64(len(logs) + 2), Type: raft.LogCommand, Data: data})
	}
	add(fsm.TypeRegister, &state.RegisterRequest{Node: "n1", Address: "127.0.0.1",
		Check: &state.HealthCheck{CheckID: "c1", Status: state.HealthPassing}})
	sessions := []string{"s0", "s1", "s2", "s3"}
	keys := []string{"a", "b", "c", "d/e", "d/f"}
	for i := 0; i < n; i++ {
		now = now.Add(time.Duration(r.IntN(3000)) * time.Millisecond)
		k := keys[r.IntN(len(keys))]
		s := sessions[r.IntN(len(sessions))]
		switch r.IntN(11) {
		case 0:
			checks := []string{}
			if r.IntN(2) == 0 {
				checks = []string{"c1"}
			}
			add(fsm.TypeSessionCreate, &state.Session{ID: s, Node: "n1", LockDelay: time.Duration(r.IntN(3)) * time.Second,
				Behavior: []string{"release", "delete"}[r.IntN(2)], NodeChecks: checks})
		case 1:
			add(fsm.TypeSessionDestroy, fsm.SessionDestroy{ID: s})
		case 2, 3:
			add(fsm.TypeKVS, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: k, Session: s, Value: []byte(fmt.Sprint(i))}})
		case 4:
			add(fsm.TypeKVS, &state.KVRequest{Op: state.OpUnlock, Entry: state.DirEntry{Key: k, Session: s}})
		case 5:
			add(fsm.TypeKVS, &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: k, Value: []byte(fmt.Sprint(i))}})
		case 6:
			add(fsm.TypeKVS, &state.KVRequest{Op: state.OpCAS, Entry: state.DirEntry{Key: k, ModifyIndex: uint64(r.IntN(len(logs) + 2))}})
		case 7:
			add(fsm.TypeKVS, &state.KVRequest{Op: []state.KVOp{state.OpDelete, state.OpDeleteTree}[r.IntN(2)], Entry: state.DirEntry{Key: k}})
		case 8: // a transaction that may fail after its first write
			add(fsm.TypeTxn, []*state.TxnOp{
				{KV: &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: "txn/" + k, Value: []byte("x")}}},
				{KV: &state.KVRequest{Op: state.OpCheckSession, Entry: state.DirEntry{Key: k, Session: s}}},
			})
		case 9:
			st := []string{state.HealthPassing, state.HealthCritical}[r.IntN(2)]
			add(fsm.TypeRegister, &state.RegisterRequest{Node: "n1", Address: "127.0.0.1",
				Check: &state.HealthCheck{CheckID: "c1", Status: st}})
		case 10:
			add(fsm.TypeKVS, &state.KVRequest{Op: state.OpLock, Entry: state.DirEntry{Key: k, Session: "nope"}})
		}
	}
	return logs
}

func persisted(t *testing.T, f *fsm.FSM) []byte {
	var buf bytes.Buffer
	if err := f.State().Snapshot().Persist(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ApplyBatch must leave the same state and give the same results as
// applying the entries one at a time, however the log is cut into batches.
func TestApplyBatchEqualsApply(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		logs := genLogs(t, seed, 400)
		one := fsm.New()
		var want []string
		for _, l := range logs {
			want = append(want, describe(t, one.Apply(l)))
		}
		r := rand.New(rand.NewPCG(seed, 2))
		batched := fsm.New()
		var got []string
		for i := 0; i < len(logs); {
			n := 1 + r.IntN(40)
			if i+n > len(logs) {
				n = len(logs) - i
			}
			for _, res := range batched.ApplyBatch(logs[i : i+n]) {
				got = append(got, describe(t, res))
			}
			i += n
		}
		if !bytes.Equal(persisted(t, one), persisted(t, batched)) {
			t.Fatalf("seed %d: state after ApplyBatch differs from Apply", seed)
		}
		for i := range want {
			if want[i] != got[i] {
				t.Fatalf("seed %d: result %d: Apply %s, ApplyBatch %s", seed, i, want[i], got[i])
			}
		}
	}
}

func describe(t *testing.T, v interface{}) string {
	res, ok := v.(*fsm.Result)
	if !ok || res == nil {
		return fmt.Sprint(v)
	}
	errText := ""
	if res.Err != nil {
		errText = res.Err.Error()
	}
	b, err := json.Marshal(struct {
		OK   bool
		Err  string
		Res  []*state.TxnResult
		Errs []*state.TxnError
	}{res.OK, errText, res.TxnResult, res.TxnErrors})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
