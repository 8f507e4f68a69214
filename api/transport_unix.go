//go:build unix

package api

import (
	"errors"
	"net"
	"syscall"
)

// idleConnUsable reports whether an idle pooled connection can carry a
// request: the server has neither closed it nor sent anything unasked (an
// idle connection has nothing to read). One non-blocking peek, so a pool
// that outlived a server restart is noticed before a request is written
// into a dead connection, where a write could not be safely retried.
func idleConnUsable(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	usable := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		// EAGAIN: nothing to read and still open. Success is either the
		// server's FIN (0 bytes) or data nobody asked for; any other error
		// is a broken connection.
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		usable = errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK)
		return true
	})
	return err == nil && usable
}
