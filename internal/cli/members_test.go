package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/holdfast/holdfast/internal/gossip"
	"github.com/holdfast/holdfast/internal/httpserve"
)

// gossipPair starts two in-process pools on loopback, a server-tagged one
// and a client joined to it, and waits until the server's pool sees the
// client. Later events of the server's pool about the client arrive on
// events.
func gossipPair(t *testing.T, serverHTTP string) (srv, cli *gossip.Pool, events <-chan gossip.Event) {
	t.Helper()
	joined := make(chan struct{}, 1)
	evs := make(chan gossip.Event, 64)
	mk := func(name string, tags map[string]string, notify func(gossip.Event)) *gossip.Pool {
		p, err := gossip.New(gossip.Config{Name: name, BindAddr: "127.0.0.1", Profile: gossip.ProfileFast, Tags: tags,
			Logger: hclog.NewNullLogger(), Notify: notify})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Shutdown() })
		return p
	}
	srv = mk("srv1", map[string]string{"role": "server", "dc": "dc1", "http": serverHTTP}, func(ev gossip.Event) {
		if ev.Member.Name != "cli1" {
			return
		}
		if ev.Type == gossip.EventJoin {
			select {
			case joined <- struct{}{}:
			default:
			}
			return
		}
		evs <- ev
	})
	cli = mk("cli1", map[string]string{"role": "client", "dc": "dc1"}, nil)
	if _, err := cli.Join([]string{srv.Addr()}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-joined:
	case <-time.After(10 * time.Second):
		t.Fatal("the server pool never saw the client join")
	}
	return srv, cli, evs
}

func runAt(t *testing.T, addr string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	stdio := Stdio{In: strings.NewReader(""), Out: &out, Err: &errb, Getenv: func(k string) string {
		if k == "HOLDFAST_HTTP_ADDR" {
			return addr
		}
		return ""
	}}
	err := Run(context.Background(), args, stdio)
	if ee, ok := err.(*ExitError); err != nil && (!ok || !ee.Silent) {
		errb.WriteString(err.Error() + "\n")
	}
	return out.String(), errb.String(), ExitCode(err)
}

func TestAgentMembersEndpoint(t *testing.T) {
	srv, cli, _ := gossipPair(t, "127.0.0.1:8500")
	var passed []string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		passed = append(passed, r.Method+" "+r.URL.RawPath+"|"+r.URL.Path)
		io.WriteString(w, "next")
	})
	hs := httptest.NewServer(withAgentRoutes(srv, next))
	defer hs.Close()

	resp, err := http.Get(hs.URL + "/v1/agent/members")
	if err != nil {
		t.Fatal(err)
	}
	var ms []map[string]interface{}
	if err := json.NewDecoder(resp.Body).Decode(&ms); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "application/json" || len(ms) != 2 {
		t.Fatalf("members: %s %v", resp.Header.Get("Content-Type"), ms)
	}
	c := ms[0]
	if c["Name"] != "cli1" || c["Addr"] != "127.0.0.1" || c["Status"] != float64(1) ||
		c["Port"] != float64(cli.Members()[0].Port) || c["Tags"].(map[string]interface{})["role"] != "client" {
		t.Fatalf("client entry: %v", c)
	}
	for _, k := range []string{"ProtocolMin", "ProtocolMax", "ProtocolCur", "DelegateMin", "DelegateMax", "DelegateCur"} {
		if _, ok := c[k]; !ok {
			t.Errorf("entry lacks %s", k)
		}
	}

	// No WAN pool; only GET.
	resp, _ = http.Get(hs.URL + "/v1/agent/members?wan=1")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(b)) != "[]" {
		t.Fatalf("wan members: %s", b)
	}
	resp, _ = http.Post(hs.URL+"/v1/agent/members", "text/plain", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST members: %d", resp.StatusCode)
	}

	// Everything else reaches the API handler as sent, odd slashes too.
	resp, _ = http.Get(hs.URL + "/v1/kv/a//b%2Fc")
	resp.Body.Close()
	resp, _ = http.Get(hs.URL + "/v1/agent/members/x")
	resp.Body.Close()
	if len(passed) != 2 || passed[0] != "GET /v1/kv/a//b%2Fc|/v1/kv/a//b/c" || !strings.HasSuffix(passed[1], "|/v1/agent/members/x") {
		t.Fatalf("passed on: %q", passed)
	}
}

