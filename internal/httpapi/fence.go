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
}

// fence serves holdfast's sequencer check (not part of Consul's API):
//
//	GET /v1/fence/<key>?session=S&lock-index=N
//
// A lock holder hands (key, S, N) to a resource it writes to; the resource
// asks here whether that sequencer is still current before acting on it.
// The answer is always 200 with {"Valid":…,"Session":…,"LockIndex":…}:
// Valid is true exactly when <key> is held by session S at LockIndex N,
// and Session and LockIndex are the key's current holder and index ("" and
// 0 for a free or missing key), so a refused caller can see who moved on.
//
// Unlike other reads the check is consistent by default (a stale "valid"
// would defeat the purpose); ?stale opts out. It takes the usual blocking
// parameters, so a resource may wait for the sequencer to go stale, and it
// reports the key's index in X-Consul-Index. A missing session or
// lock-index, or a lock-index that is not a positive integer, is a 400.
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
	err = h.read(w, r, ro, func(s *state.Store, ws watch.Set) (uint64, bool) {
		idx, e := s.KVGet(ws, key)
		ent = e
		return idx, e != nil
	})
	if err != nil {
		return err
	}
	out := fenceJSON{}
	if ent != nil {
		out.Session, out.LockIndex = ent.Session, ent.LockIndex
		out.Valid = ent.Session == sess && ent.LockIndex == li
	}
	return writeJSON(w, r, out)
}
