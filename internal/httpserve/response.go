package httpserve

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// response is the http.ResponseWriter of one request. It is used by the
// handler's goroutine only (as net/http's is), and by the connection's
// goroutine after the handler has returned.
//
// The header map is the connection's, cleared for each request: a handler
// must not keep it after it returns.
type response struct {
	c      *conn
	req    *http.Request
	cancel context.CancelFunc
	hdr    http.Header
	app    appender    // writes into head, for http.Header.WriteSubset
	body   requestBody // the request's body, if it has one

	isHead      bool // a HEAD request: the body is counted, not sent
	wroteHeader bool
	status      int
	declared    int64 // the handler's Content-Length; -1 if it set none
	sniff       bool  // no Content-Type was set: detect it from the body
	hasDate     bool
	closeAfter  bool // the connection ends after this response

	head      []byte // status line and header, from WriteHeader on
	buf       []byte // body bytes not yet on the wire
	written   int64  // body bytes accepted from the handler
	streaming bool   // the head is out; buf goes out as it fills
	chunked   bool
	err       error // a write to the connection failed
}

// Header returns the header to be sent. Changes after WriteHeader (or the
// first Write) are ignored, as under net/http.
func (w *response) Header() http.Header { return w.hdr }

// WriteHeader fixes the status and the header. A second call does nothing.
// Informational codes (1xx but 101) are sent at once, over HTTP/1.1.
func (w *response) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("httpserve: invalid WriteHeader code %d", code))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.writeInformational(code)
		return
	}
	w.wroteHeader = true
	w.status = code
	if cl := w.hdr.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			w.declared = n
		} else {
			w.c.s.logf("httpserve: handler set an invalid Content-Length %q; dropped", cl)
		}
	}
	_, hasType := w.hdr["Content-Type"]
	w.sniff = !hasType
	_, w.hasDate = w.hdr["Date"]
	for _, v := range w.hdr["Connection"] {
		if strings.EqualFold(strings.TrimSpace(v), "close") {
			w.closeAfter = true
		}
	}
	w.head = appendStatusLine(w.head, w.req.ProtoAtLeast(1, 1), code)
	w.app.b = &w.head
	w.hdr.WriteSubset(&w.app, framingHeaders)
}

// framingHeaders are the headers the server writes itself, from what the
// response turns out to be.
var framingHeaders = map[string]bool{
	"Content-Length":    true,
	"Transfer-Encoding": true,
	"Connection":        true,
	"Trailer":           true,
}

// appendStatusLine appends the status line for code, in HTTP/1.1 unless
// is11 is false (the request was HTTP/1.0), as net/http's Server answers.
func appendStatusLine(b []byte, is11 bool, code int) []byte {
	if is11 {
		b = append(b, "HTTP/1.1 "...)
	} else {
		b = append(b, "HTTP/1.0 "...)
	}
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	if text := http.StatusText(code); text != "" {
		b = append(b, text...)
	} else {
		b = append(b, "status code "...)
		b = strconv.AppendInt(b, int64(code), 10)
	}
	return append(b, "\r\n"...)
}

func (w *response) writeInformational(code int) {
	if !w.req.ProtoAtLeast(1, 1) {
		return
	}
	b := appendStatusLine(nil, true, code)
	w.app.b = &b
	w.hdr.WriteSubset(&w.app, framingHeaders)
	b = append(b, "\r\n"...)
	w.write(b)
}

// Write adds p to the body. Past 64 KiB the response is streamed.
func (w *response) Write(p []byte) (int, error) { return writeBody(w, p) }

// WriteString is Write for a string, without the conversion.
func (w *response) WriteString(s string) (int, error) { return writeBody(w, s) }

// writeBody adds p to the body. A write that would take the buffer past
// streamAfter goes out in pieces that fill it to streamAfter, so that a
// large body written at once is not copied whole into the buffer and again
// into the chunk sent: a client that did not read a 5.6 MB answer held
// three copies of it, 17 MB, for as long as it kept the connection.
func writeBody[T string | []byte](w *response, p T) (int, error) {
	n := len(p)
	if err := w.accept(n); err != nil {
		return 0, err
	}
	if w.isHead {
		return n, nil
	}
	for len(w.buf)+len(p) > streamAfter {
		k := streamAfter - len(w.buf)
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if err := w.flushBody(false); err != nil {
			return 0, err
		}
	}
	w.buf = append(w.buf, p...)
	return w.afterAppend(n)
}

// accept checks that n more body bytes may be written and counts them.
func (w *response) accept(n int) error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if n == 0 {
		return nil
	}
	if !bodyAllowed(w.status) {
		return http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return w.err
	}
	if w.declared >= 0 && w.written+int64(n) > w.declared {
		return http.ErrContentLength
	}
	w.written += int64(n)
	return nil
}

