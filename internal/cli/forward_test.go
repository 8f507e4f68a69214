package cli

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/gossip"
)

// mute is an upstream server that takes every request and never answers
// it, as a frozen server or one cut off by the network would: it reports
// each request's arrival, and then waits for the forward to be given up.
type mute struct {
	*httptest.Server
	arrived chan *http.Request
}

func newMute(t *testing.T) *mute {
	m := &mute{arrived: make(chan *http.Request, 8)}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// With the body read, the server watches the connection, and the
		// request's context ends when the forward gives it up.
		io.Copy(io.Discard, r.Body)
		m.arrived <- r
		<-r.Context().Done()
	}))
	t.Cleanup(m.Close)
	return m
}

// answering is an upstream server that answers "from <name>" and counts
// its requests.
func answering(t *testing.T, name string, hits *atomic.Int64) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "from "+name)
	}))
	t.Cleanup(s.Close)
	return s
}

func serverMember(name, http string, st gossip.Status) gossip.Member {
	return gossip.Member{Name: name, Addr: "127.0.0.1", Status: st, Tags: map[string]string{"role": "server", "http": http}}
}

type fwdAnswer struct {
	code int
	body string
}

// doAsync is do on a goroutine.
func doAsync(t *testing.T, method, url, body string) <-chan fwdAnswer {
	ch := make(chan fwdAnswer, 1)
	go func() {
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			ch <- fwdAnswer{body: err.Error()}
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- fwdAnswer{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		ch <- fwdAnswer{resp.StatusCode, strings.TrimSpace(string(b))}
	}()
	return ch
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// tick advances clk past one look of watchTargets and waits until the
// watch has re-armed its timer, so that the look is over.
func tick(t *testing.T, ctx context.Context, clk *clocktest.Fake) {
	t.Helper()
	if err := clk.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(targetWatchEvery)
	if err := clk.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// A client agent's forward waiting on a server that the pool then declares
// failed is given up at the watch's next look, not at its 30 s bound: a
// read is sent again to a live server and answered from there, a write is
// answered 500, saying it may or may not have been applied (the frozen
// server may yet apply it), and is not sent again. While the server stays
// alive, the watch leaves its forwards alone.
func TestForwardGivesUpOnServerDeclaredFailed(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		code         int
		body         string
		hitsB        int64
	}{
		{"GET", "/v1/kv/k", 200, "from B", 1},
		{"GET", "/v1/kv/k?index=7&wait=5m", 200, "from B", 1},
		{"PUT", "/v1/kv/k", 500, "holdfast client agent: the server at %A% was declared failed by the gossip pool before it answered; the request may or may not have been applied", 0},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			ctx := testCtx(t)
			a := newMute(t)
			var hitsB atomic.Int64
			b := answering(t, "B", &hitsB)
			pool := &livePool{ms: fakePool{
				serverMember("a", a.Listener.Addr().String(), gossip.StatusAlive),
				serverMember("b", b.Listener.Addr().String(), gossip.StatusAlive),
			}}
			c := newClientAgent("client1", "dc1", "x", pool, hclog.NewNullLogger())
			clk := clocktest.NewFake(time.Unix(1e9, 0))
			go c.watchTargets(ctx, clk)
			hs := httptest.NewServer(c)
			defer hs.Close()

			body := ""
			if tc.method == "PUT" {
				body = "v"
			}
			got := doAsync(t, tc.method, hs.URL+tc.path, body)
			req := <-a.arrived
			tick(t, ctx, clk) // a is alive: nothing is given up
			select {
			case <-req.Context().Done():
				t.Fatal("the forward to a live server was given up")
			case ans := <-got:
				t.Fatalf("answered while the server had not: %+v", ans)
			default:
			}

			pool.set(fakePool{
				serverMember("a", a.Listener.Addr().String(), gossip.StatusFailed),
				serverMember("b", b.Listener.Addr().String(), gossip.StatusAlive),
			})
			tick(t, ctx, clk)
			ans := <-got
			want := strings.ReplaceAll(tc.body, "%A%", a.Listener.Addr().String())
			if ans.code != tc.code || ans.body != want {
				t.Fatalf("answer %d %q, want %d %q", ans.code, ans.body, tc.code, want)
			}
			if n := hitsB.Load(); n != tc.hitsB {
				t.Fatalf("the live server got %d requests, want %d", n, tc.hitsB)
			}
		})
	}
}

