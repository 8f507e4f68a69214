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
	stopOnce sync.Once

	relMu sync.Mutex // serialises giveUp

	mu       sync.Mutex
	released bool // the server was told: giveUp's free succeeded
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

// giveUp gives the hold up: it stops the monitor, waits for it, closes
// Lost with ErrReleased, and then calls free, which tells the server. It
// returns false if an earlier call has done all that. When free fails
// the hold stays given up here (no monitor, Lost closed) but not
// released, and the next call tries free again: a holder whose release
// met an unreachable server can retry it, and until it has, the key and
// the queue entry stay with its session, so the Lock or Semaphore keeps
// the hold as its current one rather than take the key anew under the
// same sequencer. Calls are serialised.
func (h *holding) giveUp(free func() error) (bool, error) {
	h.relMu.Lock()
	defer h.relMu.Unlock()
	h.mu.Lock()
	done := h.released
	h.mu.Unlock()
	if done {
		return false, nil
	}
	h.stopOnce.Do(func() {
		h.stop()
		<-h.monitor
	})
	h.markLost(ErrReleased)
	if err := free(); err != nil {
		return true, err
	}
	h.mu.Lock()
	h.released = true
	h.mu.Unlock()
	return true, nil
}
