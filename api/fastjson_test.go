package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// Bodies captured from a holdfast agent (-dev), compact unless named
// pretty.
const (
	holdfastList   = `[{"LockIndex":0,"Key":"t/a","Flags":18446744073709551615,"Value":"aGVsbG8=","CreateIndex":6,"ModifyIndex":6},{"LockIndex":1,"Key":"t/b","Flags":0,"Value":null,"Session":"05906dbb-2a15-37b9-de08-feb383d59960","CreateIndex":7,"ModifyIndex":7},{"LockIndex":0,"Key":"t/bytes","Flags":0,"Value":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmqq6ytrq+wsbKztLW2t7i5uru8vb6/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/w==","CreateIndex":9,"ModifyIndex":9},{"LockIndex":0,"Key":"t/q\"uo\\te","Flags":0,"Value":"eQ==","CreateIndex":8,"ModifyIndex":8}]`
	holdfastGet    = `[{"LockIndex":0,"Key":"t/a","Flags":18446744073709551615,"Value":"aGVsbG8=","CreateIndex":6,"ModifyIndex":6}]`
	holdfastKeys   = `[{"LockIndex":0,"Key":"u/tab\tnl","Flags":0,"Value":"eg==","CreateIndex":13,"ModifyIndex":13},{"LockIndex":0,"Key":"u/été\u003cx\u003e\u0026\u2028y🔒","Flags":0,"Value":null,"CreateIndex":12,"ModifyIndex":12}]`
	holdfastPretty = `[
    {
        "LockIndex": 0,
        "Key": "t/a",
        "Flags": 18446744073709551615,
        "Value": "aGVsbG8=",
        "CreateIndex": 6,
        "ModifyIndex": 6
    },
    {
        "LockIndex": 1,
        "Key": "t/b",
        "Flags": 0,
        "Value": null,
        "Session": "05906dbb-2a15-37b9-de08-feb383d59960",
        "CreateIndex": 7,
        "ModifyIndex": 7
    }
]
`
	holdfastTxn      = `{"Results":[{"KV":{"LockIndex":0,"Key":"t/c","Flags":0,"Value":null,"CreateIndex":10,"ModifyIndex":10}},{"KV":{"LockIndex":1,"Key":"t/b","Flags":0,"Value":null,"Session":"05906dbb-2a15-37b9-de08-feb383d59960","CreateIndex":7,"ModifyIndex":7}},{"KV":{"LockIndex":0,"Key":"u/été\u003cx\u003e\u0026\u2028y🔒","Flags":0,"Value":"eg==","CreateIndex":13,"ModifyIndex":13}}],"Errors":null}`
	holdfastTxnErrs  = `{"Results":null,"Errors":[{"OpIndex":0,"What":"key \"t/a\" exists"},{"OpIndex":1,"What":"failed index check for key \"t/b\", current modify index 7 != 1"}]}`
	holdfastTxnEmpty = `{"Results":null,"Errors":null}`

	// What Consul Enterprise adds, and its ?pretty.
	consulList   = `[{"LockIndex":0,"Key":"a","Flags":0,"Value":"eA==","Namespace":"default","Partition":"default","CreateIndex":1,"ModifyIndex":2}]`
	consulPretty = `[
    {
        "LockIndex": 0,
        "Key": "a",
        "Flags": 0,
        "Value": "eA==",
        "Session": "s",
        "Namespace": "default",
        "Partition": "default",
        "CreateIndex": 1,
        "ModifyIndex": 2
    }
]
`
	consulTxnPretty = `{
    "Results": [
        {
            "KV": {
                "LockIndex": 0,
                "Key": "a",
                "Flags": 0,
                "Value": null,
                "Namespace": "default",
                "Partition": "default",
                "CreateIndex": 3,
                "ModifyIndex": 3
            }
        }
    ],
    "Errors": null
}
`
)

