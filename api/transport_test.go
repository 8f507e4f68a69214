package api

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is an httptest server that counts the connections opened
// to it.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var opened atomic.Int64
	ts := httptest.NewUnstartedServer(h)
	ts.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			opened.Add(1)
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)
	return ts, &opened
}

func roundTrip(t *testing.T, tr *Transport, method, url string, body []byte, hdr http.Header) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestTransportRoundTrip(t *testing.T) {
	ts, opened := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Consul-Index", "42")
		w.Header().Set("X-Seen", r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("X-Consul-Token"))
		if r.URL.Path == "/missing" {
			http.Error(w, "no such thing", http.StatusNotFound)
			return
		}
		fmt.Fprintf(w, "body=%q", b)
	})
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	for i := 0; i < 5; i++ {
		resp, body := roundTrip(t, tr, "PUT", ts.URL+"/v1/kv/a%20b?flags=3", []byte("value"), http.Header{"X-Consul-Token": {"tok"}})
		if resp.StatusCode != 200 || body != `body="value"` {
			t.Fatalf("PUT: %d %q", resp.StatusCode, body)
		}
		if got := resp.Header.Get("X-Seen"); got != "PUT /v1/kv/a%20b?flags=3 tok" {
			t.Fatalf("server saw %q", got)
		}
		if resp.Header.Get("X-Consul-Index") != "42" || resp.ContentLength != int64(len(body)) {
			t.Fatalf("headers %v, length %d", resp.Header, resp.ContentLength)
		}
		resp, body = roundTrip(t, tr, "GET", ts.URL+"/missing", nil, nil)
		if resp.StatusCode != 404 || body != "no such thing\n" {
			t.Fatalf("GET: %d %q", resp.StatusCode, body)
		}
	}
	if n := opened.Load(); n != 1 {
		t.Fatalf("%d connections for 10 requests in a row, want 1", n)
	}
}

// TestTransportChunked: a body the server streams in chunks arrives whole,
// and the connection is reused after it.
func TestTransportChunked(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1024)
	ts, opened := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < len(big); i += 1000 {
			io.WriteString(w, big[i:min(i+1000, len(big))])
			w.(http.Flusher).Flush()
		}
	})
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	for i := 0; i < 3; i++ {
		resp, body := roundTrip(t, tr, "GET", ts.URL, nil, nil)
		if body != big || resp.ContentLength != -1 {
			t.Fatalf("got %d bytes (ContentLength %d), want %d chunked", len(body), resp.ContentLength, len(big))
		}
	}
	if n := opened.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
}

// TestTransportConnectionClose: a server that says it closes gets a new
// connection for the next request.
func TestTransportConnectionClose(t *testing.T) {
	ts, opened := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "ok")
	})
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	for i := 0; i < 3; i++ {
		if _, body := roundTrip(t, tr, "PUT", ts.URL, []byte("x"), nil); body != "ok" {
			t.Fatal(body)
		}
	}
	if n := opened.Load(); n != 3 {
		t.Fatalf("%d connections, want 3", n)
	}
}

// TestTransportIdleConnClosedByServer: a pooled connection the server has
// since closed is noticed before a request is written into it, so even a
// PUT (which is never sent twice) goes through on a new connection.
func TestTransportIdleConnClosedByServer(t *testing.T) {
	ts, opened := countingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	roundTrip(t, tr, "PUT", ts.URL, []byte("1"), nil)
	ts.CloseClientConnections()
	waitIdleUnusable(t, tr)
	if _, body := roundTrip(t, tr, "PUT", ts.URL, []byte("2"), nil); body != "ok" {
		t.Fatal(body)
	}
	if n := opened.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// waitIdleUnusable waits until the kernel has delivered the server's close
// to every idle connection of tr. Only the delivery is waited for: no timer
// is involved.
func waitIdleUnusable(t *testing.T, tr *Transport) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tr.mu.Lock()
		usable := 0
		for _, idle := range tr.idle {
			for _, tc := range idle {
				if idleConnUsable(tc.c) {
					usable++
				}
			}
		}
		tr.mu.Unlock()
		if usable == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("server's close never reached the idle connection")
		}
		time.Sleep(time.Millisecond)
	}
}

// rawServer answers each connection with serve(conn, n), n counting
// connections from 1.
func rawServer(t *testing.T, serve func(c net.Conn, br *bufio.Reader, n int)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func(n int) {
				defer wg.Done()
				defer c.Close()
				serve(c, bufio.NewReader(c), n)
			}(n)
		}
	}()
	return "http://" + ln.Addr().String()
}

func readReq(br *bufio.Reader) (*http.Request, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, req.Body)
	return req, nil
}

