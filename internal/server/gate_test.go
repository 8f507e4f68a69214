package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// heldFuture is an ApplyFuture the test finishes by hand.
type heldFuture struct {
	cmd  string
	done chan struct{}
	err  error
}

func (f *heldFuture) Error() error          { <-f.done; return f.err }
func (f *heldFuture) Response() interface{} { return f.cmd }
func (f *heldFuture) Index() uint64         { return 0 }

// recordingApplier records every Apply, in order, and returns held futures.
type recordingApplier struct {
	mu      sync.Mutex
	applied []*heldFuture
}

func (r *recordingApplier) Apply(cmd []byte, timeout time.Duration) raft.ApplyFuture {
	if timeout != 0 {
		panic(fmt.Sprintf("gate applied %q with a timeout %v", cmd, timeout))
	}
	f := &heldFuture{cmd: string(cmd), done: make(chan struct{})}
	r.mu.Lock()
	r.applied = append(r.applied, f)
	r.mu.Unlock()
	return f
}

func (r *recordingApplier) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applied)
}

func (r *recordingApplier) at(i int) *heldFuture {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applied[i]
}

// waitFor yields until cond holds: the goroutines it waits for need no
// timer, only a turn on a CPU.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i > 10_000_000 {
			t.Fatalf("never happened: %s", what)
		}
		runtime.Gosched()
	}
}

// receive takes one value from ch, or fails the test if none comes within
// a minute: a bound on a hang, not a timing assertion.
func receive[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("never came: %s", what)
		panic("unreachable")
	}
}

func (g *applyGate) waitingLen() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting)
}

// gatedCall runs one caller of the gate as applyCommand does: enter, wait
// for the future, pass the baton if it holds it.
func gatedCall(g *applyGate, r applier, cmd string) (string, error) {
	f, baton := g.enter(r, []byte(cmd))
	err := f.Error()
	if baton {
		g.pass(r)
	}
	if err != nil {
		return "", err
	}
	return f.Response().(string), nil
}

func TestApplyGateBatches(t *testing.T) {
	var g applyGate
	r := &recordingApplier{}
	results := make(chan string, 16)
	call := func(cmd string) {
		got, err := gatedCall(&g, r, cmd)
		if err != nil {
			t.Errorf("%s: %v", cmd, err)
		}
		results <- got
	}

	// An idle gate lets a command straight in.
	go call("a")
	waitFor(t, "a applied", func() bool { return r.count() == 1 })

	// While "a" is in raft, others wait at the gate in the order they came.
	for i, c := range []string{"b", "c", "d"} {
		go call(c)
		waitFor(t, c+" waiting", func() bool { return g.waitingLen() == i+1 })
	}
	if n := r.count(); n != 1 {
		t.Fatalf("%d commands in raft while the first was in, want 1", n)
	}

	// "a" finishing lets all three in as one batch, in order.
	close(r.at(0).done)
	if got := <-results; got != "a" {
		t.Fatalf("first result %q", got)
	}
	waitFor(t, "b, c, d applied", func() bool { return r.count() == 4 })
	for i, want := range []string{"a", "b", "c", "d"} {
		if got := r.at(i).cmd; got != want {
			t.Fatalf("apply %d was %q, want %q", i, got, want)
		}
	}

	// One arriving now waits for the whole batch, not just for its start:
	// the baton is with "d", the batch's last.
	go call("e")
	waitFor(t, "e waiting", func() bool { return g.waitingLen() == 1 })
	close(r.at(1).done)
	close(r.at(2).done)
	<-results
	<-results
	if n := r.count(); n != 4 {
		t.Fatalf("e went in before the batch's last command finished (%d applied)", n)
	}
	close(r.at(3).done)
	<-results
	waitFor(t, "e applied", func() bool { return r.count() == 5 })
	close(r.at(4).done)
	if got := <-results; got != "e" {
		t.Fatalf("last result %q", got)
	}

	// The gate is idle again: the next command goes straight in.
	g.mu.Lock()
	busy := g.busy
	g.mu.Unlock()
	if busy {
		t.Fatal("gate still busy with nothing in raft")
	}
}

