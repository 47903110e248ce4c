package state

import "iter"

// TimeDomain says which clock a timer follows.
type TimeDomain uint8

const (
	// EventTime timers fire when the watermark passes them.
	EventTime TimeDomain = 1
	// ProcessingTime timers fire by the wall clock.
	ProcessingTime TimeDomain = 2
)

// Timer is a registered timer. Key is the caller's copy.
type Timer struct {
	Domain    TimeDomain
	Timestamp int64
	KeyGroup  uint16
	Key       []byte
}

// Timers are per-key timers, persisted as state of the backend (so they are
// checkpointed and restored like any state) and indexed in memory (loaded
// from the store on NewTimers, for the backend's key groups). Timestamps are
// in the caller's unit; (domain, timestamp, key) is unique. Not safe for
// concurrent use (see Backend).
type Timers struct {
	b *Backend
}

// NewTimers registers the timer service name on b and loads its timers.
func NewTimers(b *Backend, name string) (*Timers, error) { return nil, errNotImplemented }

// Register adds a timer for the current key (a duplicate is a no-op).
func (t *Timers) Register(d TimeDomain, ts int64) error { return errNotImplemented }

// Delete removes the current key's timer (absent is a no-op).
func (t *Timers) Delete(d TimeDomain, ts int64) error { return errNotImplemented }

// NextTimestamp returns the earliest timer's timestamp in domain d.
func (t *Timers) NextTimestamp(d TimeDomain) (int64, bool) { return 0, false }

// PopDue removes and returns the earliest timer of domain d with
// Timestamp <= upTo; false when none is due.
func (t *Timers) PopDue(d TimeDomain, upTo int64) (Timer, bool, error) {
	return Timer{}, false, errNotImplemented
}

// Due yields (and removes) the due timers of domain d in timestamp order
// (ties by key group, then key). Timers registered during the iteration at
// or below upTo are yielded too. On an error it yields it and stops.
func (t *Timers) Due(d TimeDomain, upTo int64) iter.Seq2[Timer, error] {
	return func(yield func(Timer, error) bool) {
		for {
			tm, ok, err := t.PopDue(d, upTo)
			if err != nil {
				yield(Timer{}, err)
				return
			}
			if !ok || !yield(tm, nil) {
				return
			}
		}
	}
}

// Len returns the number of registered timers in domain d.
func (t *Timers) Len(d TimeDomain) int { return 0 }
