package httpserve

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"
)

// FuzzServe sends arbitrary bytes to a Server and checks what comes back
// against what net/http's own parser makes of the same bytes: one answer
// per request, in order, each the right one, until the first request that
// must end the connection.
//
//	go test -run '^$' -fuzz FuzzServe ./internal/httpserve/
func FuzzServe(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /2 HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nT: v\r\n\r\n",
		"PUT /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
		"GET /a HTTP/1.0\r\n\r\nGET /b HTTP/1.0\r\n\r\n",
		"GET /ka HTTP/1.0\r\nConnection: keep-alive\r\n\r\nHEAD /h HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
		"GET / HTTP/2.0\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nExpect: soon\r\n\r\n",
		"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nshort",
		"GET\r\n\r\n",
		"PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n",
		"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		want := expectedAnswers(in)
		got, err := serveBytes(in)
		if err != nil {
			t.Fatalf("input %q: %v", in, err)
		}
		if len(got) != len(want) {
			t.Fatalf("input %q: %d answers %v, want %d %v", in, len(got), got, len(want), want)
		}
		for i := range want {
			if !want[i].matches(got[i]) {
				t.Fatalf("input %q: answer %d is %v, want %v", in, i, got[i], want[i])
			}
		}
	})
}

type answer struct {
	code int    // for a refusal: any 4xx or 5xx
	body string // checked for 200s
}

func (w answer) matches(g answer) bool {
	if w.code == 0 {
		return g.code >= 400
	}
	return w.code == g.code && (w.code != 200 || w.body == g.body)
}

func (w answer) String() string { return fmt.Sprintf("%d %q", w.code, w.body) }

// echoLen answers a request with its method, path and body length.
var echoLen = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, len(b))
})

// expectedAnswers reads the requests in `in` with http.ReadRequest, as the
// server does, and says what each must get.
func expectedAnswers(in []byte) []answer {
	br := bufio.NewReader(bytes.NewReader(in))
	var out []answer
	for {
		// What the server ignores before a request, which
		// http.ReadRequest would take for an empty request line.
		skipEmptyLine(br)
		if _, err := br.Peek(1); err != nil {
			return out
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return out // cut short: nobody to answer
			}
			return append(out, answer{})
		}
		// What serveOne refuses of what the parser took, as net/http's
		// Server does: refused answers are any 4xx or 5xx.
		switch ex := req.Header.Get("Expect"); {
		case req.ProtoMajor != 1,
			req.ProtoAtLeast(1, 1) && req.Host == "",
			!httpguts.ValidHostHeader(req.Host),
			invalidHeader(req.Header) != "",
			ex != "" && !strings.EqualFold(ex, "100-continue"):
			return append(out, answer{})
		}
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return append(out, answer{code: 400})
		}
		body := fmt.Sprintf("%s %s %d", req.Method, req.URL.Path, len(b))
		if req.Method == http.MethodHead {
			body = ""
		}
		out = append(out, answer{code: 200, body: body})
		if req.Close {
			return out
		}
	}
}

// serveBytes sends in over a loopback connection to a fresh Server, closes
// the sending side, and reads every answer until the server closes.
func serveBytes(in []byte) ([]answer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{Handler: echoLen, ReadHeaderTimeout: 5 * time.Second, ErrorLog: func(string) {}}
	go s.Serve(ln)
	defer s.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		nc.Write(in)
		nc.(*net.TCPConn).CloseWrite()
	}()
	br := bufio.NewReader(nc)
	var got []answer
	// The method of each answer's request decides whether it has a body;
	// take the methods from the same parse the expectation used.
	methods := requestMethods(in)
	for {
		if _, err := br.Peek(1); err != nil {
			if isTimeout(err) {
				return got, fmt.Errorf("no close after %d answers", len(got))
			}
			return got, nil // closed (or reset after the last answer)
		}
		m := http.MethodGet
		if len(got) < len(methods) {
			m = methods[len(got)]
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: m})
		if err != nil {
			return got, fmt.Errorf("unparsable answer after %d: %v", len(got), err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return got, fmt.Errorf("answer %d: body: %v", len(got), err)
		}
		if resp.StatusCode < 200 {
			continue // 100 Continue
		}
		got = append(got, answer{code: resp.StatusCode, body: string(b)})
	}
}

func requestMethods(in []byte) []string {
	br := bufio.NewReader(bytes.NewReader(in))
	var ms []string
	for {
		skipEmptyLine(br)
		req, err := http.ReadRequest(br)
		if err != nil {
			return ms
		}
		ms = append(ms, req.Method)
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return ms
		}
	}
}
