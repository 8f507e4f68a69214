package api

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// Answers as holdfast's server sends them.
const (
	hfPutAnswer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n" +
		"Date: Sun, 22 Nov 2026 00:46:07 GMT\r\n\r\ntrue"
	hfGetAnswer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" +
		"X-Consul-Effective-Consistency: leader\r\nX-Consul-Index: 76096\r\n" +
		"X-Consul-Knownleader: true\r\nX-Consul-Lastcontact: 0\r\nContent-Length: 92\r\n" +
		"Date: Sun, 22 Nov 2026 00:46:07 GMT\r\n\r\n" +
		`[{"LockIndex":0,"Key":"a","Flags":0,"Value":"aGk=","CreateIndex":76096,"ModifyIndex":76096}]`
	hfNotFound = "HTTP/1.1 404 Not Found\r\nX-Consul-Index: 7\r\nX-Consul-Knownleader: true\r\n" +
		"X-Consul-Lastcontact: 0\r\nContent-Length: 0\r\nDate: Sun, 22 Nov 2026 00:46:07 GMT\r\n\r\n"
	hfError = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n" +
		"Content-Length: 28\r\n\r\nInvalid session behavior: x\n"
)

// checkFastResponse runs fastResponse on in and, where it answers, the
// standard reader on the same bytes, and fails t if the two differ in
// anything a caller can see, or if fastResponse consumed bytes it declined.
// It returns whether fastResponse answered.
func checkFastResponse(t *testing.T, method string, in []byte) bool {
	t.Helper()
	req, err := http.NewRequest(method, "http://h.invalid/", nil)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReaderSize(bytes.NewReader(in), 4<<10)
	resp, ok, err := fastResponse(br, req)
	if !ok {
		rest, _ := io.ReadAll(br)
		if !bytes.Equal(rest, in) {
			t.Fatalf("fastResponse declined but consumed %d bytes", len(in)-len(rest))
		}
		return false
	}

	sbr := bufio.NewReaderSize(bytes.NewReader(in), 4<<10)
	want, serr := http.ReadResponse(sbr, req)
	if serr == nil {
		var body io.ReadCloser
		body, serr = readBody(want)
		if serr == nil {
			want.Body = body
		}
	}
	if err != nil {
		if serr == nil {
			t.Fatalf("fastResponse failed (%v) where net/http reads %d", err, want.StatusCode)
		}
		return true
	}
	if serr != nil {
		t.Fatalf("fastResponse answered %d where net/http fails: %v", resp.StatusCode, serr)
	}
	got, _ := io.ReadAll(resp.Body)
	wantBody, _ := io.ReadAll(want.Body)
	if !bytes.Equal(got, wantBody) {
		t.Fatalf("body %q, net/http %q", got, wantBody)
	}
	resp.Body, want.Body = nil, nil
	if !reflect.DeepEqual(resp, want) {
		t.Fatalf("response\n%+v\nnet/http\n%+v", resp, want)
	}
	rest, _ := io.ReadAll(br)
	srest, _ := io.ReadAll(sbr)
	if !bytes.Equal(rest, srest) {
		t.Fatalf("left %q unread, net/http %q", rest, srest)
	}
	return true
}

// TestFastResponseTakes: the answers holdfast's server sends take the fast
// path, and come out as net/http reads them.
func TestFastResponseTakes(t *testing.T) {
	for _, in := range []string{
		hfPutAnswer, hfGetAnswer, hfNotFound, hfError,
		hfPutAnswer + hfGetAnswer, // the next answer stays in the buffer
		"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 3\r\nX-A: 1\r\nX-A: 2\r\n\r\nbad",
		"HTTP/1.1 200 OK\r\ncontent-length:2\r\nx-consul-index: \t9 \r\n\r\nok",
	} {
		if !checkFastResponse(t, "GET", []byte(in)) {
			t.Errorf("declined %q", in)
		}
	}
	// A body cut short is an error, as it is for net/http.
	if !checkFastResponse(t, "GET", []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab")) {
		t.Error("declined a short body")
	}
}

