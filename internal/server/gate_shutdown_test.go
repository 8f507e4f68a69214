package server

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/types"

	"github.com/holdfast/holdfast/clock/clocktest"
	"github.com/holdfast/holdfast/internal/state"
)

// stallFS wraps raft-wal's file system so that, while armed, every fsync of
// a log segment waits for the test to let it through (one receive from
// release per fsync), and then fails with EIO if fail is set. raft's
// leader loop stores a batch and fsyncs it on its own goroutine, so an
// armed stallFS holds the leader loop inside StoreLogs.
type stallFS struct {
	wrappingFS
	armed   atomic.Bool
	fail    atomic.Bool
	blocked atomic.Int32
	// entered counts the fsyncs that have stalled so far, so a test can
	// wait for the next one without racing blocked's decrement.
	entered atomic.Int64
	release chan struct{}
}

func newStallFS() *stallFS {
	v := &stallFS{release: make(chan struct{})}
	v.wrappingFS = wrappingFS{VFS: fs.New(), wrap: func(f types.WritableFile) types.WritableFile {
		return &stallFile{WritableFile: f, fs: v}
	}}
	return v
}

// releaseAtCleanup disarms v and lets any waiting fsync through when the
// test ends, before the server's own cleanup shuts it down (cleanups run
// last registered first), so a failed test does not leave raft stuck.
func releaseAtCleanup(t *testing.T, v *stallFS) {
	t.Cleanup(func() {
		v.armed.Store(false)
		for v.blocked.Load() > 0 {
			select {
			case v.release <- struct{}{}:
			default:
				runtime.Gosched()
			}
		}
	})
}

// letOneThrough lets the fsync that is waiting (or the next one) finish.
func (v *stallFS) letOneThrough() { v.release <- struct{}{} }

type stallFile struct {
	types.WritableFile
	fs *stallFS
}

func (f *stallFile) Sync() error {
	if f.fs.armed.Load() {
		f.fs.blocked.Add(1)
		f.fs.entered.Add(1)
		<-f.fs.release
		f.fs.blocked.Add(-1)
		if f.fs.fail.Load() {
			return syscall.EIO
		}
	}
	return f.WritableFile.Sync()
}

// signalWriter closes ch the first time a line containing match is written.
type signalWriter struct {
	match string
	ch    chan struct{}
	once  sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.match) {
		w.once.Do(func() { close(w.ch) })
	}
	return len(p), nil
}

// applyChLen is how many futures wait in raft's apply channel, unread by
// its main loop.
func applyChLen(r *raft.Raft) int {
	return reflect.ValueOf(r).Elem().FieldByName("applyCh").Len()
}

// putKey writes key through s as a client would; a refusal is an error.
func putKey(s *Server, key string) error {
	ok, _, err := s.KVS(context.Background(), &state.KVRequest{Op: state.OpSet, Entry: state.DirEntry{Key: key, Value: []byte("v")}})
	if err == nil && !ok {
		err = errors.New("refused")
	}
	return err
}

// Closing the gate twice while a batch is in raft: both channels are
// closed once the batch is through. (The second close once replaced the
// first's channel, which was then never closed.)
func TestApplyGateCloseTwiceWhileBusy(t *testing.T) {
	var g applyGate
	r := &recordingApplier{}
	errs := make(chan error, 1)
	go func() {
		_, err := gatedCall(&g, r, "a")
		errs <- err
	}()
	waitFor(t, "a applied", func() bool { return r.count() == 1 })
	first := g.close()
	second := g.close()
	close(r.at(0).done)
	if err := <-errs; err != nil {
		t.Fatalf("a: %v", err)
	}
	// gatedCall has passed the baton before it returned.
	for name, ch := range map[string]<-chan struct{}{"first": first, "second": second} {
		select {
		case <-ch:
		default:
			t.Errorf("%s close's channel is not closed although the batch is through", name)
		}
	}
}

