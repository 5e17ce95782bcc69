package retryable

import (
	"sync"
	"time"
)

// Retries keeps, per failed call (a key of the caller's), when this process tries it again.
// The caller's record holds the same time, for a restart; this copy goes first, because a pass
// can read a copy of the record from before the write that set it (the cache lags berth's own
// writes, an event queued meanwhile reads the older copy, and a write that conflicted never
// landed), and that copy would let the call go again at once. Its zero value is ready to use.
type Retries struct{ m sync.Map } // key → entry

type entry struct {
	tag string
	at  time.Time
}

// Set keeps that the call of key goes again at at. tag tells apart what the key may stand for
// over time (a record re-created under the same name, a later phase of it): Wait with another
// tag does not see this time.
func (r *Retries) Set(key, tag string, at time.Time) { r.m.Store(key, entry{tag, at}) }

// Forget drops key.
func (r *Retries) Forget(key string) { r.m.Delete(key) }

// Wait is how long the call of key (with tag) still waits at now, 0 once it is due: the time
// this process set, else recorded, the record's (zero: none).
func (r *Retries) Wait(key, tag string, recorded, now time.Time) time.Duration {
	at := recorded
	if e, ok := r.m.Load(key); ok && e.(entry).tag == tag {
		at = e.(entry).at
	}
	return max(at.Sub(now), 0)
}