func TestMembersCommand(t *testing.T) {
	srv, cli, events := gossipPair(t, "127.0.0.1:8500")
	hs := httptest.NewServer(withAgentRoutes(srv, http.NotFoundHandler()))
	defer hs.Close()

	out, errs, code := runAt(t, hs.URL, "members")
	if code != 0 || errs != "" {
		t.Fatalf("members: %d %q", code, errs)
	}
	// The address follows every command's rules (members read it its own
	// way once, and sent host:port/x as a path prefix).
	if _, errs, code := runAt(t, strings.TrimPrefix(hs.URL, "http://")+"/x", "members"); code != 1 || !strings.Contains(errs, "host:port") {
		t.Fatalf("members at host:port/x: %d %q", code, errs)
	}
	want := "Node  Address  Status  Type    DC\n" +
		"cli1  " + cli.Addr() + "  alive   client  dc1\n" +
		"srv1  " + srv.Addr() + "  alive   server  dc1\n"
	if normSpace(out) != normSpace(want) {
		t.Fatalf("members output:\n%s\nwant:\n%s", out, want)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "Node") {
		t.Fatalf("output: %q", out)
	}

	out, _, _ = runAt(t, hs.URL, "members", "-detailed")
	if !strings.Contains(out, "dc=dc1,http=127.0.0.1:8500,role=server") || !strings.Contains(out, "Tags") {
		t.Fatalf("detailed: %s", out)
	}

	// The client leaves: the server's pool says so, and -status filters.
	if err := cli.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitLeave := time.NewTimer(10 * time.Second)
	defer waitLeave.Stop()
	for left := false; !left; {
		select {
		case ev := <-events:
			left = ev.Type == gossip.EventLeave
		case <-waitLeave.C:
			t.Fatal("server pool never saw the client leave")
		}
	}
	out, _, _ = runAt(t, hs.URL, "members", "-status", "left")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.Contains(lines[1], "cli1") || !strings.Contains(lines[1], "left") {
		t.Fatalf("left members: %q", out)
	}
	out, _, _ = runAt(t, hs.URL, "members", "-status=alive")
	if strings.Contains(out, "cli1") || !strings.Contains(out, "srv1") {
		t.Fatalf("alive members: %q", out)
	}

	// -status is a regular expression, as in consul members; nothing
	// matching prints nothing and exits 2, and a bad expression exits 1.
	out, _, _ = runAt(t, hs.URL, "members", "-status", "alive|left")
	if !strings.Contains(out, "cli1") || !strings.Contains(out, "srv1") {
		t.Fatalf("alive|left members: %q", out)
	}
	if out, errs, code := runAt(t, hs.URL, "members", "-status", "dead"); code != 2 || out != "" || errs != "" {
		t.Fatalf("no member matches: exit %d, stdout %q, stderr %q; want exit 2 and nothing printed", code, out, errs)
	}
	if _, errs, code := runAt(t, hs.URL, "members", "-status", "("); code != 1 || !strings.HasPrefix(errs, "Failed to compile status regexp: ") {
		t.Fatalf("bad status: %d %q", code, errs)
	}
	if _, errs, code := runAt(t, hs.URL, "members", "extra"); code != 1 || !strings.Contains(errs, "Too many arguments") {
		t.Fatalf("extra arg: %d %q", code, errs)
	}
}

func TestMembersCommandErrors(t *testing.T) {
	// Nothing listening.
	_, errs, code := runAt(t, "127.0.0.1:1", "members")
	if code != 1 || !strings.HasPrefix(errs, "Error retrieving members: ") || !strings.Contains(errs, "connection refused") {
		t.Fatalf("unreachable: %d %q", code, errs)
	}
	// An agent that does not serve the pool.
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such endpoint", http.StatusNotFound)
	}))
	defer hs.Close()
	_, errs, code = runAt(t, hs.URL, "members")
	if code != 1 || errs != "Error retrieving members: Unexpected response code: 404 (no such endpoint)\n" {
		t.Fatalf("404: %d %q", code, errs)
	}
	// -http-addr wins over the environment.
	_, errs, _ = runAt(t, hs.URL, "members", "-http-addr", "ftp://x")
	if !strings.Contains(errs, `unsupported scheme "ftp"`) {
		t.Fatalf("scheme: %q", errs)
	}
}

func normSpace(s string) string { return strings.Join(strings.Fields(s), " ") }

// withAgentRoutes must hand the API the server's own ResponseWriter: a
// wrapper would hide httpserve's WatchDisconnect, and a blocking query
// whose client left would then stay parked until its wait ran out.
func TestAgentRoutesKeepTheResponseWriter(t *testing.T) {
	seen := make(chan bool, 1)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := w.(interface{ WatchDisconnect() })
		seen <- ok
	})
	srv := &httpserve.Server{Handler: withAgentRoutes(nil, api)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	resp, err := http.Get("http://" + ln.Addr().String() + "/v1/kv/k?index=5")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !<-seen {
		t.Error("the API handler got a ResponseWriter without WatchDisconnect")
	}
}
