package httpserve

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// fastReqSeeds are requests as clients send them, and near misses that
// must go to http.ReadRequest.
var fastReqSeeds = []string{
	"PUT /v1/kv/bench/x/put/12 HTTP/1.1\r\nHost: 127.0.0.1:8500\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 16\r\nAccept-Encoding: gzip\r\n\r\n0123456789abcdef",
	"GET /v1/kv/a?consistent= HTTP/1.1\r\nHost: x\r\nuser-agent: curl\r\naccept: */*\r\n\r\n",
	"GET /v1/kv/a?index=5&wait=1s HTTP/1.1\r\nHost: x\r\nX-Consul-Token: t\r\nX-Custom:  a b \t\r\nX-Custom: c\r\n\r\nGET / HTTP/1.1\r\nHost: y\r\n\r\n",
	"PUT /v1/session/create HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
	"PUT /a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nshort",
	"PUT /a HTTP/1.1\r\nHost: x\r\nContent-Length: 007\r\nExpect: 100-continue\r\n\r\n1234567",
	"DELETE /v1/kv/a?recurse HTTP/1.1\r\nhost: x\r\nCONTENT-LENGTH: 0\r\n\r\n",
	"GET /a HTTP/1.0\r\nHost: x\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: x\nX: y\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
	"PUT /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
	"PUT /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na",
	"PUT /a HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
	"GET http://x/a HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /a%zz HTTP/1.1\r\nHost: x\r\n\r\n",
	"get /a HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: x\r\nBad Key: v\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: x\r\nX: caf\xc3\xa9\r\n\r\n",
	"GET /a HTTP/1.1\r\n\r\n",
	"\r\n\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: x\r\n",
}

func FuzzFastRequest(f *testing.F) {
	for _, s := range fastReqSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFastRequest(t, data)
	})
}

// TestFastRequestSeeds runs the seeds, and checks that the requests API
// clients send take the fast path.
func TestFastRequestSeeds(t *testing.T) {
	fast := 0
	for _, s := range fastReqSeeds {
		if checkFastRequest(t, []byte(s)) {
			fast++
		}
	}
	// The first seven, the one with a UTF-8 value and the one without a
	// Host (which the server refuses after parsing).
	if fast != 9 {
		t.Fatalf("%d seeds took the fast path, want 9", fast)
	}
}

// checkFastRequest holds fastRequest to http.ReadRequest on data: where
// it answers, ReadRequest must succeed with an equal request, the same
// body and the same bytes left over. It reports whether it answered.
func checkFastRequest(t *testing.T, data []byte) bool {
	t.Helper()
	br := bufio.NewReaderSize(bytes.NewReader(data), 4<<10)
	br.Peek(1) // as the connection's loop does before each request
	got := fastRequest(br)
	if got == nil {
		// Nothing may have been consumed: ReadRequest gets it all.
		if n := br.Buffered(); n != min(len(data), 4<<10) {
			t.Fatalf("fastRequest declined %q but consumed %d bytes", data, min(len(data), 4<<10)-n)
		}
		return false
	}
	rr := bufio.NewReaderSize(bytes.NewReader(data), 4<<10)
	want, err := http.ReadRequest(rr)
	if err != nil {
		t.Fatalf("fastRequest accepted %q, http.ReadRequest: %v", data, err)
	}
	gotBody, gotErr := io.ReadAll(got.Body)
	wantBody, wantErr := io.ReadAll(want.Body)
	if !bytes.Equal(gotBody, wantBody) || (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("%q: body %q (%v), want %q (%v)", data, gotBody, gotErr, wantBody, wantErr)
	}
	gotRest, _ := io.ReadAll(br)
	wantRest, _ := io.ReadAll(rr)
	if !bytes.Equal(gotRest, wantRest) {
		t.Fatalf("%q: left %q, want %q", data, gotRest, wantRest)
	}
	if (got.Body == http.NoBody) != (want.Body == http.NoBody) {
		t.Fatalf("%q: NoBody %v, want %v", data, got.Body == http.NoBody, want.Body == http.NoBody)
	}
	got.Body, want.Body = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\n got %s\nwant %s", data, describe(got), describe(want))
	}
	return true
}

func describe(r *http.Request) string {
	var b strings.Builder
	b.WriteString(r.Method + " " + r.RequestURI + " " + r.Proto + " host=" + r.Host)
	b.WriteString(" url=" + r.URL.String())
	for k, v := range r.Header {
		b.WriteString(" " + k + "=" + strings.Join(v, "|"))
	}
	return b.String()
}

// benchRead reads the PUT loadgen sends with read, from a reader that
// holds it, as a connection's loop does.
func benchRead(b *testing.B, read func(*bufio.Reader) (*http.Request, error)) {
	data := []byte(fastReqSeeds[0])
	r := bytes.NewReader(data)
	br := bufio.NewReaderSize(r, 4<<10)
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(data)
		br.Reset(r)
		br.Peek(1)
		req, err := read(br)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, req.Body)
	}
}

func BenchmarkReadRequestFast(b *testing.B) {
	benchRead(b, func(br *bufio.Reader) (*http.Request, error) {
		req, _, err := readRequest(br)
		return req, err
	})
}

func BenchmarkReadRequestStdlib(b *testing.B) { benchRead(b, http.ReadRequest) }
