package agent_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/agent"
	"github.com/holdfast/holdfast/internal/state"
)

// A restarted agent (a new Agent on the same state file and the same
// catalog) brings back its services and checks: a TTL check with its
// status and the rest of its TTL, so the session bound to it lives on and
// dies exactly when the TTL it was given before the restart runs out.
func TestRestoreAfterRestart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.json")
	clk := clocktest.NewFake(epoch)
	cat := newFakeCatalog(t, clk)
	const ttl = 10 * time.Second

	first := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file})
	if err := first.RegisterService(ctx(), &state.Service{Service: "web", Port: 80},
		[]*state.CheckDefinition{{TTL: ttl, Status: state.HealthPassing}}, false); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register service web service:web=passing")
	if err := first.RegisterCheck(ctx(), ttlCheck("app", ttl, "")); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register app=critical")
	if err := first.RegisterCheck(ctx(), ttlCheck("gone", ttl, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register gone=passing")
	if err := first.DeregisterCheck(ctx(), "gone"); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "deregister check gone")
	clk.Advance(4 * time.Second)
	if err := first.UpdateCheck(ctx(), "app", state.HealthPassing, "up"); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register app=passing")
	cat.session(t, "s1", "app")
	first.Close() // the process ends; the catalog keeps what it had

	clk.Advance(3 * time.Second) // down for 3s: "app" has 7s of TTL left
	second := restoredAgent(t, file, clk, cat)
	defer second.Close()
	// web's check was never updated: its TTL (from registration, 7s ago)
	// has 3s left.
	cat.expect(t, "register service web service:web=passing")
	cat.expect(t, "register app=passing")
	cat.quiet(t)
	if !cat.sessionAlive("s1") {
		t.Fatal("the session bound to a passing TTL check died in the restart")
	}
	if err := second.ForgetStale(ctx(), checksOf(cat)); err != nil {
		t.Fatal(err)
	}
	cat.quiet(t) // nothing is stale: everything came back

	clk.Advance(3*time.Second - time.Nanosecond)
	cat.quiet(t)
	clk.Advance(time.Nanosecond)
	cat.expect(t, "register service:web=critical")
	clk.Advance(4*time.Second - time.Nanosecond)
	cat.quiet(t)
	if !cat.sessionAlive("s1") {
		t.Fatal("session died before its check's TTL ran out")
	}
	clk.Advance(time.Nanosecond)
	cat.expect(t, "register app=critical")
	if cat.sessionAlive("s1") {
		t.Fatal("session outlived its check")
	}
	if got := second.Checks(); len(got) != 2 || got[0].CheckID != "app" || got[1].CheckID != "service:web" {
		t.Fatalf("checks after restore %+v", got)
	}
}

// A TTL check whose TTL ran out while the agent was down comes back
// critical, which invalidates the sessions bound to it.
func TestRestoreExpiredTTL(t *testing.T) {
	file, clk, cat, first := persistedAgent(t)
	if err := first.RegisterCheck(ctx(), ttlCheck("app", 10*time.Second, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register app=passing")
	cat.session(t, "s1", "app")
	first.Close()

	clk.Advance(10 * time.Second)
	second := restoredAgent(t, file, clk, cat)
	defer second.Close()
	cat.expect(t, "register app=critical")
	if cat.sessionAlive("s1") {
		t.Fatal("session bound to a check that expired during the restart is alive")
	}
}

// A check registered through the API before Restore runs is kept as
// registered, and a saved check that fails to come back is neither lost
// from the file nor forgotten as stale.
func TestRestoreKeepsNewerAndFailed(t *testing.T) {
	file, clk, cat, first := persistedAgent(t)
	for _, id := range []string{"a", "b"} {
		if err := first.RegisterCheck(ctx(), ttlCheck(id, time.Minute, state.HealthPassing)); err != nil {
			t.Fatal(err)
		}
		cat.expect(t, "register "+id+"=passing")
	}
	first.Close()

	second := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file})
	defer second.Close()
	if err := second.RegisterCheck(ctx(), ttlCheck("a", time.Minute, state.HealthWarning)); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register a=warning")
	cat.setFail(errors.New("no leader"))
	if err := second.Restore(ctx()); err == nil {
		t.Fatal("Restore succeeded with the catalog refusing writes")
	}
	cat.expect(t, "failed register b=passing")
	cat.setFail(nil)
	if err := second.ForgetStale(ctx(), checksOf(cat)); err != nil {
		t.Fatal(err)
	}
	cat.quiet(t) // b is pending, not stale
	b, err := os.ReadFile(file)
	if err != nil || !strings.Contains(string(b), `"ID": "b"`) {
		t.Fatalf("state file lost the pending check: %v\n%s", err, b)
	}
	if err := second.Restore(ctx()); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register b=passing")
	if got := second.Checks(); len(got) != 2 || got[0].Status != state.HealthWarning {
		t.Fatalf("checks %+v", got)
	}
}

