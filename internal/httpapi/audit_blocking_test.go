package httpapi

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Audit of blocking queries and read endpoints (auditor "ba"). Every test
// runs the real handler over the real state store and FSM (fakeBackend
// applies writes with fsm.Dispatch), with the fake clock for wait timeouts.

// baSeed writes a key, a session and a prepared query; baReadPaths lists
// every GET read endpoint that takes ?index, with a path that
// exists after baSeed.
func baSeed(t *testing.T, e *env) (sess, qid string) {
	t.Helper()
	e.do("PUT", "/v1/kv/seed/a", "1").want(t, 200, "true")
	sess = e.createSession("")
	r := e.do("POST", "/v1/query", `{"Name":"q1","Service":{"Service":"web"}}`).want(t, 200, "*")
	var out struct{ ID string }
	r.json(t, &out)
	return sess, out.ID
}

func baReadPaths(sess, qid string) []string {
	return []string{
		"/v1/kv/seed/a",
		"/v1/kv/seed/?recurse",
		"/v1/kv/seed/?keys&separator=/",
		"/v1/session/info/" + sess,
		"/v1/session/node/" + testNode,
		"/v1/session/list",
		"/v1/catalog/nodes",
		"/v1/catalog/node/" + testNode,
		"/v1/health/node/" + testNode,
		"/v1/query",
		"/v1/query/" + qid,
	}
}

func baWithQuery(p, q string) string {
	if strings.Contains(p, "?") {
		return p + "&" + q
	}
	return p + "?" + q
}

// Headers on every read, on 404s and on an empty KV table.
func TestAuditBlockingReadHeadersEveryEndpoint(t *testing.T) {
	e := newEnv(t)
	// Empty KV table first: index must still not be 0.
	for _, p := range []string{"/v1/kv/none", "/v1/kv/?recurse", "/v1/kv/?keys", "/v1/kv/none/?keys", "/v1/kv/none/?recurse"} {
		r := e.do("GET", p, "")
		if r.Code != 200 && r.Code != 404 {
			t.Fatalf("%s: %d %q", p, r.Code, r.Body)
		}
		if v := r.Header.Get("X-Consul-Index"); v == "" || v == "0" {
			t.Errorf("%s on an empty KV table: X-Consul-Index %q", p, v)
		}
	}
	sess, qid := baSeed(t, e)
	paths := append(baReadPaths(sess, qid),
		"/v1/kv/missing", "/v1/kv/missing/?recurse", "/v1/kv/missing/?keys", "/v1/query/nope",
		"/v1/session/info/nope", "/v1/catalog/node/nope", "/v1/health/node/nope")
	for _, p := range paths {
		r := e.do("GET", p, "")
		if r.Code != 200 && r.Code != 404 {
			t.Fatalf("%s: %d %q", p, r.Code, r.Body)
		}
		if v := r.Header.Get("X-Consul-Index"); v == "" || v == "0" {
			t.Errorf("%s: X-Consul-Index %q", p, v)
		}
		if v := r.Header.Get("X-Consul-KnownLeader"); v != "true" {
			t.Errorf("%s: X-Consul-KnownLeader %q", p, v)
		}
		if v := r.Header.Get("X-Consul-LastContact"); v != "0" {
			t.Errorf("%s: X-Consul-LastContact %q", p, v)
		}
		if r.Code == 200 && r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: Content-Type %q", p, r.Header.Get("Content-Type"))
		}
	}
}

// index above the current one answers at once with the current index on
// every endpoint (docs/compatibility.md §6); index=0 and an index behind
// answer at once too.
func TestAuditBlockingIndexAheadBehindZeroEveryEndpoint(t *testing.T) {
	e := newEnv(t)
	sess, qid := baSeed(t, e)
	for _, p := range baReadPaths(sess, qid) {
		cur := idxOf(t, e.do("GET", p, ""))
		for _, q := range []string{"index=" + u64(cur+1000) + "&wait=5m", "index=0&wait=5m", "index=1&wait=5m"} {
			if q == "index=1&wait=5m" && cur <= 1 {
				continue
			}
			r := recv(t, e.async("GET", baWithQuery(p, q), ""))
			if r.Code != 200 {
				t.Errorf("%s %s: %d %q", p, q, r.Code, r.Body)
				continue
			}
			if got := idxOf(t, r); got != cur {
				t.Errorf("%s %s: index %d, want current %d", p, q, got, cur)
			}
		}
	}
}

