package httpserve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"
)

// Server serves HTTP/1.1 requests to Handler. Set its fields before the
// first Serve; its methods may be called from any goroutine.
type Server struct {
	// Handler answers every request.
	Handler http.Handler
	// ReadHeaderTimeout bounds the time from the first byte of a request
	// to the end of its header. Zero means no limit.
	ReadHeaderTimeout time.Duration
	// IdleTimeout bounds the wait for the next request on a kept-alive
	// connection. Zero means no limit.
	IdleTimeout time.Duration
	// StreamStallTimeout bounds how long a streamed answer (one past 64
	// KiB, sent in pieces of up to that) may wait while its client takes
	// none of it; past it the connection is closed. A client that stops
	// reading a large answer would otherwise hold the handler, and
	// whatever it streams from, for as long as it keeps the connection. A
	// client that reads, however slowly, is not cut: on Linux its progress
	// is read from the socket's send queue. Answers that fit in one piece
	// are not timed: the kernel's socket buffer takes them. Zero means no
	// limit.
	StreamStallTimeout time.Duration
	// MaxHeaderBytes bounds the request line and header. Zero means
	// http.DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// ErrorLog receives handler panics and accept errors, one message per
	// call. Nil means os.Stderr.
	ErrorLog func(msg string)

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   atomic.Bool // set under mu; read without it
}

// Serve accepts connections on ln and serves each on its own goroutine. It
// returns http.ErrServerClosed after Shutdown or Close, and any other error
// of ln.Accept that is not temporary.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	if s.listeners == nil {
		s.listeners = make(map[net.Listener]struct{})
		s.conns = make(map[*conn]struct{})
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of file descriptors and the like: wait, as net/http
				// does, rather than spin or give up.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logf("httpserve: accept error: %v; retrying in %v", err, backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := newConn(s, nc)
		if !s.track(c) {
			nc.Close()
			return http.ErrServerClosed
		}
		go c.serve()
	}
}

func isTemporary(err error) bool {
	t, ok := err.(interface{ Temporary() bool })
	return ok && t.Temporary()
}

// Shutdown stops accepting, closes connections as they become idle and
// waits for the rest to finish their requests, or for ctx to end (then it
// returns ctx's error and leaves them running). Responses finished during
// the shutdown carry "Connection: close".
func (s *Server) Shutdown(ctx context.Context) error {
	s.beginClose()
	wait := time.Millisecond
	for {
		if s.closeIdle() {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// Close stops accepting and closes every connection at once, in the middle
// of a request or not.
func (s *Server) Close() error {
	s.beginClose()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.nc.Close()
	}
	return nil
}

func (s *Server) beginClose() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing.Store(true)
	for ln := range s.listeners {
		ln.Close()
	}
}

// closeIdle closes the idle connections and reports whether none is left.
func (s *Server) closeIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.state.CompareAndSwap(connIdle, connClosed) {
			c.nc.Close()
			delete(s.conns, c)
		}
	}
	return len(s.conns) == 0
}

// track registers a new connection (busy: its first request is coming).
func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *Server) logf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if s.ErrorLog != nil {
		s.ErrorLog(msg)
		return
	}
	fmt.Fprintln(os.Stderr, msg)
}

// conn is one client connection and what it reuses from request to
// request. Only its own goroutine touches it, except the disconnect watcher
// (see response.WatchDisconnect), which runs while that goroutine is in
// the handler and writes the answer, and is waited for before anything it
// touches (connReader's kept byte) is used.
type conn struct {
	s      *Server
	nc     net.Conn
	cr     connReader
	br     *bufio.Reader
	remote string
	hdr    http.Header // cleared and reused as each response's header
	out    []byte      // the response being built: head, then body
	body   []byte      // body bytes buffered before the head is written

	hdrLimit int64        // bytes a request line and header may take
	state    atomic.Int32 // connBusy, connIdle or connClosed

	watching bool          // a disconnect watcher is running
	watchEnd chan struct{} // closed when it has stopped
}

// A connection's state, for Shutdown: it closes idle connections only, and
// a connection takes a request only if it was not closed while idle. Both
// sides change the state by compare-and-swap, so the request path takes no
// lock shared with other connections.
const (
	connBusy int32 = iota
	connIdle
	connClosed
)

