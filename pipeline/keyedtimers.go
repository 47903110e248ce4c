package pipeline

import (
	"context"
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

// GroupTimerFunc is implemented by a KeyedProcessFunc that registers key
// group timers (RegisterGroupEventTimer): OnGroupTimer is called when one
// fires, with no current key. It finds the keys concerned itself (typically
// from an index it keeps in memory and rebuilds from its state when it
// starts) and acts on each through KeyedContext.ForKey.
type GroupTimerFunc[K comparable, U any] interface {
	OnGroupTimer(ctx *KeyedContext[K, U], keyGroup uint16, t Timer) error
}

// RegisterGroupEventTimer registers an event-time timer of key group kg
// (one of the subtask's: CurrentKeyGroup, or one that Backend's
// KeyGroupRange holds) that fires when the watermark reaches t, with
// OnGroupTimer (the function must implement GroupTimerFunc). One timer
// stands for every key of the group: a duplicate is a no-op. Like a key's
// timers it is checkpointed and restored with the key group's state.
func (c *KeyedContext[K, U]) RegisterGroupEventTimer(kg uint16, t time.Time) error {
	ns, err := timerNanos(t)
	if err != nil {
		return err
	}
	return c.timers.RegisterGroup(kg, ns)
}

// CurrentKeyGroup returns the current key's key group (in OnGroupTimer, the
// firing timer's until ForKey selects a key).
func (c *KeyedContext[K, U]) CurrentKeyGroup() uint16 { return c.backend.CurrentKeyGroup() }

// CurrentKeyBytes returns the current key's encoding (owned by the
// backend: valid until the key changes, not to be modified).
func (c *KeyedContext[K, U]) CurrentKeyBytes() []byte { return c.backend.CurrentKey() }

// DecodeKey decodes a key's encoding (as CurrentKeyBytes or
// state.Map.Entries give it) with the stream's key codec.
func (c *KeyedContext[K, U]) DecodeKey(b []byte) (K, error) { return c.task.decodeKey(b) }

// ForKey makes k, of key group kg, the current key and calls fn, as a
// timer of k would be called: with the operator's retries, and an error
// handled by its error policy (the dead letter is a state.Timer of k at the
// firing group timer's time). kb is k's encoding when the caller has it (as
// CurrentKeyBytes gave it; it is only read), or nil to encode k. It returns
// only what fails the job. Meant for OnGroupTimer.
func (c *KeyedContext[K, U]) ForKey(k K, kb []byte, kg uint16, fn func(*KeyedContext[K, U]) error) error {
	return c.task.forKey(k, kb, kg, fn)
}

// keyTask is what a KeyedContext asks of its keyed task.
type keyTask[K comparable, U any] interface {
	decodeKey(b []byte) (K, error)
	forKey(k K, kb []byte, kg uint16, fn func(*KeyedContext[K, U]) error) error
	late(ctx context.Context, v any, ts, wm int64) error // late.go
}
