package api

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"strconv"
)

// This file writes the common request and reads the common HTTP/1.1
// answer without net/http's general writer and parser. Profiles of
// bench/loadgen put at 32 clients had http.ReadResponse at about a seventh
// of the client's CPU and Request.Write at a thirteenth, for requests and
// answers that are all alike: a request line, a few headers and a small
// body; a status line, half a dozen short headers and a small body of known
// length.
//
// fastResponse takes an answer only if everything net/http would do with it
// is plain: HTTP/1.1, a final status other than 204 and 304, a single
// Content-Length of at most maxFastBody, printable ASCII throughout, and none
// of the headers net/http reads for framing or rewrites (Connection,
// Transfer-Encoding, Trailer, Pragma). Anything else, or a head not yet
// whole in the buffer, is left unread for http.ReadResponse. Where it
// answers, the response is the one http.ReadResponse followed by readBody
// would give; FuzzFastResponse holds the two together.

// maxFastBody is the largest body fastResponse reads, readBody's bound for
// a body read in one allocation.
const maxFastBody = 1 << 20

// maxFastHeaders bounds the header lines fastResponse takes.
const maxFastHeaders = 32

// fastResponse reads one answer to req from br if it is of the plain shape
// described above. ok false means it consumed nothing and the caller must
// read the answer another way; ok true with an error means the head was
// read and the body could not be.
func fastResponse(br *bufio.Reader, req *http.Request) (resp *http.Response, ok bool, err error) {
	if req.Method == http.MethodHead {
		return nil, false, nil
	}
	// Wait for the first bytes of the answer; whatever fails here fails the
	// same way for http.ReadResponse.
	if _, err := br.Peek(1); err != nil {
		return nil, false, nil
	}
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, false, nil
	}
	raw := buf[:end+2] // every line with its CRLF
	// "HTTP/1.1 ddd" then the end of the line or a space and a reason.
	const proto = "HTTP/1.1 "
	if len(raw) < len(proto)+5 || string(raw[:len(proto)]) != proto {
		return nil, false, nil
	}
	d := raw[len(proto) : len(proto)+3]
	if d[0] < '2' || d[0] > '5' || !isDigit(d[1]) || !isDigit(d[2]) {
		return nil, false, nil
	}
	code := int(d[0]-'0')*100 + int(d[1]-'0')*10 + int(d[2]-'0')
	if code == http.StatusNoContent || code == http.StatusNotModified {
		return nil, false, nil
	}
	lineEnd := bytes.IndexByte(raw, '\r')
	if raw[lineEnd+1] != '\n' {
		return nil, false, nil
	}
	if c := raw[len(proto)+3]; c != '\r' && c != ' ' {
		return nil, false, nil
	}
	for _, c := range raw[len(proto)+3 : lineEnd] {
		if c < ' ' || c > '~' {
			return nil, false, nil
		}
	}

	// One pass over the header lines checks their bytes and finds where
	// each name and value lies, before anything is allocated.
	var fields [maxFastHeaders]field
	n := 0
	for i := lineEnd + 2; i < len(raw); n++ {
		if n == maxFastHeaders {
			return nil, false, nil
		}
		f, next, ok := scanField(raw, i)
		if !ok {
			return nil, false, nil
		}
		fields[n] = f
		i = next
	}

	head := string(raw) // one allocation; every string below is part of it
	h := make(http.Header, n)
	vals := make([]string, n)
	length := int64(-1)
	for k, f := range fields[:n] {
		key := head[f.start:f.colon]
		if !f.canonical {
			key = textproto.CanonicalMIMEHeaderKey(key)
		}
		v := head[f.vstart:f.vend]
		switch key {
		case "Connection", "Transfer-Encoding", "Trailer", "Pragma":
			return nil, false, nil
		case "Content-Length":
			if length >= 0 {
				return nil, false, nil
			}
			if length = parseLength(v); length < 0 {
				return nil, false, nil
			}
		}
		vals[k] = v
		if old, dup := h[key]; dup {
			h[key] = append(old, v)
		} else {
			h[key] = vals[k : k+1 : k+1]
		}
	}
	if length < 0 || length > maxFastBody {
		return nil, false, nil
	}
	br.Discard(end + 4)

	resp = &http.Response{
		Status:        head[len(proto):lineEnd],
		StatusCode:    code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		ContentLength: length,
		Request:       req,
		Body:          http.NoBody,
	}
	if length > 0 {
		b := make([]byte, length)
		if _, err := io.ReadFull(br, b); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, true, fmt.Errorf("api: reading response body: %w", err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
	}
	return resp, true, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// field is where one header line's parts lie in the head.
type field struct {
	start, colon int // the name is [start, colon)
	vstart, vend int // the value, without the spaces and tabs around it
	canonical    bool
}

// scanField checks the header line of raw that starts at i: a name of
// token bytes, a colon, and a value of printable ASCII, spaces and tabs,
// then CRLF. It says where the parts lie, whether the name is already in
// net/http's canonical form, and where the next line starts.
func scanField(raw []byte, i int) (f field, next int, ok bool) {
	f.start = i
	f.canonical = true
	upper := true // the next letter of a canonical name is upper case
	j := i
	for ; j < len(raw) && raw[j] != ':'; j++ {
		c := raw[j]
		if !isTokenByte(c) {
			return f, 0, false
		}
		switch {
		case 'a' <= c && c <= 'z':
			f.canonical = f.canonical && !upper
		case 'A' <= c && c <= 'Z':
			f.canonical = f.canonical && upper
		}
		upper = c == '-'
	}
	if j == i || j == len(raw) {
		return f, 0, false
	}
	f.colon = j
	j++
	for j < len(raw) && (raw[j] == ' ' || raw[j] == '\t') {
		j++
	}
	f.vstart = j
	for ; j < len(raw) && raw[j] != '\r'; j++ {
		if c := raw[j]; (c < ' ' && c != '\t') || c > '~' {
			return f, 0, false
		}
	}
	if j+1 >= len(raw) || raw[j+1] != '\n' {
		return f, 0, false
	}
	f.vend = j
	for f.vend > f.vstart && (raw[f.vend-1] == ' ' || raw[f.vend-1] == '\t') {
		f.vend--
	}
	return f, j + 2, true
}

// isTokenByte reports whether c may appear in a header name (RFC 9110's
// tchar).
func isTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// parseLength parses a Content-Length of plain decimal digits, or returns
// -1.
func parseLength(s string) int64 {
	if s == "" || len(s) > 18 {
		return -1
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return -1
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n
}

// writeRequest writes req to bw, byte for byte as req.Write would, without
// net/http's general writer for the requests this package sends: GET, PUT,
// POST or DELETE to a plain host, a few plain headers, and no body or one
// of known length. Anything else (and any request carrying an httptrace
// with a hook req.Write calls) goes to req.Write. FuzzWriteRequest holds
// the two together.
func writeRequest(bw *bufio.Writer, req *http.Request) error {
	ruri, host, ok := plainRequest(req)
	if !ok {
		return req.Write(bw)
	}
	bw.WriteString(req.Method)
	bw.WriteByte(' ')
	bw.WriteString(ruri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	// req.Write's User-Agent: the header's first value if it has the
	// header (none if that is empty), else Go's.
	ua := "Go-http-client/1.1"
	if _, ok := req.Header["User-Agent"]; ok {
		ua = req.Header.Get("User-Agent")
	}
	if ua != "" {
		bw.WriteString("User-Agent: ")
		bw.WriteString(ua)
		bw.WriteString("\r\n")
	}
	hasBody := req.Body != nil && req.Body != http.NoBody
	// Without a body, req.Write declares an empty one for PUT and POST only.
	if hasBody || req.Method == http.MethodPut || req.Method == http.MethodPost {
		var num [20]byte
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(num[:0], req.ContentLength, 10))
		bw.WriteString("\r\n")
	}
	// The header lines in the order of their names, as req.Write sorts
	// them, without the two it writes itself (a forwarded request carries
	// its caller's, and the Content-Length it was read with).
	var keys [maxFastRequestHeaders]string
	n := 0
	for k := range req.Header {
		if k == "User-Agent" || k == "Content-Length" {
			continue
		}
		keys[n] = k
		n++
	}
	slices.Sort(keys[:n])
	for _, k := range keys[:n] {
		for _, v := range req.Header[k] {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	_, err := bw.WriteString("\r\n")
	if hasBody {
		err = writeBody(bw, req)
	}
	return err
}

// writeBody copies req's body, which must hold exactly ContentLength
// bytes, and closes it, with req.Write's error if it holds another number.
func writeBody(bw *bufio.Writer, req *http.Request) error {
	n, err := io.CopyN(bw, req.Body, req.ContentLength)
	if err == nil {
		var extra int64
		extra, err = io.Copy(io.Discard, req.Body)
		n += extra
	} else if err == io.EOF {
		err = nil
	}
	if cerr := req.Body.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != req.ContentLength {
		err = fmt.Errorf("http: ContentLength=%d with Body length %d", req.ContentLength, n)
	}
	return err
}

// maxFastRequestHeaders bounds the header names writeRequest takes.
const maxFastRequestHeaders = 12

// plainRequest reports whether writeRequest may write req itself, and if
// so returns its request-URI and the host it is for.
func plainRequest(req *http.Request) (ruri, host string, ok bool) {
	switch req.Method {
	case http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete:
	default:
		return "", "", false
	}
	if req.Close || req.TransferEncoding != nil || req.Trailer != nil || req.URL.Opaque != "" ||
		len(req.Header) > maxFastRequestHeaders || tracesWrite(req) {
		return "", "", false
	}
	if req.Body == nil || req.Body == http.NoBody {
		if req.ContentLength != 0 {
			return "", "", false
		}
	} else if req.ContentLength <= 0 {
		return "", "", false
	}
	host = req.Host
	if host == "" {
		host = req.URL.Host
	}
	if host == "" {
		return "", "", false
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '.' || c == '-' || c == ':' || c == '[' || c == ']') {
			return "", "", false
		}
	}
	for k, vs := range req.Header {
		switch k {
		case "", "Host", "Transfer-Encoding", "Trailer":
			return "", "", false
		}
		for i := 0; i < len(k); i++ {
			if !isTokenByte(k[i]) {
				return "", "", false
			}
		}
		for _, v := range vs {
			if !plainValue(v) {
				return "", "", false
			}
		}
	}
	ruri = req.URL.RequestURI()
	for i := 0; i < len(ruri); i++ {
		if c := ruri[i]; c <= ' ' || c > '~' {
			return "", "", false
		}
	}
	return ruri, host, true
}

// tracesWrite reports whether req carries an httptrace with a hook that
// req.Write calls. httputil.ReverseProxy's trace (an agent forwarding a
// request) has only Got1xxResponse, which is not one.
func tracesWrite(req *http.Request) bool {
	tr := httptrace.ContextClientTrace(req.Context())
	return tr != nil && (tr.WroteHeaderField != nil || tr.WroteHeaders != nil || tr.Wait100Continue != nil || tr.WroteRequest != nil)
}

// plainValue reports whether req.Write sends header value v unchanged:
// printable ASCII with no space at either end.
func plainValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c > '~' {
			return false
		}
	}
	return len(v) == 0 || (v[0] != ' ' && v[len(v)-1] != ' ')
}
