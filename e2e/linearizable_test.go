package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestLinearizableAcrossCrashes drives one real agent, on a data directory,
// with concurrent clients doing reads (default and ?consistent), writes,
// CAS and lock acquire/release on a few keys, while the agent is killed
// with SIGKILL and restarted on the same directory and ports three times.
// Every operation is recorded with its call and return times, and the
// history is checked for linearizability against linModel (see
// linearizable_model_test.go), key by key, with porcupine: an acknowledged
// write lost or reordered by a crash, a read served from a stale state, a
// CAS or a lock decided on one, all make the history illegal.
//
// Answers are read strictly. A read that fails tells nothing and is
// dropped. A write is dropped only when it provably never reached the
// server's log: its connection was refused (the agent is down; a refused
// dial sends nothing) or it was answered 500 "No cluster leader" (the
// server refuses before proposing: internal/server's ready and
// applyCommand). Every other failure (reset, EOF, timeout, any other 5xx)
// leaves the outcome unknown, and the write is recorded as returning at
// the end of the history with an unknown output, which the model accepts
// applied at any point after its call or not at all.
//
// HOLDFAST_LIN_SEED=<n> replays a run's choices (the seed is logged); the
// timing of a real process is not replayed.
func TestLinearizableAcrossCrashes(t *testing.T) {
	if binPath == "" {
		t.Skip("e2e tests do not run under -short")
	}
	t.Parallel()
	seed, rnd := linSeed(t)

	const (
		clients   = 8
		kills     = 3
		opTimeout = 2 * time.Second
	)
	keys := []string{"lin/a", "lin/b", "lin/c", "lin/d"}

	dir := t.TempDir()
	httpAddr := freeAddr(t)
	opts := agentOpts{dataDir: dir, raftAddr: freeAddr(t), extra: []string{"-http-addr", httpAddr}}
	start := func() *agent {
		a := launchAgent(t, opts)
		if a.httpAddr != httpAddr {
			t.Fatalf("agent listens on %s, not on the %s it was given", a.httpAddr, httpAddr)
		}
		a.waitReady()
		return a
	}
	a := start()
	base := "http://" + httpAddr

	hc := &http.Client{
		Timeout:   opTimeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: clients, DisableCompression: true},
	}
	t.Cleanup(hc.CloseIdleConnections)

	// One session per client, made before the run: no TTL, no checks (so
	// nothing but a destroy, which the test never sends, can end it) and
	// no lock-delay. They are durable: they survive each restart.
	sessions := make([]string, clients)
	for c := range sessions {
		sessions[c] = createLinSession(t, hc, base, fmt.Sprintf("lin-c%d", c))
	}

	run := newLinRun()
	workers := make([]*linClient, clients)
	for c := range workers {
		workers[c] = &linClient{
			id: c, hc: hc, base: base, keys: keys, session: sessions[c],
			rnd: rand.New(rand.NewPCG(seed, uint64(c)+1)),
		}
	}
	// Stop the clients however the test ends (a t.Fatal while restarting
	// included), before the agents are killed by their cleanups.
	defer run.halt()
	run.start(workers)
	now := run.now

	// The kills: at a random moment, with operations in flight; down for
	// a random while; restarted on the same directory and ports.
	var killedAt, readyAt []int64
	for i := 0; i < kills; i++ {
		sleepOrStop(time.Duration(1500+rnd.IntN(1000))*time.Millisecond, nil)
		a.kill()
		killedAt = append(killedAt, now())
		sleepOrStop(time.Duration(rnd.IntN(200))*time.Millisecond, nil)
		a = start()
		readyAt = append(readyAt, now())
	}
	sleepOrStop(time.Duration(1200+rnd.IntN(500))*time.Millisecond, nil)
	end := run.halt()

	history, st := linHistory(t, workers, end)
	t.Logf("%d operations recorded in %v (%d kills, down %v): %s",
		len(history), time.Duration(end), kills, downTimes(killedAt, readyAt), st.String())

	// The history must have tested something: enough of every kind of
	// answer, and acknowledged writes after every restart.
	requireLinCoverage(t, st)
	if n := st.dialRefused + st.noLeader + st.unknown; n < kills {
		t.Errorf("only %d writes that failed while the agent was down: too few to test anything (want at least %d)", n, kills)
	}
	for i, from := range append([]int64{0}, readyAt...) {
		n := 0
		for _, op := range history {
			in, out := op.Input.(linInput), op.Output.(linOutput)
			if in.Op != linRead && !out.Unknown && out.OK && op.Call >= from && (i == kills || op.Return < killedAt[i]) {
				n++
			}
		}
		if n < 10 {
			t.Errorf("only %d writes acknowledged by the agent's run #%d", n, i+1)
		}
	}

	checkLinearizable(t, history)
}

