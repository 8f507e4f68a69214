package httpapi

import (
	"net/http"
	"net/url"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// HeaderLockDelay is set on a refused ?acquire when the refusal is a
// lock-delay, not a lock held by another session. Its value is the delay
// still to run as a Go duration ("4.2s"). Consul answers a bare false in
// both cases, so its clients cannot tell a lost race from a delay.
const HeaderLockDelay = "X-Holdfast-Lock-Delay"

// kvParams is a parsed /v1/kv request.
type kvParams struct {
	key string

	// GET
	recurse bool
	keys    bool
	sep     string
	raw     bool

	// PUT and DELETE: the write to apply.
	req state.KVRequest
}

// parseKV validates the key and query of a /v1/kv request. key is the
// decoded path after /v1/kv/. It reads only its arguments, so it is safe to
// fuzz.
func parseKV(method, key string, q url.Values) (*kvParams, error) {
	p := &kvParams{key: key}
	has := func(name string) bool { _, ok := q[name]; return ok }
	switch method {
	case http.MethodGet, http.MethodPut, http.MethodDelete:
	default:
		return nil, &Error{Kind: KindMethodNotAllowed, Msg: "method " + method + " not allowed"}
	}
	if err := validateKey(key); err != nil {
		return nil, err
	}
	switch method {
	case http.MethodGet:
		p.keys = has("keys")
		p.recurse = has("recurse")
		p.raw = has("raw")
		if p.keys {
			p.sep = q.Get("separator")
			if !has("separator") {
				p.sep = q.Get("seperator") // Consul accepts the misspelling too
			}
		}
		if key == "" && !p.keys && !p.recurse {
			return nil, invalidf("Missing key name")
		}
	case http.MethodPut:
		if n := count(has, "cas", "acquire", "release"); n > 1 {
			return nil, invalidf("Conflicting flags: %s", q.Encode())
		}
		if key == "" {
			return nil, invalidf("Missing key name")
		}
		e := &p.req.Entry
		e.Key = key
		if has("flags") {
			n, err := parseUint("flags", q.Get("flags"))
			if err != nil {
				return nil, err
			}
			e.Flags = n
		}
		if has("lock-index") && !has("release") {
			return nil, invalidf("?lock-index is only meaningful with ?release")
		}
		switch {
		case has("cas"):
			n, err := parseUint("cas", q.Get("cas"))
			if err != nil {
				return nil, err
			}
			p.req.Op, e.ModifyIndex = state.OpCAS, n
		case has("acquire"):
			if e.Session = q.Get("acquire"); e.Session == "" {
				return nil, invalidf("Missing session: ?acquire needs a session ID")
			}
			p.req.Op = state.OpLock
		case has("release"):
			if e.Session = q.Get("release"); e.Session == "" {
				return nil, invalidf("Missing session: ?release needs a session ID")
			}
			if has("lock-index") {
				n, err := parseUint("lock-index", q.Get("lock-index"))
				if err != nil {
					return nil, err
				}
				if n == 0 {
					return nil, invalidf("Invalid lock-index 0: a held lock's index is at least 1")
				}
				e.LockIndex = n
			}
			p.req.Op = state.OpUnlock
		default:
			p.req.Op = state.OpSet
		}
	case http.MethodDelete:
		if n := count(has, "recurse", "cas"); n > 1 {
			return nil, invalidf("Conflicting flags: %s", q.Encode())
		}
		p.req.Entry.Key = key
		switch {
		case has("recurse"):
			p.req.Op = state.OpDeleteTree
		case key == "":
			return nil, invalidf("Missing key name")
		case has("cas"):
			n, err := parseUint("cas", q.Get("cas"))
			if err != nil {
				return nil, err
			}
			p.req.Op, p.req.Entry.ModifyIndex = state.OpDeleteCAS, n
		default:
			p.req.Op = state.OpDelete
		}
	}
	return p, nil
}

func count(has func(string) bool, names ...string) int {
	n := 0
	for _, name := range names {
		if has(name) {
			n++
		}
	}
	return n
}

func parseUint(name, s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, invalidf("Invalid %s %q: must be an unsigned 64-bit integer", name, s)
	}
	return n, nil
}