// A follower's forward waiting on a leader that lost the leadership is
// given up once another leader is known: a read is sent to the new
// leader, a write is answered 500. While no leader is known (an election
// under way), the forwards wait on.
func TestForwardGivesUpOnDeposedLeader(t *testing.T) {
	ctx := testCtx(t)
	a := newMute(t)
	var hitsB atomic.Int64
	b := answering(t, "B", &hitsB)
	var leader atomic.Value
	leader.Store(a.Listener.Addr().String())
	c := newClientAgent("f1", "dc1", "x", fakePool{}, hclog.NewNullLogger())
	c.route = forwardRoute{
		pick: func() (string, bool) { return leader.Load().(string), true },
		moved: func() func(string) bool {
			return func(target string) bool { l := leader.Load().(string); return l != "" && l != target }
		},
		noServer: "No cluster leader", who: "holdfast server f1 (not the leader)", movedWords: "lost the leadership",
	}
	clk := clocktest.NewFake(time.Unix(1e9, 0))
	go c.watchTargets(ctx, clk)
	hs := httptest.NewServer(c)
	defer hs.Close()

	read := doAsync(t, "GET", hs.URL+"/v1/kv/k?consistent", "")
	<-a.arrived
	write := doAsync(t, "PUT", hs.URL+"/v1/kv/k", "v")
	<-a.arrived
	leader.Store("") // an election: no leader known yet
	tick(t, ctx, clk)
	select {
	case ans := <-read:
		t.Fatalf("the read was given up with no other leader known: %+v", ans)
	default:
	}
	leader.Store(b.Listener.Addr().String())
	tick(t, ctx, clk)
	if ans := <-read; ans.code != 200 || ans.body != "from B" {
		t.Fatalf("read: %+v, want the new leader's answer", ans)
	}
	want := "holdfast server f1 (not the leader): the server at " + a.Listener.Addr().String() +
		" lost the leadership before it answered; the request may or may not have been applied"
	if ans := <-write; ans.code != 500 || ans.body != want {
		t.Fatalf("write: %+v, want 500 %q", ans, want)
	}
	if n := hitsB.Load(); n != 1 {
		t.Fatalf("the new leader got %d requests, want the read only", n)
	}
}

// The forwards whose answers are small are read whole by api.Transport;
// listings, catalogs and snapshots stream.
func TestSmallAnswer(t *testing.T) {
	for _, tc := range []struct {
		method, url string
		small       bool
	}{
		{"PUT", "/v1/kv/a?acquire=x", true},
		{"DELETE", "/v1/kv/a?recurse", true},
		{"PUT", "/v1/txn", true},
		{"PUT", "/v1/session/create", true},
		{"GET", "/v1/kv/a", true},
		{"GET", "/v1/kv/a?consistent&index=5", true},
		{"HEAD", "/v1/kv/a", true},
		{"GET", "/v1/kv/a?recurse", false},
		{"GET", "/v1/kv/?keys&separator=/", false},
		{"GET", "/v1/catalog/nodes", false},
		{"GET", "/v1/session/list", false},
		{"GET", "/v1/snapshot", false},
		{"PUT", "/v1/snapshot", false},
	} {
		r := httptest.NewRequest(tc.method, tc.url, nil)
		if got := smallAnswer(r); got != tc.small {
			t.Errorf("%s %s: smallAnswer %v, want %v", tc.method, tc.url, got, tc.small)
		}
	}
}

