package server

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
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