// TestFastResponseDeclines: what net/http treats specially is left to it.
func TestFastResponseDeclines(t *testing.T) {
	for _, tc := range []struct{ method, in string }{
		{"HEAD", hfPutAnswer},
		{"GET", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{"GET", "HTTP/1.1 100 Continue\r\n\r\n" + hfPutAnswer},
		{"GET", "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"},
		{"GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 0\r\n\r\n"},
		{"GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"},
		{"GET", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"},
		{"GET", "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 2\r\n\r\nok"},
		{"GET", "HTTP/1.1 200 OK\r\nTrailer: X\r\nContent-Length: 2\r\n\r\nok"},
		{"GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"},
		{"GET", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok"},
		{"GET", "HTTP/1.1 200 OK\r\n\r\nuntil close"},
		{"GET", "HTTP/1.1 200 OK\r\nX: caf\xc3\xa9\r\nContent-Length: 2\r\n\r\nok"},
		{"GET", "HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 2\r\n\r\nok"},
		{"GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"}, // head not all there
		{"GET", "HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n"},
		{"GET", "HTTP/1.1 200 OK\nContent-Length: 2\n\nok"},
	} {
		if checkFastResponse(t, tc.method, []byte(tc.in)) {
			t.Errorf("%s: took %q", tc.method, tc.in)
		}
	}
	many := "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-A: 1\r\n", maxFastHeaders) + "Content-Length: 2\r\n\r\nok"
	if checkFastResponse(t, "GET", []byte(many)) {
		t.Errorf("took %d header lines", maxFastHeaders+1)
	}
}

// FuzzFastResponse: wherever fastResponse answers, net/http reads the same
// bytes to the same response, body and position; where it declines, it
// has read nothing.
func FuzzFastResponse(f *testing.F) {
	for _, s := range []string{hfPutAnswer, hfGetAnswer, hfNotFound, hfError,
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
		"HTTP/1.1 200 OK\r\nA: 1\r\nA: 2\r\nContent-Length: 0\r\n\r\n"} {
		f.Add(false, []byte(s))
	}
	f.Add(true, []byte(hfPutAnswer))
	f.Fuzz(func(t *testing.T, head bool, in []byte) {
		method := "GET"
		if head {
			method = "HEAD"
		}
		checkFastResponse(t, method, in)
	})
}

// BenchmarkReadResponse: reading holdfast's answer to a GET, with
// fastResponse and with net/http's reader.
// go test ./api -run X -bench ReadResponse -benchmem
func BenchmarkReadResponse(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://h.invalid/", nil)
	in := []byte(hfGetAnswer)
	rd := bytes.NewReader(in)
	br := bufio.NewReaderSize(rd, 4<<10)
	for _, tc := range []struct {
		name string
		read func() (*http.Response, error)
	}{
		{"fast", func() (*http.Response, error) { return readResponse(br, req) }},
		{"net-http", func() (*http.Response, error) {
			resp, err := http.ReadResponse(br, req)
			if err == nil {
				resp.Body, err = readBody(resp)
			}
			return resp, err
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(in)
				br.Reset(rd)
				if _, err := tc.read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// checkWriteRequest writes two copies of one request, with writeRequest and
// with req.Write, and fails t if the bytes or the outcome differ. It
// returns whether writeRequest wrote the request itself.
func checkWriteRequest(t *testing.T, mk func() *http.Request) bool {
	t.Helper()
	req := mk()
	_, _, fast := plainRequest(req)
	var got, want bytes.Buffer
	gbw := bufio.NewWriter(&got)
	gerr := writeRequest(gbw, req)
	gbw.Flush()
	werr := mk().Write(&want)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("writeRequest: %v; req.Write: %v", gerr, werr)
	}
	if gerr == nil && !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("writeRequest wrote\n%q\nreq.Write\n%q", got.Bytes(), want.Bytes())
	}
	return fast
}

// plainBody is a request body of a known length that is not one of the
// in-memory readers net/http recognises.
type plainBody struct{ r io.Reader }

func (b *plainBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *plainBody) Close() error               { return nil }

// TestWriteRequestTakes: the requests this package's client sends are
// written by writeRequest, byte for byte as req.Write writes them.
func TestWriteRequestTakes(t *testing.T) {
	for _, tc := range []struct {
		method, url, body string
		hdr               http.Header
	}{
		{"GET", "http://127.0.0.1:8500/v1/kv/a?index=7&wait=5000ms", "", nil},
		{"PUT", "http://127.0.0.1:8500/v1/kv/a?acquire=1f2e", "value", http.Header{"Content-Type": {"application/octet-stream"}}},
		{"PUT", "http://localhost:8500/v1/session/destroy/x", "", nil},
		{"DELETE", "http://[::1]:8500/v1/kv/a%20b?recurse", "", http.Header{"X-Consul-Token": {"t"}, "Accept": {"a", "b"}}},
		{"POST", "http://h/v1/txn", `[{"KV":{}}]`, http.Header{"Content-Type": {"application/json"}, "A": {""}}},
		// As an agent forwards its caller's request: the caller's
		// User-Agent, and the Content-Length it was read with (req.Write
		// writes ContentLength's).
		{"PUT", "http://h/v1/kv/a", "value", http.Header{"User-Agent": {"loadgen/1", "second"}, "Content-Length": {"99"},
			"Accept-Encoding": {"gzip"}, "X-Forwarded-For": {"127.0.0.1"}, "X-Holdfast-Forwarded-By": {"n2"}}},
		{"GET", "http://h/v1/kv/a", "", http.Header{"User-Agent": {""}}},
		{"GET", "http://h/v1/kv/a", "", http.Header{"User-Agent": {}}},
	} {
		mk := func() *http.Request {
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req, err := http.NewRequest(tc.method, tc.url, body)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.hdr {
				req.Header[k] = v
			}
			return req
		}
		if !checkWriteRequest(t, mk) {
			t.Errorf("%s %s: left to req.Write", tc.method, tc.url)
		}
	}
	// A trace req.Write does not call (httputil.ReverseProxy's, for 1xx
	// answers) leaves the request to writeRequest.
	mk := func() *http.Request {
		req, _ := http.NewRequest("PUT", "http://h/v1/kv/a", strings.NewReader("v"))
		return req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			Got1xxResponse: func(int, textproto.MIMEHeader) error { return nil }}))
	}
	if !checkWriteRequest(t, mk) {
		t.Error("a request with a 1xx trace: left to req.Write")
	}
	// A body whose length is not the declared one fails as for req.Write.
	for _, body := range []string{"abc", "abcdefgh"} {
		mk := func() *http.Request {
			req, _ := http.NewRequest("PUT", "http://h/v1/kv/a", nil)
			req.Body, req.ContentLength = &plainBody{strings.NewReader(body)}, 5
			return req
		}
		if !checkWriteRequest(t, mk) {
			t.Errorf("%q as 5 bytes: left to req.Write", body)
		}
	}
}

// TestWriteRequestDeclines: what net/http treats specially stays with it.
func TestWriteRequestDeclines(t *testing.T) {
	for name, edit := range map[string]func(*http.Request){
		"HEAD":        func(r *http.Request) { r.Method = "HEAD" },
		"PATCH":       func(r *http.Request) { r.Method = "PATCH" },
		"close":       func(r *http.Request) { r.Close = true },
		"host header": func(r *http.Request) { r.Header.Set("Host", "x") },
		"zone":        func(r *http.Request) { r.Host = "[fe80::1%25eth0]:80" },
		"newline":     func(r *http.Request) { r.Header.Set("X", "a\nb") },
		"space":       func(r *http.Request) { r.Header["X"] = []string{" a"} },
		"bad name":    func(r *http.Request) { r.Header["X Y"] = []string{"a"} },
		"opaque":      func(r *http.Request) { r.URL.Opaque = "//h/x" },
		"query space": func(r *http.Request) { r.URL.RawQuery = "a b" },
		"trace of the headers": func(r *http.Request) {
			*r = *r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{WroteHeaders: func() {}}))
		},
		"trace of the request": func(r *http.Request) {
			*r = *r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
				WroteRequest: func(httptrace.WroteRequestInfo) {}}))
		},
		"unknown length": func(r *http.Request) {
			r.Body, r.ContentLength = &plainBody{strings.NewReader("x")}, 0
		},
	} {
		mk := func() *http.Request {
			req, _ := http.NewRequest("PUT", "http://h/v1/kv/a", nil)
			edit(req)
			return req
		}
		if checkWriteRequest(t, mk) {
			t.Errorf("%s: written by writeRequest", name)
		}
	}
}

