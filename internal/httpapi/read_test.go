package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/httpserve"
)

func idxOf(t *testing.T, r *resp) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(r.Header.Get("X-Consul-Index"), 10, 64)
	if err != nil {
		t.Fatalf("X-Consul-Index %q: %v", r.Header.Get("X-Consul-Index"), err)
	}
	return n
}

func u64(n uint64) string { return strconv.FormatUint(n, 10) }

// notYet fails if ch delivers within a short real-time grace period.
func notYet(t *testing.T, ch <-chan *resp) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("blocking query returned early: %d %q", r.Code, r.Body)
	case <-time.After(50 * time.Millisecond):
	}
}

func recv(t *testing.T, ch <-chan *resp) *resp {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("blocking query did not return")
		return nil
	}
}

func TestBlockingGetReturnsOnWrite(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/b", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/b", ""))

	ch := e.block("GET", "/v1/kv/b?index="+u64(idx)+"&wait=1m")
	notYet(t, ch)
	e.do("PUT", "/v1/kv/b", "2").want(t, 200, "true")
	r := recv(t, ch).want(t, 200, "*")
	if got := idxOf(t, r); got <= idx {
		t.Fatalf("index %d after a write, was %d", got, idx)
	}
	var ents []struct{ Value []byte }
	r.json(t, &ents)
	if string(ents[0].Value) != "2" {
		t.Fatalf("value %q", ents[0].Value)
	}
}

func TestBlockingIdempotentWriteDoesNotWake(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/b", "same").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/b", ""))
	ch := e.block("GET", "/v1/kv/b?index="+u64(idx)+"&wait=30s")
	e.do("PUT", "/v1/kv/b", "same").want(t, 200, "true")
	notYet(t, ch)
	e.clk.Advance(30 * time.Second)
	r := recv(t, ch).want(t, 200, "*")
	if idxOf(t, r) != idx {
		t.Fatalf("index moved without a change: %d → %d", idx, idxOf(t, r))
	}
}

func TestBlockingMissingKeyIgnoresUnrelatedWrites(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/other", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/missing", "").want(t, 404, ""))

	ch := e.block("GET", "/v1/kv/missing?index="+u64(idx)+"&wait=1m")
	for i := 0; i < 3; i++ {
		e.do("PUT", "/v1/kv/other", strconv.Itoa(i+2)).want(t, 200, "true")
		e.do("PUT", "/v1/kv/missinf", strconv.Itoa(i)).want(t, 200, "true")
	}
	notYet(t, ch)

	// The key appearing wakes it.
	e.do("PUT", "/v1/kv/missing", "here").want(t, 200, "true")
	r := recv(t, ch).want(t, 200, "*")
	if idxOf(t, r) != e.b.index() {
		t.Fatalf("index %d, want %d", idxOf(t, r), e.b.index())
	}
}

func TestBlockingMissingKeyTimesOutWith404(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/other", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/missing", "").want(t, 404, ""))
	ch := e.block("GET", "/v1/kv/missing?index="+u64(idx)+"&wait=20s")
	e.do("PUT", "/v1/kv/other", "2").want(t, 200, "true")
	notYet(t, ch)
	e.clk.Advance(20 * time.Second)
	r := recv(t, ch).want(t, 404, "")
	if idxOf(t, r) != e.b.index() {
		t.Fatalf("timed-out 404 index %d, want current %d", idxOf(t, r), e.b.index())
	}
}

func TestBlockingIndexAheadReturnsAtOnce(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/k", "1").want(t, 200, "true")
	r := recv(t, e.async("GET", "/v1/kv/k?index=999999&wait=5m", "")).want(t, 200, "*")
	if idxOf(t, r) >= 999999 {
		t.Fatalf("index %d", idxOf(t, r))
	}
	// index=0 never blocks, whatever the wait.
	recv(t, e.async("GET", "/v1/kv/k?index=0&wait=5m", "")).want(t, 200, "*")
	// Nor does a query whose index is already behind.
	recv(t, e.async("GET", "/v1/kv/k?index=1&wait=5m", "")).want(t, 200, "*")
}

