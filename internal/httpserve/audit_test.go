package httpserve

// An audit of the server against RFC 9112 and against net/http's Server.
// A test whose comment begins "Finding:" failed on the server as it was,
// and says what was wrong; the others add coverage. Where it helps, a test
// runs the same exchange against net/http's Server too (the "stdlib"
// subtests).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// startStdlib serves h with net/http's Server until the test ends.
func startStdlib(t *testing.T, s *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return ln.Addr().String()
}

// bothServers runs f against this package's Server and net/http's Server,
// each serving h.
func bothServers(t *testing.T, h http.Handler, f func(t *testing.T, addr string)) {
	t.Run("holdfast", func(t *testing.T) { f(t, start(t, &Server{Handler: h})) })
	t.Run("stdlib", func(t *testing.T) { f(t, startStdlib(t, &http.Server{Handler: h})) })
}

// auditDial is dial with a 5 s guard instead of 30 s.
func auditDial(t *testing.T, addr string) *rawConn {
	t.Helper()
	c := dial(t, addr)
	c.nc.SetDeadline(time.Now().Add(5 * time.Second))
	return c
}

var auditHostEcho = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	fmt.Fprintf(w, "%s %s host=%q header=%v", r.Method, r.URL.Path, r.Host, r.Header)
})

// Finding: a header field name followed by whitespace before the colon
// ("Transfer-Encoding : chunked") is accepted, with the space kept in the
// key. RFC 9112 section 5.1: a server MUST reject such a request with 400,
// because front ends that tolerate the space read "Transfer-Encoding" and
// frame the body differently: request smuggling. net/http's Server
// refuses it (ValidHeaderFieldName, after parsing).
func TestAuditHeaderNameWithWhitespaceRefused(t *testing.T) {
	// A front end that strips the space sees a chunked body that ends at
	// "0", then a second request, /smuggled, which it may route or
	// authorize differently; this server frames by Content-Length and
	// takes all of it as the body of /a.
	rest := "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	req := fmt.Sprintf("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding : chunked\r\n\r\n%s", len(rest), rest)
	wantRefused(t, "POST", req)
}

// wantRefused sends req (of method) to both servers and wants a 400.
func wantRefused(t *testing.T, method, req string) {
	t.Helper()
	bothServers(t, auditHostEcho, func(t *testing.T, addr string) {
		c := auditDial(t, addr)
		c.send(req)
		resp, body := c.read(method)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("got %d %q; want 400", resp.StatusCode, body)
		}
	})
}

// Finding: a Host header with an invalid value ("a b") was accepted. RFC
// 9112 section 3.2: a server MUST answer 400 to a request whose Host is
// invalid; net/http's Server checks httpguts.ValidHostHeader, which
// http.ReadRequest alone does not. (An HTTP/1.1 request in absolute form
// with no Host field at all is still accepted: telling a missing Host from
// an empty one needs the parser's help.)
func TestAuditInvalidHostRefused(t *testing.T) {
	wantRefused(t, "GET", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n")
}

// Finding: a connection that never sends a byte is kept forever, even with
// ReadHeaderTimeout set (the agent sets it, and no IdleTimeout): the
// header deadline is only armed after the first byte. net/http's Server
// counts ReadHeaderTimeout from the start of the first request's read, so
// it closes such a connection; here each one holds a file descriptor, a
// goroutine and a 4 KiB buffer until the client goes away.
func TestAuditSilentConnectionTimesOut(t *testing.T) {
	const d = 100 * time.Millisecond
	check := func(t *testing.T, addr string) {
		c := auditDial(t, addr) // fails after 5 s instead of hanging
		_, err := c.br.ReadByte()
		if err != io.EOF {
			t.Errorf("a connection that sent nothing: read %v; want the server to close it after ReadHeaderTimeout (%v)", err, d)
		}
	}
	t.Run("holdfast", func(t *testing.T) { check(t, start(t, &Server{Handler: echo, ReadHeaderTimeout: d})) })
	t.Run("stdlib", func(t *testing.T) { check(t, startStdlib(t, &http.Server{Handler: echo, ReadHeaderTimeout: d})) })
}

// Finding: after a request whose body the handler refused without reading
// (a KV PUT over the size limit answered 413, say), the server discards up
// to 256 KiB, answers with "Connection: close", then reads at most 1 MiB
// more in lingerClose and closes while the client is still sending: the
// close resets the connection a few milliseconds after the answer. A Go
// client (Consul's api package) writing the body then often reports
// "write: broken pipe" instead of the 413 (about one time in four for
// bodies of 4-32 MiB on loopback). net/http's Server does not discard a
// body it knows to be that large and waits 500 ms after the answer before
// it closes (closeWriteAndWait), which gives the client time to read it.
func TestAuditRefusedLargeBodyNotResetAtOnce(t *testing.T) {
	refuse := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Request body too large", http.StatusRequestEntityTooLarge)
	})
	bothServers(t, refuse, func(t *testing.T, addr string) {
		c := auditDial(t, addr)
		const size = 64 << 20
		c.send(fmt.Sprintf("PUT /v1/kv/big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size))
		writeErr := make(chan error, 1)
		go func() {
			chunk := make([]byte, 32<<10)
			for sent := 0; sent < size; sent += len(chunk) {
				if _, err := c.nc.Write(chunk); err != nil {
					writeErr <- err
					return
				}
			}
			writeErr <- nil
		}()
		resp, _ := c.read("PUT")
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
			t.Fatalf("got %d, close %v; want 413 and a close", resp.StatusCode, resp.Close)
		}
		// A client still sending must have a moment to see the answer
		// before the connection is reset under it.
		select {
		case err := <-writeErr:
			if err != nil {
				t.Errorf("the client's body write failed right after the answer was read: %v; want no reset within 250 ms", err)
			}
		case <-time.After(250 * time.Millisecond):
		}
	})
}

