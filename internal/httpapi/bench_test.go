package httpapi

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"
)

// benchWriter is a minimal http.ResponseWriter, so that the benchmarks
// count the handler's work and not a recorder's.
type benchWriter struct {
	hd     http.Header
	status int
	n      int
}

func (w *benchWriter) Header() http.Header         { return w.hd }
func (w *benchWriter) WriteHeader(s int)           { w.status = s }
func (w *benchWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

func benchRequest(method, target string, body []byte) *http.Request {
	u, err := url.Parse(target)
	if err != nil {
		panic(err)
	}
	r := &http.Request{Method: method, URL: u, Header: http.Header{}, ContentLength: int64(len(body)), Body: http.NoBody}
	if body != nil {
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	return r
}

// BenchmarkHandlerKVPut is one PUT /v1/kv/<key> through the handler over
// the fake backend (which JSON-encodes the command and applies it to a
// state.Store, as the FSM would).
func BenchmarkHandlerKVPut(b *testing.B) {
	h := New(newFakeBackend(newFakeClock()), Options{})
	val := []byte("0123456789abcdef")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r := benchRequest("PUT", "/v1/kv/bench/"+strconv.Itoa(i%1000), val)
		w := &benchWriter{hd: http.Header{}}
		h.ServeHTTP(w, r)
		if w.status != 200 {
			b.Fatal(w.status)
		}
	}
}

// BenchmarkHandlerKVGet is one GET /v1/kv/<key>?index=N whose index is
// already behind: what a woken blocking query does once more.
func BenchmarkHandlerKVGet(b *testing.B) {
	f := newFakeBackend(newFakeClock())
	h := New(f, Options{})
	w := &benchWriter{hd: http.Header{}}
	h.ServeHTTP(w, benchRequest("PUT", "/v1/kv/bench/watch", []byte("0123456789abcdef")))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r := benchRequest("GET", "/v1/kv/bench/watch?index=1&wait=10000ms", nil)
		w := &benchWriter{hd: http.Header{}}
		h.ServeHTTP(w, r)
		if w.status != 200 {
			b.Fatal(w.status)
		}
	}
}