// aInRaftBWaiting sends "a" through g, which lets it straight into r, and
// then "b", which waits behind it; their errors come back on the channel,
// a's first.
func aInRaftBWaiting(t *testing.T, g *applyGate, r *recordingApplier) <-chan error {
	t.Helper()
	errs := make(chan error, 2)
	call := func(cmd string) {
		_, err := gatedCall(g, r, cmd)
		errs <- err
	}
	go call("a")
	waitFor(t, "a applied", func() bool { return r.count() == 1 })
	go call("b")
	waitFor(t, "b waiting", func() bool { return g.waitingLen() == 1 })
	return errs
}

// A batch that fails (leadership lost) still passes the baton on, so the
// commands behind it are not stranded.
func TestApplyGateFailureReleasesWaiters(t *testing.T) {
	var g applyGate
	r := &recordingApplier{}
	errs := aInRaftBWaiting(t, &g, r)
	lost := errors.New("leadership lost")
	f := r.at(0)
	f.err = lost
	close(f.done)
	if err := <-errs; !errors.Is(err, lost) {
		t.Fatalf("a: %v", err)
	}
	waitFor(t, "b applied", func() bool { return r.count() == 2 })
	close(r.at(1).done)
	if err := <-errs; err != nil {
		t.Fatalf("b: %v", err)
	}
}

// No batch is larger than gateBatch; the rest wait for the next one.
func TestApplyGateBatchLimit(t *testing.T) {
	var g applyGate
	r := &recordingApplier{}
	var wg sync.WaitGroup
	call := func(cmd string) {
		defer wg.Done()
		if _, err := gatedCall(&g, r, cmd); err != nil {
			t.Error(err)
		}
	}
	wg.Add(1)
	go call("first")
	waitFor(t, "first applied", func() bool { return r.count() == 1 })
	n := gateBatch + 3
	for i := 0; i < n; i++ {
		wg.Add(1)
		go call(fmt.Sprint(i))
	}
	waitFor(t, "all waiting", func() bool { return g.waitingLen() == n })
	close(r.at(0).done)
	waitFor(t, "a full batch applied", func() bool { return r.count() == 1+gateBatch })
	for i := 1; i <= gateBatch; i++ {
		close(r.at(i).done)
	}
	waitFor(t, "the rest applied", func() bool { return r.count() == 1+n })
	for i := 1 + gateBatch; i <= n; i++ {
		close(r.at(i).done)
	}
	wg.Wait()
}

// Many callers at once: every command is applied exactly once and every
// caller gets its own result.
func TestApplyGateConcurrent(t *testing.T) {
	var g applyGate
	r := &finishingApplier{}
	var wg sync.WaitGroup
	for c := 0; c < 16; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				cmd := fmt.Sprintf("%d/%d", c, i)
				got, err := gatedCall(&g, r, cmd)
				if err != nil || got != cmd {
					t.Errorf("%s: got %q, %v", cmd, got, err)
					return
				}
			}
		}(c)
	}
	wg.Wait()
	if r.n != 16*200 {
		t.Fatalf("%d applies, want %d", r.n, 16*200)
	}
}

// finishingApplier's futures are finished on arrival.
type finishingApplier struct {
	mu sync.Mutex
	n  int
}

func (r *finishingApplier) Apply(cmd []byte, _ time.Duration) raft.ApplyFuture {
	r.mu.Lock()
	r.n++
	r.mu.Unlock()
	f := &heldFuture{cmd: string(cmd), done: make(chan struct{})}
	close(f.done)
	return f
}

