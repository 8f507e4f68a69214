package httpserve

import (
	"context"
	"slices"
	"sync"
	"time"
)

// reqCtx is a request's context: what context.WithCancel(Background())
// gives, without its cost for the many requests that never look at Done
// (a KV write is answered before anything could cancel it). Its channel
// is made on the first Done, and a context derived from it (WithTimeout,
// AfterFunc) registers through its AfterFunc method instead of a
// goroutine, as the context package lets a parent do.
type reqCtx struct {
	mu    sync.Mutex
	done  chan struct{}
	err   error
	after []*func()
}

// closedCh is the Done channel of a context cancelled before anyone
// asked for one.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *reqCtx) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c *reqCtx) Value(any) any { return nil }

func (c *reqCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *reqCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		if c.err != nil {
			return closedCh
		}
		c.done = make(chan struct{})
	}
	return c.done
}

// AfterFunc runs f in its own goroutine once c is cancelled (at once if it
// already is). stop unregisters f and reports whether that kept it from
// running.
func (c *reqCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	p := &f
	c.after = append(c.after, p)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if i := slices.Index(c.after, p); i >= 0 {
			c.after = slices.Delete(c.after, i, i+1)
			return true
		}
		return false
	}
}

// cancel cancels c; calls after the first do nothing.
func (c *reqCtx) cancel() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = context.Canceled
	if c.done != nil {
		close(c.done)
	}
	after := c.after
	c.after = nil
	c.mu.Unlock()
	for _, f := range after {
		go (*f)()
	}
}

func (c *reqCtx) String() string { return "httpserve.requestContext" }