// FuzzWriteRequest: for requests made of the fuzzer's parts, writeRequest
// writes what req.Write writes, or fails where it fails.
func FuzzWriteRequest(f *testing.F) {
	f.Add(uint8(0), "127.0.0.1:8500", "/v1/kv/a", "index=1", "Content-Type", "application/json", "", false)
	f.Add(uint8(1), "h", "/v1/kv/a b", "cas=0&flags=1", "X-Consul-Token", "tok", "value", false)
	f.Add(uint8(3), "[::1]:80", "/v1/txn", "", "A", "", "body", true)
	f.Add(uint8(1), "h", "/v1/kv/a", "", "User-Agent", "loadgen/1", "v", false)
	f.Add(uint8(0), "h", "/v1/kv/a", "", "User-Agent", "", "", false)
	f.Add(uint8(1), "h", "/v1/kv/a", "", "Content-Length", "12", "v", true)
	f.Fuzz(func(t *testing.T, m uint8, host, path, query, hk, hv, body string, lie bool) {
		methods := []string{"GET", "PUT", "POST", "DELETE", "HEAD", "PATCH"}
		method := methods[int(m)%len(methods)]
		mk := func() *http.Request {
			req := &http.Request{
				Method:     method,
				URL:        &url.URL{Scheme: "http", Host: host, Path: path, RawQuery: query},
				Proto:      "HTTP/1.1",
				ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{},
				Host:   host,
			}
			if hk != "" {
				req.Header[hk] = []string{hv}
			}
			if body != "" {
				req.Body = &plainBody{strings.NewReader(body)}
				req.ContentLength = int64(len(body))
				if lie {
					req.ContentLength++
				}
			}
			return req
		}
		checkWriteRequest(t, mk)
	})
}

// BenchmarkWriteRequest: writing a PUT of the client's, with writeRequest
// and with req.Write.
// go test ./api -run X -bench WriteRequest -benchmem
func BenchmarkWriteRequest(b *testing.B) {
	body := []byte("0123456789abcdef")
	rd := bytes.NewReader(body)
	req, _ := http.NewRequest("PUT", "http://127.0.0.1:8500/v1/kv/bench/k17?flags=0", nil)
	req.Header.Set("Content-Type", "application/octet-stream")
	bw := bufio.NewWriter(io.Discard)
	for _, tc := range []struct {
		name  string
		write func() error
	}{
		{"fast", func() error { return writeRequest(bw, req) }},
		{"net-http", func() error { return req.Write(bw) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(body)
				req.Body, req.ContentLength = io.NopCloser(rd), int64(len(body))
				if err := tc.write(); err != nil {
					b.Fatal(err)
				}
				bw.Flush()
			}
		})
	}
}
