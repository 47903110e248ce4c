package pipeline

import (
	"time"

	"github.com/runnel-dev/runnel/state"
)

// HasEventTimer reports whether the current key has an event timer at t
// that has neither fired nor been deleted. It reads only the in-memory
// timer index, never the store: operators use it to learn that state tied
// to a timer does not exist without reading it (the window operator does,
// for new windows).
func (c *KeyedContext[K, U]) HasEventTimer(t time.Time) bool {
	ns, err := timerNanos(t)
	return err == nil && c.timers.Has(state.EventTime, ns)
}

// HasProcessingTimer is HasEventTimer for processing-time timers.
func (c *KeyedContext[K, U]) HasProcessingTimer(t time.Time) bool {
	ns, err := timerNanos(t)
	return err == nil && c.timers.Has(state.ProcessingTime, ns)
}
