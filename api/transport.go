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
	"sync"
	"time"
)

// Transport is the http.RoundTripper a Client uses when its Config has no
// HTTPClient. It carries plain-HTTP (http://) requests over HTTP/1.1
// keep-alive connections, one request at a time per connection, all on the
// calling goroutine: it writes the request, reads the answer, and reads the
// whole body before it returns, so the connection is back in the pool by
// the time the caller sees the response. Requests and answers of the plain
// shape this API uses are written and read by this package (wire.go), the
// bytes on the wire the same as net/http's; the rest by http.Request.Write
// and http.ReadResponse.
//
// net/http's Transport gives every connection a reading and a writing
// goroutine and passes each request and response between them and the
// caller. For the small request/response pairs of a coordination API those
// hand-offs are a good part of the client's CPU per request (about a fifth
// in bench/loadgen; bench/README.md, "Client transport"), and client and
// server share the CPU when they run on one machine.
//
// What Transport does not carry goes to Fallback unchanged: https, requests
// the environment sends through a proxy, bodies larger than 64 KiB or of
// unknown length, and requests with an Expect header. Responses are read
// into memory in full, which suits this API's bounded JSON answers but not
// streaming; a blocking query simply waits in the read, and cancelling its
// context ends the wait.
//
// Of the httptrace hooks, only those http.Request.Write calls itself
// (WroteHeaderField, WroteHeaders, WroteRequest) are called.
//
// The zero Transport is ready to use; it must not be copied after first
// use.
type Transport struct {
	// MaxIdleConnsPerHost bounds the idle connections kept for reuse per
	// host:port. Zero means DefaultIdleConns.
	MaxIdleConnsPerHost int

	// Fallback carries the requests Transport does not (see above). Nil
	// means a clone of http.DefaultTransport keeping MaxIdleConnsPerHost
	// idle connections.
	Fallback http.RoundTripper

	// dial replaces the dialer in tests.
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	fallback sync.Once
	fb       http.RoundTripper

	// proxied maps a host:port of http requests to whether the
	// environment sends them through a proxy (then to the fallback).
	proxied sync.Map

	mu   sync.Mutex
	idle map[string][]*tconn // by host:port, most recently used last
}

// NewTransport returns a Transport with the defaults described on its
// fields.
func NewTransport() *Transport { return &Transport{} }

// maxAttempts bounds how often one request is sent on connections found
// closed by the server.
const maxAttempts = 3

// maxDirectBody is the largest request body Transport sends itself. A small
// body always fits in the socket buffers, so writing it can never block on
// a server that answers (a 413, say) without reading it; larger bodies go to
// net/http, which reads the answer while it is still writing.
const maxDirectBody = 64 << 10

// tconn is one pooled connection. Its reads go through Read so that a
// failed exchange can tell whether the server sent anything at all.
type tconn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	read int64
}

func (tc *tconn) Read(p []byte) (int, error) {
	n, err := tc.c.Read(p)
	tc.read += int64(n)
	return n, err
}

// defaultDialer has http.DefaultTransport's settings.
var defaultDialer = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}

// aLongTimeAgo is a deadline in the past: setting it makes pending and
// later reads and writes on a connection fail at once.
var aLongTimeAgo = time.Unix(1, 0)

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		closeRequestBody(req)
		return nil, errors.New("api: request has no URL")
	}
	addr := hostPort(req.URL.Host)
	if !t.direct(req, addr) {
		return t.fallbackRT().RoundTrip(req)
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeRequestBody(req)
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		tc, reused, err := t.getConn(ctx, addr)
		if err != nil {
			closeRequestBody(req)
			return nil, err
		}
		resp, retry, err := t.exchange(ctx, tc, addr, req, reused)
		if err == nil || !retry || attempt == maxAttempts {
			return resp, err
		}
		// A pooled connection the server had already closed: the request
		// never reached it. Its other idle connections are likely as old,
		// so drop them and send again on a fresh one (which, not being
		// reused, cannot come back here).
		t.dropIdle(addr)
		if req.Body != nil && req.Body != http.NoBody {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			r2 := *req
			r2.Body = body
			req = &r2
		}
	}
}

// direct reports whether Transport carries req, bound for addr, itself.
func (t *Transport) direct(req *http.Request, addr string) bool {
	if req.URL.Scheme != "http" || req.URL.Host == "" || req.Header.Get("Expect") != "" {
		return false
	}
	// A body with ContentLength 0 is one of unknown length (an empty one
	// is http.NoBody), as for req.Write.
	if req.Body != nil && req.Body != http.NoBody && (req.ContentLength <= 0 || req.ContentLength > maxDirectBody) {
		return false
	}
	// net/http reads the proxy environment once per process, so the
	// answer for a scheme and host never changes: it is asked once.
	if proxied, ok := t.proxied.Load(addr); ok {
		return !proxied.(bool)
	}
	p, err := http.ProxyFromEnvironment(req)
	proxied := p != nil || err != nil
	t.proxied.Store(addr, proxied)
	return !proxied
}

