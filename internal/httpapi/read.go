package httpapi

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// Consistency modes, as reported in X-Consul-Effective-Consistency.
const (
	modeLeader     = "leader"
	modeConsistent = "consistent"
	modeStale      = "stale"
)

// readOpts are the query parameters every read takes.
type readOpts struct {
	index uint64        // the index the client has seen; 0 = do not block
	wait  time.Duration // how long to block, defaulted and clamped
	mode  string        // modeLeader, modeConsistent or modeStale
	// maxStale bounds a stale read (?max_stale): a server whose last
	// contact with the leader is older, or that knows no leader, serves
	// it as a default read instead, which needs a known leader (Consul
	// forwards such a read to the leader; a single server is its own, so
	// the read then fails with "No cluster leader" only when there is
	// none). 0: no bound.
	maxStale time.Duration
}

// parseRead parses index, wait, stale, consistent, cached and max_stale.
// Flags are present-or-absent, as in Consul: "?stale=false" is still stale.
func (h *handler) parseRead(q url.Values) (*readOpts, error) {
	ro := &readOpts{mode: modeLeader}
	_, stale := q["stale"]
	_, consistent := q["consistent"]
	_, cached := q["cached"]
	if v, ok := q["max_stale"]; ok {
		if s := v[0]; s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 {
				return nil, invalidf("Invalid max_stale value %q", s)
			}
			ro.maxStale = d
		}
		stale = true
	}
	if stale && consistent {
		return nil, invalidf("Cannot specify ?stale with ?consistent, conflicting semantics.")
	}
	if cached && consistent {
		return nil, invalidf("Cannot specify ?cached with ?consistent, conflicting semantics.")
	}
	switch {
	case consistent:
		ro.mode = modeConsistent
	case stale:
		ro.mode = modeStale
	}
	ro.wait = h.opts.DefaultWait
	if s := q.Get("wait"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return nil, invalidf("Invalid wait time")
		}
		if d > 0 {
			ro.wait = d
		}
	}
	if ro.wait > h.opts.MaxWait {
		ro.wait = h.opts.MaxWait
	}
	if s := q.Get("index"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, invalidf("Invalid index")
		}
		ro.index = n
	}
	return ro, nil
}

// evalFunc reads from one store and registers what it read in ws. It
// returns the index to report and whether the object exists (a list is
// always found; see watch.Query).
type evalFunc func(s *state.Store, ws watch.Set) (index uint64, found bool)

// read runs eval as a (possibly blocking) query and sets the read headers
// on w. The caller keeps eval's last result and writes the body.
//
// Every evaluation calls Backend.State() afresh, so a store replaced by a
// snapshot restore is picked up; under ?consistent every evaluation first
// waits for Backend.ConsistentRead. A read that is not stale fails with
// "No cluster leader" while no leader is known.
func (h *handler) read(w http.ResponseWriter, r *http.Request, ro *readOpts, eval evalFunc) error {
	if ro.mode == modeStale && ro.maxStale > 0 {
		// The last contact with a leader counts, known now or not: a
		// server whose majority is gone still answers a read that
		// accepts that much staleness (the cluster audit).
		if _, last := h.b.LeaderStatus(); last > ro.maxStale {
			m := *ro
			m.mode = modeLeader // too stale to answer from here
			ro = &m
		}
	}
	if ro.mode != modeStale {
		if known, _ := h.b.LeaderStatus(); !known {
			return errNoLeader
		}
	} else if !h.b.Replayed() {
		// A server still replaying its log at start answers even a stale
		// read as Consul's does before it has heard from a leader.
		return errNoLeader
	}
	ctx := r.Context()
	var index uint64
	q := func(ws watch.Set) (uint64, bool, error) {
		if ro.mode == modeConsistent {
			if err := h.b.ConsistentRead(ctx); err != nil {
				return 0, false, err
			}
		}
		idx, found := eval(h.b.State(), ws)
		// The header never says 0 (clients take 0 as "do not block"), so
		// an empty table reports 1; the comparison must use the same
		// number, or a client that sends back index=1 finds the server
		// "behind" its index and is answered at once, in a busy loop.
		if idx == 0 {
			idx = 1
		}
		index = idx
		return idx, found, nil
	}
	wo := watch.Options{MinIndex: ro.index, Stop: h.opts.Stop}
	if ro.index > 0 {
		// A server that does not watch every connection for a client
		// that goes away (internal/httpserve) is asked to watch this one:
		// the query may park for minutes.
		if dw, ok := w.(interface{ WatchDisconnect() }); ok {
			dw.WatchDisconnect()
		}
		wo.Wait = ro.wait
		if h.opts.Jitter != nil {
			if j := h.opts.Jitter(ro.wait / 16); j > 0 {
				wo.Wait += j
			}
		}
	}
	if err := watch.Block(ctx, h.opts.Clock, wo, q); err != nil {
		return err
	}
	h.setReadHeaders(w, index, ro.mode)
	return nil
}

// setReadHeaders sets the headers Consul's clients parse on every read.
// The index is never 0: clients treat 0 as "do not block".
func (h *handler) setReadHeaders(w http.ResponseWriter, index uint64, mode string) {
	if index == 0 {
		index = 1
	}
	known, last := h.b.LeaderStatus()
	hd := w.Header()
	// One allocation for the three per-response values instead of one
	// string and one slice each (hd.Set): this runs on every read and on
	// every wake-up of a blocking query. The keys are written in the
	// canonical form hd.Set would give them (what goes on the wire).
	var buf [40]byte
	num := strconv.AppendUint(buf[:0], index, 10)
	n := len(num)
	num = strconv.AppendInt(num, last.Milliseconds(), 10)
	str := string(num)
	vals := []string{str[:n], str[n:]}
	hd["X-Consul-Index"] = vals[0:1:1]
	if known {
		hd["X-Consul-Knownleader"] = hvTrue
	} else {
		hd["X-Consul-Knownleader"] = hvFalse
	}
	if last == 0 {
		hd["X-Consul-Lastcontact"] = hvZero
	} else {
		hd["X-Consul-Lastcontact"] = vals[1:2:2]
	}
	switch mode {
	case modeLeader:
		hd["X-Consul-Effective-Consistency"] = hvModeLeader
	case modeConsistent:
		hd["X-Consul-Effective-Consistency"] = hvModeConsistent
	case modeStale:
		hd["X-Consul-Effective-Consistency"] = hvModeStale
	default:
		hd.Set("X-Consul-Effective-Consistency", mode)
	}
}

// readList runs a blocking read of something that always exists (a list,
// a map: empty is an answer, not a 404) and returns its last evaluation.
func readList[T any](h *handler, w http.ResponseWriter, r *http.Request, ro *readOpts, get func(*state.Store, watch.Set) (uint64, T)) (T, error) {
	var out T
	err := h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		idx, v := get(s, ws)
		out = v
		return idx, true
	})
	return out, err
}

// readScoped is readList for a list scoped to one node (its checks, its
// sessions), whose index is its table's: an empty list counts as missing,
// so while it stays empty a wake-up from a write elsewhere in the table
// (the store's watch on an empty range is shared with its neighbours)
// re-baselines and keeps waiting instead of answering the same empty list
// with a new index. A list that empties, or fills, answers.
func readScoped[T any](h *handler, w http.ResponseWriter, r *http.Request, ro *readOpts, get func(*state.Store, watch.Set) (uint64, []T)) ([]T, error) {
	var out []T
	err := h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		idx, v := get(s, ws)
		out = v
		return idx, len(v) > 0
	})
	return out, err
}
