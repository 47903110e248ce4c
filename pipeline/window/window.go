package window

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalid is returned (wrapped, when the operator opens) for invalid
// window definitions: bad sizes, a missing trigger, a late-record tag of the
// wrong type, a merging assigner with a function that cannot merge.
var ErrInvalid = errors.New("window: invalid window definition")

// Window is the time interval [Start, End) of one window.
type Window struct {
	Start time.Time
	End   time.Time
}

// MaxTimestamp returns the window's last instant, End - 1 ns: an event-time
// window fires when the watermark reaches it.
func (w Window) MaxTimestamp() time.Time { return time.Unix(0, spanOf(w).maxTs()) }

// String returns "[start, end)".
func (w Window) String() string {
	return "[" + w.Start.UTC().Format(time.RFC3339Nano) + ", " + w.End.UTC().Format(time.RFC3339Nano) + ")"
}

// Result is one firing of one key's window.
type Result[K comparable, OUT any] struct {
	// Key is the record key.
	Key K `json:"key"`
	// Start and End bound the window [Start, End). Global windows report
	// the extreme representable times.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Value is the window function's output.
	Value OUT `json:"value"`
	// Firing is 0 for the first firing of the window's contents and n for
	// the n-th firing after it (late records within the allowed lateness,
	// or a custom trigger firing again): each supersedes the previous
	// ones. It restarts at 0 after a trigger purges the window.
	Firing int `json:"firing"`
}

// Window returns the result's window.
func (r Result[K, OUT]) Window() Window { return Window{Start: r.Start, End: r.End} }

// span is a window in Unix nanoseconds.
type span struct{ start, end int64 }

func spanOf(w Window) span { return span{start: w.Start.UnixNano(), end: w.End.UnixNano()} }

func (s span) window() Window { return Window{Start: time.Unix(0, s.start), End: time.Unix(0, s.end)} }

// maxTs is the window's last instant (math.MaxInt64 for the global window).
func (s span) maxTs() int64 {
	if s.end == math.MaxInt64 {
		return math.MaxInt64
	}
	return s.end - 1
}

// intersects is Flink's TimeWindow.intersects: windows that touch count.
func (s span) intersects(o span) bool { return s.start <= o.end && s.end >= o.start }

func (s span) cover(o span) span { return span{start: min(s.start, o.start), end: max(s.end, o.end)} }

var globalSpan = span{start: math.MinInt64, end: math.MaxInt64}

type assignerKind uint8

const (
	kindNone assignerKind = iota
	kindTumbling
	kindSliding
	kindSession
	kindGlobal
)

// Assigner assigns records to windows. Build one with Tumbling, Sliding,
// Session or Global; the methods return modified copies. The zero Assigner
// is invalid.
type Assigner struct {
	kind     assignerKind
	size     int64
	slide    int64
	offset   int64
	gap      int64
	procTime bool
	trigger  Trigger
}

// Tumbling returns an event-time assigner of consecutive, non-overlapping
// windows of the given size, aligned to the Unix epoch (see WithOffset).
func Tumbling(size time.Duration) Assigner {
	return Assigner{kind: kindTumbling, size: int64(size)}
}

// Sliding returns an event-time assigner of windows of the given size
// starting every slide; a record belongs to about size/slide windows.
func Sliding(size, slide time.Duration) Assigner {
	return Assigner{kind: kindSliding, size: int64(size), slide: int64(slide)}
}

// Session returns an event-time assigner of session windows: a key's
// records closer than gap to each other share a window, which ends gap
// after its last record.
func Session(gap time.Duration) Assigner {
	return Assigner{kind: kindSession, gap: int64(gap)}
}

// Global returns the assigner of one window per key holding all its
// records, fired only by trigger (for example Purging(CountTrigger(100))).
// Global windows are never cleaned up by time.
func Global(trigger Trigger) Assigner {
	return Assigner{kind: kindGlobal, trigger: trigger}
}

// WithOffset shifts tumbling and sliding windows: with size 1 h and offset
// 15 min they start at hh:15. |offset| must be below the size (tumbling) or
// the slide (sliding).
func (a Assigner) WithOffset(offset time.Duration) Assigner {
	a.offset = int64(offset)
	return a
}