// Finding: a POST followed by an extra CRLF (old clients append one to the
// body; RFC 9112 section 2.2: a server SHOULD ignore at least one empty
// line before a request-line) makes the next request on the connection
// fail with 400 and a close. net/http's Server skips leading CR/LF after a
// POST.
func TestAuditEmptyLineBeforeRequestLine(t *testing.T) {
	bothServers(t, echo, func(t *testing.T, addr string) {
		c := auditDial(t, addr)
		c.send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\r\n" +
			"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, body := c.read("POST"); body != "POST /a abc" {
			t.Fatalf("first answer %q", body)
		}
		resp, body := c.read("GET")
		if resp.StatusCode != http.StatusOK || body != "GET /b " {
			t.Errorf("second answer %d %q; want 200 \"GET /b \"", resp.StatusCode, body)
		}
	})
}

// Finding: the answer to an HTTP/1.0 request without keep-alive says
// "HTTP/1.1" and carries no "Connection: close", yet the server closes the
// connection. To a client that reads the answer (RFC 9112 section 9.3) the
// connection is persistent: curl --http1.0 logs "left intact", then
// "seems to be dead" and reconnects. net/http's Server answers
// "HTTP/1.0" with "Connection: close".
func TestAuditHTTP10CloseAnnounced(t *testing.T) {
	bothServers(t, echo, func(t *testing.T, addr string) {
		c := auditDial(t, addr)
		c.send("GET /one HTTP/1.0\r\n\r\n")
		resp, _ := c.read("GET")
		if !resp.Close {
			t.Errorf("answer %s with Connection %q: the client may keep the connection, which the server closes",
				resp.Proto, resp.Header.Get("Connection"))
		}
	})
}

// Finding: an HTTP/1.0 request was answered with an "HTTP/1.1" status
// line. RFC 9110 section 6.2 lets a server answer with its own version,
// but net/http's Server answers "HTTP/1.0", and an old client or proxy
// that reads the line may then expect 1.1 features (chunked bodies) the
// request did not offer.
func TestAuditHTTP10AnsweredInKind(t *testing.T) {
	bothServers(t, echo, func(t *testing.T, addr string) {
		c := auditDial(t, addr)
		c.send("GET /ka HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
		if resp, _ := c.read("GET"); resp.Proto != "HTTP/1.0" {
			t.Errorf("answer to HTTP/1.0 is %s; want HTTP/1.0", resp.Proto)
		}
	})
}

// Finding: "OPTIONS *" (a question to the server, not to a path) reached
// the handler, which answered 404. RFC 9110 section 9.3.7 makes it a
// question about the server's abilities; net/http's Server answers 200
// with an empty body and does not pass it to the handler.
func TestAuditOptionsStar(t *testing.T) {
	var reached atomic.Bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Store(true)
		http.NotFound(w, r)
	})
	bothServers(t, h, func(t *testing.T, addr string) {
		reached.Store(false)
		c := auditDial(t, addr)
		c.send("OPTIONS * HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
		resp, body := c.read("OPTIONS")
		if resp.StatusCode != http.StatusOK || body != "" || resp.ContentLength != 0 {
			t.Errorf("OPTIONS * got %d, length %d, body %q; want 200 with an empty body", resp.StatusCode, resp.ContentLength, body)
		}
		if reached.Load() {
			t.Error("OPTIONS * reached the handler")
		}
		// The body was read, so the next request is framed right.
		c.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, _ := c.read("GET"); resp.StatusCode != http.StatusNotFound {
			t.Errorf("request after OPTIONS *: %d; want the handler's 404", resp.StatusCode)
		}
	})
}

