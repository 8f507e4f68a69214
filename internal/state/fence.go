package state

import (
	"encoding/json"
	"fmt"
	"strings"
)

// SemaphoreFlags is the Flags value of a semaphore's .lock key and of its
// contenders' entries in Consul's semaphore recipe, which holdfast's
// (api/recipe.Semaphore) shares.
const SemaphoreFlags uint64 = 0xe0f69a2baa414de0

// semaphoreLockName is the last segment of a semaphore's .lock key: the
// semaphore on prefix P keeps its holders in P/.lock and each contender's
// entry in P/<session>.
const semaphoreLockName = ".lock"

// CheckSequencer reports (as nil) whether the sequencer (key, session,
// index) names a hold that is current; get reads a key (nil if absent).
//
// For a lock, that is the key held by session at LockIndex index.
//
// For a semaphore's .lock key (Flags SemaphoreFlags) it is a permit: index
// is the .lock key's ModifyIndex right after the write that granted it.
// The permit is current while session is among the holders listed in the
// .lock value and its contender entry is held by session and was last
// written no later than index. A session contends (writes its entry)
// before each permit it is granted, so a later permit of the same session
// has a higher index and the earlier one's sequencer fails; a session
// that ends loses its entry and every sequencer it had.
func CheckSequencer(get func(key string) *DirEntry, key, session string, index uint64) error {
	cur := get(key)
	if !IsSemaphoreLock(cur) {
		return checkLock(cur, key, session, index)
	}
	var lk struct{ Holders map[string]bool }
	if err := json.Unmarshal(cur.Value, &lk); err != nil {
		return fmt.Errorf("failed permit check for semaphore %q: its value is not a semaphore's holder list: %v", key, err)
	}
	switch {
	case session == "" || !lk.Holders[session]:
		return fmt.Errorf("failed permit check for semaphore %q: session %q holds no permit", key, session)
	case index > cur.ModifyIndex:
		return fmt.Errorf("failed permit check for semaphore %q: index %d is ahead of the semaphore's %d", key, index, cur.ModifyIndex)
	}
	ckey := strings.TrimSuffix(key, semaphoreLockName) + session
	c := get(ckey)
	switch {
	case c == nil || c.Session != session:
		return fmt.Errorf("failed permit check for semaphore %q: the contender entry %q is not held by session %q", key, ckey, session)
	case c.ModifyIndex > index:
		return fmt.Errorf("failed permit check for semaphore %q: session %q contended again at index %d, after the permit at %d",
			key, session, c.ModifyIndex, index)
	}
	return nil
}

// IsSemaphoreLock reports whether e is a semaphore's .lock key: named so,
// with the semaphore's Flags. CheckSequencer checks a permit on such a key,
// a lock on any other.
func IsSemaphoreLock(e *DirEntry) bool {
	return e != nil && e.Flags == SemaphoreFlags &&
		(e.Key == semaphoreLockName || strings.HasSuffix(e.Key, "/"+semaphoreLockName))
}

// checkLock is the lock check: key held by session at LockIndex index.
func checkLock(cur *DirEntry, key, session string, index uint64) error {
	if cur == nil {
		return fmt.Errorf("failed to check lock, key %q doesn't exist", key)
	}
	if session == "" || cur.Session != session || cur.LockIndex != index {
		return fmt.Errorf("failed lock check for key %q: held by session %q at lock index %d, not %q at %d",
			key, cur.Session, cur.LockIndex, session, index)
	}
	return nil
}