// Through a durable server: many writers at once, each write with its own
// log entry (so its own ModifyIndex), every one applied; then a shutdown
// with writers still coming, none of which is left hanging at the gate.
func TestGateThroughServer(t *testing.T) {
	s := newTestServer(t, t.TempDir(), clocktest.NewFake(epoch))
	ctx := context.Background()
	const writers, each = 16, 40
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				key := fmt.Sprintf("gate/%d/%d", w, i)
				if err := putKey(s, key); err != nil {
					t.Errorf("%s: %v", key, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	seen := map[uint64]string{}
	for w := 0; w < writers; w++ {
		for i := 0; i < each; i++ {
			key := fmt.Sprintf("gate/%d/%d", w, i)
			_, e := s.State().KVGet(nil, key)
			if e == nil {
				t.Fatalf("%s missing", key)
			}
			if other, dup := seen[e.ModifyIndex]; dup {
				t.Fatalf("%s and %s share ModifyIndex %d", key, other, e.ModifyIndex)
			}
			seen[e.ModifyIndex] = key
		}
	}

	// Writers that keep writing until refused; the shutdown must refuse
	// every one of them, including those waiting at the gate.
	stopped := make(chan struct{})
	var running sync.WaitGroup
	for w := 0; w < writers; w++ {
		running.Add(1)
		go func(w int) {
			defer running.Done()
			for i := 0; ; i++ {
				e := state.DirEntry{Key: fmt.Sprintf("late/%d/%d", w, i)}
				if _, _, err := s.KVS(ctx, &state.KVRequest{Op: state.OpSet, Entry: e}); err != nil {
					if !errors.Is(err, ErrShuttingDown) && !errors.Is(err, ErrNoLeader) {
						t.Errorf("writer %d: %v", w, err)
					}
					return
				}
			}
		}(w)
	}
	go func() { running.Wait(); close(stopped) }()
	// Parked on the key's watch until the writers are well under way.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		ws := watch.NewSet()
		if _, e := s.State().KVGet(ws, fmt.Sprintf("late/%d/%d", writers-1, 3)); e != nil {
			break
		}
		if err := ws.WatchCtx(wctx); err != nil {
			t.Fatal("the late writers never got going")
		}
	}
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("writers still blocked 30 s after the shutdown:\n%s", buf[:runtime.Stack(buf, true)])
	}
}

// Closing the gate refuses the waiting commands and new ones, and says
// when the batch in raft is through.
func TestApplyGateClose(t *testing.T) {
	var g applyGate
	r := &recordingApplier{}
	errs := aInRaftBWaiting(t, &g, r)

	drained := g.close()
	if err := <-errs; !errors.Is(err, raft.ErrRaftShutdown) {
		t.Fatalf("waiting b: %v, want refused", err)
	}
	if _, err := gatedCall(&g, r, "c"); !errors.Is(err, raft.ErrRaftShutdown) {
		t.Fatalf("c after close: %v, want refused", err)
	}
	select {
	case <-drained:
		t.Fatal("drained while a was still in raft")
	default:
	}
	close(r.at(0).done)
	if err := <-errs; err != nil {
		t.Fatalf("a: %v", err)
	}
	<-drained
	if n := r.count(); n != 1 {
		t.Fatalf("%d commands reached raft, want only a", n)
	}
	select {
	case <-g.close(): // closing again, idle: drained at once
	default:
		t.Fatal("an idle closed gate is not drained")
	}
}

