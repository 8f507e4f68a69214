package gossip

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/holdfast/holdfast/clock/clocktest"
)

// The pools here run memberlist on 127.0.0.1 with free ports and the fast
// profile. memberlist keeps real time, so the tests wait for the events
// themselves, each wait bounded by a deadline.

const waitLimit = 15 * time.Second

type testPool struct {
	*Pool
	events chan Event
	// skipped holds events waitEvent read while looking for another, in
	// order, so that a later wait still finds them: events about
	// different members may arrive in either order.
	skipped []Event
}

func newPool(t *testing.T, name string, tags map[string]string, tweak func(*Config)) *testPool {
	t.Helper()
	events := make(chan Event, 256)
	cfg := Config{
		Name: name, BindAddr: "127.0.0.1", BindPort: 0, Tags: tags, Profile: ProfileFast,
		Logger: hclog.New(&hclog.LoggerOptions{Name: name, Output: io.Discard}),
		Notify: func(ev Event) { events <- ev },
	}
	if testing.Verbose() {
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Debug, Output: testWriter{t}})
	}
	if tweak != nil {
		tweak(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Shutdown() })
	return &testPool{Pool: p, events: events}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// waitEvent waits for an event of type typ about member name, keeping
// the others it reads for later waits.
func (tp *testPool) waitEvent(t *testing.T, typ EventType, name string) Event {
	t.Helper()
	for i, ev := range tp.skipped {
		if ev.Type == typ && ev.Member.Name == name {
			tp.skipped = append(tp.skipped[:i:i], tp.skipped[i+1:]...)
			return ev
		}
	}
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		select {
		case ev := <-tp.events:
			if ev.Type == typ && ev.Member.Name == name {
				return ev
			}
			tp.skipped = append(tp.skipped, ev)
		case <-deadline.C:
			t.Fatalf("%s: no %s event for %s within %v; members: %+v", tp.Name(), typ, name, waitLimit, tp.Members())
		}
	}
}

func statusOf(p *Pool, name string) Status {
	m, ok := p.Member(name)
	if !ok {
		return StatusNone
	}
	return m.Status
}

func TestJoinMembersTags(t *testing.T) {
	a := newPool(t, "a", map[string]string{"role": "server", "http": "127.0.0.1:8500"}, nil)
	b := newPool(t, "b", map[string]string{"role": "client"}, nil)
	c := newPool(t, "c", map[string]string{"role": "client"}, nil)

	// Every pool reports itself first.
	a.waitEvent(t, EventJoin, "a")
	if n, err := b.Join([]string{a.Addr()}); err != nil || n != 1 {
		t.Fatalf("b joins a: %d %v", n, err)
	}
	if n, err := c.Join([]string{b.Addr()}); err != nil || n != 1 {
		t.Fatalf("c joins b: %d %v", n, err)
	}
	// a hears of c through b.
	ev := a.waitEvent(t, EventJoin, "c")
	if ev.Member.Tags["role"] != "client" || ev.Member.Status != StatusAlive {
		t.Fatalf("join event: %+v", ev)
	}
	c.waitEvent(t, EventJoin, "a")

	ms := c.Members()
	if len(ms) != 3 {
		t.Fatalf("c sees %d members: %+v", len(ms), ms)
	}
	want := []string{"a", "b", "c"}
	for i, m := range ms {
		if m.Name != want[i] || m.Status != StatusAlive {
			t.Fatalf("member %d: %+v", i, m)
		}
		if m.Address() == "" || net.ParseIP(m.Addr) == nil || m.Port == 0 {
			t.Fatalf("member %d has no address: %+v", i, m)
		}
	}
	if ms[0].Tags["http"] != "127.0.0.1:8500" || ms[0].Tags["role"] != "server" {
		t.Fatalf("a's tags as c sees them: %v", ms[0].Tags)
	}
	if ms[0].Address() != a.Addr() {
		t.Fatalf("a's address: %s, a says %s", ms[0].Address(), a.Addr())
	}
	// The caller owns the result.
	ms[0].Tags["role"] = "changed"
	if m, _ := c.Member("a"); m.Tags["role"] != "server" {
		t.Fatal("Members shares its tag maps with the pool")
	}
}