func (w *response) afterAppend(n int) (int, error) {
	if len(w.buf) >= streamAfter {
		if err := w.flushBody(false); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// bodyAllowed reports whether a response with this status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// flushBody sends what is buffered, the head first if it has not gone out.
// Once the head is out the response is framed by the handler's
// Content-Length, by chunks, or (HTTP/1.0) by the close. last ends the
// response.
func (w *response) flushBody(last bool) error {
	out := w.head
	if !w.streaming {
		w.streaming = true
		switch {
		case w.declared >= 0:
			out = appendLength(out, w.declared)
		case w.req.ProtoAtLeast(1, 1):
			w.chunked = true
			out = append(out, "Transfer-Encoding: chunked\r\n"...)
		default:
			w.closeAfter = true
		}
		out = w.finishHead(out)
	}
	if w.chunked {
		if len(w.buf) > 0 {
			out = strconv.AppendInt(out, int64(len(w.buf)), 16)
			out = append(out, "\r\n"...)
			out = append(out, w.buf...)
			out = append(out, "\r\n"...)
		}
		if last {
			out = append(out, "0\r\n\r\n"...)
		}
	} else {
		out = append(out, w.buf...)
	}
	w.head, w.buf = out[:0], w.buf[:0]
	d := w.c.s.StreamStallTimeout
	err := w.send(out, d)
	if d > 0 && last && err == nil {
		// The connection goes on to its next request, whose answer must
		// not meet this deadline.
		w.c.nc.SetWriteDeadline(time.Time{})
	}
	return err
}

// finish completes the response after the handler has returned.
func (w *response) finish() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	isHead := w.isHead
	if w.declared >= 0 && w.written != w.declared && !isHead {
		// The body is shorter than the header says: the client cannot
		// find the end of it but by the close.
		w.closeAfter = true
	}
	if w.streaming {
		return w.flushBody(true)
	}
	out := w.head
	if bodyAllowed(w.status) {
		switch {
		case w.declared >= 0:
			out = appendLength(out, w.declared)
		case !isHead || w.written > 0:
			out = appendLength(out, w.written)
		}
	}
	out = w.finishHead(out)
	if !isHead && bodyAllowed(w.status) {
		out = append(out, w.buf...)
	}
	w.head = out
	return w.write(out)
}

// finishHead adds the headers that depend on the body and the connection,
// and the blank line.
func (w *response) finishHead(b []byte) []byte {
	if !w.hasDate {
		b = appendDate(b, time.Now())
	}
	if w.sniff && len(w.buf) > 0 && bodyAllowed(w.status) {
		b = append(b, "Content-Type: "...)
		b = append(b, http.DetectContentType(w.buf)...)
		b = append(b, "\r\n"...)
	}
	if w.c.s.closing.Load() {
		w.closeAfter = true
	}
	keepAlive := !w.closeAfter && !w.req.Close
	switch {
	case !keepAlive:
		b = append(b, "Connection: close\r\n"...)
	case !w.req.ProtoAtLeast(1, 1):
		b = append(b, "Connection: keep-alive\r\n"...)
	}
	return append(b, "\r\n"...)
}

func appendLength(b []byte, n int64) []byte {
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, n, 10)
	return append(b, "\r\n"...)
}

func (w *response) write(b []byte) error { return w.send(b, 0) }

// send writes b, bounded by writeProgressing if stall > 0 (a streamed
// piece), and closes the connection after if the write fails.
func (w *response) send(b []byte, stall time.Duration) error {
	if w.err != nil {
		return w.err
	}
	var err error
	if stall > 0 {
		_, err = writeProgressing(w.c.nc, b, stall, sendQueue)
	} else {
		_, err = w.c.nc.Write(b)
	}
	if err != nil {
		w.err = err
		w.closeAfter = true
	}
	return w.err
}

// WatchDisconnect asks that the request's context be cancelled if the
// client closes the connection while the handler runs. A handler calls it
// before a long wait; see the package doc. It does nothing for a request
// with a body (the watcher would read it). A pipelined request the client
// has sent already does not stop it, unless the watcher of an earlier
// request kept a byte of it.
func (w *response) WatchDisconnect() {
	if w.req.Body != http.NoBody {
		return
	}
	w.c.startWatch(w.cancel)
}

// appender lets http.Header.WriteSubset append to a byte slice.
type appender struct{ b *[]byte }

func (a *appender) Write(p []byte) (int, error) {
	*a.b = append(*a.b, p...)
	return len(p), nil
}

func (a *appender) WriteString(s string) (int, error) {
	*a.b = append(*a.b, s...)
	return len(s), nil
}

// dateLine is a formatted "Date: ...\r\n" header line and the second it
// shows.
type dateLine struct {
	sec  int64
	line []byte
}

// lastDate is the Date line of the last answer: answers in the same second
// share it instead of formatting the time again.
var lastDate atomic.Pointer[dateLine]

// appendDate appends the Date header line for now.
func appendDate(b []byte, now time.Time) []byte {
	sec := now.Unix()
	if d := lastDate.Load(); d != nil && d.sec == sec {
		return append(b, d.line...)
	}
	line := append([]byte("Date: "), now.UTC().AppendFormat(nil, http.TimeFormat)...)
	line = append(line, "\r\n"...)
	lastDate.Store(&dateLine{sec: sec, line: line})
	return append(b, line...)
}