// linSeed is the run's seed, HOLDFAST_LIN_SEED's if set (it is logged, to
// rerun a run's choices), and the random source of the test's own choices.
func linSeed(t *testing.T) (uint64, *rand.Rand) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("HOLDFAST_LIN_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("HOLDFAST_LIN_SEED=%q: %v", s, err)
		}
		seed = n
	}
	t.Logf("seed %d (HOLDFAST_LIN_SEED=%d to rerun with the same choices)", seed, seed)
	return seed, rand.New(rand.NewPCG(seed, 0))
}

// linRun runs linClients, on one clock for the history, until halted.
type linRun struct {
	began time.Time
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

func newLinRun() *linRun { return &linRun{began: time.Now(), stop: make(chan struct{})} }

// now is the history's clock: nanoseconds since the run began.
func (r *linRun) now() int64 { return time.Since(r.began).Nanoseconds() }

// start gives the workers the run's clock and stop, and runs each on a
// goroutine of its own.
func (r *linRun) start(workers []*linClient) {
	for _, w := range workers {
		w.now, w.stop = r.now, r.stop
		r.wg.Add(1)
		go func(w *linClient) { defer r.wg.Done(); w.run() }(w)
	}
}

// halt stops the workers and waits for them; it returns the history's
// end (a time after every operation's return). Safe to call twice.
func (r *linRun) halt() int64 {
	r.once.Do(func() { close(r.stop) })
	r.wg.Wait()
	return r.now() + 1
}

// linHistory gathers the workers' operations into one history, an
// operation of unknown outcome returning at end (it may have taken effect
// at any point after its call), adds up their stats, and reports the
// answers no operation may get.
func linHistory(t *testing.T, workers []*linClient, end int64) ([]porcupine.Operation, linStats) {
	t.Helper()
	var history []porcupine.Operation
	var st linStats
	for _, w := range workers {
		for _, op := range w.history {
			if op.Output.(linOutput).Unknown {
				op.Return = end
			}
			history = append(history, op)
		}
		st.add(&w.stats)
		for _, e := range w.errors {
			t.Error(e)
		}
	}
	return history, st
}

// requireLinCoverage fails the test if the history holds too few of any
// kind of answer to have tested anything.
func requireLinCoverage(t *testing.T, st linStats) {
	t.Helper()
	for _, need := range []struct {
		what   string
		n, min int
	}{
		{"acknowledged writes", st.writesOK, 100},
		{"default-mode reads", st.readsDefault, 50},
		{"consistent reads", st.readsConsistent, 50},
		{"successful CAS", st.casOK, 20},
		{"failed CAS", st.casFailed, 1},
		{"successful acquires", st.acquireOK, 10},
		{"refused acquires", st.acquireFailed, 1},
		{"successful releases", st.releaseOK, 10},
	} {
		if need.n < need.min {
			t.Errorf("only %d %s: too few to test anything (want at least %d)", need.n, need.what, need.min)
		}
	}
}

// checkLinearizable checks history against linModel and, when it is not
// linearizable, says which key, prints the operations around where the
// linearization got stuck and writes porcupine's visualization.
func checkLinearizable(t *testing.T, history []porcupine.Operation) {
	began := time.Now()
	res, info := porcupine.CheckOperationsVerbose(linModel, history, linCheckTimeout)
	t.Logf("porcupine: %v in %v", res, time.Since(began).Round(time.Millisecond))
	switch res {
	case porcupine.Ok:
		return
	case porcupine.Unknown:
		t.Fatalf("the linearizability check did not finish within %v: no verdict, so no pass", linCheckTimeout)
	}
	f, err := os.CreateTemp("", "holdfast-linearizability-*.html")
	if err == nil {
		err = porcupine.Visualize(linModel, info, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Errorf("writing the visualization: %v", err)
	} else {
		t.Errorf("visualization of the history: %s", f.Name())
	}
	keys := linKeys(history)
	parts := linPartition(history)
	for p, partials := range info.PartialLinearizationsOperations() {
		if porcupine.CheckOperationsTimeout(linModel, parts[p], linCheckTimeout) == porcupine.Ok {
			continue
		}
		t.Errorf("key %s: not linearizable (%d operations)\n%s", keys[p], len(parts[p]), linStuck(parts[p], partials))
	}
	t.FailNow()
}

// linStuck describes where the linearization of one key's history got
// stuck: the end of the longest linearizable prefix found, with the state
// after each operation, and the operations that could come next.
func linStuck(ops []porcupine.Operation, partials [][]porcupine.Operation) string {
	var longest []porcupine.Operation
	for _, p := range partials {
		if len(p) > len(longest) {
			longest = p
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "longest linearizable prefix: %d operations; its last ones, with the state after each:\n", len(longest))
	var state interface{} = linModel.Init()
	done := map[string]bool{}
	opKey := func(o porcupine.Operation) string { return fmt.Sprintf("%d/%d/%v", o.ClientId, o.Call, o.Input) }
	for i, o := range longest {
		_, state = linModel.Step(state, o.Input, o.Output)
		done[opKey(o)] = true
		if i >= len(longest)-12 {
			fmt.Fprintf(&b, "  c%d [%.3fs, %s] %s  => %s\n", o.ClientId, secs(o.Call), linRet(o), linDescribe(o.Input, o.Output),
				linDescribeState(state))
		}
	}
	var rest []porcupine.Operation
	for _, o := range ops {
		if !done[opKey(o)] {
			rest = append(rest, o)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].Call < rest[j].Call })
	b.WriteString("operations not linearized, first called first (none of them can come next):\n")
	for i, o := range rest {
		if i == 12 {
			fmt.Fprintf(&b, "  … and %d more\n", len(rest)-i)
			break
		}
		fmt.Fprintf(&b, "  c%d [%.3fs, %s] %s\n", o.ClientId, secs(o.Call), linRet(o), linDescribe(o.Input, o.Output))
	}
	return b.String()
}

func secs(ns int64) float64 { return float64(ns) / 1e9 }

func linRet(o porcupine.Operation) string {
	if o.Output.(linOutput).Unknown {
		return "end"
	}
	return fmt.Sprintf("%.3fs", secs(o.Return))
}

func downTimes(killed, ready []int64) string {
	var s []string
	for i := range killed {
		s = append(s, time.Duration(ready[i]-killed[i]).Round(time.Millisecond).String())
	}
	return strings.Join(s, ", ")
}

// sleepOrStop sleeps for d, or less if stop is closed.
func sleepOrStop(d time.Duration, stop <-chan struct{}) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-stop:
	}
}