func newConn(s *Server, nc net.Conn) *conn {
	maxHdr := s.MaxHeaderBytes
	if maxHdr <= 0 {
		maxHdr = http.DefaultMaxHeaderBytes
	}
	c := &conn{s: s, nc: nc, remote: nc.RemoteAddr().String(), hdr: make(http.Header, 8),
		hdrLimit: int64(maxHdr) + 4096} // net/http's slack for the request line
	c.cr.nc = nc
	c.cr.limit = -1
	c.br = bufio.NewReaderSize(&c.cr, 4<<10)
	return c
}

func (c *conn) serve() {
	defer func() {
		c.nc.Close()
		c.s.untrack(c)
	}()
	if c.s.IdleTimeout <= 0 && c.s.ReadHeaderTimeout > 0 {
		// As net/http: a new connection has ReadHeaderTimeout to send
		// its first request, so one that sends nothing does not hold a
		// descriptor and a goroutine for ever. (serveOne clears the
		// deadline once a header is read; later waits have none, as in
		// net/http without an IdleTimeout.)
		c.nc.SetReadDeadline(time.Now().Add(c.s.ReadHeaderTimeout))
	}
	for {
		// Idle first, then the check: a Shutdown that set closing before
		// it looked at this connection either finds it idle (and closes
		// it) or is seen here.
		c.state.Store(connIdle)
		if c.s.closing.Load() {
			return
		}
		if d := c.s.IdleTimeout; d > 0 {
			c.nc.SetReadDeadline(time.Now().Add(d))
		}
		// The header limit counts from here, so that what the Peek
		// buffers counts too.
		c.cr.limit = c.hdrLimit
		c.cr.hitLimit = false
		if _, err := c.br.Peek(1); err != nil {
			return
		}
		if !c.state.CompareAndSwap(connIdle, connBusy) {
			return // closed by Shutdown while idle
		}
		if !c.serveOne() {
			return
		}
	}
}

// Limits on what a connection does for a handler that left the request
// body unread, and on how much of a response is buffered before it is
// streamed.
const (
	maxDiscard     = 256 << 10
	streamAfter    = 64 << 10
	keepBufferUpTo = 16 << 10
)