// Bad index / wait values are a 400 with Consul's sentence; ?stale with
// ?consistent is refused as the spec says.
func TestAuditBlockingBadParams(t *testing.T) {
	e := newEnv(t)
	sess, qid := baSeed(t, e)
	for _, p := range baReadPaths(sess, qid) {
		for q, want := range map[string]string{
			"index=abc":         "Invalid index",
			"index=-1":          "Invalid index",
			"index=1.5":         "Invalid index",
			"index=5&wait=abc":  "Invalid wait time",
			"index=5&wait=10":   "Invalid wait time", // Go duration needs a unit, as in Consul
			"index=5&wait=-1s":  "Invalid wait time",
			"stale&consistent":  "Cannot specify ?stale with ?consistent, conflicting semantics.",
			"cached&consistent": "Cannot specify ?cached with ?consistent, conflicting semantics.",
		} {
			r := e.do("GET", baWithQuery(p, q), "")
			if r.Code != 400 || r.Body != want {
				t.Errorf("%s %s: %d %q, want 400 %q", p, q, r.Code, r.Body, want)
			}
		}
	}
}

// A blocking read wakes for what it reads and not for unrelated writes, on
// each endpoint where the two can be told apart.
func TestAuditBlockingWakePrecision(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/catalog/register", `{"Node":"na","Address":"10.0.0.1","Check":{"CheckID":"ca","Status":"passing"}}`).want(t, 200, "true")
	e.do("PUT", "/v1/catalog/register", `{"Node":"nb","Address":"10.0.0.2","Check":{"CheckID":"cb","Status":"passing"}}`).want(t, 200, "true")
	e.do("PUT", "/v1/kv/p/a", "1").want(t, 200, "true")
	sa := e.createSession("")
	sb := e.createSession("")
	qa := e.do("POST", "/v1/query", `{"Name":"qa","Service":{"Service":"web"}}`).want(t, 200, "*")
	var qid struct{ ID string }
	qa.json(t, &qid)

	idx := func(p string) string { return u64(idxOf(t, e.do("GET", p, ""))) }
	info := e.block("GET", "/v1/session/info/"+sa+"?wait=1m&index="+idx("/v1/session/info/"+sa))
	hA := e.block("GET", "/v1/health/node/na?wait=1m&index="+idx("/v1/health/node/na"))
	pre := e.block("GET", "/v1/kv/p/?recurse&wait=1m&index="+idx("/v1/kv/p/?recurse"))
	keys := e.block("GET", "/v1/kv/p/?keys&separator=/&wait=1m&index="+idx("/v1/kv/p/?keys&separator=/"))
	miss := e.block("GET", "/v1/kv/p/missing?wait=1m&index="+idx("/v1/kv/p/missing"))
	qg := e.block("GET", "/v1/query/"+qid.ID+"?wait=1m&index="+idx("/v1/query/"+qid.ID))

	// Unrelated writes.
	e.do("PUT", "/v1/session/destroy/"+sb, "").want(t, 200, "true")
	e.do("PUT", "/v1/catalog/register", `{"Node":"nb","Address":"10.0.0.2","Check":{"CheckID":"cb","Status":"warning"}}`).want(t, 200, "true")
	e.do("PUT", "/v1/catalog/register", `{"Node":"nb","Address":"10.0.0.3","Service":{"ID":"s","Service":"s"}}`).want(t, 200, "true")
	e.do("PUT", "/v1/kv/pa", "outside").want(t, 200, "true")
	e.do("PUT", "/v1/kv/q/x", "outside").want(t, 200, "true")
	e.do("POST", "/v1/query", `{"Name":"qb","Service":{"Service":"web"}}`).want(t, 200, "*")
	for name, ch := range map[string]<-chan *resp{"session info": info, "health A": hA,
		"recurse p/": pre, "keys p/": keys, "missing key": miss, "query A": qg} {
		select {
		case r := <-ch:
			t.Errorf("%s woke on an unrelated write: %d %q", name, r.Code, r.Body)
		case <-time.After(50 * time.Millisecond):
		}
	}
	e.clk.Advance(2 * time.Minute) // release the parked queries
}

