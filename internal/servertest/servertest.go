// Package servertest starts in-process holdfast servers for tests: raft on
// an in-memory transport, in-memory or temp-dir storage, a fake clock that
// drives session TTLs and lock-delays, and the HTTP API on a loopback
// httptest server.
package servertest

import (
	"context"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/httpapi"
	"github.com/holdfast/holdfast/internal/server"
)

// Epoch is where every fake clock starts, so transcripts are stable.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Options tune a test server.
type Options struct {
	// NodeName defaults to "node1".
	NodeName string
	// DataDir makes storage durable there; empty means in memory.
	DataDir string
	// SessionTTLMultiplier as in server.Config (default 1).
	SessionTTLMultiplier float64
	// Verbose sends server logs to the test log.
	Verbose bool
}

// Server is a running in-process server.
type Server struct {
	*server.Server
	Clock *clocktest.Fake
	HTTP  *httptest.Server
	// URL is the HTTP API's base URL, e.g. http://127.0.0.1:41234.
	URL string
	// Addr is host:port of the HTTP API.
	Addr string
}

// New starts a server and waits until it leads. It stops when the test ends.
func New(t testing.TB, o Options) *Server {
	t.Helper()
	if o.NodeName == "" {
		o.NodeName = "node1"
	}
	clk := clocktest.NewFake(Epoch)
	var out io.Writer = io.Discard
	if o.Verbose {
		out = testWriter{t}
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: o.NodeName, Level: hclog.Debug, Output: out})
	_, trans := raft.NewInmemTransport(raft.ServerAddress(o.NodeName))
	srv, err := server.New(server.Config{
		NodeName: o.NodeName, DataDir: o.DataDir, Transport: trans, Clock: clk, Logger: logger,
		SessionTTLMultiplier: o.SessionTTLMultiplier,
		RaftTuning: func(c *raft.Config) {
			c.HeartbeatTimeout = 50 * time.Millisecond
			c.ElectionTimeout = 50 * time.Millisecond
			c.LeaderLeaseTimeout = 50 * time.Millisecond
			c.CommitTimeout = 5 * time.Millisecond
		},
	})
	if err != nil {
		t.Fatalf("servertest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitForLeader(ctx); err != nil {
		srv.Shutdown()
		t.Fatalf("servertest: %v", err)
	}
	if err := srv.WaitForSelfRegistration(ctx); err != nil {
		srv.Shutdown()
		t.Fatalf("servertest: %v", err)
	}
	hs := httptest.NewServer(httpapi.New(srv, httpapi.Options{Clock: clk}))
	s := &Server{Server: srv, Clock: clk, HTTP: hs, URL: hs.URL, Addr: hs.Listener.Addr().String()}
	t.Cleanup(s.Stop)
	return s
}

// Stop shuts the server down; safe to call twice.
func (s *Server) Stop() {
	s.HTTP.Close()
	s.Server.Shutdown()
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