const okResponse = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// TestTransportRetry: when a reused connection is closed by the server after
// it took the request but before any answer, a GET is sent again on a new
// connection, and a PUT (the server may have acted on it) is not.
func TestTransportRetry(t *testing.T) {
	for _, tc := range []struct {
		method string
		wantOK bool
		sent   int // requests the server receives in all
	}{{"GET", true, 3}, {"PUT", false, 2}} {
		var seen atomic.Int64
		url := rawServer(t, func(c net.Conn, br *bufio.Reader, n int) {
			for i := 0; ; i++ {
				if _, err := readReq(br); err != nil {
					return
				}
				seen.Add(1)
				if n == 1 && i == 1 {
					return // the second request on the first connection: hang up
				}
				io.WriteString(c, okResponse)
			}
		})
		tr := NewTransport()
		roundTrip(t, tr, tc.method, url, nil, nil)
		req, _ := http.NewRequest(tc.method, url, nil)
		resp, err := tr.RoundTrip(req)
		if tc.wantOK != (err == nil) {
			t.Fatalf("%s on a connection closed under it: resp %v, err %v; want success %v", tc.method, resp, err, tc.wantOK)
		}
		tr.CloseIdleConnections()
		if n := seen.Load(); n != int64(tc.sent) {
			t.Errorf("%s: server got %d requests, want %d", tc.method, n, tc.sent)
		}
	}
}

// TestTransportUnaskedBytes: bytes after a complete answer make the
// connection unusable, so the next request does not read them as its own
// answer. Interim 1xx answers are skipped.
func TestTransportUnaskedBytes(t *testing.T) {
	var conns atomic.Int64
	url := rawServer(t, func(c net.Conn, br *bufio.Reader, n int) {
		conns.Add(1)
		for {
			if _, err := readReq(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n"+okResponse+"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad")
		}
	})
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	for i := 0; i < 3; i++ {
		if resp, body := roundTrip(t, tr, "GET", url, nil, nil); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3", n)
	}
}

// TestTransportCancel: cancelling the context of a request the server is
// sitting on (a blocking query) ends it with the context's error, and the
// next request works.
func TestTransportCancel(t *testing.T) {
	got := make(chan struct{}, 1)
	ts, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("block") {
			got <- struct{}{}
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "ok")
	})
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	roundTrip(t, tr, "GET", ts.URL, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"?block", nil)
	errc := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(req)
		errc <- err
	}()
	<-got
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v, want context.Canceled", err)
	}
	if _, body := roundTrip(t, tr, "GET", ts.URL, nil, nil); body != "ok" {
		t.Fatal(body)
	}

	past, cancel2 := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel2()
	req, _ = http.NewRequestWithContext(past, "PUT", ts.URL, strings.NewReader("x"))
	if _, err := tr.RoundTrip(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired context: %v, want context.DeadlineExceeded", err)
	}
}

type recordingRT struct {
	mu   sync.Mutex
	urls []string
}

func (r *recordingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.urls = append(r.urls, req.Method+" "+req.URL.String())
	r.mu.Unlock()
	if req.Body != nil {
		req.Body.Close()
	}
	return &http.Response{StatusCode: 299, Body: http.NoBody, Request: req}, nil
}

// TestTransportFallback: what Transport does not carry itself goes to the
// fallback unchanged.
func TestTransportFallback(t *testing.T) {
	ts, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "direct") })
	fb := &recordingRT{}
	tr := &Transport{Fallback: fb}
	defer tr.CloseIdleConnections()
	big := bytes.Repeat([]byte("v"), maxDirectBody+1)
	cases := []struct {
		name   string
		req    func() *http.Request
		direct bool
	}{
		{"small PUT", func() *http.Request {
			r, _ := http.NewRequest("PUT", ts.URL, bytes.NewReader(big[:maxDirectBody]))
			return r
		}, true},
		{"https", func() *http.Request { r, _ := http.NewRequest("GET", "https://127.0.0.1:1/", nil); return r }, false},
		{"large body", func() *http.Request { r, _ := http.NewRequest("PUT", ts.URL, bytes.NewReader(big)); return r }, false},
		{"unknown length", func() *http.Request {
			r, _ := http.NewRequest("PUT", ts.URL, io.NopCloser(strings.NewReader("x")))
			return r
		}, false},
		{"expect", func() *http.Request {
			r, _ := http.NewRequest("PUT", ts.URL, strings.NewReader("x"))
			r.Header.Set("Expect", "100-continue")
			return r
		}, false},
	}
	for _, c := range cases {
		before := len(fb.urls)
		resp, err := tr.RoundTrip(c.req())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp.Body.Close()
		if direct := len(fb.urls) == before; direct != c.direct || (resp.StatusCode == 200) != c.direct {
			t.Errorf("%s: direct %v (status %d), want %v", c.name, direct, resp.StatusCode, c.direct)
		}
	}
}