// createLinSession makes a session with no TTL, no health checks and no
// lock-delay, and checks the agent took it so.
func createLinSession(t *testing.T, hc *http.Client, base, name string) string {
	t.Helper()
	body := fmt.Sprintf(`{"Name":%q,"LockDelay":"0s","NodeChecks":[],"Behavior":"release"}`, name)
	req, _ := http.NewRequest("PUT", base+"/v1/session/create", strings.NewReader(body))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ ID string }
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || out.ID == "" {
		t.Fatalf("session create: %d %+v %v", resp.StatusCode, out, err)
	}
	resp, err = hc.Get(base + "/v1/session/info/" + out.ID + "?consistent")
	if err != nil {
		t.Fatal(err)
	}
	var info []struct {
		LockDelay  time.Duration
		TTL        string
		NodeChecks []string
		Checks     []string
	}
	err = json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if err != nil || len(info) != 1 || info[0].LockDelay != 0 || info[0].TTL != "" || len(info[0].NodeChecks) != 0 || len(info[0].Checks) != 0 {
		t.Fatalf("session %s: %+v %v; want no lock-delay, no TTL and no checks", out.ID, info, err)
	}
	return out.ID
}

// linStats counts the answers of one client's operations.
type linStats struct {
	readsDefault, readsConsistent, readsFailed int
	writesOK                                   int
	casOK, casFailed                           int
	acquireOK, acquireFailed                   int
	releaseOK, releaseFailed                   int
	unknown                                    int // writes with no answer: recorded as unknown
	dialRefused                                int // writes whose connection was refused: dropped
	noLeader                                   int // writes answered "No cluster leader": dropped
}

