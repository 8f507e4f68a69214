package httpapi

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

// recipeTxnBodies are the two transactions of a hand-off of api/recipe's
// Lock with a queue of 32: the holder's release, which hands the key to
// the next waiter (5 operations), and the former holder's join of the
// queue again, which reads the key and its queue (2 operations).
var recipeTxnBodies = map[string]string{
	"handoff": `[{"KV":{"Verb":"unlock","Key":"bench/contend","Value":null,"Flags":3304740253564472344,"Index":0,"Session":"adf4238a-882b-9ddc-4a9d-5b6758e4159e","LockIndex":17}},` +
		`{"KV":{"Verb":"delete","Key":"bench/contend/.queue/adf4238a-882b-9ddc-4a9d-5b6758e4159e","Value":null,"Flags":0,"Index":0,"Session":""}},` +
		`{"KV":{"Verb":"check-session","Key":"bench/contend/.queue/5b6758e4-882b-9ddc-4a9d-adf4238a159e","Value":null,"Flags":0,"Index":0,"Session":"5b6758e4-882b-9ddc-4a9d-adf4238a159e"}},` +
		`{"KV":{"Verb":"lock","Key":"bench/contend","Value":null,"Flags":3304740253564472344,"Index":0,"Session":"5b6758e4-882b-9ddc-4a9d-adf4238a159e"}},` +
		`{"KV":{"Verb":"lock","Key":"bench/contend/.queue/5b6758e4-882b-9ddc-4a9d-adf4238a159e","Value":null,"Flags":3304740253564472345,"Index":0,"Session":"5b6758e4-882b-9ddc-4a9d-adf4238a159e"}}]`,
	"join": `[{"KV":{"Verb":"lock","Key":"bench/contend/.queue/adf4238a-882b-9ddc-4a9d-5b6758e4159e","Value":null,"Flags":3304740253564472344,"Index":0,"Session":"adf4238a-882b-9ddc-4a9d-5b6758e4159e"}},` +
		`{"KV":{"Verb":"get-tree","Key":"bench/contend","Value":null,"Flags":0,"Index":0,"Session":""}}]`,
}

// BenchmarkDecodeTxn decodes the recipe's bodies as decodeTxn does (the
// fast path) and, for a baseline in the same run, through encoding/json
// alone, as decodeTxn did before fastTxnBody.
func BenchmarkDecodeTxn(b *testing.B) {
	for _, name := range []string{"handoff", "join"} {
		body := []byte(recipeTxnBodies[name])
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodeTxn(body, 512<<10); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var in []*txnOpBody
				if err := decodeStrict(body, &in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// queueResults is what the join's transaction answers with a queue of n:
// its own entry, then the key and the n entries of the queue.
func queueResults(n int) []*state.TxnResult {
	sess := func(i int) string { return fmt.Sprintf("%08x-882b-9ddc-4a9d-5b6758e4159e", i) }
	res := []*state.TxnResult{{KV: &state.DirEntry{Key: "bench/contend/.queue/" + sess(0), Flags: 3304740253564472344, Session: sess(0), LockIndex: 1, CreateIndex: 90, ModifyIndex: 90}}}
	res = append(res, &state.TxnResult{KV: &state.DirEntry{Key: "bench/contend", Flags: 3304740253564472344, Session: sess(1), LockIndex: 17, CreateIndex: 3, ModifyIndex: 88}})
	for i := 0; i < n; i++ {
		res = append(res, &state.TxnResult{KV: &state.DirEntry{Key: "bench/contend/.queue/" + sess(i), Flags: 3304740253564472344, Session: sess(i), LockIndex: 1, CreateIndex: uint64(10 + i), ModifyIndex: uint64(10 + i)}})
	}
	return res
}

// BenchmarkEncodeTxnResults writes the join's answer with a queue of 32,
// by hand and, for a baseline in the same run, through encoding/json.
func BenchmarkEncodeTxnResults(b *testing.B) {
	res := queueResults(32)
	r := benchRequest("PUT", "/v1/txn", nil)
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			w := &benchWriter{hd: http.Header{}}
			if err := writeTxnResults(w, r, res); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			w := &benchWriter{hd: http.Header{}}
			if err := writeJSON(w, r, &txnResponse{Results: res}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
