//go:build !linux

package httpserve

import "net"

// sendQueue is -1 where the socket's send queue cannot be read: a streamed
// answer then counts as progress only the bytes its writes hand over.
func sendQueue(net.Conn) int { return -1 }