var allBytes = func() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// decodeCase checks that body decodes into a fresh value of out's type
// exactly as encoding/json decodes it, both as json.Decoder.Decode (the
// answer of a request) and as json.Unmarshal (the body of a 409), and
// reports whether the fast path took it (without fallback) each way.
func decodeCase(t testing.TB, body []byte, newOut func() any) (fast, fastStrict bool) {
	t.Helper()
	zero := newOut()

	// json.Decoder.Decode, which decodeJSON stands for.
	want := newOut()
	wantErr := json.NewDecoder(bytes.NewReader(body)).Decode(want)
	got := newOut()
	d := new(fastDecoder)
	fast = d.decode(body, got, false)
	if fast {
		if wantErr != nil {
			t.Fatalf("fast path took %q, encoding/json fails: %v", body, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("fast path on %q:\n got %s\nwant %s", body, dump(got), dump(want))
		}
	} else if !reflect.DeepEqual(got, zero) {
		t.Fatalf("fast path gave up on %q but changed out to %s", body, dump(got))
	}
	got = newOut()
	err := decodeJSON(bytes.NewReader(body), got)
	if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != "api: decoding response: "+wantErr.Error()) {
		t.Fatalf("decodeJSON(%q) = %v, encoding/json: %v", body, err, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decodeJSON(%q):\n got %s\nwant %s", body, dump(got), dump(want))
	}

	// json.Unmarshal.
	want = newOut()
	wantErr = json.Unmarshal(body, want)
	got = newOut()
	fastStrict = d.decode(body, got, true)
	if fastStrict && wantErr != nil {
		t.Fatalf("strict fast path took %q, json.Unmarshal fails: %v", body, wantErr)
	}
	got = newOut()
	err = unmarshalJSON(body, got)
	if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
		t.Fatalf("unmarshalJSON(%q) = %v, json.Unmarshal: %v", body, err, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("unmarshalJSON(%q):\n got %s\nwant %s", body, dump(got), dump(want))
	}
	return fast, fastStrict
}

func newKVPairs() any     { return new(KVPairs) }
func newTxnResponse() any { return new(TxnResponse) }

// dump shows nil and empty slices apart, which %+v does not.
func dump(v any) string {
	b, _ := json.Marshal(v)
	var s strings.Builder
	s.Write(b)
	fmt.Fprintf(&s, " %#v", reflect.ValueOf(v).Elem().Interface())
	return s.String()
}

func TestFastDecodeKV(t *testing.T) {
	tests := []struct {
		name string
		body string
		fast bool // whether the fast path must take it (Decoder semantics)
		err  bool // whether encoding/json fails
		want KVPairs
	}{
		{name: "holdfast list", body: holdfastList, fast: true},
		{name: "holdfast get", body: holdfastGet, fast: true, want: KVPairs{{Key: "t/a", Flags: 1<<64 - 1, Value: []byte("hello"), CreateIndex: 6, ModifyIndex: 6}}},
		{name: "holdfast escaped and unicode keys", body: holdfastKeys, fast: true},
		{name: "holdfast pretty", body: holdfastPretty, fast: true},
		{name: "consul unknown fields", body: consulList, fast: true, want: KVPairs{{Key: "a", Value: []byte("x"), CreateIndex: 1, ModifyIndex: 2}}},
		{name: "consul pretty", body: consulPretty, fast: true},
		{name: "unknown nested field", body: `[{"Key":"a","Meta":{"x":[1,-2.5e+3,true,false,null,"s\u00e9\n",{}],"y":[]}}]`, fast: true, want: KVPairs{{Key: "a"}}},
		{name: "session absent", body: `[{"Key":"a","Session":"s"},{"Key":"b"}]`, fast: true, want: KVPairs{{Key: "a", Session: "s"}, {Key: "b"}}},
		{name: "session null", body: `[{"Key":"a","Session":null}]`, fast: true, want: KVPairs{{Key: "a"}}},
		{name: "value null", body: `[{"Key":"a","Value":null}]`, fast: true, want: KVPairs{{Key: "a"}}},
		{name: "value absent", body: `[{"Key":"a"}]`, fast: true, want: KVPairs{{Key: "a"}}},
		{name: "value empty", body: `[{"Key":"a","Value":""}]`, fast: true, want: KVPairs{{Key: "a", Value: []byte{}}}},
		{name: "numbers null", body: `[{"LockIndex":null,"Flags":null,"CreateIndex":null,"ModifyIndex":null,"Key":null}]`, fast: true, want: KVPairs{{}}},
		{name: "fields in any order", body: `[{"ModifyIndex":2,"Value":"eA==","Key":"k","CreateIndex":1}]`, fast: true, want: KVPairs{{Key: "k", Value: []byte("x"), CreateIndex: 1, ModifyIndex: 2}}},
		{name: "empty array", body: `[]`, fast: true, want: KVPairs{}},
		{name: "empty array with spaces", body: " \n[ \t]\r\n", fast: true, want: KVPairs{}},
		{name: "null", body: `null`, fast: true, want: nil},
		{name: "null element", body: `[null,{}]`, fast: true, want: KVPairs{nil, {}}},
		{name: "trailing bytes are not read", body: `[{"Key":"a"}]]garbage`, fast: true, want: KVPairs{{Key: "a"}}},
		{name: "escapes", body: `[{"Key":"\"\\\/\b\f\n\r\t\u0000\u00e9\u20ac\uFFFF"}]`, fast: true, want: KVPairs{{Key: "\"\\/\b\f\n\r\t\x00é€\uffff"}}},

		// What the fast path leaves to encoding/json.
		{name: "name in another case", body: `[{"key":"a","FLAGS":3}]`, want: KVPairs{{Key: "a", Flags: 3}}},
		{name: "duplicate field", body: `[{"Key":"a","Key":"b"}]`, want: KVPairs{{Key: "b"}}},
		{name: "surrogate pair", body: `[{"Key":"\ud83d\udd12"}]`, want: KVPairs{{Key: "🔒"}}},
		{name: "lone surrogate", body: `[{"Key":"\ud83d"}]`, want: KVPairs{{Key: "\ufffd"}}},
		{name: "invalid UTF-8", body: "[{\"Key\":\"a\xffb\"}]", want: KVPairs{{Key: "a\ufffdb"}}},
		{name: "escaped base64", body: `[{"Value":"aGVs\u0062G8="}]`, want: KVPairs{{Value: []byte("hello")}}},
		{name: "escaped name", body: `[{"K\u0065y":"a"}]`, want: KVPairs{{Key: "a"}}},
		{name: "number too big", body: `[{"Flags":18446744073709551616}]`, err: true},
		{name: "negative", body: `[{"Flags":-1}]`, err: true},
		{name: "fraction", body: `[{"Flags":1.0}]`, err: true},
		{name: "exponent", body: `[{"Flags":1e2}]`, err: true},
		{name: "leading zero", body: `[{"Flags":01}]`, err: true},
		{name: "string number", body: `[{"Flags":"1"}]`, err: true},
		{name: "bad base64", body: `[{"Key":"a","Value":"abc"}]`, err: true},
		{name: "value as an array", body: `[{"Value":[1,2]}]`, want: KVPairs{{Value: []byte{1, 2}}}},
		{name: "value a bool", body: `[{"Value":true}]`, err: true},
		{name: "object", body: `{"Key":"a"}`, err: true},
		{name: "nested array", body: `[[]]`, err: true},
		{name: "truncated", body: `[{"Key":"a"`, err: true},
		{name: "trailing comma", body: `[{"Key":"a"},]`, err: true},
		{name: "control character", body: "[{\"Key\":\"a\nb\"}]", err: true},
		{name: "bad escape", body: `[{"Key":"\x41"}]`, err: true},
		{name: "empty", body: ``, err: true},
		{name: "spaces only", body: "  \n", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fast, _ := decodeCase(t, []byte(tt.body), newKVPairs)
			if fast != tt.fast {
				t.Errorf("fast path taken: %v, want %v", fast, tt.fast)
			}
			var got KVPairs
			err := decodeJSON(strings.NewReader(tt.body), &got)
			if (err != nil) != tt.err {
				t.Fatalf("err = %v, want error: %v", err, tt.err)
			}
			if tt.want != nil || tt.body == "null" {
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("got %s, want %s", dump(&got), dump(&tt.want))
				}
			}
		})
	}
}

