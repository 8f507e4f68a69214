package server

import (
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// applier is the part of *raft.Raft the apply gate uses.
type applier interface {
	Apply(cmd []byte, timeout time.Duration) raft.ApplyFuture
}

// gateBatch is the most commands the gate lets into raft at once: half of
// the apply channel (maxAppendEntries), leaving the other half as headroom
// for Barrier, so that no Apply ever waits for room in the channel.
const gateBatch = maxAppendEntries / 2

// applyGate lets one batch of commands into raft at a time.
//
// Why: raft's leader loop stores a batch of entries (a write and an fsync)
// and then chooses at random between handing the stored batch to the state
// machine and storing the entries that arrived meanwhile. Under a steady
// stream of writes it picks the second half the time, so a write that was
// already on disk waited for one more store, on average, before it was
// applied and answered. With the gate, the entries that arrive while a
// batch is in raft wait here instead; raft's apply channel is empty when
// the batch is stored, the leader loop has only the commit to do, and the
// waiting commands go in together, as the next batch, as soon as it is
// applied. Each command is still its own log entry with its own index.
//
// Nobody runs the gate: the command whose Apply opened the current batch,
// or the last command of it, holds the baton, and once its future has
// finished it lets in the next batch (or closes the gate when none waits).
// The state machine answers a batch's entries in log order, so the last
// one finishing means the batch is through.
//
// Measured on a single voter, where a batch is through once it is on the
// local disk. With more voters it is through only once a quorum has stored
// it, and the gate would also hold the next batch for the network's round
// trip, where raft alone pipelines its appends: measure it there before
// keeping it for clusters.
type applyGate struct {
	mu      sync.Mutex
	busy    bool // a batch is in raft
	waiting []*gatedCommand
	// closed refuses new commands; drained, once the gate is closed, is
	// closed when the batch in raft is through.
	closed  bool
	drained chan struct{}
	// holders wait, in order, for the baton outside any batch (see hold);
	// held is set while one has it.
	holders []chan struct{}
	held    bool
	// epoch counts the restores of a backup (see replaced and enterAt).
	epoch uint64
}

// errStateReplaced refuses a command that was decided on a state a restore
// has since replaced (see enterAt).
var errStateReplaced = errors.New("server: the state this command was decided on was replaced by a restore")

// gatedCommand is a command waiting for the next batch.
type gatedCommand struct {
	cmd []byte
	f   raft.ApplyFuture
	// baton is set on the batch's last command.
	baton bool
	// epoch, if pinned, is the gate's epoch the command was decided in.
	epoch  uint64
	pinned bool
	// in is closed once f is set.
	in chan struct{}
}

// enter hands cmd to raft, at once if no batch is in raft, or else with
// the next batch. It returns the command's future and whether the caller
// holds the baton, in which case it must call pass once the future has
// finished, whatever its outcome.
func (g *applyGate) enter(r applier, cmd []byte) (raft.ApplyFuture, bool) {
	return g.enterAt(r, cmd, 0, false)
}

// enterAt is enter for a command the leader decided on the state of gate
// epoch epoch (read with Epoch before it looked): a session expiry judged
// on a session that existed. If pinned and a restore has replaced the
// state since, the command is refused with errStateReplaced rather than
// applied to the restored state.
func (g *applyGate) enterAt(r applier, cmd []byte, epoch uint64, pinned bool) (raft.ApplyFuture, bool) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return refusedFuture{raft.ErrRaftShutdown}, false
	}
	if pinned && epoch != g.epoch {
		g.mu.Unlock()
		return refusedFuture{errStateReplaced}, false
	}
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		return r.Apply(cmd, 0), true
	}
	w := &gatedCommand{cmd: cmd, in: make(chan struct{}), epoch: epoch, pinned: pinned}
	g.waiting = append(g.waiting, w)
	g.mu.Unlock()
	<-w.in
	return w.f, w.baton
}

// pass lets the waiting commands into raft as one batch, up to gateBatch
// of them, and gives the baton to the last; with none waiting it closes
// the gate.
func (g *applyGate) pass(r applier) {
	g.mu.Lock()
	g.held = false
	if len(g.holders) > 0 {
		h := g.holders[0]
		g.holders = g.holders[1:]
		g.held = true
		g.mu.Unlock()
		close(h) // the gate stays busy: the holder has the baton
		return
	}
	n := len(g.waiting)
	if n == 0 {
		g.busy = false
		if g.drained != nil {
			close(g.drained)
			g.drained = nil
		}
		g.mu.Unlock()
		return
	}
	if n > gateBatch {
		n = gateBatch
	}
	batch := make([]*gatedCommand, n)
	copy(batch, g.waiting)
	rest := copy(g.waiting, g.waiting[n:])
	clear(g.waiting[rest:])
	g.waiting = g.waiting[:rest]
	g.mu.Unlock()

	// All of the batch goes into the apply channel before any of its
	// callers is woken, so that the leader loop finds it there whole
	// rather than competing with them for a CPU.
	for _, w := range batch {
		w.f = r.Apply(w.cmd, 0)
	}
	batch[n-1].baton = true
	for _, w := range batch {
		close(w.in)
	}
}

// hold takes the baton outside any batch: it waits until the batch in
// raft, if any, is through, and from then on every command waits until the
// caller calls pass. A restore of a backup uses it, so that no write is in
// raft or the state machine while it reads the state it replaces. It
// refuses (ErrRaftShutdown) once the gate is closed.
func (g *applyGate) hold() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return raft.ErrRaftShutdown
	}
	if !g.busy {
		g.busy, g.held = true, true
		g.mu.Unlock()
		return nil
	}
	ready := make(chan struct{})
	g.holders = append(g.holders, ready)
	g.mu.Unlock()
	<-ready
	return nil
}

// idle returns a channel closed once no batch is in raft and no command
// waits (at once if so now).
func (g *applyGate) idle() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.idleLocked()
}

// idleLocked is idle with g.mu held.
func (g *applyGate) idleLocked() <-chan struct{} {
	if !g.busy {
		done := make(chan struct{})
		close(done)
		return done
	}
	if g.drained == nil {
		g.drained = make(chan struct{})
	}
	return g.drained
}

// holding reports whether a holder (a restore) has the baton.
func (g *applyGate) holding() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// Epoch is the count of restores so far (see enterAt).
func (g *applyGate) Epoch() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epoch
}

// replaced is called by the holder once a restore has replaced the state:
// it starts a new epoch and refuses the pinned commands waiting, which
// were decided on the state replaced.
func (g *applyGate) replaced() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.epoch++
	kept := g.waiting[:0]
	for _, w := range g.waiting {
		if w.pinned {
			w.f = refusedFuture{errStateReplaced}
			close(w.in)
			continue
		}
		kept = append(kept, w)
	}
	clear(g.waiting[len(kept):])
	g.waiting = kept
}

// close refuses every command from now on, the waiting ones included, and
// returns a channel closed once the batch in raft, if any, is through.
//
// Why: raft's apply channel is buffered (BatchApplyCh), and a future left
// in it when raft shuts down is never answered, so its caller would wait
// for ever. The server closes the gate and waits for it to drain before
// it shuts raft down.
func (g *applyGate) close() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for _, w := range g.waiting {
		w.f = refusedFuture{raft.ErrRaftShutdown}
		close(w.in)
	}
	g.waiting = nil
	return g.idleLocked()
}

// refusedFuture is the answer to a command the gate did not let in.
type refusedFuture struct{ err error }

func (f refusedFuture) Error() error          { return f.err }
func (f refusedFuture) Response() interface{} { return nil }
func (f refusedFuture) Index() uint64         { return 0 }
