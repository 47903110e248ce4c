package window

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// TriggerResult is what a Trigger decides for a window.
type TriggerResult uint8

const (
	// Continue does nothing.
	Continue TriggerResult = iota
	// Fire emits the window's result and keeps its contents.
	Fire
	// Purge drops the window's contents without emitting.
	Purge
	// FireAndPurge emits the window's result, then drops its contents.
	FireAndPurge
)

// String returns the result's name.
func (r TriggerResult) String() string {
	switch r {
	case Continue:
		return "continue"
	case Fire:
		return "fire"
	case Purge:
		return "purge"
	case FireAndPurge:
		return "fire-and-purge"
	}
	return fmt.Sprintf("TriggerResult(%d)", uint8(r))
}

func (r TriggerResult) fires() bool  { return r == Fire || r == FireAndPurge }
func (r TriggerResult) purges() bool { return r == Purge || r == FireAndPurge }

// Trigger decides when a window fires (Flink's Trigger). It is called from
// the keyed subtask's goroutine with a TriggerContext bound to the current
// key and window; per-window data it needs across calls goes into the
// context's state (kept in the operator's keyed state, checkpointed).
//
// Timers are per key: OnEventTime and OnProcessingTime are called for every
// window of the key when any timer of the key fires, and must return
// Continue for times that are not theirs.
type Trigger interface {
	// OnElement is called for each record added to window w (ts is its
	// event time, or arrival time for processing-time assigners).
	OnElement(c *TriggerContext, ts time.Time, w Window) (TriggerResult, error)
	// OnEventTime is called when an event-time timer of the key fires.
	OnEventTime(c *TriggerContext, t time.Time, w Window) (TriggerResult, error)
	// OnProcessingTime is called when a processing-time timer of the key
	// fires.
	OnProcessingTime(c *TriggerContext, t time.Time, w Window) (TriggerResult, error)
	// Clear is called when window w expires (after its allowed lateness);
	// its trigger state is deleted afterwards.
	Clear(c *TriggerContext, w Window) error
}

// triggerOps is what a TriggerContext needs from the operator.
type triggerOps interface {
	watermark() int64
	now() time.Time
	registerEventTimer(ts int64) error
	registerProcessingTimer(ts int64) error
	triggerState(w span) ([]byte, bool, error)
	setTriggerState(w span, b []byte) error
	clearTriggerState(w span) error
}

// TriggerContext gives a Trigger the watermark, the clock, timers and its
// per-window state. It is valid only during the call it is passed to.
type TriggerContext struct {
	ops triggerOps
	w   span
}

// Watermark returns the current event-time watermark (the zero time before
// the first one).
func (c *TriggerContext) Watermark() time.Time {
	wm := c.ops.watermark()
	if wm == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, wm)
}

// Now returns the job's processing time.
func (c *TriggerContext) Now() time.Time { return c.ops.now() }

// RegisterEventTimer registers an event-time timer of the current key.
func (c *TriggerContext) RegisterEventTimer(t time.Time) error {
	return c.ops.registerEventTimer(t.UnixNano())
}

// RegisterProcessingTimer registers a processing-time timer of the current
// key.
func (c *TriggerContext) RegisterProcessingTimer(t time.Time) error {
	return c.ops.registerProcessingTimer(t.UnixNano())
}

// State returns the trigger's state for the current key and window (false
// when unset). The bytes are the caller's.
func (c *TriggerContext) State() ([]byte, bool, error) { return c.ops.triggerState(c.w) }

// SetState stores the trigger's state for the current key and window.
func (c *TriggerContext) SetState(b []byte) error { return c.ops.setTriggerState(c.w, b) }

// ClearState deletes the trigger's state for the current key and window.
func (c *TriggerContext) ClearState() error { return c.ops.clearTriggerState(c.w) }

// CountTrigger fires a window every n records (Flink's CountTrigger); it
// keeps its count in the trigger state. Wrap it in Purging to drop the
// window's contents at each firing.
func CountTrigger(n int64) Trigger { return countTrigger{n: max(n, 1)} }

