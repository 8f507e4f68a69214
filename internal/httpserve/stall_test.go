package httpserve

import (
	"errors"
	"net"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"
)

// scriptedConn answers each Write with the next of its steps (bytes taken,
// whether the deadline passed), and reports the send queue of the next of
// its queue readings.
type scriptedConn struct {
	net.Conn
	steps  []scriptStep
	queues []int
	writes int
}

type scriptStep struct {
	n       int
	timeout bool
}

func (c *scriptedConn) SetWriteDeadline(time.Time) error { return nil }

func (c *scriptedConn) Write(b []byte) (int, error) {
	s := c.steps[c.writes]
	c.writes++
	if s.n > len(b) {
		s.n = len(b)
	}
	if s.timeout {
		return s.n, os.ErrDeadlineExceeded
	}
	return s.n, nil
}

func (c *scriptedConn) queue(net.Conn) int {
	q := c.queues[0]
	c.queues = c.queues[1:]
	return q
}

func TestWriteProgressing(t *testing.T) {
	const size = 100
	for _, tc := range []struct {
		name    string
		steps   []scriptStep
		queues  []int // the first is read before the first write
		wantN   int
		wantErr bool
	}{
		{"written at once", []scriptStep{{size, false}}, []int{0}, size, false},
		// queue before + handed over - queue after = acknowledged.
		{"peer acknowledges each bound", []scriptStep{{30, true}, {30, true}, {40, false}}, []int{100, 110, 120}, size, false},
		// The audit's reader: the write hands over nothing for several
		// bounds while the client drains the queue a little each time.
		{"queue drains, write blocked", []scriptStep{{0, true}, {0, true}, {size, false}}, []int{900, 850, 800}, size, false},
		// The second audit's: bytes go into room the buffer had or grew,
		// and the peer takes none of them.
		{"handed over, nothing acknowledged", []scriptStep{{20, true}}, []int{900, 920}, 20, true},
		{"nothing taken for a bound", []scriptStep{{0, true}}, []int{900, 900}, 0, true},
		{"queue unreadable: handed-over bytes count", []scriptStep{{20, true}, {0, true}}, []int{-1, -1, -1}, 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &scriptedConn{steps: tc.steps, queues: tc.queues}
			n, err := writeProgressing(c, make([]byte, size), time.Minute, c.queue)
			if n != tc.wantN || (err != nil) != tc.wantErr {
				t.Fatalf("wrote %d, err %v; want %d, error %v", n, err, tc.wantN, tc.wantErr)
			}
			if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("error %v, want the deadline's", err)
			}
		})
	}
}

// sendQueue reads the socket's queue through the package's wrappers, as
// the agent serves (LimitConns) and as a client agent does (StallConns):
// behind a wrapper without NetConn, the agent's stall bound would count
// only the bytes its writes hand over.
func TestSendQueueThroughWrappers(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the send queue is read on Linux only")
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ln := StallConns(LimitConns(raw, 4, nil), time.Minute)
	cc, err := net.Dial("tcp", raw.Addr().String()) // the backlog takes it before Accept
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if q := sendQueue(c); q < 0 {
		t.Fatalf("sendQueue through StallConns and LimitConns = %d, want the socket's queue", q)
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatalf("a write through StallConns: %v", err)
	}
}

// net/http's server on StallConns: a client that stops reading a large
// answer makes the handler's write fail, instead of holding it for as long
// as the client keeps the connection (a client agent serves so).
func TestStallConnsUnderNetHTTP(t *testing.T) {
	ended := make(chan error, 1)
	big := writes256MiB(ended)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: big}
	go hs.Serve(StallConns(ln, 50*time.Millisecond))
	t.Cleanup(func() { hs.Close() })
	c := dial(t, ln.Addr().String())
	c.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n") // and never read
	waitWriteFails(t, ended)
}
