package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// KVPair is one key of the store; the server calls it a DirEntry. Its
// fields are declared in the order Consul emits them, so marshalling a
// KVPair yields Consul's JSON byte for byte.
type KVPair struct {
	// LockIndex counts the acquisitions of the key's lock; it is the
	// sequencer a holder can hand to others.
	LockIndex uint64

	Key string

	// Flags is an opaque number for clients; the lock recipes put a marker
	// in it.
	Flags uint64

	// Value is the stored bytes (base64 on the wire). A key with no value
	// may come back as nil or as an empty slice.
	Value []byte

	// Session is the ID of the session holding the lock, "" if unlocked.
	Session string `json:",omitempty"`

	CreateIndex uint64
	ModifyIndex uint64
}

// KVPairs is a list of pairs, as List returns them (sorted by key). The
// pairs of one answer share their memory: keeping one
// pair keeps the strings and values of all.
type KVPairs []*KVPair

// KV is the key/value endpoint, /v1/kv. Get one with Client.KV.
type KV struct{ c *Client }

// KV returns the key/value endpoint.
func (c *Client) KV() *KV { return &KV{c} }

// Get reads one key. An absent key is not an error: Get returns a nil pair
// and the QueryMeta, whose LastIndex can be used to block until it appears.
// A leading "/" is dropped from key.
func (k *KV) Get(ctx context.Context, key string, q *QueryOptions) (*KVPair, *QueryMeta, error) {
	var out KVPairs
	qm, err := k.c.query(ctx, kvPath(key), nil, q, &out)
	if isNotFound(err) {
		return nil, qm, nil
	}
	if err != nil {
		return nil, qm, err
	}
	if len(out) == 0 {
		return nil, qm, nil
	}
	return out[0], qm, nil
}

// List reads every key that starts with prefix (?recurse), sorted by key.
// No match is not an error: the result is empty.
func (k *KV) List(ctx context.Context, prefix string, q *QueryOptions) (KVPairs, *QueryMeta, error) {
	var out KVPairs
	qm, err := k.c.query(ctx, kvPath(prefix), url.Values{"recurse": {""}}, q, &out)
	if isNotFound(err) {
		return nil, qm, nil
	}
	if err != nil {
		return nil, qm, err
	}
	return out, qm, nil
}

// Keys lists the keys under prefix (?keys) without their values. With a
// non-empty separator, keys are rolled up at the first separator after
// the prefix, the way a directory listing rolls up subdirectories
// ("a/b/c" under "a/" with "/" gives "a/b/"). No match is not an error.
func (k *KV) Keys(ctx context.Context, prefix, separator string, q *QueryOptions) ([]string, *QueryMeta, error) {
	params := url.Values{"keys": {""}}
	if separator != "" {
		params.Set("separator", separator)
	}
	var out []string
	qm, err := k.c.query(ctx, kvPath(prefix), params, q, &out)
	if isNotFound(err) {
		return nil, qm, nil
	}
	if err != nil {
		return nil, qm, err
	}
	return out, qm, nil
}

// Put writes p.Value and p.Flags to p.Key unconditionally. It does not touch
// the key's lock: p.Session is not sent.
func (k *KV) Put(ctx context.Context, p *KVPair, w *WriteOptions) (*WriteMeta, error) {
	_, wm, err := k.put(ctx, p, nil, w)
	return wm, err
}

// CAS writes p only if the key's ModifyIndex still equals p.ModifyIndex;
// p.ModifyIndex 0 means "only if the key does not exist". It reports
// whether the write happened.
func (k *KV) CAS(ctx context.Context, p *KVPair, w *WriteOptions) (bool, *WriteMeta, error) {
	if p == nil {
		return false, nil, errNilPair
	}
	return k.put(ctx, p, url.Values{"cas": {strconv.FormatUint(p.ModifyIndex, 10)}}, w)
}

// Acquire tries to lock p.Key for session p.Session, writing p.Value and
// p.Flags as it does (an empty Value empties the key). It reports whether
// the session holds the lock afterwards; re-acquiring a lock the session
// already holds succeeds.
//
// A refusal is not an error. When the server refused because the key is
// in its lock-delay window and said so, WriteMeta.LockDelayRemaining tells
// how long to wait before trying again.
func (k *KV) Acquire(ctx context.Context, p *KVPair, w *WriteOptions) (bool, *WriteMeta, error) {
	if p == nil {
		return false, nil, errNilPair
	}
	return k.put(ctx, p, url.Values{"acquire": {p.Session}}, w)
}

// Release unlocks p.Key if session p.Session holds it, writing p.Value and
// p.Flags as it does. It reports whether the lock was released; false
// means the key was not held by that session.
func (k *KV) Release(ctx context.Context, p *KVPair, w *WriteOptions) (bool, *WriteMeta, error) {
	if p == nil {
		return false, nil, errNilPair
	}
	return k.put(ctx, p, url.Values{"release": {p.Session}}, w)
}

var errNilPair = errors.New("api: nil KVPair")

// put is the PUT behind Put, CAS, Acquire and Release; params carries the
// one mode parameter, if any.
func (k *KV) put(ctx context.Context, p *KVPair, params url.Values, w *WriteOptions) (bool, *WriteMeta, error) {
	if p == nil {
		return false, nil, errNilPair
	}
	if strings.HasPrefix(p.Key, "/") {
		return false, nil, fmt.Errorf("Invalid key. Key must not begin with a '/': %s", p.Key)
	}
	r := k.c.newRequest(http.MethodPut, "/v1/kv/"+p.Key)
	for name, v := range params {
		r.params[name] = v
	}
	if p.Flags != 0 {
		r.params.Set("flags", strconv.FormatUint(p.Flags, 10))
	}
	r.body = bytes.NewReader(p.Value)
	r.contentType = "application/octet-stream"
	var ok bool
	wm, err := k.c.write(ctx, r, w, &ok)
	if err != nil {
		return false, wm, err
	}
	return ok, wm, nil
}

// Delete removes key, whether or not it is locked (locks are advisory).
// Deleting an absent key succeeds.
func (k *KV) Delete(ctx context.Context, key string, w *WriteOptions) (*WriteMeta, error) {
	r := k.c.newRequest(http.MethodDelete, kvPath(key))
	return k.c.write(ctx, r, w, nil)
}

// DeleteCAS removes p.Key only if its ModifyIndex equals p.ModifyIndex, and
// reports whether it did. An absent key counts as deleted (true).
func (k *KV) DeleteCAS(ctx context.Context, p *KVPair, w *WriteOptions) (bool, *WriteMeta, error) {
	if p == nil {
		return false, nil, errNilPair
	}
	r := k.c.newRequest(http.MethodDelete, kvPath(p.Key))
	r.params.Set("cas", strconv.FormatUint(p.ModifyIndex, 10))
	var ok bool
	wm, err := k.c.write(ctx, r, w, &ok)
	if err != nil {
		return false, wm, err
	}
	return ok, wm, nil
}

// DeleteTree removes every key that starts with prefix. An empty prefix
// empties the store.
func (k *KV) DeleteTree(ctx context.Context, prefix string, w *WriteOptions) (*WriteMeta, error) {
	r := k.c.newRequest(http.MethodDelete, kvPath(prefix))
	r.params.Set("recurse", "")
	return k.c.write(ctx, r, w, nil)
}

// kvPath is the URL path of key for reads and deletes, which forgive one
// leading slash.
func kvPath(key string) string {
	return "/v1/kv/" + strings.TrimPrefix(key, "/")
}

func isNotFound(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusNotFound
}