// A shutdown while the batch in raft is held up by a stalled disk, with
// part of that batch still unread in raft's apply channel: every write is
// answered. Shutdown once waited ApplyTimeout for the batch and then shut
// raft down anyway; raft's leader loop exits without reading its apply
// channel (runLeader answers only leaderState.inflight), so the writes
// left there waited for ever, and raft.Shutdown could not finish before
// the stalled StoreLogs returned either, so giving up gained nothing.
// Shutdown now says it is waiting and keeps waiting.
func TestGateShutdownWithBatchHeldByDisk(t *testing.T) {
	vfs := newStallFS()
	cfg := testConfig(t.TempDir(), clocktest.NewFake(epoch), nil)
	cfg.logFS = vfs
	warned := make(chan struct{})
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: &signalWriter{
		match: "waiting for writes still in raft", ch: warned}})
	cfg.ApplyTimeout = 50 * time.Millisecond // Shutdown's drain wait (the barrier of term 1 is done before we start)
	s := startServer(t, cfg)
	releaseAtCleanup(t, vfs)

	const n = 64
	var results chan error
	split := false
	for attempt := 0; attempt < 50 && !split; attempt++ {
		// A's store stalls in fsync: A is the batch in raft.
		vfs.armed.Store(true)
		resA := make(chan error, 1)
		go func() { resA <- putKey(s, fmt.Sprintf("a/%d", attempt)) }()
		waitFor(t, "A's fsync stalled", func() bool { return vfs.blocked.Load() == 1 })
		// n writes wait at the gate behind it.
		results = make(chan error, n)
		for i := 0; i < n; i++ {
			go func(i int) { results <- putKey(s, fmt.Sprintf("b/%d/%d", attempt, i)) }(i)
		}
		waitFor(t, "writes waiting at the gate", func() bool { return s.gate.waitingLen() == n })
		// A's fsync finishes: A is answered, its caller lets the n in as
		// one batch before it returns, and the leader loop stalls in the
		// fsync of the first part of that batch it picked up.
		vfs.letOneThrough()
		if err := <-resA; err != nil {
			t.Fatalf("A: %v", err)
		}
		waitFor(t, "the batch's first store stalled", func() bool { return vfs.blocked.Load() == 1 })
		if applyChLen(s.raft) > 0 {
			split = true
			break
		}
		// The leader loop picked up the whole batch at once; let it
		// through and try again.
		vfs.armed.Store(false)
		vfs.letOneThrough()
		for i := 0; i < n; i++ {
			if err := <-results; err != nil {
				t.Fatalf("b: %v", err)
			}
		}
	}
	if !split {
		t.Skip("the leader loop always read the whole batch at once; scenario not reached")
	}
	queued := applyChLen(s.raft)

	shutdown := make(chan error, 1)
	go func() { shutdown <- s.Shutdown() }()
	// Shutdown has waited ApplyTimeout for the batch to be through.
	select {
	case <-warned:
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown never said it was waiting for writes in raft")
	}
	// It keeps waiting: raft is not shut down while the batch is in it.
	if st := s.raft.State(); st == raft.Shutdown {
		t.Fatal("raft shut down with writes still in its apply channel")
	}
	select {
	case <-shutdown:
		t.Fatal("Shutdown returned while the batch was held by the disk")
	default:
	}
	// The disk comes back.
	vfs.armed.Store(false)
	vfs.letOneThrough()
	select {
	case <-shutdown:
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown hung")
	}

	// raft has stopped: nobody reads its apply channel any more, so the
	// futures still in it are never answered. The others are answered
	// (ErrLeadershipLost for the ones raft had read: runLeader's defer).
	left := applyChLen(s.raft)
	guard := time.After(30 * time.Second)
	for i := 0; i < n-left; i++ {
		select {
		case <-results:
		case <-guard:
			t.Fatalf("only %d of the %d writes raft had read were answered", i, n-left)
		}
	}
	if left > 0 {
		t.Fatalf("%d of %d writes never answered: they were in raft's apply channel (%d when Shutdown began) "+
			"when raft stopped", left, n, queued)
	}
	select {
	case <-results:
		t.Fatal("more answers than writes")
	default:
	}
}

// A log write that fails while writes wait at the gate: raft steps down
// and answers the batch in raft with the store's error; the waiting
// writes go in next and are answered too (ErrNoLeader from the follower,
// or success once it leads again); none is left at the gate, and writes
// resume.
func TestGateFailedStoreWithWaiters(t *testing.T) {
	clk := clocktest.NewFake(epoch)
	vfs := newStallFS()
	cfg := testConfig(t.TempDir(), clk, nil)
	cfg.logFS = vfs
	s := startServer(t, cfg)
	releaseAtCleanup(t, vfs)

	vfs.armed.Store(true)
	vfs.fail.Store(true)
	resA := make(chan error, 1)
	go func() { resA <- putKey(s, "a") }()
	waitFor(t, "A's fsync stalled", func() bool { return vfs.blocked.Load() == 1 })
	const n = 32
	results := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(i int) { results <- putKey(s, fmt.Sprintf("b/%d", i)) }(i)
	}
	waitFor(t, "writes waiting at the gate", func() bool { return s.gate.waitingLen() == n })
	vfs.armed.Store(false)
	vfs.letOneThrough() // A's fsync fails: raft steps down
	if err := <-resA; err == nil {
		t.Fatal("A succeeded on a failed fsync")
	}
	guard := time.After(30 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case err := <-results:
			if err != nil && !errors.Is(err, ErrNoLeader) {
				t.Errorf("waiting write: %v", err)
			}
		case <-guard:
			t.Fatalf("%d writes still blocked at the gate or in raft", n-i)
		}
	}
	if s.gate.waitingLen() != 0 {
		t.Fatal("writes left at the gate")
	}
	// Writes resume once it leads again (the barrier retry runs on the
	// fake clock).
	writesResume(t, s, clk)
}

// writesResume waits until s leads again and takes a write of "after" (the
// leader loop's barrier retry runs on the fake clock, raft's election in
// real time), failing the test after 15 s.
func writesResume(t *testing.T, s *Server, clk *clocktest.Fake) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		wctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := s.WaitForLeader(wctx)
		cancel()
		if err == nil && putKey(s, "after") == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no write succeeded after the disk recovered")
		}
		clk.Advance(time.Second)
	}
}