// ProcessingTime makes the assigner use the job's clock when a record
// arrives instead of its event time; windows fire by the clock and are
// never late.
func (a Assigner) ProcessingTime() Assigner {
	a.procTime = true
	return a
}

// WithTrigger replaces the assigner's default trigger (fire at the end of
// the window) by t. Not supported with Session.
func (a Assigner) WithTrigger(t Trigger) Assigner {
	a.trigger = t
	return a
}

// String describes the assigner.
func (a Assigner) String() string {
	var s string
	switch a.kind {
	case kindTumbling:
		s = fmt.Sprintf("tumbling(%v", time.Duration(a.size))
	case kindSliding:
		s = fmt.Sprintf("sliding(%v, %v", time.Duration(a.size), time.Duration(a.slide))
	case kindSession:
		s = fmt.Sprintf("session(%v", time.Duration(a.gap))
	case kindGlobal:
		return "global"
	default:
		return "invalid"
	}
	if a.offset != 0 {
		s += fmt.Sprintf(", offset %v", time.Duration(a.offset))
	}
	if a.procTime {
		s += ", processing time"
	}
	return s + ")"
}

func (a Assigner) validate() error {
	switch a.kind {
	case kindTumbling:
		if a.size <= 0 || a.offset <= -a.size || a.offset >= a.size {
			return fmt.Errorf("%w: %v: size must be positive and |offset| below it", ErrInvalid, a)
		}
	case kindSliding:
		if a.size <= 0 || a.slide <= 0 || a.offset <= -a.slide || a.offset >= a.slide {
			return fmt.Errorf("%w: %v: size and slide must be positive and |offset| below the slide", ErrInvalid, a)
		}
		if a.size/a.slide > maxWindowsPerRecord {
			return fmt.Errorf("%w: %v: more than %d windows per record", ErrInvalid, a, maxWindowsPerRecord)
		}
	case kindSession:
		if a.gap <= 0 {
			return fmt.Errorf("%w: %v: the gap must be positive", ErrInvalid, a)
		}
		if a.trigger != nil {
			return fmt.Errorf("%w: %v: custom triggers are not supported on session windows", ErrInvalid, a)
		}
	case kindGlobal:
		if a.trigger == nil {
			return fmt.Errorf("%w: global windows need a trigger", ErrInvalid)
		}
	default:
		return fmt.Errorf("%w: zero Assigner", ErrInvalid)
	}
	return nil
}

// maxWindowsPerRecord bounds size/slide of sliding windows.
const maxWindowsPerRecord = 10_000

// merging reports whether windows of the assigner merge.
func (a Assigner) merging() bool { return a.kind == kindSession }

// eventTime reports whether the assigner works in event time (and so with
// watermarks, lateness and late records).
func (a Assigner) eventTime() bool { return !a.procTime && a.kind != kindGlobal }

// startOf is Flink's TimeWindow.getWindowStartWithOffset with a floor
// modulo (correct for negative times too).
func startOf(ts, offset, size int64) int64 {
	r := (ts - offset) % size
	if r < 0 {
		r += size
	}
	return ts - r
}

// assign appends the windows of a record at ts to dst.
func (a Assigner) assign(ts int64, dst []span) []span {
	switch a.kind {
	case kindTumbling:
		s := startOf(ts, a.offset, a.size)
		return append(dst, span{start: s, end: s + a.size})
	case kindSliding:
		last := startOf(ts, a.offset, a.slide)
		for s := last; s > ts-a.size; s -= a.slide {
			dst = append(dst, span{start: s, end: s + a.size})
		}
		return dst
	case kindSession:
		return append(dst, span{start: ts, end: satAdd(ts, a.gap)})
	default:
		return append(dst, globalSpan)
	}
}

// satAdd adds non-negative d to t, saturating at math.MaxInt64.
func satAdd(t, d int64) int64 {
	if t > math.MaxInt64-d {
		return math.MaxInt64
	}
	return t + d
}
