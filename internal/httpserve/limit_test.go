package httpserve

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Finding (many-clients audit): with its file descriptors taken by client
// connections the agent could not open its next raft log segment and
// stopped, and its own TCP checks failed, invalidating sessions. The
// listener closes connections beyond its limit at once, keeps serving
// those it has, and takes new ones again as old ones close.
func TestLimitConns(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedCh := make(chan int, 10)
	ln := LimitConns(inner, 2, func(open int) { refusedCh <- open })
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	addr := inner.Addr().String()

	get := func(c net.Conn) error {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "ok" {
			t.Fatalf("answer %q", b)
		}
		return nil
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := dial(), dial()
	for _, c := range []net.Conn{a, b} {
		if err := get(c); err != nil {
			t.Fatalf("a connection within the limit: %v", err)
		}
	}
	over := dial()
	if err := get(over); err == nil {
		t.Fatal("a third connection was served over a limit of 2")
	} else if !strings.Contains(err.Error(), "EOF") && !strings.Contains(err.Error(), "reset") {
		t.Logf("refused connection: %v", err)
	}
	select {
	case open := <-refusedCh:
		if open != 2 {
			t.Fatalf("refused with %d open, want 2", open)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("refusal not reported")
	}
	// The two it has are still served; once one closes, a new one is.
	if err := get(a); err != nil {
		t.Fatalf("a kept connection after the refusal: %v", err)
	}
	b.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := dial()
		if err := get(c); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no new connection served after one closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
