package recipe

import (
	"context"
	"sync"
)

// holding is what every hold has, whatever it holds (a Hold of a Lock, a
// Permit of a Semaphore): the sequencer naming it, the Lost channel and the
// reason it was closed, and the monitor goroutine that watches the hold
// until it is given up.
type holding struct {
	seq  Sequencer
	lost chan struct{}

	lostOnce sync.Once
	stop     context.CancelFunc
	monitor  chan struct{} // closed when the monitor has stopped

	mu       sync.Mutex
	released bool
	why      error
}

func (h *holding) init(seq Sequencer) {
	h.seq = seq
	h.lost = make(chan struct{})
	h.monitor = make(chan struct{})
}

// Sequencer names the hold; hand it to the resources it guards.
func (h *holding) Sequencer() Sequencer { return h.seq }

// Lost is closed the moment the hold is lost (see the holding type's
// documentation for what loses it), and also when it is given up.
func (h *holding) Lost() <-chan struct{} { return h.lost }

// Err says why the hold was lost, nil while it is held.
func (h *holding) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.why
}

func (h *holding) markLost(why error) {
	h.lostOnce.Do(func() {
		h.mu.Lock()
		h.why = why
		h.mu.Unlock()
		close(h.lost)
	})
}

// startMonitor runs watch on its own goroutine until giveUp. Its context
// keeps ctx's values but not its cancellation: the hold outlives the call
// that took it.
func (h *holding) startMonitor(ctx context.Context, watch func(context.Context)) {
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.stop = cancel
	go func() {
		defer close(h.monitor)
		watch(mctx)
	}()
}

// giveUp marks the hold released, stops its monitor, waits for it, and
// closes Lost with ErrReleased. It returns false if the hold was already
// given up.
func (h *holding) giveUp() bool {
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return false
	}
	h.released = true
	h.mu.Unlock()
	h.stop()
	<-h.monitor
	h.markLost(ErrReleased)
	return true
}