func TestGracefulLeave(t *testing.T) {
	a := newPool(t, "a", nil, nil)
	b := newPool(t, "b", nil, nil)
	if _, err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	a.waitEvent(t, EventJoin, "b")

	if err := b.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	ev := a.waitEvent(t, EventLeave, "b")
	if ev.Member.Status != StatusLeft {
		t.Fatalf("leave event: %+v", ev)
	}
	if s := statusOf(a.Pool, "b"); s != StatusLeft {
		t.Fatalf("a sees b as %v, want left", s)
	}
	if s := statusOf(b.Pool, "b"); s != StatusLeft {
		t.Fatalf("b sees itself as %v, want left", s)
	}
	// Leaving twice is harmless; after Shutdown it is an error.
	if err := b.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	b.Shutdown()
	if err := b.Leave(time.Second); !errors.Is(err, ErrShutdown) {
		t.Fatalf("leave after shutdown: %v", err)
	}
	if _, err := b.Join([]string{a.Addr()}); !errors.Is(err, ErrShutdown) {
		t.Fatalf("join after shutdown: %v", err)
	}
	// a still sees b as left, not failed, after b stopped answering.
	pending := a.skipped
	select {
	case ev := <-a.events:
		pending = append(pending, ev)
	default:
	}
	for _, ev := range pending {
		if ev.Member.Name == "b" && ev.Type == EventFailed {
			t.Fatalf("a declared b failed after it left: %+v", ev)
		}
	}
}

func TestFailureDetectedAfterShutdownWithoutLeave(t *testing.T) {
	a := newPool(t, "a", nil, nil)
	b := newPool(t, "b", nil, nil)
	c := newPool(t, "c", nil, nil)
	b.Join([]string{a.Addr()})
	c.Join([]string{a.Addr()})
	a.waitEvent(t, EventJoin, "b")
	a.waitEvent(t, EventJoin, "c")
	c.waitEvent(t, EventJoin, "b")

	start := time.Now()
	b.Shutdown()
	ev := a.waitEvent(t, EventFailed, "b")
	t.Logf("a declared b failed %v after b stopped (fast profile)", time.Since(start).Round(time.Millisecond))
	if ev.Member.Status != StatusFailed {
		t.Fatalf("failed event: %+v", ev)
	}
	c.waitEvent(t, EventFailed, "b")
	if s := statusOf(a.Pool, "b"); s != StatusFailed {
		t.Fatalf("a sees b as %v", s)
	}
	if s := statusOf(a.Pool, "c"); s != StatusAlive {
		t.Fatalf("a sees c as %v", s)
	}
	// agent/self's serf_lan: three members listed, one of them failed.
	st := a.Stats()
	if st["members"] != "3" || st["failed"] != "1" || st["left"] != "0" || st["encrypted"] != "false" {
		t.Fatalf("a's Stats: %v", st)
	}
}

func TestFailedMemberRejoins(t *testing.T) {
	a := newPool(t, "a", nil, nil)
	b := newPool(t, "b", nil, nil)
	b.Join([]string{a.Addr()})
	a.waitEvent(t, EventJoin, "b")
	b.Shutdown()
	a.waitEvent(t, EventFailed, "b")

	// The same agent comes back (restarted) on the same address.
	host, port, _ := net.SplitHostPort(b.Addr())
	b2 := newPool(t, "b", nil, func(c *Config) { c.BindAddr, c.BindPort = host, atoi(port) })
	if _, err := b2.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	ev := a.waitEvent(t, EventJoin, "b")
	if ev.Member.Status != StatusAlive {
		t.Fatalf("rejoin: %+v", ev)
	}
}