// A file that is not a state file is moved aside and the agent starts
// with nothing (and says so in the log).
func TestUnreadableStateFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.json")
	if err := os.WriteFile(file, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	clk := clocktest.NewFake(epoch)
	cat := newFakeCatalog(t, clk)
	ag := restoredAgent(t, file, clk, cat)
	defer ag.Close()
	cat.quiet(t)
	if b, err := os.ReadFile(file + ".unreadable"); err != nil || string(b) != "{not json" {
		t.Fatalf("unreadable file not kept aside: %q %v", b, err)
	}
}

// An HTTP check comes back with the status it last had, not the one it
// had when it was saved for another reason: a check that went passing
// after its registration must not come back critical, which would
// invalidate the sessions bound to it in the restart.
func TestRestoreProbedCheckKeepsItsLastStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	file, clk, cat, first := persistedAgent(t)
	def := &state.CheckDefinition{Name: "web", HTTP: srv.URL, Interval: time.Minute}
	if err := first.RegisterCheck(ctx(), def); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register web=critical") // the initial status, saved with the registration
	cat.expect(t, "register web=passing")  // the first probe
	cat.session(t, "s1", "web")
	first.Close()

	second := restoredAgent(t, file, clk, cat)
	defer second.Close()
	cat.expect(t, "register web=passing")
	if !cat.sessionAlive("s1") {
		t.Fatal("the session bound to a passing HTTP check died in the restart")
	}
}

