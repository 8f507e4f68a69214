package api

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestKVGet(t *testing.T) {
	tests := []struct {
		name      string
		key       string
		reply     reply
		wantPath  string
		wantPair  *KVPair
		wantIndex uint64
	}{
		{
			name:     "found",
			key:      "foo/bar",
			reply:    reply{Header: readHeaders("15"), Body: `[{"LockIndex":1,"Key":"foo/bar","Flags":3,"Value":"aGVsbG8=","Session":"s1","CreateIndex":12,"ModifyIndex":15}]`},
			wantPath: "/v1/kv/foo/bar",
			wantPair: &KVPair{LockIndex: 1, Key: "foo/bar", Flags: 3, Value: []byte("hello"), Session: "s1", CreateIndex: 12, ModifyIndex: 15},
			// The index of a single key is its ModifyIndex.
			wantIndex: 15,
		},
		{
			name:      "absent is nil, not an error, and keeps the index",
			key:       "nope",
			reply:     reply{Code: 404, Header: readHeaders("31")},
			wantPath:  "/v1/kv/nope",
			wantIndex: 31,
		},
		{
			name:      "leading slash is dropped",
			key:       "/foo",
			reply:     reply{Header: readHeaders("4"), Body: `[{"LockIndex":0,"Key":"foo","Flags":0,"Value":null,"CreateIndex":4,"ModifyIndex":4}]`},
			wantPath:  "/v1/kv/foo",
			wantPair:  &KVPair{Key: "foo", CreateIndex: 4, ModifyIndex: 4},
			wantIndex: 4,
		},
		{
			name:      "empty value as empty string",
			key:       "e",
			reply:     reply{Header: readHeaders("5"), Body: `[{"LockIndex":0,"Key":"e","Flags":0,"Value":"","CreateIndex":5,"ModifyIndex":5}]`},
			wantPath:  "/v1/kv/e",
			wantPair:  &KVPair{Key: "e", Value: []byte{}, CreateIndex: 5, ModifyIndex: 5},
			wantIndex: 5,
		},
		{
			name:      "odd characters are escaped in the path",
			key:       "a b?c#d",
			reply:     reply{Code: 404, Header: readHeaders("2")},
			wantPath:  "/v1/kv/a b?c#d",
			wantIndex: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, c := newStub(t, func(seen) reply { return tt.reply })
			pair, qm, err := c.KV().Get(context.Background(), tt.key, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := st.last(t)
			if got.Method != "GET" || got.Path != tt.wantPath || len(got.Query) != 0 {
				t.Errorf("request = %s %s ?%v, want GET %s", got.Method, got.Path, got.Query, tt.wantPath)
			}
			if !reflect.DeepEqual(pair, tt.wantPair) {
				t.Errorf("pair = %+v, want %+v", pair, tt.wantPair)
			}
			if qm == nil || qm.LastIndex != tt.wantIndex {
				t.Errorf("meta = %+v, want index %d", qm, tt.wantIndex)
			}
		})
	}
}

func TestKVGetServerError(t *testing.T) {
	_, c := newStub(t, func(seen) reply { return reply{Code: 500, Body: "No cluster leader"} })
	pair, _, err := c.KV().Get(context.Background(), "k", nil)
	if pair != nil || err == nil || err.Error() != "Unexpected response code: 500 (No cluster leader)" {
		t.Fatalf("got %v, %v", pair, err)
	}
}

func TestKVListAndKeys(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name      string
		call      func(c *Client) (any, *QueryMeta, error)
		reply     reply
		wantPath  string
		wantQuery string
		want      any
	}{
		{
			name: "list",
			call: func(c *Client) (any, *QueryMeta, error) {
				return unpack(c.KV().List(ctx, "foo/", &QueryOptions{WaitIndex: 8, WaitTime: 15 * time.Second}))
			},
			reply: reply{Header: readHeaders("9"), Body: `[{"LockIndex":0,"Key":"foo/a","Flags":0,"Value":"MQ==","CreateIndex":3,"ModifyIndex":3},` +
				`{"LockIndex":0,"Key":"foo/b","Flags":0,"Value":"Mg==","CreateIndex":9,"ModifyIndex":9}]`},
			wantPath: "/v1/kv/foo/", wantQuery: "index=8&recurse&wait=15000ms",
			want: KVPairs{{Key: "foo/a", Value: []byte("1"), CreateIndex: 3, ModifyIndex: 3}, {Key: "foo/b", Value: []byte("2"), CreateIndex: 9, ModifyIndex: 9}},
		},
		{
			name:     "list of nothing",
			call:     func(c *Client) (any, *QueryMeta, error) { return unpack(c.KV().List(ctx, "none/", nil)) },
			reply:    reply{Code: 404, Header: readHeaders("9")},
			wantPath: "/v1/kv/none/", wantQuery: "recurse",
			want: KVPairs(nil),
		},
		{
			name: "keys with separator",
			call: func(c *Client) (any, *QueryMeta, error) {
				return unpack(c.KV().Keys(ctx, "foo/", "/", &QueryOptions{AllowStale: true}))
			},
			reply:    reply{Header: readHeaders("9"), Body: `["foo/a","foo/dir/"]`},
			wantPath: "/v1/kv/foo/", wantQuery: "keys&separator=%2F&stale",
			want: []string{"foo/a", "foo/dir/"},
		},
		{
			name:     "keys at the root",
			call:     func(c *Client) (any, *QueryMeta, error) { return unpack(c.KV().Keys(ctx, "", "", nil)) },
			reply:    reply{Header: readHeaders("9"), Body: `[]`},
			wantPath: "/v1/kv/", wantQuery: "keys",
			want: []string{},
		},
		{
			name:     "keys of nothing",
			call:     func(c *Client) (any, *QueryMeta, error) { return unpack(c.KV().Keys(ctx, "none", "", nil)) },
			reply:    reply{Code: 404, Header: readHeaders("9")},
			wantPath: "/v1/kv/none", wantQuery: "keys",
			want: []string(nil),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, c := newStub(t, func(seen) reply { return tt.reply })
			got, qm, err := tt.call(c)
			if err != nil {
				t.Fatal(err)
			}
			req := st.last(t)
			if req.Method != "GET" || req.Path != tt.wantPath || queryString(req.Query) != tt.wantQuery {
				t.Errorf("request = %s %s?%s, want GET %s?%s", req.Method, req.Path, queryString(req.Query), tt.wantPath, tt.wantQuery)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("result = %#v, want %#v", got, tt.want)
			}
			if qm.LastIndex != 9 {
				t.Errorf("index = %d, want 9", qm.LastIndex)
			}
		})
	}
}