func TestFastDecodeTxn(t *testing.T) {
	tests := []struct {
		name string
		body string
		fast bool
		err  bool
		want *TxnResponse
	}{
		{name: "holdfast results", body: holdfastTxn, fast: true},
		{name: "holdfast errors", body: holdfastTxnErrs, fast: true, want: &TxnResponse{Errors: TxnErrors{
			{OpIndex: 0, What: `key "t/a" exists`},
			{OpIndex: 1, What: `failed index check for key "t/b", current modify index 7 != 1`},
		}}},
		{name: "holdfast empty", body: holdfastTxnEmpty, fast: true, want: &TxnResponse{}},
		{name: "consul pretty", body: consulTxnPretty, fast: true, want: &TxnResponse{Results: TxnResults{{KV: &KVPair{Key: "a", CreateIndex: 3, ModifyIndex: 3}}}}},
		{name: "result without KV", body: `{"Results":[{},{"KV":null},null,{"KV":{}}]}`, fast: true, want: &TxnResponse{Results: TxnResults{{}, {}, nil, {KV: &KVPair{}}}}},
		{name: "empty arrays", body: `{"Results":[],"Errors":[]}`, fast: true, want: &TxnResponse{Results: TxnResults{}, Errors: TxnErrors{}}},
		{name: "null", body: `null`, fast: true, want: &TxnResponse{}},
		{name: "empty object", body: `{}`, fast: true, want: &TxnResponse{}},
		{name: "unknown fields", body: `{"Index":3,"Results":[{"KV":{"Key":"a"},"X":"y"}],"Errors":[{"OpIndex":-1,"What":null,"Z":1}]}`, fast: true,
			want: &TxnResponse{Results: TxnResults{{KV: &KVPair{Key: "a"}}}, Errors: TxnErrors{{OpIndex: -1}}}},
		{name: "error element null", body: `{"Errors":[null,{}]}`, fast: true, want: &TxnResponse{Errors: TxnErrors{nil, {}}}},

		{name: "duplicate KV merges", body: `{"Results":[{"KV":{"Key":"a"},"KV":{"Flags":1}}]}`, want: &TxnResponse{Results: TxnResults{{KV: &KVPair{Key: "a", Flags: 1}}}}},
		{name: "name in another case", body: `{"results":[{"kv":{"Key":"a"}}]}`, want: &TxnResponse{Results: TxnResults{{KV: &KVPair{Key: "a"}}}}},
		{name: "OpIndex too big", body: `{"Errors":[{"OpIndex":9223372036854775808}]}`, err: true},
		{name: "OpIndex fraction", body: `{"Errors":[{"OpIndex":1.5}]}`, err: true},
		{name: "results not an array", body: `{"Results":{}}`, err: true},
		{name: "array", body: `[]`, err: true},
		{name: "truncated", body: `{"Results":[{"KV":`, err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fast, _ := decodeCase(t, []byte(tt.body), newTxnResponse)
			if fast != tt.fast {
				t.Errorf("fast path taken: %v, want %v", fast, tt.fast)
			}
			got := &TxnResponse{}
			err := decodeJSON(strings.NewReader(tt.body), got)
			if (err != nil) != tt.err {
				t.Fatalf("err = %v, want error: %v", err, tt.err)
			}
			if tt.want != nil && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %s, want %s", dump(got), dump(tt.want))
			}
		})
	}
}

