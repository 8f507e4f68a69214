package httpapi

import (
	"net/http"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// fenceJSON is the answer of GET /v1/fence/<key>.
type fenceJSON struct {
	Valid     bool
	Session   string
	LockIndex uint64
	Reason    string `json:",omitempty"`
}

// fence serves holdfast's sequencer check (not part of Consul's API):
//
//	GET /v1/fence/<key>?session=S&lock-index=N
//
// A holder hands (key, S, N) to a resource it writes to; the resource asks
// here whether that sequencer is still current before acting on it. The
// answer is always 200 with {"Valid":…,"Session":…,"LockIndex":…}, and a
// Reason when it is not valid:
//   - for a lock, Valid is true exactly when <key> is held by session S at
//     LockIndex N, and Session and LockIndex are the key's current holder
//     and index ("" and 0 for a free or missing key), so a refused caller
//     can see who moved on;
//   - for a semaphore's .lock key, (key, S, N) names a permit granted by
//     the write of .lock at index N (state.CheckSequencer); Session and
//     LockIndex echo S and N when it is current, "" and 0 otherwise.
//
// Unlike other reads the check is consistent by default (a stale "valid"
// would defeat the purpose); ?stale opts out. It takes the usual blocking
// parameters, so a resource may wait for the sequencer to go stale, and it
// reports in X-Consul-Index the index of the key (and of the permit's
// contender entry). A missing session or lock-index, or a lock-index that
// is not a positive integer, is a 400.
func (h *handler) fence(w http.ResponseWriter, r *http.Request, key string) error {
	q := r.URL.Query()
	ro, err := h.parseRead(q)
	if err != nil {
		return err
	}
	if _, stale := q["stale"]; !stale {
		if _, maxStale := q["max_stale"]; !maxStale {
			ro.mode = modeConsistent
		}
	}
	if err := validateKey(key); err != nil {
		return err
	}
	if key == "" {
		return invalidf("Missing key name")
	}
	sess := q.Get("session")
	if sess == "" {
		return invalidf("Missing session: give the sequencer's ?session=")
	}
	if _, ok := q["lock-index"]; !ok {
		return invalidf("Missing lock-index: give the sequencer's ?lock-index=")
	}
	li, err := parseUint("lock-index", q.Get("lock-index"))
	if err != nil {
		return err
	}
	if li == 0 {
		return invalidf("Invalid lock-index 0: a held lock's index is at least 1")
	}
	var ent *state.DirEntry
	var invalid error
	err = h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		var top uint64
		ent = nil
		get := func(k string) *state.DirEntry {
			idx, e := s.KVGet(ws, k)
			top = max(top, idx)
			if k == key && ent == nil {
				ent = e
			}
			return e
		}
		invalid = state.CheckSequencer(get, key, sess, li)
		return top, ent != nil
	})
	if err != nil {
		return err
	}
	out := fenceJSON{Valid: invalid == nil}
	switch {
	case state.IsSemaphoreLock(ent):
		if out.Valid {
			out.Session, out.LockIndex = sess, li
		}
	case ent != nil:
		out.Session, out.LockIndex = ent.Session, ent.LockIndex
	}
	if invalid != nil {
		out.Reason = invalid.Error()
	}
	return writeJSON(w, r, out)
}
