package api

// Audit of the public Go client (package api). Tests whose comment starts
// with "Finding:" fail on the code as it stands; the others confirm
// behaviour that was probed and found correct.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/httpapi"
	"github.com/holdfast/holdfast/internal/servertest"
)

// caServer is a real in-process holdfast server whose HTTP listener counts
// the connections opened to it and those still open.
type caServer struct {
	*servertest.Server
	api    *httptest.Server
	opened atomic.Int64
	open   atomic.Int64
}

func caNewServer(t *testing.T) (*caServer, *Client) {
	t.Helper()
	s := &caServer{Server: servertest.New(t, servertest.Options{})}
	s.api = httptest.NewUnstartedServer(httpapi.New(s.Server.Server, httpapi.Options{Clock: s.Clock}))
	var mu sync.Mutex
	known := map[net.Conn]bool{}
	s.api.Config.ConnState = func(c net.Conn, st http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch st {
		case http.StateNew:
			known[c] = true
			s.opened.Add(1)
			s.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			if known[c] {
				s.open.Add(-1)
				delete(known, c)
			}
		}
	}
	s.api.Start()
	t.Cleanup(s.api.Close)
	c, err := NewClient(&Config{Address: s.api.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func caCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// caPoll waits, bounded, for cond; used only where real connections or
// server goroutines are involved, never to let a timer run.
func caPoll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// caHold creates a session without lock-delay and locks key with it.
func caHold(t *testing.T, ctx context.Context, c *Client, key string) Sequencer {
	t.Helper()
	sid, _, err := c.Session().Create(ctx, &SessionEntry{LockDelay: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok, _, err := c.KV().Acquire(ctx, &KVPair{Key: key, Session: sid}, nil)
	if err != nil || !ok {
		t.Fatalf("acquire %s: %v %v", key, ok, err)
	}
	p, _, err := c.KV().Get(ctx, key, nil)
	if err != nil || p == nil || p.Session != sid {
		t.Fatalf("after acquire: %+v %v", p, err)
	}
	return Sequencer{Key: key, Session: sid, LockIndex: p.LockIndex}
}

// ---------------------------------------------------------------------
// Findings (fail on the current code).

// Finding: NewClient trims trailing slashes before it splits off the
// scheme, so Address "https://" (or "http://") loses its "://", keeps the
// default scheme http and dials the host "https:" — a silent downgrade
// from https to http and a baffling DNS error, where Config documents
// that a scheme prefix overrides Scheme and an empty host means
// DefaultAddress (the brief: bad addresses get clear errors).
func TestAuditClientSchemeOnlyAddress(t *testing.T) {
	for _, tc := range []struct{ addr, scheme string }{{"https://", "https"}, {"http://", "http"}} {
		c, err := NewClient(&Config{Address: tc.addr})
		if err != nil {
			continue // refusing it is fine
		}
		if c.scheme != tc.scheme || c.host != DefaultAddress {
			t.Errorf("Address %q: client talks to %s://%s; want %s://%s or an error",
				tc.addr, c.scheme, c.host, tc.scheme, DefaultAddress)
		}
	}
}

// Finding: a negative QueryOptions.WaitTime on a blocking read is silently
// turned into "no ?wait at all", which also throws away Config.WaitTime, so
// the server blocks for its default 5 minutes: a caller whose remaining
// budget went negative gets the longest wait there is. NewClient refuses a
// negative Config.WaitTime; the per-query one should be refused too (or
// sent, so the server answers 400 "Invalid wait time", as Consul's client
// does), never dropped.
func TestAuditClientNegativeQueryWaitTime(t *testing.T) {
	st, _ := newStub(t, func(s seen) reply { return reply{Header: readHeaders("9"), Body: "[]"} })
	c, err := NewClient(&Config{Address: st.srv.URL, WaitTime: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = c.KV().Get(caCtx(t), "k", &QueryOptions{WaitIndex: 5, WaitTime: -time.Second})
	if err != nil {
		return // refusing it is fine
	}
	if q := st.last(t).Query; !q.Has("wait") {
		t.Fatalf("blocking read with WaitTime -1s sent %q: no wait at all, so the server blocks for its default", q.Encode())
	}
}

// Finding: Config.WaitTime is documented as "the default ?wait= of
// blocking queries (those with a WaitIndex)", but setQueryOptions sends it
// on every read, blocking or not, even with nil QueryOptions and on
// /v1/status/leader. Harmless to holdfast's server today, but the code and
// its contract disagree.
func TestAuditClientConfigWaitTimeOnlyOnBlockingReads(t *testing.T) {
	st, _ := newStub(t, func(s seen) reply { return reply{Header: readHeaders("9"), Body: "[]"} })
	c, err := NewClient(&Config{Address: st.srv.URL, WaitTime: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := caCtx(t)
	c.KV().Get(ctx, "k", &QueryOptions{WaitIndex: 4})
	if got := st.last(t).Query.Get("wait"); got != "3000ms" {
		t.Fatalf("blocking read: wait=%q, want 3000ms", got)
	}
	c.KV().Get(ctx, "k", nil)
	if q := st.last(t).Query; q.Has("wait") {
		t.Errorf("non-blocking read sent %q; Config.WaitTime is only for reads with a WaitIndex", q.Encode())
	}
}

// Finding: the fencing helpers disagree about one sequencer. KV.Fence
// trims a leading "/" from Sequencer.Key (as KV.Get does) and calls
// {Key:"/lk"} current, while PutFenced/DeleteFenced/CheckLockOp send the
// key verbatim and the server refuses the same sequencer as stale. A
// resource that checks with Fence and then writes with PutFenced sees
// "valid" and then "stale" for a hold that never changed.
func TestAuditClientFenceAndPutFencedAgree(t *testing.T) {
	ctx := caCtx(t)
	_, c := caNewServer(t)
	seq := caHold(t, ctx, c, "lk")
	slashed := Sequencer{Key: "/" + seq.Key, Session: seq.Session, LockIndex: seq.LockIndex}
	fs, _, err := c.KV().Fence(ctx, slashed, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok, _, err := c.KV().PutFenced(ctx, &KVPair{Key: "data", Value: []byte("1")}, slashed, nil)
	if err != nil {
		t.Fatal(err)
	}
	if fs.Valid != ok {
		t.Fatalf("sequencer %v: Fence says valid=%v, PutFenced says written=%v; they must agree (normalise or refuse a leading '/' in both)", slashed, fs.Valid, ok)
	}
}

// Finding: PutFenced and DeleteFenced skip KV's leading-slash rule. KV.Put
// refuses "/data" ("Invalid key. Key must not begin with a '/'") and
// KV.Get/Delete address "/data" as "data"; PutFenced writes a key named
// "/data" that KV.Get("/data") never reads, and DeleteFenced("/data")
// deletes that other key while "data" stays. (spec §1: the Go client
// rejects a leading '/' on PUT and strips it on GET/DELETE.)
func TestAuditClientFencedWritesLeadingSlash(t *testing.T) {
	ctx := caCtx(t)
	_, c := caNewServer(t)
	kv := c.KV()
	seq := caHold(t, ctx, c, "lk")
	if _, err := kv.Put(ctx, &KVPair{Key: "data", Value: []byte("old")}, nil); err != nil {
		t.Fatal(err)
	}
	ok, _, err := kv.PutFenced(ctx, &KVPair{Key: "/data", Value: []byte("new")}, seq, nil)
	if err == nil && ok {
		p, _, err := kv.Get(ctx, "/data", nil)
		if err != nil {
			t.Fatal(err)
		}
		if p == nil || string(p.Value) != "new" {
			t.Errorf("PutFenced(/data) reported success, but KV.Get(/data) reads %q; PutFenced must refuse a leading '/' as Put does", p.Value)
		}
	}
	if _, err := kv.Put(ctx, &KVPair{Key: "data", Value: []byte("old")}, nil); err != nil {
		t.Fatal(err)
	}
	ok, _, err = kv.DeleteFenced(ctx, "/data", seq, nil)
	if err != nil || !ok {
		t.Fatalf("DeleteFenced: %v %v", ok, err)
	}
	if p, _, _ := kv.Get(ctx, "/data", nil); p != nil {
		t.Errorf("DeleteFenced(/data) reported success but KV.Get(/data) still reads %q (KV.Delete(/data) would have deleted it)", p.Value)
	}
}

// Finding: CreateNoChecks passes se.ServiceChecks (and Checks) through, so
// the session it returns is bound to a service check and is invalidated
// when that check goes critical. Its doc says the session "is bound to no
// health check", and Consul's CreateNoChecks copies only Name, Node,
// LockDelay, Behavior and TTL.
func TestAuditClientCreateNoChecksBindsNoCheck(t *testing.T) {
	ctx := caCtx(t)
	_, c := caNewServer(t)
	reg := func(status string) {
		t.Helper()
		_, err := c.Catalog().Register(ctx, &CatalogRegistration{Node: "node1", Address: "127.0.0.1", SkipNodeUpdate: true,
			Service: &AgentService{ID: "web", Service: "web"},
			Check:   &HealthCheck{Node: "node1", CheckID: "web-alive", Name: "web", Status: status, ServiceID: "web"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	reg(HealthPassing)
	id, _, err := c.Session().CreateNoChecks(ctx, &SessionEntry{Name: "n", ServiceChecks: []ServiceCheck{{ID: "web-alive"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg(HealthCritical)
	info, _, err := c.Session().Info(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info == nil {
		t.Fatal("a CreateNoChecks session was invalidated by a service check going critical; it should be bound to no check")
	}
	if len(info.NodeChecks)+len(info.ServiceChecks)+len(info.Checks) != 0 {
		t.Fatalf("CreateNoChecks session bound to checks: %+v", info)
	}
}

// ---------------------------------------------------------------------
// Confirmed behaviour.

// Keys of every awkward byte round-trip through Put/Get/List/Delete
// against a real server, with binary values and the full Flags range.
func TestAuditClientKeyEscapingRoundTrip(t *testing.T) {
	ctx := caCtx(t)
	_, c := caNewServer(t)
	kv := c.KV()
	val := []byte{0, 1, 2, 0xff, '\n', '%'}
	for _, k := range []string{"a b", "a%b", "a%2Fb", "a?b=c&d", "a#frag", "ünï/cödé", "a+b", "a;b", "a//b", "a/./b", `a\b`, "trailing/", "\x01ctl"} {
		if _, err := kv.Put(ctx, &KVPair{Key: k, Value: val, Flags: 1<<64 - 1}, nil); err != nil {
			t.Errorf("put %q: %v", k, err)
			continue
		}
		p, _, err := kv.Get(ctx, "/"+k, nil) // one leading slash is forgiven on reads
		if err != nil || p == nil || p.Key != k || !bytes.Equal(p.Value, val) || p.Flags != 1<<64-1 {
			t.Errorf("get %q: %+v %v", k, p, err)
		}
		if l, _, err := kv.List(ctx, k, nil); err != nil || len(l) == 0 || l[0].Key != k {
			t.Errorf("list %q: %v %v", k, l, err)
		}
		if _, err := kv.Delete(ctx, k, nil); err != nil {
			t.Errorf("delete %q: %v", k, err)
		}
		if p, qm, err := kv.Get(ctx, k, nil); err != nil || p != nil || qm == nil || qm.LastIndex == 0 {
			t.Errorf("get after delete %q: %+v %+v %v (want nil, meta, nil)", k, p, qm, err)
		}
	}
}

// A cancelled blocking read returns at once, its connection is closed (the
// server sees it go), and the client works on afterwards; sequential calls
// share one connection and concurrent ones stay within the pool.
func TestAuditClientBlockingCancelAndConnections(t *testing.T) {
	ctx := caCtx(t)
	s, c := caNewServer(t)
	kv := c.KV()
	for i := 0; i < 100; i++ {
		if _, err := kv.Put(ctx, &KVPair{Key: "k", Value: []byte(fmt.Sprint(i))}, nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := kv.Get(ctx, "missing", nil); err != nil {
			t.Fatal(err)
		}
		c.Txn().Txn(ctx, TxnOps{{KV: &KVTxnOp{Verb: KVGet, Key: "missing"}}}, nil) // 409
	}
	if n := s.opened.Load(); n != 1 {
		t.Fatalf("sequential calls (incl. 404 and 409 answers) opened %d connections, want 1", n)
	}
	var wg sync.WaitGroup
	for g := 0; g < 24; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				k := fmt.Sprint("c/", g)
				if _, err := kv.Put(ctx, &KVPair{Key: k, Value: []byte("v")}, nil); err != nil {
					t.Error(err)
					return
				}
				if p, _, err := kv.Get(ctx, k, nil); err != nil || p == nil {
					t.Error(p, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	if n := s.opened.Load(); n > 1+24 {
		t.Fatalf("%d connections for 24 goroutines", n)
	}

	_, qm, err := kv.Get(ctx, "blk", nil)
	if err != nil {
		t.Fatal(err)
	}
	openBefore, w0 := s.open.Load(), s.Clock.Waiters()
	bctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, _, err := kv.Get(bctx, "blk", &QueryOptions{WaitIndex: qm.LastIndex, WaitTime: time.Minute})
		errc <- err
	}()
	caPoll(t, "the blocking read to reach the server", func() bool { return s.Clock.Waiters() > w0 })
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) || IsRetryable(err) {
			t.Fatalf("cancelled blocking read: %v (retryable %v)", err, IsRetryable(err))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled blocking read did not return")
	}
	caPoll(t, "the server to see the connection close", func() bool { return s.open.Load() < openBefore })
	caPoll(t, "the server's blocking read to end", func() bool { return s.Clock.Waiters() == w0 })

	go func() {
		p, qm2, err := kv.Get(ctx, "blk", &QueryOptions{WaitIndex: qm.LastIndex})
		if err == nil && (p == nil || qm2.LastIndex <= qm.LastIndex) {
			err = fmt.Errorf("woke with %+v %+v", p, qm2)
		}
		errc <- err
	}()
	caPoll(t, "the blocking read to reach the server", func() bool { return s.Clock.Waiters() > w0 })
	if _, err := kv.Put(ctx, &KVPair{Key: "blk", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// Lock-delay is surfaced in WriteMeta, Renew of an expired session is
// ErrSessionNotFound, and Txn's 409 and 413 come back in their documented
// shapes; KVGetOrEmpty answers a missing key.
func TestAuditClientSessionAndTxnShapes(t *testing.T) {
	ctx := caCtx(t)
	s, c := caNewServer(t)
	sess, kv := c.Session(), c.KV()
	a, _, err := sess.Create(ctx, &SessionEntry{LockDelay: 15 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := sess.CreateNoChecks(ctx, &SessionEntry{TTL: "10s", LockDelay: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info, _, err := sess.Info(ctx, b, nil); err != nil || info.LockDelay != 0 || info.TTL != "10s" || len(info.NodeChecks) != 0 {
		t.Fatalf("CreateNoChecks LockDelay -1: %+v %v", info, err)
	}
	if ok, _, err := kv.Acquire(ctx, &KVPair{Key: "l", Session: a}, nil); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := sess.Destroy(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	ok, wm, err := kv.Acquire(ctx, &KVPair{Key: "l", Session: b}, nil)
	if ok || err != nil || wm.LockDelayRemaining != 15*time.Second {
		t.Fatalf("acquire in lock-delay: %v %+v %v", ok, wm, err)
	}

	s.Clock.Advance(10*time.Second + time.Nanosecond)
	caPoll(t, "the TTL invalidation", func() bool { i, _, _ := sess.Info(ctx, b, nil); return i == nil })
	if e, _, err := sess.Renew(ctx, b, nil); e != nil || !errors.Is(err, ErrSessionNotFound) {
		t.Fatalf("renew of expired session: %+v %v", e, err)
	}

	ok, resp, _, err := c.Txn().Txn(ctx, TxnOps{{KV: &KVTxnOp{Verb: KVSet, Key: "t"}}, {KV: &KVTxnOp{Verb: KVGet, Key: "missing"}}}, nil)
	if ok || err != nil || len(resp.Errors) != 1 || resp.Errors[0].OpIndex != 1 || len(resp.Results) != 0 {
		t.Fatalf("409: %v %+v %v", ok, resp, err)
	}
	ok, resp, _, err = c.Txn().Txn(ctx, TxnOps{{KV: &KVTxnOp{Verb: KVGetOrEmpty, Key: "missing"}}}, nil)
	if !ok || err != nil || len(resp.Results) != 1 || resp.Results[0].KV.Key != "missing" {
		t.Fatalf("get-or-empty: %v %+v %v", ok, resp, err)
	}
	var ops TxnOps
	for i := 0; i < 129; i++ {
		ops = append(ops, &TxnOp{KV: &KVTxnOp{Verb: KVSet, Key: fmt.Sprint("k", i)}})
	}
	_, _, _, err = c.Txn().Txn(ctx, ops, nil)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusRequestEntityTooLarge ||
		err.Error() != "Unexpected response code: 413 (Transaction contains too many operations (129 > 128))" {
		t.Fatalf("129 ops: %v", err)
	}
}

// A body that stalls ends at the context's deadline; a truncated one is an
// error (retryable, like any transport error); garbage X-Consul-Index is an
// error; a non-JSON body is a decode error.
func TestAuditClientBadBodies(t *testing.T) {
	release := make(chan struct{})
	url := rawServer(t, func(conn net.Conn, br *bufio.Reader, n int) {
		for {
			req, err := readReq(br)
			if err != nil {
				return
			}
			head := "HTTP/1.1 200 OK\r\nX-Consul-Index: 3\r\nX-Consul-KnownLeader: true\r\nX-Consul-LastContact: 12\r\n"
			switch req.URL.Path {
			case "/v1/kv/slow":
				io.WriteString(conn, head+"Content-Length: 10\r\n\r\n[{")
				<-release
				return
			case "/v1/kv/trunc":
				io.WriteString(conn, head+"Content-Length: 10\r\n\r\n[{")
				return
			case "/v1/kv/garbage":
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nX-Consul-Index: 1x\r\nContent-Length: 2\r\n\r\n[]")
			case "/v1/kv/html":
				io.WriteString(conn, head+"Content-Length: 6\r\n\r\n<html>")
			default:
				io.WriteString(conn, head+"Content-Length: 2\r\n\r\n[]")
			}
		}
	})
	t.Cleanup(func() { close(release) }) // runs before rawServer's cleanup
	c, err := NewClient(&Config{Address: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.hc.CloseIdleConnections) // lets rawServer's connection loops end
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	start := time.Now()
	_, _, err = c.KV().Get(ctx, "slow", nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 3*time.Second {
		t.Fatalf("slow body: %v after %v", err, time.Since(start))
	}
	if _, _, err := c.KV().Get(caCtx(t), "trunc", nil); err == nil || !IsRetryable(err) {
		t.Fatalf("truncated body: %v", err)
	}
	if _, _, err := c.KV().Get(caCtx(t), "garbage", nil); err == nil {
		t.Fatal("garbage X-Consul-Index accepted")
	}
	if _, _, err := c.KV().Get(caCtx(t), "html", nil); err == nil {
		t.Fatal("non-JSON body accepted")
	}
	p, qm, err := c.KV().Get(caCtx(t), "ok", nil)
	if err != nil || p != nil || qm.LastIndex != 3 || qm.LastContact != 12*time.Millisecond || !qm.KnownLeader {
		t.Fatalf("plain read: %+v %+v %v", p, qm, err)
	}
}
