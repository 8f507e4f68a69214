package main

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go serve(ln)
	base := "http://" + ln.Addr().String() + "/v1/kv/bench/x"
	for _, c := range []struct{ method, body, want string }{
		{http.MethodGet, "", `"Key":"bench/x"`},
		{http.MethodPut, "a value", "true"},
		{http.MethodGet, "", `"ModifyIndex":1005`}, // the same connection after a body
	} {
		req, err := http.NewRequest(c.method, base, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.method, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), c.want) ||
			resp.Header.Get("X-Consul-Index") != "1005" {
			t.Fatalf("%s: %d %q %v, want %q", c.method, resp.StatusCode, b, err, c.want)
		}
	}
}