// hold waits for the batch in raft to be through, takes the baton ahead of
// the commands waiting, keeps every command out until pass, and then lets
// the waiting ones in as the next batch.
func TestApplyGateHold(t *testing.T) {
	var g applyGate
	r := &recordingApplier{}
	errs := aInRaftBWaiting(t, &g, r)
	held := make(chan error, 1)
	go func() { held <- g.hold() }()
	waitFor(t, "hold waiting", func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.holders) == 1 })
	select {
	case <-held:
		t.Fatal("hold returned while a was in raft")
	default:
	}

	close(r.at(0).done) // a is through: the baton goes to the holder, not to b
	if err := receive(t, "a's answer", errs); err != nil {
		t.Fatalf("a: %v", err)
	}
	if err := receive(t, "hold", held); err != nil {
		t.Fatalf("hold: %v", err)
	}
	cErr := make(chan error, 1)
	go func() { _, err := gatedCall(&g, r, "c"); cErr <- err }()
	waitFor(t, "c waiting", func() bool { return g.waitingLen() == 2 })
	if n := r.count(); n != 1 {
		t.Fatalf("%d commands in raft while the gate was held, want 1", n)
	}

	g.pass(r) // the holder is done: b and c go in together
	waitFor(t, "b and c applied", func() bool { return r.count() == 3 })
	close(r.at(1).done)
	close(r.at(2).done)
	if err := receive(t, "b's answer", errs); err != nil {
		t.Fatalf("b: %v", err)
	}
	if err := receive(t, "c's answer", cErr); err != nil {
		t.Fatalf("c: %v", err)
	}

	// An idle gate is held at once; a closed one refuses.
	if err := g.hold(); err != nil {
		t.Fatal(err)
	}
	g.pass(r)
	g.close()
	if err := g.hold(); !errors.Is(err, raft.ErrRaftShutdown) {
		t.Fatalf("hold on a closed gate: %v", err)
	}
}

// Finding (snapshot audit): a session whose TTL ran out while a restore
// held the gate was destroyed in the restored state, where it had just
// been given a full TTL: its destroy, decided on the state replaced,
// waited at the gate and went in after. A command pinned to an epoch is
// now refused once a restore has replaced the state (replaced), waiting or
// arriving late; other commands waiting go in as usual.
func TestApplyGateReplacedRefusesPinned(t *testing.T) {
	var g applyGate
	r := &recordingApplier{}
	e := g.Epoch()
	if err := g.hold(); err != nil {
		t.Fatal(err)
	}
	pinned, plain := make(chan error, 1), make(chan error, 1)
	go func() {
		f, baton := g.enterAt(r, []byte("expire"), e, true)
		err := f.Error()
		if baton {
			g.pass(r)
		}
		pinned <- err
	}()
	go func() { _, err := gatedCall(&g, r, "write"); plain <- err }()
	waitFor(t, "both waiting", func() bool { return g.waitingLen() == 2 })

	g.replaced() // the restore is in
	if err := receive(t, "the pinned command's answer", pinned); !errors.Is(err, errStateReplaced) {
		t.Fatalf("pinned command decided before the restore: %v, want errStateReplaced", err)
	}
	g.pass(r)
	waitFor(t, "write applied", func() bool { return r.count() == 1 })
	close(r.at(0).done)
	if err := receive(t, "the write's answer", plain); err != nil || r.at(0).cmd != "write" {
		t.Fatalf("write: %v (applied %q)", err, r.at(0).cmd)
	}
	// Decided before, arriving after: refused at the door.
	if f, _ := g.enterAt(r, []byte("late"), e, true); !errors.Is(f.Error(), errStateReplaced) {
		t.Fatalf("late pinned command: %v", f.Error())
	}
	// Decided in the new epoch: applied.
	f, baton := g.enterAt(r, []byte("now"), g.Epoch(), true)
	close(r.at(1).done)
	if err := f.Error(); err != nil || !baton {
		t.Fatalf("pinned command of the current epoch: %v", err)
	}
	g.pass(r)

	// A gate closed while a restore holds it drains when the restore is
	// through: raft, stopped while the state machine loads a backup,
	// panics (the shutdown bounds its wait, see Server.Shutdown).
	if err := g.hold(); err != nil {
		t.Fatal(err)
	}
	if !g.holding() {
		t.Fatal("holding() false while held")
	}
	drained := g.close()
	select {
	case <-drained:
		t.Fatal("close drained while a restore held the gate")
	default:
	}
	g.pass(r)
	receive(t, "drained once the restore passed", drained)
}