// The file an agent writes after restoring what it could is one it
// restores in full at its next start: a saved entry that came back under
// a name it did not carry (a check with no ID, a service with no ID) is
// not kept besides the registration it became, and an entry the agent
// refuses (no name, two kinds) is dropped, with an error in the log,
// without holding back the rest: kept pending it would keep its catalog
// check from ForgetStale, passing, for ever.
func TestRestoreTwiceRestoresTheSame(t *testing.T) {
	expires := epoch.Add(5 * time.Second).Format(time.RFC3339)
	unnamed := `{"definition":{"ServiceID":"web","TTL":10000000000},"status":"passing","expires":"` + expires + `"}`
	cases := map[string]string{
		// Two checks of web without an ID, named service:web:1 and :2
		// when registered; the check with no name and no ID cannot be
		// registered and is dropped.
		"unnamed service checks": `{"version":1,"services":[{"ID":"web","Service":"web"}],"checks":[` +
			unnamed + `,` + unnamed + `,{"definition":{"TTL":10000000000}}]}`,
		// A service given by name only, after the same service by ID:
		// the second entry must not hide the first one's checks later.
		"service without an ID": `{"version":1,"services":[{"ID":"web","Service":"web"},{"Service":"web","Port":80}],"checks":[` +
			`{"definition":{"ID":"c","ServiceID":"web","TTL":10000000000},"status":"passing","expires":"` + expires + `"},` +
			`{"definition":{"TTL":10000000000}}]}`,
		// An unnamed check of a service that registers next to one named
		// as the unnamed one will be.
		"generated ID taken": `{"version":1,"services":[{"ID":"a","Service":"a"}],"checks":[` +
			`{"definition":{"ServiceID":"a","TTL":10000000000},"status":"passing","expires":"` + expires + `"},` +
			`{"definition":{"ID":"b","ServiceID":"a","TCP":"127.0.0.1:1","Interval":1000000000},"status":"critical"},` +
			`{"definition":{"ID":"x","TCP":"127.0.0.1:1","TTL":10000000000}}]}`,
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "agent.json")
			if err := os.WriteFile(file, []byte(in), 0o644); err != nil {
				t.Fatal(err)
			}
			clk := clocktest.NewFake(epoch)
			cat := &quietCatalog{st: state.New(), now: epoch}
			cat.Register(ctx(), &state.RegisterRequest{Node: node, Address: "127.0.0.1"})
			var runs [][]string
			for run := 0; run < 3; run++ {
				ag := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file, Dialer: failDialer{}})
				if err := ag.Restore(ctx()); err != nil {
					t.Fatalf("run %d: Restore: %v (an entry the agent refuses is dropped, not an error)", run, err)
				}
				var ids []string
				for _, c := range ag.Checks() {
					ids = append(ids, c.CheckID+"@"+c.ServiceID)
				}
				ag.Close()
				runs = append(runs, ids)
			}
			for run := 1; run < len(runs); run++ {
				if strings.Join(runs[run], " ") != strings.Join(runs[0], " ") {
					t.Fatalf("restored %v, then %v at start %d", runs[0], runs[run], run+1)
				}
			}
			if len(runs[0]) == 0 {
				t.Fatal("nothing restored")
			}
		})
	}
}

// An entry of the file that is JSON null is skipped, not followed.
func TestStateFileNullEntries(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.json")
	in := `{"version":1,"services":[null,{"ID":"web","Service":"web"}],"checks":[null,` +
		`{"definition":{"ID":"app","TTL":10000000000},"status":"passing","expires":"2026-01-01T00:00:05Z"}]}`
	if err := os.WriteFile(file, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	clk := clocktest.NewFake(epoch)
	cat := newFakeCatalog(t, clk)
	ag := restoredAgent(t, file, clk, cat)
	defer ag.Close()
	cat.expect(t, "register service web")
	cat.expect(t, "register app=passing")
	if got := ag.Checks(); len(got) != 1 || len(ag.Services()) != 1 {
		t.Fatalf("restored %d checks and %d services", len(got), len(ag.Services()))
	}
}

// A service deregistered while something else of the file is still
// pending stays deregistered: neither the next Restore nor the next start
// brings it (or its checks) back.
func TestDeregisteredServiceStaysGone(t *testing.T) {
	file, clk, cat, first := persistedAgent(t)
	if err := first.RegisterService(ctx(), &state.Service{Service: "web"},
		[]*state.CheckDefinition{{TTL: time.Minute, Status: state.HealthPassing}}, false); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register service web service:web=passing")
	if err := first.RegisterCheck(ctx(), ttlCheck("b", time.Minute, state.HealthPassing)); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register b=passing")
	first.Close()

	second := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file})
	cat.failOnly("b", errors.New("no leader"))
	if err := second.Restore(ctx()); err == nil {
		t.Fatal("Restore succeeded with b refused")
	}
	cat.expect(t, "register service web service:web=passing")
	cat.expect(t, "failed register b=passing")
	if err := second.DeregisterService(ctx(), "web"); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "deregister service web")
	cat.setFail(nil)
	if err := second.Restore(ctx()); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register b=passing")
	cat.quiet(t)
	second.Close()

	third := restoredAgent(t, file, clk, cat)
	defer third.Close()
	cat.expect(t, "register b=passing")
	cat.quiet(t)
	if got := third.Services(); len(got) != 0 {
		t.Fatalf("deregistered service came back: %+v", got)
	}
}

