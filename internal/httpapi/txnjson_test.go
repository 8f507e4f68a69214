package httpapi

import (
	"encoding/json"
	"reflect"
	"testing"
)

// txnBodySeeds are bodies the fast decoder must take (the first group) or
// decline (the second), each with encoding/json's answer beside it.
var (
	txnBodiesTaken = []string{
		`[]`,
		` [ ] `,
		recipeTxnBodies["handoff"],
		recipeTxnBodies["join"],
		`[{"KV":{"Verb":"set","Key":"a","Value":"aGk=","Flags":3}}]`,
		`[{"KV":{"Verb":"set","Key":"a","Value":""}}]`,
		`[{"KV":{"Verb":"cas","Key":"a","Index":4}},{"KV":{"Verb":"get","Key":"a"}}]`,
		`[{"KV":{"Verb":"delete-cas","Key":"d","Index":18446744073709551615}}]`,
		`[{"KV":null,"Check":null}]`,
		`[{}]`,
		"[\n\t{\"KV\": {\"Verb\": \"get\", \"Key\": \"a\"}, \"Node\": null, \"Service\": null, \"Check\": null, \"Session\": null}\r\n]\n",
		`[{"KV":{"Verb":"set","Key":"a","Namespace":"","Partition":"p","Other":null}}]`,
	}
	txnBodiesDeclined = []string{
		`null`, `{}`, `[null]`, `[{"kv":{}}]`, `[{"KV":{"verb":"get"}}]`,
		`[{"KV":{"Verb":"get","Verb":"set"}}]`, `[{"KV":{},"KV":{}}]`,
		`[{"KV":{"Key":"a\u0062"}}]`, `[{"KV":{"Key":"é"}}]`, `[{"KV":{"Flags":01}}]`,
		`[{"KV":{"Flags":1.0}}]`, `[{"KV":{"Flags":1e3}}]`, `[{"KV":{"Flags":-1}}]`,
		`[{"KV":{"Flags":18446744073709551616}}]`, `[{"KV":{"Key":null}}]`, `[{"KV":{"Value":"a"}}]`,
		`[{"Node":{}}]`, `[{"KV":{"Other":1}}]`, `[] x`, `[]]`, `[{"KV":{}},]`, `[{"KV":{"Key":"a"}`,
	}
)

// checkFastTxnBody holds fastTxnBody to encoding/json: where it takes a
// body, decodeStrict must take it too and give the same operations.
func checkFastTxnBody(t *testing.T, body []byte) (taken bool) {
	t.Helper()
	got, ok := fastTxnBody(body)
	if !ok {
		return false
	}
	var want []*txnOpBody
	if err := decodeStrict(body, &want); err != nil {
		t.Fatalf("fast decoder took %q, which encoding/json refuses: %v", body, err)
	}
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Fatalf("%q:\nfast %s\njson %s", body, g, w)
	}
	return true
}

func TestFastTxnBody(t *testing.T) {
	for _, b := range txnBodiesTaken {
		if !checkFastTxnBody(t, []byte(b)) {
			t.Errorf("declined %q", b)
		}
	}
	for _, b := range txnBodiesDeclined {
		if checkFastTxnBody(t, []byte(b)) {
			t.Errorf("took %q", b)
		}
	}
}

func FuzzFastTxnBody(f *testing.F) {
	for _, b := range append(append([]string{}, txnBodiesTaken...), txnBodiesDeclined...) {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFastTxnBody(t, body)
	})
}
