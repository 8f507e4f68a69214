// Command nullhttp is a server that does nothing: it answers every GET with
// one fixed KV entry and every other request with "true", each with the
// headers holdfast sends, from a goroutine per connection on net's poller.
// Run against loadgen's put and get-consistent workloads, it measures what
// the load generator, the kernel and a trivial Go server take between them,
// the floor under any server's latencies on the same machine.
//
//	go run ./bench/nullhttp -addr 127.0.0.1:18600 &
//	go run ./bench/loadgen -addr 127.0.0.1:18600 -workload get-consistent
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
)

// entry is a GET's answer body, as holdfast gives it for a 16-byte value.
const entry = `[{"LockIndex":0,"Key":"bench/x","Flags":0,"Value":"aGVsbG8xMjdoZWxsbzEy","CreateIndex":1005,"ModifyIndex":1005}]`

func answer(body string) []byte {
	return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" +
		"X-Consul-Effective-Consistency: consistent\r\nX-Consul-Index: 1005\r\n" +
		"X-Consul-Knownleader: true\r\nX-Consul-Lastcontact: 0\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n" +
		"Date: Sat, 28 Nov 2026 01:44:15 GMT\r\n\r\n" + body)
}

var (
	getAnswer   = answer(entry)
	otherAnswer = answer("true")
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18600", "address to listen on")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nullhttp:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "nullhttp: listening on", ln.Addr())
	serve(ln)
}

// serve answers on every connection ln accepts until ln is closed.
func serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				get, err := readRequest(br)
				if err != nil {
					return
				}
				a := otherAnswer
				if get {
					a = getAnswer
				}
				if _, err := c.Write(a); err != nil {
					return
				}
			}
		}()
	}
}

// readRequest reads one request, discarding its body, and reports whether
// it was a GET.
func readRequest(br *bufio.Reader) (get bool, err error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return false, err
	}
	get = strings.HasPrefix(line, "GET ")
	n := int64(0)
	for {
		h, err := br.ReadString('\n')
		if err != nil {
			return false, err
		}
		if h == "\r\n" || h == "\n" {
			break
		}
		k, v, ok := strings.Cut(h, ":")
		if ok && strings.EqualFold(k, "Content-Length") {
			if n, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil || n < 0 {
				return false, errors.New("bad Content-Length")
			}
		}
	}
	_, err = io.CopyN(io.Discard, br, n)
	return get, err
}
