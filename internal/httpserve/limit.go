package httpserve

import (
	"net"
	"sync"
	"sync/atomic"
)

// LimitConns returns ln with at most max connections open at once: a
// connection accepted beyond that is closed at once, and refused is told
// how many were open. max <= 0 returns ln as it is.
//
// It keeps a server's clients from taking every file descriptor the
// process may open. A server that runs out of them cannot open what it
// needs for itself: the next raft log segment, a snapshot, the socket of a
// health check (which then reads as the checked service failing, and takes
// the sessions bound to it). Closing the surplus connection at once, as
// Consul's per-client connection limit does, tells its client to try again
// later; leaving it in the listen queue would keep it waiting without a
// word.
func LimitConns(ln net.Listener, max int, refused func(open int)) net.Listener {
	if max <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, max: int64(max), refused: refused}
}

type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused func(open int)
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.open.Add(1); n > l.max {
			l.open.Add(-1)
			c.Close()
			if l.refused != nil {
				l.refused(int(n - 1))
			}
			continue
		}
		return &limitConn{Conn: c, l: l}, nil
	}
}

// limitConn gives its place back once, however often it is closed.
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

// NetConn returns the connection underneath, for what needs the socket
// itself (sendQueue), as tls.Conn's method of the same name does.
func (c *limitConn) NetConn() net.Conn { return c.Conn }
