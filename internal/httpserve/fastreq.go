package httpserve

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
)

// readRequest reads one request from br: by fastRequest when the request
// has the common shape, and by http.ReadRequest otherwise, which also
// makes every error. fast says which: fastRequest takes only valid header
// names and values, where http.ReadRequest lets some invalid ones through
// for the server to refuse.
func readRequest(br *bufio.Reader) (req *http.Request, fast bool, err error) {
	if req := fastRequest(br); req != nil {
		return req, true, nil
	}
	req, err = http.ReadRequest(br)
	return req, false, err
}

// fastRequest parses a request whose whole header is already buffered in
// br and that has the shape nearly every API client sends: an HTTP/1.1
// request line with an upper-case method and an origin-form target, and
// header fields without folding and without the fields whose handling has
// rules of its own (Transfer-Encoding, Connection, Pragma, Trailer, a
// repeated Host or Content-Length). It returns the request http.ReadRequest
// would return, having consumed the same bytes, or nil, having consumed
// nothing, for any other input. FuzzFastRequest holds it to that.
//
// What it saves over http.ReadRequest: the textproto reader, a string per
// line, the transfer reader, and most allocations: the header's keys,
// values and target are cut from one string of the whole header, and its
// value slices from one array.
func fastRequest(br *bufio.Reader) *http.Request {
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, crlfcrlf)
	if end < 0 {
		return nil
	}
	head := buf[:end+2] // every line with its CRLF
	nl := bytes.IndexByte(head, '\n')
	if nl < 1 || head[nl-1] != '\r' {
		return nil
	}
	line := head[:nl-1]
	if bytes.IndexByte(line, '\r') >= 0 {
		return nil
	}
	method, rest, ok := bytes.Cut(line, sp)
	if !ok || len(method) == 0 || len(method) > 16 {
		return nil
	}
	for _, c := range method {
		if c < 'A' || c > 'Z' {
			return nil
		}
	}
	target, proto, ok := bytes.Cut(rest, sp)
	if !ok || string(proto) != "HTTP/1.1" || len(target) == 0 || target[0] != '/' {
		return nil
	}
	for _, c := range target {
		if c <= ' ' || c >= 0x7f {
			return nil
		}
	}

	// Count the fields and check them, before anything is allocated.
	fields := 0
	for rest := head[nl+1:]; len(rest) > 0; fields++ {
		i := bytes.IndexByte(rest, '\n')
		if i < 1 || rest[i-1] != '\r' {
			return nil
		}
		if !validField(rest[:i-1]) {
			return nil
		}
		rest = rest[i+1:]
	}

	all := string(head) // keys, values and target are cut from this
	req := &http.Request{
		Method:     methodString(all[:len(method)]),
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		RequestURI: all[len(method)+1 : len(method)+1+len(target)],
		Header:     make(http.Header, fields),
		Body:       http.NoBody,
	}
	vals := make([]string, fields)
	contentLength := ""
	hosts := 0
	for pos := nl + 1; pos < len(all); {
		i := pos + bytes.IndexByte(head[pos:], '\n')
		line := all[pos : i-1]
		pos = i + 1
		colon := 0
		for line[colon] != ':' {
			colon++
		}
		key := canonicalKey(line[:colon])
		v := trimSpaceTab(line[colon+1:])
		switch key {
		case "Transfer-Encoding", "Connection", "Pragma", "Trailer":
			return nil
		case "Host":
			if hosts++; hosts > 1 {
				return nil
			}
			req.Host = v // and not in Header: http.ReadRequest deletes it
			continue
		case "Content-Length":
			if contentLength != "" || v == "" || len(v) > 18 {
				return nil
			}
			for j := 0; j < len(v); j++ {
				if v[j] < '0' || v[j] > '9' {
					return nil
				}
			}
			contentLength = v
		}
		if vv, ok := req.Header[key]; ok {
			req.Header[key] = append(vv, v)
			continue
		}
		vals[0] = v
		req.Header[key] = vals[:1:1]
		vals = vals[1:]
	}
	u, err := url.ParseRequestURI(req.RequestURI)
	if err != nil {
		return nil // http.ReadRequest says why
	}
	req.URL = u
	if contentLength != "" {
		var n int64
		for j := 0; j < len(contentLength); j++ {
			n = n*10 + int64(contentLength[j]-'0')
		}
		req.ContentLength = n
		if n > 0 {
			req.Body = &fixedBody{br: br, left: n}
		}
	}
	br.Discard(end + 4)
	return req
}

var (
	crlfcrlf = []byte("\r\n\r\n")
	sp       = []byte(" ")
)

// validField reports whether line is a header field fastRequest takes: a
// non-empty name of token bytes, a colon, and a value of the bytes
// net/textproto accepts (no control byte but tab).
func validField(line []byte) bool {
	colon := bytes.IndexByte(line, ':')
	if colon < 1 {
		return false
	}
	for _, c := range line[:colon] {
		if !tokenByte[c] {
			return false
		}
	}
	for _, c := range line[colon+1:] {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// tokenByte marks the bytes of an RFC 7230 token.
var tokenByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// canonicalKey is http.CanonicalHeaderKey of a token, without allocating
// when the key is already canonical (it is then a substring of its line)
// or is one of the usual keys.
func canonicalKey(k string) string {
	upper := true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			if s, ok := usualKeys[k]; ok {
				return s
			}
			return http.CanonicalHeaderKey(k)
		}
		upper = c == '-'
	}
	return k
}

// usualKeys maps the spellings clients send of the usual keys to their
// canonical forms.
var usualKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Host", "User-Agent", "Content-Length", "Content-Type", "Accept",
		"Accept-Encoding", "X-Consul-Token", "Authorization", "Expect"} {
		m[k] = k
		b := []byte(k)
		for i := range b {
			if 'A' <= b[i] && b[i] <= 'Z' {
				b[i] += 'a' - 'A'
			}
		}
		m[string(b)] = k
	}
	return m
}()

// methodString returns the usual methods as constants, so that a request
// does not keep its header string alive through its method alone.
func methodString(m string) string {
	switch m {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodPut:
		return http.MethodPut
	case http.MethodPost:
		return http.MethodPost
	case http.MethodDelete:
		return http.MethodDelete
	case http.MethodHead:
		return http.MethodHead
	}
	return m
}

func trimSpaceTab(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// fixedBody is a request body of a declared length, read from the
// connection: what http.ReadRequest's body does for one, as a reader.
type fixedBody struct {
	br   *bufio.Reader
	left int64
}

func (b *fixedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.br.Read(p)
	b.left -= int64(n)
	switch {
	case err == io.EOF:
		return n, io.ErrUnexpectedEOF
	case err == nil && b.left == 0:
		return n, io.EOF
	}
	return n, err
}

func (b *fixedBody) Close() error { return nil }