func (s *linStats) add(o *linStats) {
	s.readsDefault += o.readsDefault
	s.readsConsistent += o.readsConsistent
	s.readsFailed += o.readsFailed
	s.writesOK += o.writesOK
	s.casOK += o.casOK
	s.casFailed += o.casFailed
	s.acquireOK += o.acquireOK
	s.acquireFailed += o.acquireFailed
	s.releaseOK += o.releaseOK
	s.releaseFailed += o.releaseFailed
	s.unknown += o.unknown
	s.dialRefused += o.dialRefused
	s.noLeader += o.noLeader
}

func (s *linStats) String() string {
	return fmt.Sprintf("reads %d default + %d consistent (%d failed, dropped); writes %d; cas %d true, %d false; "+
		"acquire %d true, %d false; release %d true, %d false; %d writes with unknown outcome; "+
		"dropped as never proposed: %d writes whose connection was refused, %d answered \"No cluster leader\"",
		s.readsDefault, s.readsConsistent, s.readsFailed, s.writesOK, s.casOK, s.casFailed,
		s.acquireOK, s.acquireFailed, s.releaseOK, s.releaseFailed, s.unknown, s.dialRefused, s.noLeader)
}

// linClient is one client: it runs operations one at a time until stop,
// and records them.
type linClient struct {
	id      int
	hc      *http.Client
	base    string
	keys    []string
	session string
	rnd     *rand.Rand
	now     func() int64
	stop    <-chan struct{}

	n          int             // values written so far
	consistent bool            // the next read is ?consistent
	held       map[string]bool // keys an acquire of ours was answered true on, and not released since
	history    []porcupine.Operation
	stats      linStats
	errors     []string // answers no operation may get
}

func (c *linClient) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// backoff pauses after a failed request, so that clients do not spin while
// the agent is down.
func (c *linClient) backoff() {
	sleepOrStop(time.Duration(5+c.rnd.IntN(16))*time.Millisecond, c.stop)
}

// value is a value no other write of the run sends.
func (c *linClient) value() string {
	c.n++
	return fmt.Sprintf("c%d-%d", c.id, c.n)
}

func (c *linClient) run() {
	c.held = map[string]bool{}
	for !c.stopped() {
		key := c.keys[c.rnd.IntN(len(c.keys))]
		ok := true
		switch p := c.rnd.IntN(100); {
		case p < 30:
			_, _, ok = c.read(key)
		case p < 50:
			ok = c.write(linInput{Op: linWrite, Key: key, Value: c.value()}, "")
		case p < 72:
			// CAS: read the key's version, then write if it is still
			// that version.
			v, idx, rok := c.read(key)
			if !rok {
				ok = false
				break
			}
			ok = c.write(linInput{Op: linCAS, Key: key, Exp: v, Value: c.value()}, "cas="+strconv.FormatUint(idx, 10))
		case p < 86:
			ok = c.write(linInput{Op: linAcquire, Key: key, Session: c.session, Value: c.value()}, "acquire="+c.session)
		default:
			// Mostly release what this client holds; sometimes a key it
			// may well not hold.
			if len(c.held) > 0 && c.rnd.IntN(5) > 0 {
				var mine []string
				for k := range c.held {
					mine = append(mine, k)
				}
				sort.Strings(mine)
				key = mine[c.rnd.IntN(len(mine))]
			}
			ok = c.write(linInput{Op: linRelease, Key: key, Session: c.session, Value: c.value()}, "release="+c.session)
		}
		if !ok {
			c.backoff()
		} else {
			// A moment between operations: the clients still overlap
			// all the time, and the history stays small enough to check
			// in seconds.
			sleepOrStop(time.Duration(c.rnd.IntN(1000))*time.Microsecond, c.stop)
		}
	}
}