// A saved service that could not be registered again can still be
// deregistered: it is forgotten, and removed from the catalog.
func TestDeregisterPendingService(t *testing.T) {
	file, clk, cat, first := persistedAgent(t)
	if err := first.RegisterService(ctx(), &state.Service{Service: "web"},
		[]*state.CheckDefinition{{TTL: time.Minute, Status: state.HealthPassing}}, false); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register service web service:web=passing")
	first.Close()

	second := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file})
	defer second.Close()
	cat.setFail(errors.New("no leader"))
	if err := second.Restore(ctx()); err == nil {
		t.Fatal("Restore succeeded with the catalog refusing writes")
	}
	cat.expect(t, "failed register service web service:web=passing")
	cat.setFail(nil)
	if err := second.DeregisterService(ctx(), "web"); err != nil {
		t.Fatalf("deregistering a service kept for a Restore to come: %v", err)
	}
	cat.expect(t, "deregister service web")
	if err := second.Restore(ctx()); err != nil {
		t.Fatal(err)
	}
	cat.quiet(t)
	if b, err := os.ReadFile(file); err != nil || strings.Contains(string(b), `"web"`) {
		t.Fatalf("the state file still has the deregistered service: %v\n%s", err, b)
	}
}

func checksOf(cat *fakeCatalog) []*state.HealthCheck {
	_, cs := cat.st.NodeChecks(nil, node)
	return cs
}

// quietCatalog accepts every write into a real store and reports nothing.
type quietCatalog struct {
	mu  sync.Mutex
	st  *state.Store
	idx uint64
	now time.Time
}

func (q *quietCatalog) Register(_ context.Context, req *state.RegisterRequest) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.idx++
	return q.st.Register(q.idx, q.now, req)
}

func (q *quietCatalog) Deregister(_ context.Context, req *state.DeregisterRequest) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.idx++
	return q.st.Deregister(q.idx, q.now, req)
}

