package httpserve

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
)

// BenchmarkServePut measures the server's own cost per request: small PUTs
// with a body, as the KV API gets them, one after another on one kept-alive
// connection, to a handler that reads the body and answers "true". The
// client is a raw connection writing fixed bytes, so most of the time is
// the server's. go test -run '^$' -bench ServePut -benchmem ./internal/httpserve/
func BenchmarkServePut(b *testing.B) {
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "true")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	req := []byte("PUT /v1/kv/bench/key-0042 HTTP/1.1\r\nHost: " + ln.Addr().String() +
		"\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 16\r\nContent-Type: application/octet-stream\r\n" +
		"Accept-Encoding: gzip\r\n\r\n0123456789abcdef")
	br := bufio.NewReader(c)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
