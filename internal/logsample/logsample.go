// Package logsample keeps a repeated log line to one per interval: the
// first event after the interval is logged, with how many came since the
// line before, and the rest are only counted. A client polling a server
// that is still replaying its log, or 40,000 sessions lapsing at once
// after a restart, make a few lines rather than one per event, and a lone
// event is still logged at once.
package logsample

import (
	"sync"
	"time"
)

// Sampler counts events; its zero value is ready and logs the first.
type Sampler struct {
	// Every is the least time between two logged events.
	Every time.Duration

	mu    sync.Mutex
	next  time.Time
	count int
}

// Note counts one event at now and returns how many to report with it
// (itself and those held back since the last line), or 0 to log nothing.
func (s *Sampler) Note(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count++
	if now.Before(s.next) {
		return 0
	}
	n := s.count
	s.count = 0
	s.next = now.Add(s.Every)
	return n
}