// serveOne reads one request, runs the handler and writes the response. It
// reports whether the connection may carry another request.
func (c *conn) serveOne() bool {
	s := c.s
	if d := s.ReadHeaderTimeout; d > 0 {
		c.nc.SetReadDeadline(time.Now().Add(d))
	} else if s.IdleTimeout > 0 {
		c.nc.SetReadDeadline(time.Time{})
	}
	skipEmptyLine(c.br)
	req, fast, err := readRequest(c.br)
	c.cr.limit = -1
	if s.ReadHeaderTimeout > 0 {
		c.nc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		switch {
		case c.cr.hitLimit:
			c.writeError(nil, http.StatusRequestHeaderFieldsTooLarge, "the request header is larger than the server accepts")
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), isTimeout(err), errors.Is(err, net.ErrClosed):
			// The client went away, or was too slow: nobody to answer.
		case strings.HasPrefix(err.Error(), "unsupported transfer encoding"), strings.HasPrefix(err.Error(), "too many transfer encodings"):
			// net/http's error for this is not exported; its text is.
			c.writeError(nil, http.StatusNotImplemented, err.Error())
		default:
			c.writeError(nil, http.StatusBadRequest, "the request could not be parsed: "+clip(err.Error(), maxEcho))
		}
		return false
	}
	if req.ProtoMajor != 1 {
		c.writeError(req, http.StatusHTTPVersionNotSupported, "only HTTP/1.x is served here")
		return false
	}
	if req.ProtoAtLeast(1, 1) && req.Host == "" {
		// The parser has taken the header into req.Host.
		c.writeError(req, http.StatusBadRequest, "an HTTP/1.1 request needs a Host header")
		return false
	}
	if !httpguts.ValidHostHeader(req.Host) {
		c.writeError(req, http.StatusBadRequest, "the Host header is not a valid host")
		return false
	}
	// http.ReadRequest keeps a field name with a space before its colon
	// ("Transfer-Encoding :"); a proxy that trims it would frame the body
	// differently, so such a request is refused, as net/http's Server does.
	// fastRequest has checked its names and values already.
	if !fast {
		if msg := invalidHeader(req.Header); msg != "" {
			c.writeError(req, http.StatusBadRequest, msg)
			return false
		}
	}
	req.RemoteAddr = c.remote

	expect := false
	if ex := req.Header.Get("Expect"); ex != "" {
		if !strings.EqualFold(ex, "100-continue") {
			c.writeError(req, http.StatusExpectationFailed, "the only Expect served here is 100-continue")
			return false
		}
		// Over HTTP/1.0 there is no interim answer: the client sends the
		// body anyway.
		expect = req.ProtoAtLeast(1, 1)
	}

	ctx := new(reqCtx)
	cancel := ctx.cancel
	req = req.WithContext(ctx)
	clear(c.hdr)
	w := &response{c: c, req: req, cancel: cancel, hdr: c.hdr, declared: -1, isHead: req.Method == http.MethodHead}
	w.head = c.out[:0]
	w.buf = c.body[:0]
	hasBody := req.Body != http.NoBody
	if hasBody {
		w.body = requestBody{c: c, r: req.Body, expect: expect}
		req.Body = &w.body
	}
	ok := c.runHandler(w)
	cancel()
	if !ok {
		c.stopWatch()
		return false
	}

	// The request body: what the handler left is discarded, within reason,
	// so that the next request can be read.
	if hasBody && !w.body.sawEOF {
		switch {
		case w.body.expect && !w.body.sent:
			// The client may be holding the body back until it hears
			// "100 Continue"; it will not hear it now.
			w.closeAfter = true
		case w.body.err != nil:
			w.closeAfter = true
		case req.ContentLength > maxDiscard:
			// Too much to read through: close after the answer (and
			// lingerClose reads what is still coming meanwhile).
			w.closeAfter = true
		default:
			n, err := io.CopyN(io.Discard, w.body.r, maxDiscard+1)
			if n > maxDiscard || err != nil && err != io.EOF {
				w.closeAfter = true
			}
		}
		if w.closeAfter {
			defer c.lingerClose() // after the answer
		}
	}
	// A disconnect watcher (only ever started for a request without a
	// body, so it took no part in the above) is stopped after the answer
	// is written, not before: stopping it means waking its goroutine and
	// waiting for it, two trips through the scheduler that the answer to
	// every blocking query that parked would otherwise wait for. Writing
	// while it reads is what a full-duplex connection is for, and a byte of
	// a next request it reads meanwhile is kept (connReader.hasByte). It is
	// stopped here rather than left to become the wait for the next
	// request: a client often sends that request as soon as it has the
	// answer, and would then wait for two goroutines to wake instead of one
	// (measured: bench/README.md, "HTTP server loop").
	ferr := w.finish()
	c.stopWatch()
	if ferr != nil {
		return false
	}
	// Keep the buffers for the next response unless this one was large.
	if cap(w.head) <= keepBufferUpTo {
		c.out = w.head[:0]
	} else {
		c.out = nil
	}
	if cap(w.buf) <= keepBufferUpTo {
		c.body = w.buf[:0]
	} else {
		c.body = nil
	}
	return !w.closeAfter && !req.Close
}

// skipEmptyLine skips up to two empty lines (CRLF or a bare LF) before a
// request: a client may end a request's body with an extra CRLF (RFC 9112
// section 2.2: ignore at least one empty line before a request). A CR that
// is not followed by LF is not an empty line, and is left to fail the
// parse, as in net/http.
func skipEmptyLine(br *bufio.Reader) {
	for i := 0; i < 2; i++ {
		b, err := br.Peek(1)
		if err != nil {
			return
		}
		switch {
		case b[0] == '\n':
			br.Discard(1)
		case b[0] == '\r':
			if b, err := br.Peek(2); err != nil || b[1] != '\n' {
				return
			}
			br.Discard(2)
		default:
			return
		}
	}
}

// maxEcho bounds how much of a parse error, which quotes the request, an
// error answer repeats: a megabyte of control bytes in a header would
// otherwise come back as four megabytes of escapes.
const maxEcho = 256

// clip shortens s to at most n bytes, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "... (cut)"
}

// invalidHeader says what is wrong with h's first invalid field name or
// value, or returns "".
func invalidHeader(h http.Header) string {
	for name, values := range h {
		if !httpguts.ValidHeaderFieldName(name) {
			return "invalid header name " + strconv.Quote(name)
		}
		for _, v := range values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return "invalid value of header " + strconv.Quote(name)
			}
		}
	}
	return ""
}

// runHandler calls the handler. A panic is logged and closes the
// connection without an answer, as net/http does.
func (c *conn) runHandler(w *response) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.s.logf("httpserve: panic serving %s: %v\n%s", c.remote, v, buf)
			}
			ok = false
		}
	}()
	h := c.s.Handler
	if w.req.Method == http.MethodOptions && w.req.RequestURI == "*" {
		h = optionsStar
	}
	h.ServeHTTP(w, w.req)
	return true
}