// TestFastDecodeAllBytes: a value holding every byte, and each byte alone.
func TestFastDecodeAllBytes(t *testing.T) {
	var got KVPairs
	if err := decodeJSON(strings.NewReader(holdfastList), &got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[2].Value, allBytes) {
		t.Fatalf("Value = %x, want 00..ff", got[2].Value)
	}
	for i := 0; i < 256; i++ {
		pairs := KVPairs{{Key: "k", Value: []byte{byte(i)}}, {Key: "k2", Value: []byte{byte(i), byte(255 - i)}}}
		body, _ := json.Marshal(pairs)
		if fast, _ := decodeCase(t, body, newKVPairs); !fast {
			t.Fatalf("fast path refused %s", body)
		}
	}
}

// TestFastDecodeValuesDoNotOverlap: the values of one answer share an
// array, but appending to one must not write into the next.
func TestFastDecodeValuesDoNotOverlap(t *testing.T) {
	var got KVPairs
	if err := decodeJSON(strings.NewReader(`[{"Value":"YWJj"},{"Value":"ZGVm"}]`), &got); err != nil {
		t.Fatal(err)
	}
	_ = append(got[0].Value, 'X')
	if string(got[1].Value) != "def" {
		t.Fatalf("second value = %q after appending to the first", got[1].Value)
	}
}

// TestFastDecodeRoundTrip marshals random pairs and results, compact and
// indented, and checks that the fast path takes them all.
func TestFastDecodeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	randString := func() string {
		b := make([]rune, rng.Intn(12))
		for i := range b {
			switch rng.Intn(4) {
			case 0:
				b[i] = rune(rng.Intn(0x80))
			case 1:
				b[i] = rune(rng.Intn(0xD800))
			case 2:
				b[i] = rune(0xE000 + rng.Intn(0x110000-0xE000))
			default:
				b[i] = rune('a' + rng.Intn(26))
			}
		}
		return string(b)
	}
	randPair := func() *KVPair {
		p := &KVPair{LockIndex: rng.Uint64() >> rng.Intn(64), Key: randString(), Flags: rng.Uint64() >> rng.Intn(64),
			Session: randString(), CreateIndex: rng.Uint64() >> rng.Intn(64), ModifyIndex: rng.Uint64() >> rng.Intn(64)}
		if rng.Intn(3) > 0 {
			p.Value = make([]byte, rng.Intn(40))
			rng.Read(p.Value)
		}
		return p
	}
	for i := 0; i < 500; i++ {
		pairs := make(KVPairs, rng.Intn(6))
		for j := range pairs {
			pairs[j] = randPair()
		}
		resp := &TxnResponse{}
		for j := rng.Intn(5); j > 0; j-- {
			r := &TxnResult{}
			if rng.Intn(4) > 0 {
				r.KV = randPair()
			}
			resp.Results = append(resp.Results, r)
		}
		for j := rng.Intn(3); j > 0; j-- {
			resp.Errors = append(resp.Errors, &TxnError{OpIndex: rng.Intn(100), What: randString()})
		}
		for _, v := range []struct {
			v   any
			new func() any
		}{{pairs, newKVPairs}, {resp, newTxnResponse}} {
			compact, _ := json.Marshal(v.v)
			indented, _ := json.MarshalIndent(v.v, "", "    ")
			for _, body := range [][]byte{compact, indented} {
				if fast, strict := decodeCase(t, body, v.new); !fast || !strict {
					t.Fatalf("fast path refused %s", body)
				}
			}
		}
	}
}