// FuzzStateFile: whatever the state file holds, a starting agent neither
// panics nor hangs; it restores what it can and keeps or sets aside the
// rest. What it restored it saves again in a form it reads back the same.
//
// Each run writes and syncs the file several times, so keep the
// minimisation of new inputs short:
//
//	go test -run '^$' -fuzz FuzzStateFile -fuzzminimizetime 3s ./internal/agent/
func FuzzStateFile(f *testing.F) {
	f.Add([]byte(`{"version":1,"services":[{"ID":"web","Service":"web","Port":80}],"checks":[` +
		`{"definition":{"ID":"service:web","Name":"w","ServiceID":"web","TTL":10000000000},"status":"passing","expires":"2026-01-01T00:00:05Z"},` +
		`{"definition":{"ID":"app","Name":"app","TTL":30000000000},"status":"warning","expires":"2025-12-31T23:59:00Z"}]}`))
	f.Add([]byte(`{"version":1,"services":[],"checks":[{"definition":{"ID":"t","Name":"t","TCP":"127.0.0.1:1","Interval":1000000000}},` +
		`{"definition":{"ID":"","Name":""}},{"definition":{"ID":"x","ServiceID":"nope","TTL":5000000000}}]}`))
	// Entries restored under another ID than the one saved, one that
	// cannot be registered, and null entries.
	f.Add([]byte(`{"version":1,"services":[{"ID":"web","Service":"web"},{"Service":"web"}],"checks":[` +
		`{"definition":{"ServiceID":"web","TTL":10000000000},"status":"passing","expires":"2026-01-01T00:00:05Z"},` +
		`{"definition":{"ServiceID":"web","TTL":10000000000},"status":"passing","expires":"2026-01-01T00:00:05Z"},` +
		`{"definition":{"Name":"n","TTL":10000000000}},{"definition":{"TTL":10000000000}},null]}`))
	f.Add([]byte(`{"version":1,"services":[null],"checks":[null]}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, in []byte) {
		dir := t.TempDir()
		file := filepath.Join(dir, "agent.json")
		if err := os.WriteFile(file, in, 0o644); err != nil {
			t.Fatal(err)
		}
		clk := clocktest.NewFake(epoch)
		cat := &quietCatalog{st: state.New(), now: epoch}
		cat.Register(ctx(), &state.RegisterRequest{Node: node, Address: "127.0.0.1"})
		// TCP and HTTP checks must not reach out: every dial fails.
		ag := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file, Dialer: failDialer{},
			HTTPClient: &http.Client{Transport: &http.Transport{DialContext: failDialer{}.DialContext}}})
		ag.Restore(ctx()) // an error is fine: what failed stays pending
		first := ag.Checks()
		ag.Close()

		// Whatever came back was saved; a second start reads it back.
		again := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file, Dialer: failDialer{},
			HTTPClient: &http.Client{Transport: &http.Transport{DialContext: failDialer{}.DialContext}}})
		defer again.Close()
		again.Restore(ctx())
		if got := again.Checks(); len(got) < len(first) {
			t.Fatalf("restored %d checks, then only %d after a second start", len(first), len(got))
		}
	})
}

type failDialer struct{}

func (failDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("fuzzing: no network")
}

// persistedAgent starts an agent that keeps its state in a new file, on a
// fake clock and catalog: the next agent of a test starts on the same.
func persistedAgent(t *testing.T) (string, *clocktest.Fake, *fakeCatalog, *agent.Agent) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "agent.json")
	clk := clocktest.NewFake(epoch)
	cat := newFakeCatalog(t, clk)
	return file, clk, cat, agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file})
}

// restoredAgent starts the next agent on the state file of an earlier one,
// with the same clock and catalog, and restores what it saved.
func restoredAgent(t *testing.T, file string, clk *clocktest.Fake, cat *fakeCatalog) *agent.Agent {
	t.Helper()
	ag := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file})
	if err := ag.Restore(ctx()); err != nil {
		ag.Close()
		t.Fatal(err)
	}
	return ag
}

// Finding (storage audit): a registration the agent could not save (its
// state file's directory not writable) was answered as a success, and the
// next restart of the agent lost it, leaving the service in the catalog
// with nobody running its checks. As Consul's agent does, the request is
// now answered with an error that says the change is in the catalog but
// not kept; deregistrations too.
func TestRegistrationThatCannotBeSavedFails(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gone", "agent.json") // its directory does not exist
	clk := clocktest.NewFake(epoch)
	cat := newFakeCatalog(t, clk)
	a := agent.New(agent.Config{Node: node, Clock: clk, Catalog: cat, StateFile: file})
	defer a.Close()
	wantUnsaved := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "could not save it to "+file) {
			t.Fatalf("%s that could not be saved: %v; want an error naming %s", what, err, file)
		}
	}
	wantUnsaved("service registration", a.RegisterService(ctx(), &state.Service{Service: "web", Port: 80}, nil, false))
	cat.expect(t, "register service web")
	wantUnsaved("check registration", a.RegisterCheck(ctx(), ttlCheck("app", time.Minute, "")))
	cat.expect(t, "register app=critical")
	wantUnsaved("check deregistration", a.DeregisterCheck(ctx(), "app"))
	cat.expect(t, "deregister check app")
	wantUnsaved("service deregistration", a.DeregisterService(ctx(), "web"))
	cat.expect(t, "deregister service web")
	// Once the directory is there, the same requests succeed.
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := a.RegisterService(ctx(), &state.Service{Service: "web", Port: 80}, nil, false); err != nil {
		t.Fatal(err)
	}
	cat.expect(t, "register service web")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("state file after a saved registration: %v", err)
	}
}