func TestJoinUnreachable(t *testing.T) {
	a := newPool(t, "a", nil, nil)
	// A port with nothing behind it: listen, note the port, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	n, err := a.Join([]string{dead})
	if n != 0 || err == nil {
		t.Fatalf("join of a dead address: %d %v", n, err)
	}
	var je *JoinError
	if !errors.As(err, &je) || len(je.Failures) != 1 || je.Failures[0].Addr != dead {
		t.Fatalf("error: %#v", err)
	}
	msg := err.Error()
	for _, want := range []string{"could not join the pool through " + dead, "nothing is listening there", "connection refused"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if ms := a.Members(); len(ms) != 1 {
		t.Fatalf("a failed join changed the members: %+v", ms)
	}

	// One good address among bad ones is a success.
	b := newPool(t, "b", nil, nil)
	if n, err := a.Join([]string{dead, b.Addr()}); err != nil || n != 1 {
		t.Fatalf("mixed join: %d %v", n, err)
	}

	// Two dead ones: both named.
	_, err = b.Join([]string{dead, "127.0.0.1:1"})
	if err == nil || !strings.Contains(err.Error(), "any of 2 addresses") || !strings.Contains(err.Error(), "127.0.0.1:1: nothing is listening") {
		t.Fatalf("two dead addresses: %v", err)
	}
}

func TestCheckJoinAddr(t *testing.T) {
	for _, tc := range []struct{ in, out, err string }{
		{in: "127.0.0.1:8301", out: "127.0.0.1:8301"},
		{in: " 10.0.0.1:7000 ", out: "10.0.0.1:7000"},
		{in: "10.0.0.1", out: "10.0.0.1:8301"},
		{in: "server.example", out: "server.example:8301"},
		{in: "[::1]:9000", out: "[::1]:9000"},
		{in: "[::1]", out: "[::1]:8301"},
		{in: "", err: "empty join address"},
		{in: "10.0.0.1:0", err: "port \"0\" is not a number from 1 to 65535"},
		{in: "10.0.0.1:http", err: "is not a number"},
		{in: "10.0.0.1:70000", err: "is not a number"},
		{in: ":8301", err: "no host"},
		{in: "a:b:c", err: "want host:port"},
		{in: "http://10.0.0.1:8301", err: "want host:port"},
	} {
		got, err := CheckJoinAddr(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("CheckJoinAddr(%q) = %q, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.out {
			t.Errorf("CheckJoinAddr(%q) = %q, %v; want %q", tc.in, got, err, tc.out)
		}
	}
}

func TestJoinBadAddressContactsNothing(t *testing.T) {
	a := newPool(t, "a", nil, nil)
	b := newPool(t, "b", nil, nil)
	// The good address comes first, but a bad one fails the whole call
	// before anything is contacted.
	_, err := a.Join([]string{b.Addr(), "a:b:c"})
	if err == nil || !strings.Contains(err.Error(), `bad join address "a:b:c"`) {
		t.Fatalf("err = %v", err)
	}
	var je *JoinError
	if errors.As(err, &je) {
		t.Fatal("a malformed address is not a JoinError")
	}
	if len(a.Members()) != 1 {
		t.Fatalf("members after a refused join: %+v", a.Members())
	}
	if _, err := a.Join(nil); err == nil {
		t.Fatal("join of nothing succeeded")
	}
}

func TestRetryJoinBacksOffOnTheClock(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	// Park the upkeep timer far away so the only waiter is RetryJoin's.
	a := newPool(t, "a", nil, func(c *Config) { c.Clock = clk; c.ReconnectInterval = time.Hour })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := a.RetryJoin(ctx, []string{dead}, time.Second, 4*time.Second)
		done <- result{n, err}
	}()
	bctx, bcancel := context.WithTimeout(context.Background(), waitLimit)
	defer bcancel()
	// Attempt 1 fails and waits 1s; moving the clock 999ms does nothing.
	if err := clk.BlockUntilWaiters(bctx, 2); err != nil {
		t.Fatal(err)
	}
	clk.Advance(999 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("RetryJoin returned early: %+v", r)
	default:
	}
	// Now bring an agent up where the address points... memberlist needs
	// the exact port, so start one there.
	newPool(t, "b", nil, func(c *Config) {
		host, port, _ := net.SplitHostPort(dead)
		c.BindAddr = host
		c.BindPort = atoi(port)
	})
	clk.Advance(time.Millisecond)
	select {
	case r := <-done:
		if r.err != nil || r.n != 1 {
			t.Fatalf("RetryJoin: %+v", r)
		}
	case <-time.After(waitLimit):
		t.Fatal("RetryJoin did not retry after its backoff")
	}
	a.waitEvent(t, EventJoin, "b")

	// A malformed address is not retried; a cancelled context stops it.
	if _, err := a.RetryJoin(ctx, []string{"x:y:z"}, time.Second, time.Second); err == nil || !strings.Contains(err.Error(), "bad join address") {
		t.Fatalf("malformed: %v", err)
	}
	go func() {
		n, err := a.RetryJoin(ctx, []string{"127.0.0.1:1"}, time.Second, time.Second)
		done <- result{n, err}
	}()
	if err := clk.BlockUntilWaiters(bctx, 2); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled RetryJoin: %+v", r)
		}
	case <-time.After(waitLimit):
		t.Fatal("RetryJoin ignored its context")
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

func TestReapForgetsFailedMembers(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	a := newPool(t, "a", nil, func(c *Config) { c.Clock = clk; c.ReconnectInterval = time.Minute; c.ReapAfter = time.Hour })
	b := newPool(t, "b", nil, nil)
	b.Join([]string{a.Addr()})
	a.waitEvent(t, EventJoin, "b")
	b.Shutdown()
	a.waitEvent(t, EventFailed, "b")

	// Upkeep runs every minute; b is kept until an hour after it failed.
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := clk.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(59 * time.Minute)
	if err := clk.BlockUntilWaiters(ctx, 1); err != nil { // upkeep ran and re-armed
		t.Fatal(err)
	}
	if s := statusOf(a.Pool, "b"); s != StatusFailed {
		t.Fatalf("b is %v before its hour", s)
	}
	clk.Advance(time.Minute)
	ev := a.waitEvent(t, EventReap, "b")
	if ev.Member.Status != StatusFailed {
		t.Fatalf("reap event: %+v", ev)
	}
	if _, ok := a.Member("b"); ok {
		t.Fatal("b still listed after reap")
	}
	if len(a.Members()) != 1 {
		t.Fatalf("members: %+v", a.Members())
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "needs a name") {
		t.Fatalf("no name: %v", err)
	}
	if _, err := New(Config{Name: "a", Profile: "slow"}); err == nil || !strings.Contains(err.Error(), `unknown profile "slow"`) {
		t.Fatalf("bad profile: %v", err)
	}
	big := map[string]string{"x": strings.Repeat("y", 600)}
	if _, err := New(Config{Name: "a", Tags: big}); err == nil || !strings.Contains(err.Error(), "tags take") {
		t.Fatalf("big tags: %v", err)
	}
	a := newPool(t, "a", nil, nil)
	host, port, _ := net.SplitHostPort(a.Addr())
	_, err := New(Config{Name: "b", BindAddr: host, BindPort: atoi(port), Profile: ProfileFast})
	if err == nil || !strings.Contains(err.Error(), "cannot listen on "+a.Addr()) {
		t.Fatalf("port in use: %v", err)
	}
	if p, err := ParseProfile(""); err != nil || p != ProfileLAN {
		t.Fatalf("default profile: %v %v", p, err)
	}
}

// TestEncryptedPool: agents with the same key join and hear each other;
// an agent with another key, or none, cannot join, and is never heard of
// by the encrypted ones; a key of the wrong size is refused.
func TestEncryptedPool(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	withKey := func(k []byte) func(*Config) { return func(c *Config) { c.SecretKey = k } }
	a := newPool(t, "a", nil, withKey(key))
	b := newPool(t, "b", nil, withKey(slices.Clone(key)))
	if !a.Encrypted() || !b.Encrypted() {
		t.Fatal("pools given a key say they are not encrypted")
	}
	if n, err := b.Join([]string{a.Addr()}); err != nil || n != 1 {
		t.Fatalf("b joins a with the same key: %d %v", n, err)
	}
	a.waitEvent(t, EventJoin, "b")

	other := []byte("fedcba9876543210fedcba9876543210")
	for _, c := range []struct {
		name string
		key  []byte
		why  string
	}{
		{"wrongkey", other, "the pool there uses another key"},
		{"nokey", nil, "the pool there is encrypted and this agent has no key"},
	} {
		p := newPool(t, c.name, nil, withKey(c.key))
		if n, err := p.Join([]string{a.Addr()}); err == nil || n != 0 || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s joins an encrypted pool: %d %v, want an error saying %q", c.name, n, err, c.why)
		}
		if _, ok := a.Member(c.name); ok {
			t.Errorf("the encrypted pool took in %s", c.name)
		}
	}
	if len(a.Members()) != 2 {
		t.Fatalf("a's members: %+v", a.Members())
	}
	plain := newPool(t, "plain", nil, nil)
	if _, err := b.Join([]string{plain.Addr()}); err == nil || !strings.Contains(err.Error(), "the pool there is not encrypted and this agent has a key") {
		t.Errorf("an agent with a key joins a plain pool: %v", err)
	}
	if _, err := New(Config{Name: "c", SecretKey: []byte("short")}); err == nil || !strings.Contains(err.Error(), "16, 24 or 32 bytes, not 5") {
		t.Fatalf("a 5-byte key: %v", err)
	}
}
