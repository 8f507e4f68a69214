package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeConsul is a small in-memory stand-in for the parts of Consul's HTTP
// API the workloads use: sessions, KV with acquire/release, consistent and
// blocking reads. It exists so the load generator can be tested before
// holdfast's agent does.
type fakeConsul struct {
	mu       sync.Mutex
	index    uint64
	nextID   int
	sessions map[string]bool
	kv       map[string]*fakeEnt
	changed  chan struct{} // closed and replaced on every write
	renews   int
	dropAll  bool // answer every renew with 404
}

type fakeEnt struct {
	val     []byte
	session string
	modify  uint64
}

func newFakeConsul(t *testing.T) (*fakeConsul, string) {
	f := &fakeConsul{sessions: map[string]bool{}, kv: map[string]*fakeEnt{}, changed: make(chan struct{}), index: 1}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, strings.TrimPrefix(srv.URL, "http://")
}

// write must be called with mu held; it moves the index and wakes watchers.
func (f *fakeConsul) write() uint64 {
	f.index++
	close(f.changed)
	f.changed = make(chan struct{})
	return f.index
}

func (f *fakeConsul) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodPut && p == "/v1/session/create":
		var body struct{ TTL, LockDelay, Behavior string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil && err != io.EOF {
			http.Error(w, "Request decode failed: "+err.Error(), http.StatusBadRequest)
			return
		}
		if _, err := time.ParseDuration(body.TTL); body.TTL != "" && err != nil {
			http.Error(w, "Session TTL invalid", http.StatusInternalServerError)
			return
		}
		f.mu.Lock()
		f.nextID++
		id := fmt.Sprintf("00000000-0000-0000-0000-%012d", f.nextID)
		f.sessions[id] = true
		f.write()
		f.mu.Unlock()
		fmt.Fprintf(w, `{"ID":%q}`, id)
	case r.Method == http.MethodPut && strings.HasPrefix(p, "/v1/session/destroy/"):
		id := strings.TrimPrefix(p, "/v1/session/destroy/")
		f.mu.Lock()
		if f.sessions[id] {
			delete(f.sessions, id)
			idx := f.write()
			for _, e := range f.kv {
				if e.session == id {
					e.session = ""
					e.modify = idx
				}
			}
		}
		f.mu.Unlock()
		io.WriteString(w, "true")
	case r.Method == http.MethodPut && strings.HasPrefix(p, "/v1/session/renew/"):
		id := strings.TrimPrefix(p, "/v1/session/renew/")
		f.mu.Lock()
		ok := f.sessions[id] && !f.dropAll
		f.renews++
		f.mu.Unlock()
		if !ok {
			http.Error(w, "Session id '"+id+"' not found", http.StatusNotFound)
			return
		}
		fmt.Fprintf(w, `[{"ID":%q,"TTL":"60s"}]`, id)
	case strings.HasPrefix(p, "/v1/kv/"):
		key := strings.TrimPrefix(p, "/v1/kv/")
		if r.Method == http.MethodPut {
			f.kvPut(w, r, key)
			return
		}
		if r.Method == http.MethodGet {
			f.kvGet(w, r, key, q.Get("index"), q.Get("wait"))
			return
		}
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeConsul) kvPut(w http.ResponseWriter, r *http.Request, key string) {
	val, _ := io.ReadAll(r.Body)
	q := r.URL.Query()
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.kv[key]
	switch {
	case q.Has("acquire"):
		s := q.Get("acquire")
		if !f.sessions[s] {
			http.Error(w, fmt.Sprintf("invalid session %q", s), http.StatusInternalServerError)
			return
		}
		if e != nil && e.session != "" && e.session != s {
			io.WriteString(w, "false")
			return
		}
		if e == nil {
			e = &fakeEnt{}
			f.kv[key] = e
		}
		e.session, e.val, e.modify = s, val, f.write()
	case q.Has("release"):
		s := q.Get("release")
		if e == nil || e.session != s {
			io.WriteString(w, "false")
			return
		}
		e.session, e.val, e.modify = "", val, f.write()
	default:
		if e == nil {
			e = &fakeEnt{}
			f.kv[key] = e
		}
		e.val, e.modify = val, f.write()
	}
	io.WriteString(w, "true")
}

func (f *fakeConsul) kvGet(w http.ResponseWriter, r *http.Request, key, index, wait string) {
	var min uint64
	if index != "" {
		var err error
		if min, err = strconv.ParseUint(index, 10, 64); err != nil {
			http.Error(w, "Invalid index", http.StatusBadRequest)
			return
		}
	}
	d := 5 * time.Minute
	if wait != "" {
		var err error
		if d, err = time.ParseDuration(wait); err != nil {
			http.Error(w, "Invalid wait time", http.StatusBadRequest)
			return
		}
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		e := f.kv[key]
		idx := f.index
		if e != nil {
			idx = e.modify
		}
		ch := f.changed
		var body []byte
		if e != nil {
			ent := map[string]any{"Key": key, "Value": e.val, "ModifyIndex": e.modify}
			if e.session != "" {
				ent["Session"] = e.session
			}
			body, _ = json.Marshal([]any{ent})
		}
		f.mu.Unlock()
		if min == 0 || idx > min {
			w.Header().Set("X-Consul-Index", strconv.FormatUint(idx, 10))
			if e == nil {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write(body)
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			min = 0 // answer with what is there now
		case <-r.Context().Done():
			return
		}
	}
}
