package server

import (
	"context"
	"sync"
)

// readBarrier coalesces leadership verifications for consistent reads.
//
// A read that arrives while a verification is in flight cannot use that
// one's answer (it may have started before the read arrived, and a
// leadership change in between would go unseen), so it waits for the next
// round. Every read that arrived during round N is answered by round N+1:
// one quorum round trip serves them all, instead of one per read.
//
// Ownership: mu guards waiting and running; one goroutine at a time runs a
// round (the one that found running false), and it keeps running rounds
// while new readers queue up.
type readBarrier struct {
	verify func() error

	mu      sync.Mutex
	waiting []chan error
	running bool
}

// wait returns once a verification that started after the call succeeded
// (nil) or failed (its error), or when ctx ends.
func (b *readBarrier) wait(ctx context.Context) error {
	ch := make(chan error, 1)
	b.mu.Lock()
	b.waiting = append(b.waiting, ch)
	if !b.running {
		b.running = true
		go b.loop()
	}
	b.mu.Unlock()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *readBarrier) loop() {
	for {
		b.mu.Lock()
		batch := b.waiting
		b.waiting = nil
		if len(batch) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		// Every reader in batch registered before this round starts.
		err := b.verify()
		for _, ch := range batch {
			ch <- err
		}
	}
}
