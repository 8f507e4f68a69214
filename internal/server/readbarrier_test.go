package server

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/holdfast/holdfast/clock/clocktest"
)

// A reader that arrives while a round is in flight is answered by the next
// round, never by the one already running.
func TestReadBarrierWaitsForAFreshRound(t *testing.T) {
	started := make(chan struct{})
	release := make(chan error)
	var rounds atomic.Int32
	b := &readBarrier{verify: func() error {
		rounds.Add(1)
		started <- struct{}{}
		return <-release
	}}
	first := make(chan error, 1)
	go func() { first <- b.wait(context.Background()) }()
	<-started // round 1 is in flight

	second := make(chan error, 1)
	go func() { second <- b.wait(context.Background()) }()
	waitQueued(b, 1)
	release <- nil // round 1 answers only the first reader
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-second:
		t.Fatalf("second reader answered by a round that started before it arrived (%v)", err)
	default:
	}
	<-started
	boom := errors.New("lost leadership")
	release <- boom
	if err := <-second; !errors.Is(err, boom) {
		t.Fatalf("second reader got %v, want the second round's error", err)
	}
	if rounds.Load() != 2 {
		t.Fatalf("rounds = %d, want 2", rounds.Load())
	}
}

// Many concurrent readers share one round.
func TestReadBarrierCoalesces(t *testing.T) {
	var rounds atomic.Int32
	started := make(chan struct{}, 2)
	gate := make(chan struct{})
	b := &readBarrier{verify: func() error {
		rounds.Add(1)
		started <- struct{}{}
		<-gate
		return nil
	}}
	var wg sync.WaitGroup
	read := func() {
		defer wg.Done()
		if err := b.wait(context.Background()); err != nil {
			t.Error(err)
		}
	}
	wg.Add(1)
	go read()
	<-started // round 1 holds the barrier
	for i := 0; i < 63; i++ {
		wg.Add(1)
		go read()
	}
	waitQueued(b, 63)
	close(gate)
	wg.Wait()
	if r := rounds.Load(); r != 2 {
		t.Fatalf("64 readers took %d rounds, want 2 (the first, then one for the 63 that queued)", r)
	}
}

// waitQueued spins until n readers are queued for the next round. It waits
// for other goroutines to register, not for time to pass.
func waitQueued(b *readBarrier, n int) {
	for {
		b.mu.Lock()
		q := len(b.waiting)
		b.mu.Unlock()
		if q >= n {
			return
		}
		runtime.Gosched()
	}
}

// TestConsistentReadSoleVoter: a leader alone in the latest configuration
// answers consistent reads without a verification round; once any other
// server is in the configuration (here a non-voter, which leaves the quorum
// at one so the round can succeed), every consistent read goes through the
// read barrier again.
func TestConsistentReadSoleVoter(t *testing.T) {
	s := newTestServer(t, "", clocktest.NewFake(epoch))
	var rounds atomic.Int32
	verify := s.reads.verify
	s.reads.verify = func() error {
		rounds.Add(1)
		return verify()
	}
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if err := s.ConsistentRead(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := rounds.Load(); n != 0 {
		t.Fatalf("sole voter: %d verification rounds, want 0", n)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.ConsistentRead(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("sole voter with a cancelled context: %v, want context.Canceled", err)
	}

	other, _ := raft.NewInmemTransport("node2")
	if err := s.raft.AddNonvoter("node2", other, 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.ConsistentRead(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rounds.Load(); n != 1 {
		t.Fatalf("with a second server: %d verification rounds, want 1", n)
	}
}