// Session invalidation wakes reads of the keys it releases or deletes, and
// the index returned is the invalidation's.
func TestAuditBlockingSessionInvalidationWakesKeys(t *testing.T) {
	e := newEnv(t)
	rel := e.createSession(`{"LockDelay":"0s"}`)
	del := e.createSession(`{"LockDelay":"0s","Behavior":"delete"}`)
	e.do("PUT", "/v1/kv/l/rel?acquire="+rel, "v").want(t, 200, "true")
	e.do("PUT", "/v1/kv/l/del?acquire="+del, "v").want(t, 200, "true")
	ir := idxOf(t, e.do("GET", "/v1/kv/l/rel", ""))
	id := idxOf(t, e.do("GET", "/v1/kv/l/del", ""))
	chRel := e.block("GET", "/v1/kv/l/rel?index="+u64(ir))
	chDel := e.block("GET", "/v1/kv/l/del?index="+u64(id))
	e.do("PUT", "/v1/session/destroy/"+rel, "").want(t, 200, "true")
	r := recv(t, chRel).want(t, 200, "*")
	if got := idxOf(t, r); got != e.b.index() {
		t.Errorf("released key index %d, want invalidation index %d", got, e.b.index())
	}
	notYet(t, chDel)
	e.do("PUT", "/v1/session/destroy/"+del, "").want(t, 200, "true")
	r = recv(t, chDel).want(t, 404, "")
	if got := idxOf(t, r); got != e.b.index() {
		t.Errorf("deleted key index %d, want invalidation index %d", got, e.b.index())
	}
	// Deleted, then re-created: the blocked 404 reader wakes with the create.
	miss := idxOf(t, r)
	ch := e.block("GET", "/v1/kv/l/del?index="+u64(miss))
	e.do("PUT", "/v1/kv/other", "x").want(t, 200, "true")
	notYet(t, ch)
	e.do("PUT", "/v1/kv/l/del", "again").want(t, 200, "true")
	r = recv(t, ch).want(t, 200, "*")
	if got := idxOf(t, r); got != e.b.index() {
		t.Errorf("re-created key index %d, want %d", got, e.b.index())
	}
	// Acquire and release (no lock-delay involved) wake a reader.
	s := e.createSession(`{"LockDelay":"0s"}`)
	cur := idxOf(t, r)
	ch = e.block("GET", "/v1/kv/l/del?index="+u64(cur))
	e.do("PUT", "/v1/kv/l/del?acquire="+s, "again").want(t, 200, "true")
	cur = idxOf(t, recv(t, ch).want(t, 200, "*"))
	ch = e.block("GET", "/v1/kv/l/del?index="+u64(cur))
	e.do("PUT", "/v1/kv/l/del?release="+s, "again").want(t, 200, "true")
	if got := idxOf(t, recv(t, ch).want(t, 200, "*")); got != e.b.index() {
		t.Errorf("release index %d, want %d", got, e.b.index())
	}
}

// Finding: a prefix listing (?recurse / ?keys) that is blocked on its index
// never wakes when its keys are removed by a recursive delete of a
// shorter (ancestor) prefix, if an older tombstone under the listed prefix
// exists: the delete leaves one tombstone for the ancestor ("a"), which
// prefixIndex does not count for the listing "ab/", so the listing keeps
// the old tombstone's index and the query parks until wait although its
// contents went from [ab/x] to none. docs/compatibility.md §6 promises
// "every listing of a prefix reports the highest index among its keys and
// the tombstones of keys deleted under it, so that a delete moves the
// index"; spec §4 "recurse/keys watch the prefix" (change ⇒ new index).
func TestAuditBlockingPrefixListMissesAncestorTreeDelete(t *testing.T) {
	for _, q := range []string{"recurse", "keys"} {
		e := newEnv(t)
		e.do("PUT", "/v1/kv/ab/x", "1").want(t, 200, "true")
		e.do("PUT", "/v1/kv/ab/y", "1").want(t, 200, "true")
		e.do("DELETE", "/v1/kv/ab/y", "").want(t, 200, "true") // tombstone ab/y
		idx := idxOf(t, e.do("GET", "/v1/kv/ab/?"+q, "").want(t, 200, "*"))
		ch := e.block("GET", "/v1/kv/ab/?"+q+"&wait=1m&index="+u64(idx))
		e.do("DELETE", "/v1/kv/a?recurse", "").want(t, 200, "true") // removes ab/x
		select {
		case r := <-ch:
			r.want(t, 404, "")
			if got := idxOf(t, r); got <= idx {
				t.Errorf("?%s: index %d after ab/x was deleted, was %d", q, got, idx)
			}
		case <-time.After(2 * time.Second):
			after := idxOf(t, e.do("GET", "/v1/kv/ab/?"+q, ""))
			e.clk.Advance(2 * time.Minute)
			<-ch
			t.Errorf("?%s of ab/ still blocked after DELETE a?recurse removed ab/x; "+
				"listing index stays %d (was %d, delete was at %d)", q, after, idx, e.b.index())
		}
	}
	// The same hole makes the index go backwards without any reaping: the
	// listing saw ab/x at its ModifyIndex, and after the ancestor delete it
	// reports the older tombstone's index.
	e := newEnv(t)
	e.do("PUT", "/v1/kv/ab/y", "1").want(t, 200, "true")
	e.do("DELETE", "/v1/kv/ab/y", "").want(t, 200, "true")
	e.do("PUT", "/v1/kv/ab/x", "1").want(t, 200, "true")
	before := idxOf(t, e.do("GET", "/v1/kv/ab/?recurse", "").want(t, 200, "*"))
	e.do("DELETE", "/v1/kv/a?recurse", "").want(t, 200, "true")
	if after := idxOf(t, e.do("GET", "/v1/kv/ab/?recurse", "").want(t, 404, "")); after <= before {
		t.Errorf("listing index went from %d to %d across a delete at %d", before, after, e.b.index())
	}
}

