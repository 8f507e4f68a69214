package httpapi

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

// TestDirEntryFields pins the fields appendEntries writes: a field added to
// state.DirEntry must be added there too (and to the cases below).
func TestDirEntryFields(t *testing.T) {
	var names []string
	rt := reflect.TypeOf(state.DirEntry{})
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		names = append(names, f.Name+" "+f.Type.String()+" "+string(f.Tag))
	}
	want := []string{"LockIndex uint64 ", "Key string ", "Flags uint64 ", "Value []uint8 ",
		`Session string json:",omitempty"`, "CreateIndex uint64 ", "ModifyIndex uint64 "}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("state.DirEntry fields changed:\n got %q\nwant %q\nupdate appendEntries", names, want)
	}
}

// sameAsJSON fails t unless got is json.Marshal(v), or ok is false (the
// hand-built encoder declined, and json.Marshal is used instead).
func sameAsJSON(t *testing.T, v any, got []byte, ok bool) {
	t.Helper()
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if ok && string(got) != string(want) {
		t.Fatalf("hand-built JSON:\n got %s\nwant %s", got, want)
	}
}

// fullEntry is an entry with every field set, a value json.Marshal must
// encode in base64 and a lock.
func fullEntry() *state.DirEntry {
	return &state.DirEntry{LockIndex: 3, Key: "a/b c", Flags: 1<<64 - 1, Value: []byte("hello\x00\xff"),
		Session: "adf4238a-882b-9ddc-4a9d-5b6758e4159e", CreateIndex: 7, ModifyIndex: 12}
}

func checkEntries(t *testing.T, ents []*state.DirEntry) {
	t.Helper()
	got, ok := appendEntries(nil, ents)
	sameAsJSON(t, ents, got, ok)
}

func TestAppendEntriesMatchesJSON(t *testing.T) {
	full := fullEntry()
	cases := [][]*state.DirEntry{
		nil,
		{},
		{full},
		{{Key: "k"}},
		{{Key: "k", Value: []byte{}}},
		{full, {Key: "x", Value: []byte("1")}, nil},
		{{Key: "<html>&"}},
		{{Key: "é"}},
		{{Key: "tab\t"}},
		{{Key: `q"uote\`}},
		{{Key: "del\x7f"}},
	}
	for _, c := range cases {
		checkEntries(t, c)
	}
	if _, ok := appendEntries(nil, []*state.DirEntry{{Key: "<"}}); ok {
		t.Fatal("a key json.Marshal escapes must fall back")
	}
}

func checkTxnResults(t *testing.T, res []*state.TxnResult) {
	t.Helper()
	got, ok := appendTxnResults(nil, res)
	sameAsJSON(t, &txnResponse{Results: res}, got, ok)
}

func TestAppendTxnResultsMatchesJSON(t *testing.T) {
	full := fullEntry()
	cases := [][]*state.TxnResult{
		nil,
		{},
		{nil},
		{{}},
		{{KV: full}},
		{{KV: full}, {}, nil, {KV: &state.DirEntry{Key: "x", Value: []byte{}}}},
		queueResults(32),
		{{KV: &state.DirEntry{Key: "é"}}},
	}
	for _, c := range cases {
		checkTxnResults(t, c)
	}
	if _, ok := appendTxnResults(nil, []*state.TxnResult{{KV: full}, {KV: &state.DirEntry{Key: "<"}}}); ok {
		t.Fatal("a key json.Marshal escapes must fall back")
	}
}

func FuzzAppendEntries(f *testing.F) {
	f.Add("a/b", "", []byte("v"), uint64(1), uint64(2), uint64(3), uint64(4), false)
	f.Add("x<y", "s", []byte(nil), uint64(0), uint64(0), uint64(0), uint64(0), true)
	f.Fuzz(func(t *testing.T, key, sess string, val []byte, li, fl, ci, mi uint64, nilVal bool) {
		if nilVal {
			val = nil
		}
		e := &state.DirEntry{LockIndex: li, Key: key, Flags: fl, Value: val, Session: sess, CreateIndex: ci, ModifyIndex: mi}
		checkEntries(t, []*state.DirEntry{e})
		checkTxnResults(t, []*state.TxnResult{{KV: e}, {}})
	})
}