type countTrigger struct{ n int64 }

func (t countTrigger) OnElement(c *TriggerContext, _ time.Time, _ Window) (TriggerResult, error) {
	b, _, err := c.State()
	if err != nil {
		return Continue, err
	}
	var cnt int64
	if len(b) == 8 {
		cnt = int64(binary.BigEndian.Uint64(b))
	}
	cnt++
	if cnt >= t.n {
		return Fire, c.ClearState()
	}
	return Continue, c.SetState(binary.BigEndian.AppendUint64(b[:0], uint64(cnt)))
}

func (countTrigger) OnEventTime(*TriggerContext, time.Time, Window) (TriggerResult, error) {
	return Continue, nil
}

func (countTrigger) OnProcessingTime(*TriggerContext, time.Time, Window) (TriggerResult, error) {
	return Continue, nil
}

func (countTrigger) Clear(c *TriggerContext, _ Window) error { return c.ClearState() }

// EventTimeTrigger fires a window when the watermark reaches its maximum
// timestamp, and at once for records added after that (the default trigger
// of event-time assigners).
func EventTimeTrigger() Trigger { return eventTimeTrigger{} }

type eventTimeTrigger struct{}

func (eventTimeTrigger) OnElement(c *TriggerContext, _ time.Time, w Window) (TriggerResult, error) {
	m := spanOf(w).maxTs()
	if m <= c.ops.watermark() {
		return Fire, nil
	}
	return Continue, c.ops.registerEventTimer(m)
}

func (eventTimeTrigger) OnEventTime(_ *TriggerContext, t time.Time, w Window) (TriggerResult, error) {
	if t.UnixNano() == spanOf(w).maxTs() {
		return Fire, nil
	}
	return Continue, nil
}

func (eventTimeTrigger) OnProcessingTime(*TriggerContext, time.Time, Window) (TriggerResult, error) {
	return Continue, nil
}

func (eventTimeTrigger) Clear(*TriggerContext, Window) error { return nil }

// ProcessingTimeTrigger fires a window when the job's clock reaches its
// maximum timestamp (the default trigger of processing-time assigners).
func ProcessingTimeTrigger() Trigger { return processingTimeTrigger{} }

type processingTimeTrigger struct{}

func (processingTimeTrigger) OnElement(c *TriggerContext, _ time.Time, w Window) (TriggerResult, error) {
	return Continue, c.ops.registerProcessingTimer(spanOf(w).maxTs())
}

func (processingTimeTrigger) OnEventTime(*TriggerContext, time.Time, Window) (TriggerResult, error) {
	return Continue, nil
}

func (processingTimeTrigger) OnProcessingTime(_ *TriggerContext, t time.Time, w Window) (TriggerResult, error) {
	if t.UnixNano() == spanOf(w).maxTs() {
		return Fire, nil
	}
	return Continue, nil
}

func (processingTimeTrigger) Clear(*TriggerContext, Window) error { return nil }

// Purging turns the Fire results of t into FireAndPurge (Flink's
// PurgingTrigger).
func Purging(t Trigger) Trigger { return purging{t: t} }

type purging struct{ t Trigger }

func purge(r TriggerResult, err error) (TriggerResult, error) {
	if r == Fire {
		r = FireAndPurge
	}
	return r, err
}

func (p purging) OnElement(c *TriggerContext, ts time.Time, w Window) (TriggerResult, error) {
	return purge(p.t.OnElement(c, ts, w))
}

func (p purging) OnEventTime(c *TriggerContext, t time.Time, w Window) (TriggerResult, error) {
	return purge(p.t.OnEventTime(c, t, w))
}

func (p purging) OnProcessingTime(c *TriggerContext, t time.Time, w Window) (TriggerResult, error) {
	return purge(p.t.OnProcessingTime(c, t, w))
}

func (p purging) Clear(c *TriggerContext, w Window) error { return p.t.Clear(c, w) }