// optionsStar answers "OPTIONS *", a question about the server rather than
// a path, with 200 and an empty body, as net/http's Server does; handlers
// never see it. A body of up to 4 KiB is read and dropped.
var optionsStar = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Length", "0")
	if r.ContentLength != 0 {
		io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 4<<10))
	}
})

// writeError answers a request that could not be parsed (req is nil) or is
// refused before any handler sees it, and is followed by a close. The
// answer to a HEAD request has the length of its body but not the body.
func (c *conn) writeError(req *http.Request, code int, msg string) {
	body := strconv.Itoa(code) + " " + http.StatusText(code) + ": " + msg + "\n"
	// Like net/http's, this answer is HTTP/1.1 whatever the request was:
	// it may not have been parsed far enough to know.
	b := appendStatusLine(nil, true, code)
	b = append(b, "Content-Type: text/plain; charset=utf-8\r\n"...)
	b = appendLength(b, int64(len(body)))
	b = append(b, "Connection: close\r\n\r\n"...)
	if req == nil || req.Method != http.MethodHead {
		b = append(b, body...)
	}
	c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	c.nc.Write(b)
	c.lingerClose()
}

// lingerClose ends the sending side and reads what the client still sends
// for a moment before the connection is closed. Closing a socket with
// unread bytes in it resets the connection, and a reset can destroy the
// answer before the client has read it.
func (c *conn) lingerClose() {
	cw, ok := c.nc.(interface{ CloseWrite() error })
	if !ok {
		return
	}
	cw.CloseWrite()
	c.nc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	io.Copy(io.Discard, c.nc) // until the client closes, or the deadline
}

// startWatch starts the disconnect watcher for w's request: a read on the
// side that cancels the request's context if the client closes the
// connection. It is only started for a request without a body, so it
// cannot take part of one. It reads from the connection under the
// buffered reader, so a pipelined request already buffered there does not
// stop it (and is read first when the watcher is done); a byte it does
// read is kept for the next request, after what is buffered. It is not
// started while a byte is kept already: it has nowhere to put another.
func (c *conn) startWatch(cancel context.CancelFunc) {
	if c.watching || c.cr.hasByte {
		return
	}
	c.watching = true
	c.watchEnd = make(chan struct{})
	go func() {
		defer close(c.watchEnd)
		n, err := c.nc.Read(c.cr.byteBuf[:])
		if n == 1 {
			c.cr.hasByte = true
			return
		}
		if err != nil && !isTimeout(err) {
			cancel()
		}
	}()
}

// stopWatch stops the disconnect watcher, if one runs, and waits for it.
func (c *conn) stopWatch() {
	if !c.watching {
		return
	}
	c.nc.SetReadDeadline(time.Unix(1, 0))
	<-c.watchEnd
	c.nc.SetReadDeadline(time.Time{})
	c.watching = false
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// connReader is what the connection's bufio.Reader reads from: the
// connection, with an optional limit (for the request header) and a byte
// kept from the disconnect watcher.
type connReader struct {
	nc       net.Conn
	limit    int64 // bytes that may still be read; -1 = no limit
	hitLimit bool
	hasByte  bool
	byteBuf  [1]byte
}

func (cr *connReader) Read(p []byte) (int, error) {
	if cr.limit == 0 {
		cr.hitLimit = true
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if cr.limit > 0 && int64(len(p)) > cr.limit {
		p = p[:cr.limit]
	}
	if cr.hasByte {
		p[0] = cr.byteBuf[0]
		cr.hasByte = false
		if cr.limit > 0 {
			cr.limit--
		}
		return 1, nil
	}
	n, err := cr.nc.Read(p)
	if cr.limit > 0 {
		cr.limit -= int64(n)
	}
	return n, err
}

// requestBody is the body a handler reads. It sends "100 Continue" before
// the first read when the client asked for it, and its Close does not
// read the rest (as net/http's server-side bodies): the server decides
// after the handler whether to discard it or close the connection.
type requestBody struct {
	c      *conn
	r      io.ReadCloser // the parser's body
	expect bool          // the client waits for "100 Continue"
	sent   bool
	closed bool
	sawEOF bool
	err    error // a failed write of "100 Continue"
}

func (b *requestBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.expect && !b.sent {
		b.sent = true
		if _, err := io.WriteString(b.c.nc, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			b.err = err
		}
	}
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.sawEOF = true
	}
	return n, err
}

func (b *requestBody) Close() error {
	b.closed = true
	return nil
}