// unpack turns a typed (result, meta, error) triple into an untyped one.
func unpack[T any](v T, qm *QueryMeta, err error) (any, *QueryMeta, error) { return v, qm, err }

func TestKVWrites(t *testing.T) {
	ctx := context.Background()
	type result struct {
		ok  bool
		err error
	}
	boolCall := func(ok bool, _ *WriteMeta, err error) result { return result{ok, err} }
	plainCall := func(_ *WriteMeta, err error) result { return result{true, err} }
	tests := []struct {
		name       string
		call       func(kv *KV) result
		body       string // server's answer
		wantMethod string
		wantPath   string
		wantQuery  string
		wantBody   string
		wantOK     bool
	}{
		{"put", func(kv *KV) result {
			return plainCall(kv.Put(ctx, &KVPair{Key: "a/b", Value: []byte("v"), Session: "ignored"}, nil))
		}, "true", "PUT", "/v1/kv/a/b", "", "v", true},
		{"put with flags", func(kv *KV) result {
			return plainCall(kv.Put(ctx, &KVPair{Key: "k", Flags: 42, Value: []byte("x")}, nil))
		}, "true", "PUT", "/v1/kv/k", "flags=42", "x", true},
		{"cas hit", func(kv *KV) result {
			return boolCall(kv.CAS(ctx, &KVPair{Key: "k", ModifyIndex: 17, Value: []byte("x")}, nil))
		}, "true", "PUT", "/v1/kv/k", "cas=17", "x", true},
		{"cas zero means create only", func(kv *KV) result {
			return boolCall(kv.CAS(ctx, &KVPair{Key: "k"}, nil))
		}, "false", "PUT", "/v1/kv/k", "cas=0", "", false},
		{"acquire", func(kv *KV) result {
			return boolCall(kv.Acquire(ctx, &KVPair{Key: "lock", Session: "s1", Flags: 3304740253564472344, Value: []byte("me")}, nil))
		}, "true", "PUT", "/v1/kv/lock", "acquire=s1&flags=3304740253564472344", "me", true},
		{"acquire refused", func(kv *KV) result {
			return boolCall(kv.Acquire(ctx, &KVPair{Key: "lock", Session: "s2"}, nil))
		}, "false\n", "PUT", "/v1/kv/lock", "acquire=s2", "", false},
		{"release", func(kv *KV) result {
			return boolCall(kv.Release(ctx, &KVPair{Key: "lock", Session: "s1"}, nil))
		}, "true", "PUT", "/v1/kv/lock", "release=s1", "", true},
		{"release refused", func(kv *KV) result {
			return boolCall(kv.Release(ctx, &KVPair{Key: "lock", Session: "s9", Value: []byte("1")}, nil))
		}, "false", "PUT", "/v1/kv/lock", "release=s9", "1", false},
		{"delete", func(kv *KV) result {
			return plainCall(kv.Delete(ctx, "/a/b", nil))
		}, "true", "DELETE", "/v1/kv/a/b", "", "", true},
		{"delete cas", func(kv *KV) result {
			return boolCall(kv.DeleteCAS(ctx, &KVPair{Key: "k", ModifyIndex: 5}, nil))
		}, "false", "DELETE", "/v1/kv/k", "cas=5", "", false},
		{"delete tree", func(kv *KV) result {
			return plainCall(kv.DeleteTree(ctx, "dir/", &WriteOptions{Datacenter: "dc9"}))
		}, "true", "DELETE", "/v1/kv/dir/", "dc=dc9&recurse", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, c := newStub(t, func(seen) reply { return reply{Body: tt.body} })
			r := tt.call(c.KV())
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.ok != tt.wantOK {
				t.Errorf("ok = %v, want %v", r.ok, tt.wantOK)
			}
			req := st.last(t)
			if req.Method != tt.wantMethod || req.Path != tt.wantPath || queryString(req.Query) != tt.wantQuery {
				t.Errorf("request = %s %s?%s, want %s %s?%s", req.Method, req.Path, queryString(req.Query),
					tt.wantMethod, tt.wantPath, tt.wantQuery)
			}
			if req.Body != tt.wantBody {
				t.Errorf("body = %q, want %q", req.Body, tt.wantBody)
			}
			if req.Method == "PUT" && req.ContentType != "application/octet-stream" {
				t.Errorf("content type = %q", req.ContentType)
			}
		})
	}
}