// exchange sends req on tc and reads the whole response. On success tc is
// back in the pool (or closed); on failure it is closed, and retry says
// whether the request may be sent again on another connection: only when
// tc was a reused one that yielded nothing, and the request either never
// left completely or is idempotent, and its body can be had again.
func (t *Transport) exchange(ctx context.Context, tc *tconn, addr string, req *http.Request, reused bool) (resp *http.Response, retry bool, err error) {
	stop := context.AfterFunc(ctx, func() { tc.c.SetDeadline(aLongTimeAgo) })
	before := tc.read
	rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil

	err = writeRequest(tc.bw, req)
	if err == nil {
		err = tc.bw.Flush()
	}
	if err != nil {
		stopped := stop()
		tc.c.Close()
		if !stopped && ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		return nil, reused && rewindable, err
	}

	resp, err = readResponse(tc.br, req)
	if !stop() {
		// The context ended while we were at it: the deadline set on tc may
		// have cut the exchange short, and it poisons the connection
		// either way.
		tc.c.Close()
		return nil, false, ctx.Err()
	}
	if err != nil {
		tc.c.Close()
		nothing := tc.read == before
		return nil, reused && nothing && rewindable && idempotent(req.Method), err
	}
	// A server that said it closes, or sent more than one answer, leaves
	// the connection unusable for the next request.
	if resp.Close || req.Close || tc.br.Buffered() > 0 {
		tc.c.Close()
	} else {
		t.putConn(addr, tc)
	}
	return resp, false, nil
}

// readResponse reads the answer to req from br, skipping interim 1xx
// answers, and replaces its body with the body read in full. The common
// plain answer is read by fastResponse (wire.go); the rest by net/http.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	for {
		if resp, ok, err := fastResponse(br, req); ok {
			return resp, err
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			resp.Body.Close()
			return nil, errors.New("api: server switched protocols")
		case resp.StatusCode >= 100 && resp.StatusCode < 200:
			resp.Body.Close()
			continue
		}
		body, err := readBody(resp)
		if err != nil {
			return nil, err
		}
		resp.Body = body
		return resp, nil
	}
}

// readBody reads and closes resp.Body and returns a replacement that reads
// what it held.
func readBody(resp *http.Response) (io.ReadCloser, error) {
	if resp.Body == http.NoBody || resp.ContentLength == 0 {
		resp.Body.Close()
		return http.NoBody, nil
	}
	var b []byte
	var err error
	if n := resp.ContentLength; n > 0 && n <= 1<<20 {
		b = make([]byte, n)
		_, err = io.ReadFull(resp.Body, b)
	} else {
		b, err = io.ReadAll(resp.Body)
	}
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("api: reading response body: %w", err)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func idempotent(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

func closeRequestBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// getConn returns the most recently used idle connection to addr that is
// still open, or dials a new one. reused says which.
func (t *Transport) getConn(ctx context.Context, addr string) (tc *tconn, reused bool, err error) {
	for {
		t.mu.Lock()
		idle := t.idle[addr]
		n := len(idle)
		if n == 0 {
			t.mu.Unlock()
			break
		}
		tc = idle[n-1]
		idle[n-1] = nil
		t.idle[addr] = idle[:n-1]
		t.mu.Unlock()
		if idleConnUsable(tc.c) {
			return tc, true, nil
		}
		tc.c.Close()
	}
	dial := t.dial
	if dial == nil {
		dial = defaultDialer.DialContext
	}
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	tc = &tconn{c: c}
	tc.br = bufio.NewReaderSize(tc, 4<<10)
	tc.bw = bufio.NewWriterSize(c, 4<<10)
	return tc, false, nil
}

func (t *Transport) putConn(addr string, tc *tconn) {
	t.mu.Lock()
	if len(t.idle[addr]) < t.maxIdle() {
		if t.idle == nil {
			t.idle = make(map[string][]*tconn)
		}
		t.idle[addr] = append(t.idle[addr], tc)
		tc = nil
	}
	t.mu.Unlock()
	if tc != nil {
		tc.c.Close()
	}
}

// maxIdle is MaxIdleConnsPerHost with its default.
func (t *Transport) maxIdle() int {
	if t.MaxIdleConnsPerHost > 0 {
		return t.MaxIdleConnsPerHost
	}
	return DefaultIdleConns
}

// dropIdle closes addr's idle connections.
func (t *Transport) dropIdle(addr string) {
	t.mu.Lock()
	idle := t.idle[addr]
	delete(t.idle, addr)
	t.mu.Unlock()
	closeAll(idle)
}

func closeAll(conns []*tconn) {
	for _, tc := range conns {
		tc.c.Close()
	}
}

// CloseIdleConnections closes every idle connection, the fallback's too.
// http.Client.CloseIdleConnections calls it.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	all := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, idle := range all {
		closeAll(idle)
	}
	if c, ok := t.fallbackRT().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) fallbackRT() http.RoundTripper {
	t.fallback.Do(func() {
		t.fb = t.Fallback
		if t.fb != nil {
			return
		}
		t.fb = http.DefaultTransport
		if dt, ok := http.DefaultTransport.(*http.Transport); ok {
			c := dt.Clone()
			c.MaxIdleConnsPerHost = t.maxIdle()
			t.fb = c
		}
	})
	return t.fb
}

// hostPort adds HTTP's default port to a URL host that has none.
func hostPort(host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
		return host + ":80"
	}
	return net.JoinHostPort(host, "80")
}
