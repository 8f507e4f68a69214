package httpserve

import (
	"errors"
	"net"
	"os"
	"time"
)

// writeProgressing writes b to nc and gives up only when the peer has
// taken nothing for d: each wait is bounded by a write deadline d ahead,
// and when it passes, the write goes on if the peer acknowledged bytes
// meanwhile: the socket's send queue (queue, sendQueue in production)
// before the wait, plus what the write handed over, less the queue after.
// Bytes handed over into room the buffer had, or grew, are not the peer's
// doing: counted as progress, they let a client that read nothing hold a
// write three bounds instead of one (the second audit of the bound). What
// the peer acknowledges is its kernel's doing, not its program's: a client
// that stopped reading still takes bytes into its receive buffer for a
// while (the buffer grows, a window probe is answered), so it is cut one
// to two bounds after it stopped (the third audit: 120 s). Where the queue
// cannot be read (-1), the bytes handed over are all there is to go by.
// It returns the bytes written.
//
// Why the send queue: a blocked write returns only once the kernel has
// room for a third of its send buffer, which is megabytes on a connection
// that has streamed for a while, so a client reading a steady 4 KiB/s
// could leave a write of 64 KiB waiting five minutes, and was cut after
// one (the audit of the stall bound).
func writeProgressing(nc net.Conn, b []byte, d time.Duration, queue func(net.Conn) int) (int, error) {
	total := 0
	queued := queue(nc)
	for {
		nc.SetWriteDeadline(time.Now().Add(d))
		n, err := nc.Write(b)
		total += n
		if err == nil {
			return total, nil
		}
		b = b[n:]
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return total, err
		}
		now := queue(nc)
		acked := n > 0 // all there is to go by without the queue
		if queued >= 0 && now >= 0 {
			acked = queued+n-now > 0
		}
		if !acked {
			return total, err // nothing taken for d
		}
		queued = now
	}
}

// StallConns returns ln with every connection's writes bounded as
// writeProgressing bounds them: a write gives up, with an error, once the
// peer has taken nothing for d. For servers that are not this package's
// (net/http's, under a client agent's reverse proxy), whose writers cannot
// be reached: it costs a deadline on every write, where Server's
// StreamStallTimeout times streamed answers only. d <= 0 returns ln.
func StallConns(ln net.Listener, d time.Duration) net.Listener {
	if d <= 0 {
		return ln
	}
	return &stallListener{Listener: ln, d: d}
}

type stallListener struct {
	net.Listener
	d time.Duration
}

func (l *stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, d: l.d}, nil
}

type stallConn struct {
	net.Conn
	d time.Duration
}

func (c *stallConn) Write(b []byte) (int, error) { return writeProgressing(c.Conn, b, c.d, sendQueue) }

// NetConn returns the connection underneath (see sendQueue).
func (c *stallConn) NetConn() net.Conn { return c.Conn }
