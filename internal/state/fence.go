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

// SemaphoreLockName is the last segment of a semaphore's .lock key: the
// semaphore on prefix P keeps its holders in P/.lock and each contender's
// entry in P/<session>.
const SemaphoreLockName = ".lock"

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
	if cur == nil || cur.Flags != SemaphoreFlags || !isSemaphoreLock(key) {
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
	ckey := SemaphoreContender(key, session)
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

// isSemaphoreLock reports whether key is named as a semaphore's .lock key.
func isSemaphoreLock(key string) bool {
	return key == SemaphoreLockName || strings.HasSuffix(key, "/"+SemaphoreLockName)
}

// SemaphoreContender returns the key of session's contender entry in the
// semaphore whose .lock key is lockKey.
func SemaphoreContender(lockKey, session string) string {
	return strings.TrimSuffix(lockKey, SemaphoreLockName) + session
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
