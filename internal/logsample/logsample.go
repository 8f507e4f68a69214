// Package logsample keeps a repeated log line to one per interval: the
// first event after the interval is logged, with how many came since the
// line before, and the rest are only counted; the count of a burst that
// nothing follows is handed to a flush when its interval ends. A client
// polling a server that is still replaying its log, or 40,000 sessions
// lapsing at once after a restart, make a few lines rather than one per
// event, and a lone event is still logged at once.
package logsample

import (
	"sync"
	"time"

	"github.com/holdfast/holdfast/clock"
)

// Sampler counts events; with Every set it is ready, and logs the first.
type Sampler struct {
	// Every is the least time between two logged events.
	Every time.Duration
	// Flush, if set, is called with the number of events held back when
	// their interval ends with no later event to report them, on a timer
	// of Clock.
	Flush func(n int)
	// Clock reads the time of each event and runs Flush's timer: the
	// caller's, so that a test's fake clock moves both (nil: the real one).
	Clock clock.Clock

	mu    sync.Mutex
	next  time.Time
	count int
	armed bool
}

// Note counts one event, now on Clock, and returns how many to report with it
// (itself and those held back since the last line), or 0 to log nothing.
func (s *Sampler) Note() int {
	c := s.Clock
	if c == nil {
		c = clock.Real()
	}
	now := c.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count++
	if now.Before(s.next) {
		if s.Flush != nil && !s.armed {
			s.armed = true
			c.AfterFunc(s.next.Sub(now), s.flush)
		}
		return 0
	}
	n := s.count
	s.count = 0
	s.next = now.Add(s.Every)
	return n
}

// flush hands the events held back to Flush.
func (s *Sampler) flush() {
	s.mu.Lock()
	n := s.count
	s.count = 0
	s.armed = false
	s.mu.Unlock()
	if n > 0 {
		s.Flush(n)
	}
}