func TestKVPutRejectsLeadingSlash(t *testing.T) {
	st, c := newStub(t, nil)
	_, err := c.KV().Put(context.Background(), &KVPair{Key: "/abs"}, nil)
	if err == nil || err.Error() != "Invalid key. Key must not begin with a '/': /abs" {
		t.Fatalf("err = %v", err)
	}
	if _, _, err := c.KV().Acquire(context.Background(), nil, nil); err == nil {
		t.Fatal("nil pair accepted")
	}
	if st.count() != 0 {
		t.Fatal("a request was sent")
	}
}

func TestAcquireLockDelayHeader(t *testing.T) {
	tests := []struct {
		header string
		want   time.Duration
	}{
		{"14.2s", 14200 * time.Millisecond},
		{"250ms", 250 * time.Millisecond},
		{"", 0},
		{"soon", 0}, // malformed: ignored
		{"-1s", 0},
	}
	for _, tt := range tests {
		_, c := newStub(t, func(seen) reply {
			h := map[string]string{}
			if tt.header != "" {
				h["X-Holdfast-Lock-Delay"] = tt.header
			}
			return reply{Header: h, Body: "false"}
		})
		ok, wm, err := c.KV().Acquire(context.Background(), &KVPair{Key: "k", Session: "s"}, nil)
		if err != nil || ok {
			t.Fatalf("%q: ok=%v err=%v", tt.header, ok, err)
		}
		if wm.LockDelayRemaining != tt.want {
			t.Errorf("%q: LockDelayRemaining = %v, want %v", tt.header, wm.LockDelayRemaining, tt.want)
		}
	}
}

func TestWriteIndexHeader(t *testing.T) {
	_, c := newStub(t, func(seen) reply { return reply{Header: map[string]string{"X-Consul-Index": "77"}, Body: "true"} })
	wm, err := c.KV().Put(context.Background(), &KVPair{Key: "k"}, nil)
	if err != nil || wm.LastIndex != 77 {
		t.Fatalf("wm=%+v err=%v", wm, err)
	}
}

func TestKVPairJSON(t *testing.T) {
	tests := []struct {
		name string
		pair KVPair
		want string
	}{
		{"unlocked, session omitted", KVPair{LockIndex: 0, Key: "foo/bar", Flags: 0, Value: []byte("hello"), CreateIndex: 12, ModifyIndex: 15},
			`{"LockIndex":0,"Key":"foo/bar","Flags":0,"Value":"aGVsbG8=","CreateIndex":12,"ModifyIndex":15}`},
		{"locked", KVPair{LockIndex: 1, Key: "k", Flags: 7, Value: []byte("v"), Session: "adf4238a-882b-9ddc-4a9d-5b6758e4159e", CreateIndex: 3, ModifyIndex: 4},
			`{"LockIndex":1,"Key":"k","Flags":7,"Value":"dg==","Session":"adf4238a-882b-9ddc-4a9d-5b6758e4159e","CreateIndex":3,"ModifyIndex":4}`},
		{"no value is null", KVPair{Key: "k", CreateIndex: 2, ModifyIndex: 2},
			`{"LockIndex":0,"Key":"k","Flags":0,"Value":null,"CreateIndex":2,"ModifyIndex":2}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustJSON(t, tt.pair); got != tt.want {
				t.Errorf("json = %s\nwant   %s", got, tt.want)
			}
			var back KVPair
			if err := json.Unmarshal([]byte(tt.want), &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, tt.pair) {
				t.Errorf("round trip = %+v, want %+v", back, tt.pair)
			}
		})
	}
}

func TestKVFlagsFullRange(t *testing.T) {
	// Flags is a u64: the semaphore marker does not fit in an int64.
	in := `[{"LockIndex":0,"Key":"p/.lock","Flags":16210313421097356768,"Value":null,"CreateIndex":1,"ModifyIndex":1}]`
	_, c := newStub(t, func(seen) reply { return reply{Header: readHeaders("1"), Body: in} })
	pair, _, err := c.KV().Get(context.Background(), "p/.lock", nil)
	if err != nil || pair.Flags != 0xe0f69a2baa414de0 {
		t.Fatalf("pair=%+v err=%v", pair, err)
	}
	if !strings.Contains(mustJSON(t, pair), `"Flags":16210313421097356768`) {
		t.Fatal("flags not written back in full")
	}
}