func TestBlockingWaitTimeoutJitterAndClamp(t *testing.T) {
	var mu sync.Mutex
	var asked []time.Duration
	e := newEnv(t, func(o *Options) {
		o.Jitter = func(max time.Duration) time.Duration {
			mu.Lock()
			asked = append(asked, max)
			mu.Unlock()
			return 5 * time.Second
		}
	})
	e.do("PUT", "/v1/kv/k", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/k", ""))

	// wait=32s plus 5s of jitter.
	ch := e.block("GET", "/v1/kv/k?index="+u64(idx)+"&wait=32s")
	e.clk.Advance(32 * time.Second)
	notYet(t, ch)
	e.clk.Advance(5 * time.Second)
	r := recv(t, ch).want(t, 200, "*")
	if idxOf(t, r) != idx {
		t.Fatalf("index %d after timeout, want %d", idxOf(t, r), idx)
	}
	mu.Lock()
	if len(asked) != 1 || asked[0] != 2*time.Second {
		t.Fatalf("jitter asked for %v, want [2s] (wait/16)", asked)
	}
	mu.Unlock()

	// wait=1h is clamped to 10m (+5s jitter).
	ch = e.block("GET", "/v1/kv/k?index="+u64(idx)+"&wait=1h")
	e.clk.Advance(10*time.Minute + 4*time.Second)
	notYet(t, ch)
	e.clk.Advance(time.Second)
	recv(t, ch).want(t, 200, "*")

	// No wait: the default 5m (+5s).
	ch = e.block("GET", "/v1/kv/k?index="+u64(idx))
	e.clk.Advance(5*time.Minute + 4*time.Second)
	notYet(t, ch)
	e.clk.Advance(time.Second)
	recv(t, ch).want(t, 200, "*")
}

func TestBlockingRecurseAndKeys(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/p/a", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/p/?recurse", ""))
	rec := e.block("GET", "/v1/kv/p/?recurse&index="+u64(idx))
	keys := e.block("GET", "/v1/kv/p/?keys&index="+u64(idx))
	e.do("PUT", "/v1/kv/q", "unrelated").want(t, 200, "true")
	notYet(t, rec)
	notYet(t, keys)
	e.do("DELETE", "/v1/kv/p/a", "").want(t, 200, "true")
	// The prefix went empty: 404 with the tombstone's index.
	r := recv(t, rec).want(t, 404, "")
	if idxOf(t, r) != e.b.index() {
		t.Fatalf("recurse index %d, want %d", idxOf(t, r), e.b.index())
	}
	recv(t, keys).want(t, 404, "")
}

func TestBlockingSessionEndpoints(t *testing.T) {
	e := newEnv(t)
	id := e.createSession("")
	idx := idxOf(t, e.do("GET", "/v1/session/info/"+id, ""))
	info := e.block("GET", "/v1/session/info/"+id+"?index="+u64(idx))
	list := e.block("GET", "/v1/session/list?index="+u64(idx))
	node := e.block("GET", "/v1/session/node/"+testNode+"?index="+u64(idx))
	e.do("PUT", "/v1/kv/x", "unrelated").want(t, 200, "true")
	notYet(t, info)
	e.do("PUT", "/v1/session/destroy/"+id, "").want(t, 200, "true")
	recv(t, info).want(t, 200, "[]")
	recv(t, list).want(t, 200, "[]")
	recv(t, node).want(t, 200, "[]")

	// The node's list is empty now: an empty list that stays empty keeps
	// waiting through writes elsewhere, and answers when it fills.
	idx = idxOf(t, e.do("GET", "/v1/session/node/"+testNode, ""))
	node = e.block("GET", "/v1/session/node/"+testNode+"?index="+u64(idx))
	e.do("PUT", "/v1/kv/x", "unrelated again").want(t, 200, "true")
	notYet(t, node)
	id = e.createSession("")
	if r := recv(t, node).want(t, 200, "*"); !strings.Contains(r.Body, id) {
		t.Fatalf("node list after a create: %s", r.Body)
	}
}

func TestBlockingConsistentChecksEachEvaluation(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/c", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/c", ""))
	before := e.b.consistent.Load()
	ch := e.block("GET", "/v1/kv/c?consistent&index="+u64(idx))
	e.do("PUT", "/v1/kv/c", "2").want(t, 200, "true")
	recv(t, ch).want(t, 200, "*")
	if n := e.b.consistent.Load() - before; n != 2 {
		t.Fatalf("ConsistentRead called %d times, want one per evaluation (2)", n)
	}
}

func TestBlockingClientGoneStopsQuery(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/k", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/k", ""))
	ctx, cancel := contextWithCancel()
	done := make(chan *resp, 1)
	go func() { done <- e.doCtx(ctx, "GET", "/v1/kv/k?index="+u64(idx), "") }()
	e.clk.WaitTimers(t, 1)
	cancel()
	recv(t, done).want(t, 500, errCancelled.Msg)
	deadline := time.Now().Add(5 * time.Second)
	for e.clk.Timers() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the blocking query's timer was never stopped")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBlockingDeletedKeyReturns404(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/gone", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/gone", ""))
	ch := e.block("GET", "/v1/kv/gone?consistent&index="+u64(idx))
	e.do("DELETE", "/v1/kv/gone", "").want(t, 200, "true")
	r := recv(t, ch).want(t, 404, "")
	if idxOf(t, r) != e.b.index() {
		t.Fatalf("index %d, want %d", idxOf(t, r), e.b.index())
	}
}

// A blocking query served by internal/httpserve, which watches for a
// client going away only when asked, still ends when its client hangs up:
// read asks (WatchDisconnect) before it parks.
func TestBlockingGetEndsWhenClientLeavesUnderHTTPServe(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/b", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/b", ""))

	returned := make(chan struct{}, 1)
	srv := &httpserve.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.h.ServeHTTP(w, r)
		returned <- struct{}{}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()

	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	before, timers := e.b.reads.Load(), e.clk.Timers()
	fmt.Fprintf(nc, "GET /v1/kv/b?index=%d&wait=10m HTTP/1.1\r\nHost: x\r\n\r\n", idx)
	for e.b.reads.Load() == before {
		time.Sleep(100 * time.Microsecond)
	}
	e.clk.WaitTimers(t, timers+1) // parked
	select {
	case <-returned:
		t.Fatal("the blocking query returned before anything changed")
	default:
	}
	nc.Close()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking query still parked 10s after its client left")
	}
}