// Finding: node-scoped reads wake, with an unchanged body and a new index,
// on writes that concern only another node: /v1/health/node/<A> and
// /v1/session/node/<A> of a node that has no checks/sessions (or is not
// registered yet) wake on any check/session write elsewhere, and
// /v1/catalog/node/<A> wakes when another node gets its first service.
// The reads watch a go-memdb iterator whose channel, when the node has no
// rows or the radix node is split, is an ancestor's; as lists (found=true)
// they are not re-baselined and report the whole table's index. Breaks the
// user expectation "health of node A does not wake for node B" (spec §4:
// waking is fine-grained) and turns every write into a wake-up for each
// waiter on an idle node.
//
// Fixed for health and sessions (an empty list is re-baselined, as a
// missing key is). Left: /v1/catalog/node/<A> of a node with no services
// still wakes, with the same body, when another node's services change, as
// in Consul; telling that apart needs an index per node.
func TestAuditBlockingNodeReadsIgnoreOtherNodes(t *testing.T) {
	e := newEnv(t)
	e.createSession("") // the sessions table index is not 0
	e.do("PUT", "/v1/catalog/register", `{"Node":"na","Address":"10.0.0.1"}`).want(t, 200, "true")
	e.do("PUT", "/v1/catalog/register", `{"Node":"nb","Address":"10.0.0.2","Check":{"CheckID":"cb","Status":"passing"}}`).want(t, 200, "true")
	for i, c := range []struct{ path, write string }{
		{"/v1/health/node/na", `{"Node":"nb","Address":"10.0.0.2","Check":{"CheckID":"cb","Status":"warning"}}`},
		{"/v1/health/node/ghost", `{"Node":"nb","Address":"10.0.0.2","Check":{"CheckID":"cb","Status":"passing"}}`},
		{"/v1/session/node/na", "session on nb"},
	} {
		idx := idxOf(t, e.do("GET", c.path, "").want(t, 200, "*"))
		before := e.do("GET", c.path, "").Body
		ch := e.block("GET", c.path+"?wait=1m&index="+u64(idx))
		if c.write == "session on nb" {
			e.createSession(`{"Node":"nb","NodeChecks":["cb"]}`)
		} else {
			e.do("PUT", "/v1/catalog/register", c.write).want(t, 200, "true")
		}
		select {
		case r := <-ch:
			t.Errorf("%d: %s woke on a write to another node: index %d -> %s, body %q (unchanged: %v)",
				i, c.path, idx, r.Header.Get("X-Consul-Index"), r.Body, r.Body == before)
		case <-time.After(100 * time.Millisecond):
			e.clk.Advance(2 * time.Minute)
			recv(t, ch)
		}
	}
}

// Finding: on a table that has never been written (no sessions yet, no
// prepared queries, empty KV) the read reports X-Consul-Index 1 (forced,
// as it must never be 0) but compares the raw 0 with the client's index:
// the client's next blocking call with index=1 looks "ahead of the
// server" (0 < 1) and returns at once, forever: a blocking watch on an
// empty table becomes a busy loop of requests. Spec §0/§4: the server
// forces index 1 and "clients ... treat index<1 as 1"; Consul's
// blockingQuery sets the index to 1 before comparing, so it blocks.
func TestAuditBlockingEmptyTableIndexOneBlocks(t *testing.T) {
	e := newEnv(t) // only the server's own node is registered
	for _, p := range []string{"/v1/kv/missing", "/v1/kv/?recurse", "/v1/kv/?keys", "/v1/kv/dir/?keys",
		"/v1/session/list", "/v1/session/node/" + testNode, "/v1/session/info/nope", "/v1/query"} {
		r := e.do("GET", p, "")
		if got := r.Header.Get("X-Consul-Index"); got != "1" {
			t.Fatalf("%s: index %q, want the forced 1", p, got)
		}
		ch := e.async("GET", baWithQuery(p, "index=1&wait=1m"), "")
		select {
		case r := <-ch:
			t.Errorf("%s with index=1 (the index the server just reported) returned at once: %d %q index %s",
				p, r.Code, r.Body, r.Header.Get("X-Consul-Index"))
		case <-time.After(100 * time.Millisecond):
			e.clk.Advance(2 * time.Minute)
			recv(t, ch)
		}
	}
}