// A forward whose connection fails (the server's port refuses: killed) is
// sent again to another server, whatever its method, since the first got
// nothing: a write's body, kept in memory, reaches the second server
// whole.
func TestForwardSendsAgainWhenTheConnectionFails(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadAddr := dead.Listener.Addr().String()
	dead.Close() // its port now refuses
	var got atomic.Value
	var hits atomic.Int64
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		got.Store(r.Method + " " + string(b))
		io.WriteString(w, "true")
	}))
	defer live.Close()
	pool := fakePool{
		serverMember("a", deadAddr, gossip.StatusAlive), // first by name: picked first
		serverMember("b", live.Listener.Addr().String(), gossip.StatusAlive),
	}
	c := newClientAgent("client1", "dc1", "x", pool, hclog.NewNullLogger())
	hs := httptest.NewServer(c)
	defer hs.Close()

	if code, body := do(t, "PUT", hs.URL+"/v1/kv/k?cas=0", "hello"); code != 200 || body != "true" {
		t.Fatalf("a write whose first server refused the connection: %d %q, want the live server's true", code, body)
	}
	if g, _ := got.Load().(string); g != "PUT hello" || hits.Load() != 1 {
		t.Fatalf("the live server got %q in %d requests, want PUT hello once", g, hits.Load())
	}
	// A value of the largest size a key takes (512 KiB), past what the
	// forwarding transport sends in one write, is kept whole too.
	c.mu.Lock()
	c.last, c.skip = "", "" // a is asked first again
	c.mu.Unlock()
	big := strings.Repeat("v", 512<<10)
	if code, body := do(t, "PUT", hs.URL+"/v1/kv/big", big); code != 200 || body != "true" {
		t.Fatalf("a 512 KiB write whose first server refused the connection: %d %q", code, body)
	}
	if g, _ := got.Load().(string); g != "PUT "+big || hits.Load() != 2 {
		t.Fatalf("the live server got %d bytes in %d requests, want the 512 KiB value once more", len(g), hits.Load())
	}
}

// A follower's forward that its leader refuses with "No cluster leader"
// (handing its leadership over, or deposed: it applied nothing) is sent
// again to the leader known next, body and all; a client agent with no
// other server to send it to answers it as it came (its server had held
// it for a leader already).
func TestForwardSendsAgainWhatTheLeaderRefused(t *testing.T) {
	var leader atomic.Value
	var gotB atomic.Value
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		gotB.Store(r.Method + " " + string(body))
		io.WriteString(w, "true")
	}))
	defer b.Close()
	var hitsA atomic.Int64
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsA.Add(1)
		io.Copy(io.Discard, r.Body)
		leader.Store(b.Listener.Addr().String()) // a leads no more: b does
		http.Error(w, "No cluster leader", http.StatusInternalServerError)
	}))
	defer a.Close()

	follower := newClientAgent("f1", "dc1", "x", fakePool{}, hclog.NewNullLogger())
	follower.route = forwardRoute{
		pick:     func() (string, bool) { return leader.Load().(string), true },
		moved:    func() func(string) bool { return func(string) bool { return false } },
		noServer: "No cluster leader", who: "holdfast server f1 (not the leader)", movedWords: "lost the leadership",
		resendNoLeader: func(string) bool { return true },
	}
	hs := httptest.NewServer(follower)
	defer hs.Close()
	leader.Store(a.Listener.Addr().String())
	if code, body := do(t, "PUT", hs.URL+"/v1/kv/k?cas=0", "hello"); code != 200 || body != "true" {
		t.Fatalf("a write the old leader refused: %d %q, want the new leader's true", code, body)
	}
	if g, _ := gotB.Load().(string); g != "PUT hello" || hitsA.Load() != 1 {
		t.Fatalf("the new leader got %q, the old one %d requests", g, hitsA.Load())
	}

	// A client agent with no other server passes the refusal on (and
	// sets the server aside).
	leader.Store(a.Listener.Addr().String())
	agent := newClientAgent("client1", "dc1", "x", fakePool{serverMember("a", a.Listener.Addr().String(), gossip.StatusAlive)}, hclog.NewNullLogger())
	ha := httptest.NewServer(agent)
	defer ha.Close()
	if code, body := do(t, "PUT", ha.URL+"/v1/kv/k", "again"); code != 500 || body != "No cluster leader" {
		t.Fatalf("a client agent's forward refused: %d %q, want the refusal itself", code, body)
	}
}