// Finding: an unsupported transfer coding is answered 400; RFC 9112
// section 6.1 (a server SHOULD answer 501) and net/http's Server answer
// 501 Not Implemented.
func TestAuditUnsupportedTransferCoding501(t *testing.T) {
	bothServers(t, echo, func(t *testing.T, addr string) {
		c := auditDial(t, addr)
		c.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
		if resp, body := c.read("POST"); resp.StatusCode != http.StatusNotImplemented {
			t.Errorf("got %d %q; want 501", resp.StatusCode, body)
		}
	})
}

// --- Coverage: behaviour checked and found sound. ---

// Keys with an encoded slash reach the handler as net/http gives them,
// on both the fast path and http.ReadRequest's (absolute form).
func TestAuditPercentEncodedPath(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s|%s|%s|%s", r.URL.Path, r.URL.RawPath, r.URL.EscapedPath(), r.URL.RawQuery)
	})
	var got [2][]string
	i := 0
	bothServers(t, h, func(t *testing.T, addr string) {
		c := auditDial(t, addr)
		for _, target := range []string{"/v1/kv/a%2Fb%20c?recurse", "/v1/kv/%E2%9C%93/x%25y", "http://x/v1/kv/a%2Fb"} {
			c.send("GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n")
			_, body := c.read("GET")
			got[i] = append(got[i], body)
		}
		i++
	})
	for j := range got[0] {
		if got[0][j] != got[1][j] {
			t.Errorf("request %d: holdfast %q, stdlib %q", j, got[0][j], got[1][j])
		}
	}
}

// A blocking query cancelled by Consul's Go client (context cancelled,
// the transport closes the connection) ends the handler's context.
func TestAuditConsulClientCancelEndsBlockingQuery(t *testing.T) {
	entered := make(chan struct{}, 1)
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("index") == "" {
			w.Header().Set("X-Consul-Index", "7")
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `[]`)
			return
		}
		if dw, ok := w.(interface{ WatchDisconnect() }); ok {
			dw.WatchDisconnect()
		}
		entered <- struct{}{}
		select {
		case <-r.Context().Done():
			ended <- r.Context().Err()
		case <-time.After(5 * time.Second):
			ended <- errors.New("not cancelled within 5 s")
		}
	})
	addr := start(t, &Server{Handler: h})
	client, err := api.NewClient(&api.Config{Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := client.KV().Get("k", (&api.QueryOptions{WaitIndex: 7, WaitTime: time.Minute}).WithContext(ctx))
		done <- err
	}()
	<-entered
	cancel()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("handler: %v; want its context cancelled", err)
	}
	if err := <-done; err == nil {
		t.Error("client: no error after cancel")
	}
}

// Close ends every connection goroutine, including one parked in a
// watched handler, and one waiting for a first byte.
func TestAuditNoGoroutinesLeftAfterClose(t *testing.T) {
	before := runtime.NumGoroutine()
	h := newWaiter(true)
	s := &Server{Handler: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	addr := ln.Addr().String()
	busy := auditDial(t, addr)
	busy.send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
	<-h.entered
	silent := auditDial(t, addr)
	kept := auditDial(t, addr)
	kept.send("GET /q HTTP/1.1\r\nHost: x\r\n\r\n")
	kept.read("GET")
	_ = silent
	s.Close()
	if err := <-h.ended; !errors.Is(err, context.Canceled) {
		t.Errorf("parked handler: %v; want cancelled by Close", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// A handler that panics after its answer began to stream: the client sees
// a truncated body (an error, not a complete answer), the error is logged,
// and the server goes on serving.
func TestAuditPanicWhileStreaming(t *testing.T) {
	var logged atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			io.WriteString(w, strings.Repeat("p", 100000))
			panic("mid-stream")
		}
		io.WriteString(w, "fine")
	})
	addr := start(t, &Server{Handler: h, ErrorLog: func(string) { logged.Add(1) }})
	c := auditDial(t, addr)
	c.send("GET /panic HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Error("a body cut by a panic read as complete")
	}
	if logged.Load() != 1 {
		t.Errorf("%d log messages, want 1", logged.Load())
	}
	c = auditDial(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := c.read("GET"); body != "fine" {
		t.Errorf("after the panic: %q", body)
	}
}

// Many header fields within MaxHeaderBytes, and a request line of several
// KiB, go through (http.ReadRequest's path); one byte over the limit is 431.
func TestAuditLargeHeaders(t *testing.T) {
	addr := start(t, &Server{Handler: echo, MaxHeaderBytes: 64 << 10})
	var b strings.Builder
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&b, "X-H%d: v\r\n", i)
	}
	c := auditDial(t, addr)
	c.send("GET /" + strings.Repeat("k", 8000) + " HTTP/1.1\r\nHost: x\r\n" + b.String() + "\r\n")
	if resp, _ := c.read("GET"); resp.StatusCode != 200 {
		t.Errorf("2000 small headers: %d", resp.StatusCode)
	}
	c = auditDial(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 80<<10) + "\r\n\r\n")
	if resp, _ := c.read("GET"); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("80 KiB header: %d, want 431", resp.StatusCode)
	}
}