// validateKey refuses keys that would mean something else once a proxy,
// a file system or a shell got hold of them: ".." path segments (whether
// they arrived raw or percent-encoded: key is already decoded) and leading
// or trailing white space. Any other key, including "", is left to the
// caller.
func validateKey(key string) error {
	// Segments are split on '/' and '\\' byte by byte (neither byte occurs
	// inside a multi-byte UTF-8 sequence), without allocating them.
	start := 0
	for i := 0; i <= len(key); i++ {
		if i < len(key) && key[i] != '/' && key[i] != '\\' {
			continue
		}
		if i-start == 2 && key[start] == '.' && key[start+1] == '.' {
			return invalidf("Invalid key %q: \"..\" path segments are not allowed", key)
		}
		start = i + 1
	}
	if key == "" {
		return nil
	}
	first, _ := utf8.DecodeRuneInString(key)
	last, _ := utf8.DecodeLastRuneInString(key)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return invalidf("Invalid key %q: leading or trailing white space is not allowed", key)
	}
	return nil
}

func (h *handler) kvGet(w http.ResponseWriter, r *http.Request, key string) error {
	q := query(r)
	ro, err := h.parseRead(q)
	if err != nil {
		return err
	}
	p, err := parseKV(http.MethodGet, key, q)
	if err != nil {
		return err
	}
	switch {
	case p.keys:
		var keys []string
		err := h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
			idx, ks := s.KVKeys(ws, key, p.sep)
			keys = ks
			return idx, true
		})
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			if key != "" {
				w.WriteHeader(http.StatusNotFound)
				return nil
			}
			keys = []string{}
		}
		return writeJSON(w, r, keys)
	case p.recurse:
		var ents []*state.DirEntry
		err := h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
			idx, es := s.KVList(ws, key)
			ents = es
			return idx, true
		})
		if err != nil {
			return err
		}
		if len(ents) == 0 {
			w.WriteHeader(http.StatusNotFound)
			return nil
		}
		return writeEntries(w, r, ents)
	}
	var ent *state.DirEntry
	err = h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		idx, e := s.KVGet(ws, key)
		ent = e
		return idx, e != nil
	})
	if err != nil {
		return err
	}
	if ent == nil {
		w.WriteHeader(http.StatusNotFound)
		return nil
	}
	if p.raw {
		hd := w.Header()
		hd["Content-Type"] = hvTextPlain
		hd["X-Content-Type-Options"] = hvNosniff
		hd["Content-Security-Policy"] = hvSandbox
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(ent.Value)
		return nil
	}
	return writeEntries(w, r, []*state.DirEntry{ent})
}

func (h *handler) kvPut(w http.ResponseWriter, r *http.Request, key string) error {
	p, err := parseKV(http.MethodPut, key, query(r))
	if err != nil {
		return err
	}
	body, err := readBody(r, h.opts.MaxValueSize, maxSizeDoc)
	if err != nil {
		return err
	}
	p.req.Entry.Value = body
	ok, delay, err := h.b.KVS(r.Context(), &p.req)
	if err != nil {
		return err
	}
	if !ok && delay > 0 && p.req.Op == state.OpLock {
		w.Header().Set(HeaderLockDelay, delay.String())
	}
	return writeJSON(w, r, ok)
}

func (h *handler) kvDelete(w http.ResponseWriter, r *http.Request, key string) error {
	p, err := parseKV(http.MethodDelete, key, query(r))
	if err != nil {
		return err
	}
	ok, _, err := h.b.KVS(r.Context(), &p.req)
	if err != nil {
		return err
	}
	return writeJSON(w, r, ok)
}