// The wait runs on the fake clock and the timed-out answer carries the
// unchanged index, on every endpoint.
func TestAuditBlockingTimeoutEveryEndpoint(t *testing.T) {
	e := newEnv(t)
	sess, qid := baSeed(t, e)
	for _, p := range baReadPaths(sess, qid) {
		cur := idxOf(t, e.do("GET", p, ""))
		ch := e.block("GET", baWithQuery(p, "index="+u64(cur)+"&wait=30s"))
		e.clk.Advance(29 * time.Second)
		notYet(t, ch)
		e.clk.Advance(time.Second)
		r := recv(t, ch)
		if r.Code != 200 || idxOf(t, r) != cur {
			t.Errorf("%s: timed out with %d index %s, want 200 index %d", p, r.Code, r.Header.Get("X-Consul-Index"), cur)
		}
	}
}

// ?stale and ?consistent each work with blocking.
func TestAuditBlockingStaleAndConsistentBlock(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v1/kv/c", "1").want(t, 200, "true")
	idx := idxOf(t, e.do("GET", "/v1/kv/c", ""))
	st := e.block("GET", "/v1/kv/c?stale&index="+u64(idx))
	co := e.block("GET", "/v1/kv/c?consistent&index="+u64(idx))
	e.do("PUT", "/v1/kv/c", "2").want(t, 200, "true")
	if r := recv(t, st).want(t, 200, "*"); r.Header.Get("X-Consul-Effective-Consistency") != "stale" {
		t.Errorf("stale: %q", r.Header.Get("X-Consul-Effective-Consistency"))
	}
	if r := recv(t, co).want(t, 200, "*"); r.Header.Get("X-Consul-Effective-Consistency") != "consistent" {
		t.Errorf("consistent: %q", r.Header.Get("X-Consul-Effective-Consistency"))
	}
}

// Many blocking queries over real connections, half timing out and half
// abandoned by their clients, leave no goroutines behind.
func TestAuditBlockingNoGoroutineGrowth(t *testing.T) {
	e := newEnv(t)
	sess, qid := baSeed(t, e)
	ctx, cancelSrv := context.WithCancel(context.Background())
	srv := httptest.NewUnstartedServer(e.h)
	srv.Listener.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.Config.BaseContext = func(net.Listener) context.Context { return ctx }
	srv.Start()
	defer func() { cancelSrv(); srv.Close() }()
	tr := &http.Transport{}
	cl := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()

	paths := baReadPaths(sess, qid)
	run := func() {
		var wg sync.WaitGroup
		cctx, cancel := context.WithCancel(context.Background())
		timers := e.clk.Timers()
		n := 0
		for round := 0; round < 4; round++ {
			for _, p := range paths {
				cur := idxOf(t, e.do("GET", p, ""))
				c := context.Background()
				if round%2 == 1 {
					c = cctx // abandoned by the client
				}
				req, _ := http.NewRequestWithContext(c, "GET", srv.URL+baWithQuery(p, "wait=1m&index="+u64(cur)), nil)
				wg.Add(1)
				n++
				go func() {
					defer wg.Done()
					resp, err := cl.Do(req)
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
			}
		}
		e.clk.WaitTimers(t, timers+n)
		cancel()
		// Wait until the abandoned ones have stopped their timers.
		deadline := time.Now().Add(10 * time.Second)
		for e.clk.Timers() > timers+n/2 {
			if time.Now().After(deadline) {
				t.Fatalf("abandoned blocking queries still armed: %d timers", e.clk.Timers())
			}
			time.Sleep(time.Millisecond)
		}
		e.clk.Advance(2 * time.Minute)
		wg.Wait()
		tr.CloseIdleConnections()
	}
	run() // warm up pools and connections
	base := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		run()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base+2 {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines grew from %d to %d\n%s", base, n, buf)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
