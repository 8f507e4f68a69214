package httpserve

import (
	"net"
	"syscall"
	"unsafe"
)

// sendQueue returns the bytes in c's socket send queue, sent but not yet
// acknowledged by the client or not yet sent (SIOCOUTQ), or -1 if c is not
// a socket or the kernel does not say.
func sendQueue(c net.Conn) int {
	// Wrappers (LimitConns', StallConns') say what they wrap.
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	q := -1
	rc.Control(func(fd uintptr) {
		var n int32
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n))); errno == 0 {
			q = int(n)
		}
	})
	return q
}