// FuzzDecode: for any bytes, decoding KVPairs or a TxnResponse gives what
// encoding/json gives, value and error alike.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		holdfastList, holdfastGet, holdfastKeys, holdfastPretty, holdfastTxn, holdfastTxnErrs, holdfastTxnEmpty,
		consulList, consulPretty, consulTxnPretty,
		`[]`, `null`, `[null,{}]`, `[{"Key":"\ud83d\udd12","Value":""}]`, `{"Results":[{},{"KV":null}],"Errors":[{"OpIndex":-1}]}`,
		`nullx`, `[]]`, "\t[{\"Flags\":18446744073709551615}]", `[{"Flags":99999999999999999999}]`, `[{"Flags":0.5e1}]`,
		`[{"Key":"\u00e9\ud800","Session":"\/\"","Value":"eA=\u003d"}]`, `[{"Meta":[[[[{"a":{"b":[1e5,-0.1]}}]]]]}]`,
		`{"Errors":[{"OpIndex":-9223372036854775808,"What":"x"}],"Results":[{"KV":{"Key":"a"},"kv":null}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		decodeCase(t, body, newKVPairs)
		decodeCase(t, body, newTxnResponse)
	})
}

// benchPairs is a lock with 32 contenders as a prefix read returns it: the
// lock key, held, and its queue.
func benchPairs() KVPairs {
	rng := rand.New(rand.NewSource(2))
	uuid := func() string {
		b := make([]byte, 16)
		rng.Read(b)
		return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	}
	var pairs KVPairs
	holder := uuid()
	pairs = append(pairs, &KVPair{LockIndex: 1234, Key: "service/bench/lock", Flags: 0x2ddccbc058a50c18, Value: []byte("worker-17"), Session: holder, CreateIndex: 1021, ModifyIndex: 98765})
	for i := 0; i < 31; i++ {
		s := uuid()
		if i == 0 {
			s = holder
		}
		pairs = append(pairs, &KVPair{LockIndex: 1, Key: "service/bench/lock/.queue/" + s, Flags: 0x2ddccbc058a50c18, Value: []byte("worker-17"), Session: s, CreateIndex: uint64(98000 + i), ModifyIndex: uint64(98000 + i)})
	}
	return pairs
}

func benchDecode(b *testing.B, body []byte, newOut func() any) {
	b.Run("encoding_json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			out := newOut()
			if err := json.NewDecoder(bytes.NewReader(body)).Decode(out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			out := newOut()
			if err := decodeJSON(bytes.NewReader(body), out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecodeKVList32(b *testing.B) {
	body, _ := json.Marshal(benchPairs())
	if fast, _ := decodeCase(b, body, newKVPairs); !fast {
		b.Fatal("fast path refused the body")
	}
	benchDecode(b, body, newKVPairs)
}

func BenchmarkDecodeTxn32(b *testing.B) {
	pairs := benchPairs()
	resp := &TxnResponse{Results: TxnResults{{KV: &KVPair{LockIndex: 1, Key: pairs[5].Key, Flags: pairs[5].Flags, Session: pairs[5].Session, CreateIndex: 99000, ModifyIndex: 99000}}}}
	for _, p := range pairs {
		resp.Results = append(resp.Results, &TxnResult{KV: p})
	}
	body, _ := json.Marshal(resp)
	if fast, _ := decodeCase(b, body, newTxnResponse); !fast {
		b.Fatal("fast path refused the body")
	}
	benchDecode(b, body, newTxnResponse)
}