// read GETs key, alternately in the default mode and ?consistent, and
// records it. It returns the value and its ModifyIndex (0 when absent).
func (c *linClient) read(key string) (string, uint64, bool) {
	in := linInput{Op: linRead, Key: key, Consistent: c.consistent}
	c.consistent = !c.consistent
	u := c.base + "/v1/kv/" + key
	if in.Consistent {
		u += "?consistent"
	}
	call := c.now()
	resp, err := c.hc.Get(u)
	if err != nil {
		c.stats.readsFailed++
		return "", 0, false
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	ret := c.now()
	if err != nil {
		c.stats.readsFailed++
		return "", 0, false
	}
	var out linOutput
	var idx uint64
	switch resp.StatusCode {
	case 200:
		var ents []struct {
			Key         string
			Value       []byte
			Session     string
			ModifyIndex uint64
		}
		if err := json.Unmarshal(body, &ents); err != nil || len(ents) != 1 || ents[0].Key != key {
			c.errors = append(c.errors, fmt.Sprintf("GET %s: 200 with %q (%v)", u, body, err))
			return "", 0, false
		}
		out.Value, out.Holder, idx = string(ents[0].Value), ents[0].Session, ents[0].ModifyIndex
		if out.Value == "" {
			out.Value = "<empty>" // not a value the test writes: the model rejects it
		}
	case 404:
	default:
		// 500 "No cluster leader" while the agent starts, or any other
		// failure: a read that tells nothing.
		c.stats.readsFailed++
		return "", 0, false
	}
	if in.Consistent {
		c.stats.readsConsistent++
	} else {
		c.stats.readsDefault++
	}
	c.history = append(c.history, porcupine.Operation{ClientId: c.id, Input: in, Output: out, Call: call, Return: ret})
	return out.Value, idx, true
}

// write PUTs in.Value to in.Key with the query q, and records the
// operation unless it provably did not reach the server's log. It reports
// whether the server answered.
func (c *linClient) write(in linInput, q string) bool {
	u := c.base + "/v1/kv/" + in.Key
	if q != "" {
		u += "?" + q
	}
	call := c.now()
	req, _ := http.NewRequest("PUT", u, strings.NewReader(in.Value))
	resp, err := c.hc.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	ret := c.now()
	op := porcupine.Operation{ClientId: c.id, Input: in, Call: call, Return: ret}
	answer := strings.TrimSpace(string(body))
	switch {
	case err != nil && errors.Is(err, syscall.ECONNREFUSED):
		// The dial was refused: nothing was sent. (net/http resends a
		// request on a new connection only when it knows the first
		// attempt was not written or the server had closed the idle
		// connection, so a refused retry means no attempt was seen.)
		c.stats.dialRefused++
		return false
	case err != nil:
		op.Output = linOutput{Unknown: true}
		c.stats.unknown++
	case resp.StatusCode == 500 && answer == "No cluster leader":
		// Refused before it was proposed (internal/server: ready,
		// applyCommand).
		c.stats.noLeader++
		return false
	case resp.StatusCode >= 500:
		// Any other server failure may have happened after the entry
		// reached the log ("the write may or may not have been
		// applied", or one not foreseen here).
		op.Output = linOutput{Unknown: true}
		c.stats.unknown++
	case resp.StatusCode == 200 && (answer == "true" || answer == "false"):
		op.Output = linOutput{OK: answer == "true"}
		c.count(in.Op, answer == "true")
		switch {
		case in.Op == linAcquire && answer == "true":
			c.held[in.Key] = true
		case in.Op == linRelease:
			delete(c.held, in.Key)
		}
	default:
		c.errors = append(c.errors, fmt.Sprintf("PUT %s: %d %q", u, resp.StatusCode, body))
		return false
	}
	if op.Output.(linOutput).Unknown {
		if in.Op == linRelease || in.Op == linAcquire {
			delete(c.held, in.Key) // whether we hold it is unknown
		}
	}
	c.history = append(c.history, op)
	return !op.Output.(linOutput).Unknown
}

func (c *linClient) count(op string, ok bool) {
	s := &c.stats
	switch {
	case op == linWrite:
		s.writesOK++
	case op == linCAS && ok:
		s.casOK++
	case op == linCAS:
		s.casFailed++
	case op == linAcquire && ok:
		s.acquireOK++
	case op == linAcquire:
		s.acquireFailed++
	case op == linRelease && ok:
		s.releaseOK++
	case op == linRelease:
		s.releaseFailed++
	}
}