func TestTransportHostPort(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:8500": "127.0.0.1:8500",
		"localhost":      "localhost:80",
		"[::1]":          "[::1]:80",
		"[::1]:8500":     "[::1]:8500",
	} {
		if got := hostPort(in); got != want {
			t.Errorf("hostPort(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzTransportResponse sends a request to a server that answers with the
// fuzzer's bytes: RoundTrip must not panic or hang, and whatever it returns
// must be what http.ReadResponse makes of the same bytes.
func FuzzTransportResponse(f *testing.F) {
	f.Add([]byte(okResponse))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"))
	f.Add([]byte("HTTP/1.0 200 OK\r\n\r\nuntil close"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"))
	f.Add([]byte("HTTP/1.1 101 Switching Protocols\r\n\r\n"))
	f.Fuzz(func(t *testing.T, answer []byte) {
		tr := &Transport{dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			client, server := net.Pipe()
			go func() {
				defer server.Close()
				if _, err := readReq(bufio.NewReader(server)); err != nil {
					return
				}
				server.Write(answer)
			}()
			return client, nil
		}}
		req, _ := http.NewRequest("GET", "http://fuzz.invalid/", nil)
		resp, err := tr.RoundTrip(req)
		tr.CloseIdleConnections()
		if err != nil {
			return
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			t.Fatalf("RoundTrip returned the interim status %d", resp.StatusCode)
		}
		got, _ := io.ReadAll(resp.Body)
		// What a reader that skips interim answers, as RoundTrip does, makes
		// of the same bytes.
		br := bufio.NewReader(bytes.NewReader(answer))
		want, werr := http.ReadResponse(br, req)
		for werr == nil && want.StatusCode >= 100 && want.StatusCode < 200 && want.StatusCode != 101 {
			want.Body.Close()
			want, werr = http.ReadResponse(br, req)
		}
		if werr != nil {
			t.Fatalf("RoundTrip answered %d where http.ReadResponse fails: %v", resp.StatusCode, werr)
		}
		wantBody, rerr := io.ReadAll(want.Body)
		if rerr != nil {
			t.Fatalf("RoundTrip returned a response whose body http.ReadResponse cannot read: %v", rerr)
		}
		if resp.StatusCode != want.StatusCode || !bytes.Equal(got, wantBody) {
			t.Fatalf("RoundTrip: %d %q; http.ReadResponse: %d %q", resp.StatusCode, got, want.StatusCode, wantBody)
		}
	})
}

// BenchmarkRoundTrip compares Transport with net/http's Transport on small
// PUTs to an in-process server, 32 goroutines at a time: the CPU per
// request of client and server together (ns/op is wall time over all
// goroutines). go test -run '^$' -bench RoundTrip -benchmem ./api/
func BenchmarkRoundTrip(b *testing.B) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "true")
	}))
	defer ts.Close()
	body := []byte("0123456789abcdef")
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"stdlib", &http.Transport{MaxIdleConnsPerHost: 64}},
		{"holdfast", NewTransport()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := &http.Client{Transport: tc.rt}
			defer c.CloseIdleConnections()
			b.SetParallelism(16) // 32 goroutines on 2 CPUs
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest("PUT", ts.URL+"/v1/kv/k", bytes.NewReader(body))
					resp, err := c.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}

// TestTransportTooLarge: a server that refuses a value without reading it
// (holdfast answers 413 from the declared length) is heard, whether the
// body is small enough for Transport to send itself or goes through the
// fallback, and the connection is fine for the next request.
func TestTransportTooLarge(t *testing.T) {
	const limit = 8 << 10
	ts, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			http.Error(w, "Request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "true")
	})
	c, err := NewClient(&Config{Address: ts.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []int{limit + 1, maxDirectBody + 1, 600 << 10} {
		_, err := c.KV().Put(ctx, &KVPair{Key: "k", Value: bytes.Repeat([]byte("v"), n)}, nil)
		var se *StatusError
		if !errors.As(err, &se) || se.Code != http.StatusRequestEntityTooLarge || se.Body != "Request body too large" {
			t.Fatalf("%d-byte value: %v, want a 413 StatusError", n, err)
		}
		if _, err := c.KV().Put(ctx, &KVPair{Key: "k", Value: []byte("small")}, nil); err != nil {
			t.Fatalf("after a %d-byte value: %v", n, err)
		}
	}
}
