package window

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/state"
)

// Option configures a window operator.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	lateness time.Duration
	lateTag  any // pipeline.OutputTag[T]
	ops      []pipeline.OperatorOption
}

// AllowedLateness keeps event-time windows d past their end: records
// arriving by then are added and re-fire the window with the updated result
// (default 0: a record is late once its window fired). It has no effect on
// processing-time and global windows.
func AllowedLateness(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lateness = d })
}

// LateRecords sends records that arrive after all their windows expired
// (event time only) to the side output tag, selected with
// pipeline.SideOutput on the operator's stream (Flink's
// sideOutputLateData). T must be the operator's record type; otherwise the
// operator fails when it opens. Without it late records go to the
// operator's error policy when it is a dead-letter one
// (OperatorOptions(pipeline.OnError(pipeline.DeadLetter(…)))), with reason
// "late", and are dropped otherwise (the first drop per subtask is logged).
// Either way they are counted in the operator's late records (the status
// page's Late column).
func LateRecords[T any](tag pipeline.OutputTag[T]) Option {
	return optionFunc(func(c *config) { c.lateTag = tag })
}

// OperatorOptions passes options (parallelism, error policy, retries) to
// the keyed operator that runs the windows.
func OperatorOptions(opts ...pipeline.OperatorOption) Option {
	return optionFunc(func(c *config) { c.ops = append(c.ops, opts...) })
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// Apply groups k's records into windows of a and folds each key's window
// with fn, emitting a Result when the window fires. uid is the operator's
// UID (it keys its state in checkpoints). Results carry the event time
// End - 1 ns of their window. Definition errors (see ErrInvalid) fail the
// job when the operator opens.
func Apply[K comparable, T, ACC, OUT any](k *pipeline.KeyedStream[K, T], uid string, a Assigner, fn Function[T, ACC, OUT], opts ...Option) *pipeline.Stream[Result[K, OUT]] {
	cfg := newConfig(opts)
	return pipeline.Process(k, uid, func() pipeline.KeyedProcessFunc[K, T, Result[K, OUT]] {
		return newOperator[K, T, OUT](a, cfg, &incContents[K, T, ACC, OUT]{fn: fn})
	}, cfg.ops...)
}

// Process groups k's records into windows of a and keeps each key's
// window's records (encoded with codec; nil means JSON) until it fires;
// then fn computes its results from them. See Apply.
func Process[K comparable, T, OUT any](k *pipeline.KeyedStream[K, T], uid string, a Assigner, fn ProcessFunc[K, T, OUT], codec pipeline.Codec[T], opts ...Option) *pipeline.Stream[Result[K, OUT]] {
	if codec == nil {
		codec = pipeline.JSON[T]()
	}
	cfg := newConfig(opts)
	return pipeline.Process(k, uid, func() pipeline.KeyedProcessFunc[K, T, Result[K, OUT]] {
		return newOperator[K, T, OUT](a, cfg, &procContents[K, T, OUT]{fn: fn, codec: codec})
	}, cfg.ops...)
}

// operator is the window operator: a pipeline.KeyedProcessFunc, one per
// keyed subtask.
type operator[K comparable, T, OUT any] struct {
	a        Assigner
	lateness int64
	lateTag  *pipeline.OutputTag[T]
	cont     contents[K, T, OUT]
	trig     Trigger
	err      error // definition error, reported by Open

	sessions *state.Value[[]session]  // merging: the key's windows (actual -> state)
	tstate   *state.Map[span, []byte] // custom triggers

	ctx   *pipeline.KeyedContext[K, Result[K, OUT]]
	buf   []span
	cur   span // the window being fired
	pane  Pane[K]
	tctx  TriggerContext
	outFn func(OUT) error
	// emptyFn is stateless, for the windows that it can tell about (nil:
	// none).
	emptyFn func(span) bool

	// Group timers (index.go): idx is nil when the operator has per-key
	// timers.
	idx        *windowIndex[K]
	gw         span // the window OnGroupTimer fires or expires
	fireKeyFn  func(*pipeline.KeyedContext[K, Result[K, OUT]]) error
	clearKeyFn func(*pipeline.KeyedContext[K, Result[K, OUT]]) error
}

type session struct{ actual, state span }

func newOperator[K comparable, T, OUT any](a Assigner, cfg config, c contents[K, T, OUT]) *operator[K, T, OUT] {
	o := &operator[K, T, OUT]{a: a, lateness: int64(cfg.lateness), cont: c, trig: a.trigger}
	o.tctx.ops = o
	o.outFn = o.out
	if o.trig == nil && !a.merging() {
		o.emptyFn = o.stateless
		if a.eventTime() {
			o.idx = &windowIndex[K]{}
			o.fireKeyFn, o.clearKeyFn = o.fireKey, o.clearKey
		}
	}
	if err := a.validate(); err != nil {
		o.err = err
	} else if err := c.check(a.merging()); err != nil {
		o.err = err
	} else if cfg.lateness < 0 {
		o.err = fmt.Errorf("%w: negative allowed lateness %v", ErrInvalid, cfg.lateness)
	}
	if cfg.lateTag != nil {
		tag, ok := cfg.lateTag.(pipeline.OutputTag[T])
		if !ok {
			var z T
			o.err = fmt.Errorf("%w: LateRecords tag %T is not for the record type %T", ErrInvalid, cfg.lateTag, z)
		}
		o.lateTag = &tag
	}
	if !a.eventTime() {
		o.lateness = 0
	}
	return o
}

// Open implements pipeline.KeyedProcessFunc.
func (o *operator[K, T, OUT]) Open(oc *pipeline.OpenContext) (err error) {
	if o.err != nil {
		return o.err
	}
	b := oc.Backend()
	if err := o.cont.open(b); err != nil {
		return err
	}
	if o.a.merging() {
		if o.sessions, err = state.NewValue(b, "window.sessions", state.Codec[[]session](sessionsCodec{})); err != nil {
			return err
		}
	}
	if o.trig != nil {
		if o.tstate, err = state.NewMap(b, "window.trigger", spanCodec{}, state.Codec[[]byte](bytesCodec{})); err != nil {
			return err
		}
	}
	return nil
}

// watermark returns the current watermark in Unix nanoseconds.
func (o *operator[K, T, OUT]) watermark() int64 {
	wm := o.ctx.Watermark()
	if wm.IsZero() {
		return math.MinInt64
	}
	return wm.UnixNano()
}

// cleanupTime is when window w's state is deleted.
func (o *operator[K, T, OUT]) cleanupTime(w span) int64 {
	if w.end == math.MaxInt64 {
		return math.MaxInt64
	}
	return satAdd(w.maxTs(), o.lateness)
}

// ProcessElement implements pipeline.KeyedProcessFunc.
func (o *operator[K, T, OUT]) ProcessElement(ctx *pipeline.KeyedContext[K, Result[K, OUT]], v T) error {
	o.ctx = ctx
	if o.idx != nil && !o.idx.built {
		if err := o.ensureIndex(ctx); err != nil {
			return err
		}
	}
	evt := o.a.eventTime()
	wm := int64(math.MinInt64)
	var ts int64
	if o.a.procTime {
		ts = ctx.Now().UnixNano()
	} else {
		ts = ctx.Timestamp().UnixNano()
		if evt {
			wm = o.watermark()
		}
	}
	if o.a.merging() {
		return o.processMerging(v, ts, wm)
	}
	o.buf = o.a.assign(ts, o.buf[:0])
	skipped := true
	for _, w := range o.buf {
		if evt && o.cleanupTime(w) <= wm {
			continue // the window expired
		}
		skipped = false
		created, err := o.cont.add(w, v, o.emptyFn)
		if err != nil {
			return err
		}
		if o.trig != nil {
			if created {
				if err := o.registerCleanup(w); err != nil {
					return err
				}
			}
			o.tctx.w = w
			res, err := o.trig.OnElement(&o.tctx, time.Unix(0, ts), w.window())
			if err != nil {
				return fmt.Errorf("window trigger: %w", err)
			}
			if err := o.apply(w, w, res); err != nil {
				return err
			}
			continue
		}
		if created {
			if o.idx != nil {
				err = o.indexWindow(w, wm)
			} else {
				err = o.registerTimers(w, wm)
			}
			if err != nil {
				return err
			}
		}
		if evt && w.maxTs() <= wm {
			if err := o.fire(w, w, false); err != nil { // a late record within the lateness
				return err
			}
		}
	}
	if skipped && evt && satAdd(ts, o.lateness) <= wm {
		return o.late(v)
	}
	return nil
}

// processMerging adds a record to a merging (session) assigner's windows.
func (o *operator[K, T, OUT]) processMerging(v T, ts, wm int64) error {
	w := o.a.assign(ts, o.buf[:0])[0]
	ents, err := o.loadSessions()
	if err != nil {
		return err
	}
	// Split the key's sessions into those the record's window touches
	// (merged, in start order) and the others (kept).
	cover := w
	var merged []session
	kept := ents[:0:0]
	for _, e := range ents {
		if e.actual.intersects(w) {
			merged = append(merged, e)
			cover = cover.cover(e.actual)
		} else {
			kept = append(kept, e)
		}
	}
	var actual, sw span
	switch {
	case len(merged) == 0:
		if o.a.eventTime() && o.cleanupTime(w) <= wm {
			if satAdd(ts, o.lateness) <= wm {
				return o.late(v)
			}
			return nil
		}
		actual, sw = w, w
		if err := o.storeSessions(append(kept, session{actual: w, state: w})); err != nil {
			return err
		}
		if err := o.registerTimers(w, wm); err != nil {
			return err
		}
	case len(merged) == 1 && merged[0].actual == cover:
		actual, sw = cover, merged[0].state
	default:
		// The record joins (and may bridge) existing sessions: their state
		// moves into the first one's state window. Their timers stay
		// registered and find nothing to do when they fire.
		actual, sw = cover, merged[0].state
		for _, e := range merged[1:] {
			if err := o.cont.merge(sw, e.state); err != nil {
				return err
			}
		}
		if err := o.storeSessions(append(kept, session{actual: cover, state: sw})); err != nil {
			return err
		}
		if err := o.registerTimers(cover, wm); err != nil {
			return err
		}
	}
	if _, err := o.cont.add(sw, v, nil); err != nil {
		return err
	}
	if o.a.eventTime() && actual.maxTs() <= wm {
		return o.fire(actual, sw, false)
	}
	return nil
}

// loadSessions reads the current key's session windows (one state
// entry: a key has few sessions at a time, and a point read and write per
// record beats scanning a map whose keys change as sessions grow).
func (o *operator[K, T, OUT]) loadSessions() ([]session, error) {
	ents, _, err := o.sessions.Get()
	return ents, err
}

// storeSessions writes the current key's session windows, ordered by
// start (so merges keep the earliest session's state window).
func (o *operator[K, T, OUT]) storeSessions(ents []session) error {
	if len(ents) == 0 {
		return o.sessions.Clear()
	}
	slices.SortFunc(ents, func(x, y session) int { return cmp.Compare(x.actual.start, y.actual.start) })
	return o.sessions.Set(ents)
}

// stateless reports that window w of the current key is known to have no
// state, so that adding to it needs no read (for a new window the read
// would miss every cache and reach the store). With the default trigger a
// tumbling or sliding window has state exactly while its cleanup timer
// (event time) or firing timer (processing time) is registered: the timer
// is registered when the state is created, the state is cleared when the
// timer fires, and a window whose cleanup time passed gets no state again.
// The in-memory timer index answers without a store read. It is asked only
// when the write-back layers and the cache of committed values do not know
// the window (see contents.add): most records find their window's state in
// memory, and the timer lookup would be a second random memory access per
// record.
func (o *operator[K, T, OUT]) stateless(w span) bool {
	if o.trig != nil || o.a.merging() {
		return false
	}
	if o.idx != nil {
		return !o.idx.has(w.end, o.ctx.Key())
	}
	if o.a.procTime {
		return !o.ctx.HasProcessingTimer(time.Unix(0, w.maxTs()))
	}
	c := o.cleanupTime(w)
	return c != math.MaxInt64 && !o.ctx.HasEventTimer(time.Unix(0, c))
}

// registerTimers registers the default trigger's timers of a new window:
// firing at its end (unless already due) and cleanup after the lateness.
func (o *operator[K, T, OUT]) registerTimers(w span, wm int64) error {
	m := w.maxTs()
	if !o.a.eventTime() {
		return o.registerProcessingTimer(m)
	}
	if m > wm {
		if err := o.registerEventTimer(m); err != nil {
			return err
		}
	}
	if c := o.cleanupTime(w); c != m && c != math.MaxInt64 {
		return o.registerEventTimer(c)
	}
	return nil
}

// registerCleanup registers the cleanup timer of a new window with a custom
// trigger.
func (o *operator[K, T, OUT]) registerCleanup(w span) error {
	c := o.cleanupTime(w)
	switch {
	case c == math.MaxInt64:
		return nil
	case o.a.procTime:
		return o.registerProcessingTimer(c)
	default:
		return o.registerEventTimer(c)
	}
}

// late handles a record after all its windows expired: counted as late,
// then sent to the LateRecords side output, or else to the operator's
// dead-letter policy (dropped, with a warning, without one).
func (o *operator[K, T, OUT]) late(v T) error {
	if o.lateTag == nil {
		return o.ctx.LateRecord(v)
	}
	o.ctx.CountLate()
	return pipeline.EmitSide(o.ctx, *o.lateTag, v)
}

// apply carries out a trigger's decision for actual window w (state in sw).
func (o *operator[K, T, OUT]) apply(w, sw span, r TriggerResult) error {
	switch {
	case r.fires():
		return o.fire(w, sw, r.purges())
	case r.purges():
		return o.cont.clear(sw)
	}
	return nil
}

// fire emits the results of actual window w whose state is in sw.
func (o *operator[K, T, OUT]) fire(w, sw span, purge bool) error {
	o.cur = w
	o.pane = Pane[K]{Key: o.ctx.Key(), Window: w.window(), Watermark: o.ctx.Watermark()}
	_, err := o.cont.fire(&o.pane, sw, purge, false, o.outFn)
	return err
}

// fireFirst is fire for the first firing of window w (state in w): a
// window that fired before is left alone.
func (o *operator[K, T, OUT]) fireFirst(w span, purge, first bool) error {
	o.cur = w
	o.pane = Pane[K]{Key: o.ctx.Key(), Window: w.window(), Watermark: o.ctx.Watermark()}
	_, err := o.cont.fire(&o.pane, w, purge, first, o.outFn)
	return err
}

// out emits one result of the window being fired.
func (o *operator[K, T, OUT]) out(v OUT) error {
	r := Result[K, OUT]{Key: o.pane.Key, Start: o.pane.Window.Start, End: o.pane.Window.End, Value: v, Firing: o.pane.Firing}
	return o.ctx.EmitAt(r, time.Unix(0, o.cur.maxTs()))
}

// OnTimer implements pipeline.KeyedProcessFunc.
func (o *operator[K, T, OUT]) OnTimer(ctx *pipeline.KeyedContext[K, Result[K, OUT]], t pipeline.Timer) error {
	o.ctx = ctx
	ts := t.Time.UnixNano()
	if o.trig != nil {
		return o.onTimerTrigger(ts, t.Domain)
	}
	want := state.EventTime
	if o.a.procTime {
		want = state.ProcessingTime
	}
	if t.Domain != want || ts == math.MaxInt64 || o.idx != nil {
		// With group timers, a key's window timer comes from a
		// checkpoint of an older version: the group timers registered
		// for the restored windows (ensureIndex) fire and expire them.
		return nil
	}
	if o.a.merging() {
		return o.onTimerMerging(ts)
	}
	// Tumbling and sliding windows are known by their end: the window
	// firing now ends at ts+1, the one expiring now at ts+1-lateness.
	w := span{start: ts + 1 - o.a.size, end: ts + 1}
	if err := o.fire(w, w, o.lateness == 0); err != nil {
		return err
	}
	if o.lateness > 0 {
		e := ts + 1 - o.lateness
		return o.cont.clear(span{start: e - o.a.size, end: e})
	}
	return nil
}

// onTimerMerging fires and expires session windows at ts.
func (o *operator[K, T, OUT]) onTimerMerging(ts int64) error {
	ents, err := o.loadSessions()
	if err != nil {
		return err
	}
	kept := ents[:0:0]
	for _, e := range ents {
		c := o.cleanupTime(e.actual)
		switch {
		case e.actual.maxTs() == ts:
			if err := o.fire(e.actual, e.state, c == ts); err != nil {
				return err
			}
			if c != ts {
				kept = append(kept, e)
			}
		case c == ts:
			if err := o.cont.clear(e.state); err != nil {
				return err
			}
		default:
			kept = append(kept, e)
		}
	}
	if len(kept) == len(ents) {
		return nil
	}
	return o.storeSessions(kept)
}

// onTimerTrigger asks the custom trigger about every window of the key,
// then expires the windows whose cleanup time is ts.
func (o *operator[K, T, OUT]) onTimerTrigger(ts int64, d state.TimeDomain) error {
	ws, err := o.triggerWindows()
	if err != nil {
		return err
	}
	at := time.Unix(0, ts)
	for _, w := range ws {
		o.tctx.w = w
		var r TriggerResult
		if d == state.EventTime {
			r, err = o.trig.OnEventTime(&o.tctx, at, w.window())
		} else {
			r, err = o.trig.OnProcessingTime(&o.tctx, at, w.window())
		}
		if err != nil {
			return fmt.Errorf("window trigger: %w", err)
		}
		if err := o.apply(w, w, r); err != nil {
			return err
		}
		c := o.cleanupTime(w)
		if c == math.MaxInt64 || c != ts || (d == state.ProcessingTime) != o.a.procTime {
			continue
		}
		if err := o.cont.clear(w); err != nil {
			return err
		}
		o.tctx.w = w
		if err := o.trig.Clear(&o.tctx, w.window()); err != nil {
			return fmt.Errorf("window trigger: %w", err)
		}
		if err := o.tstate.Delete(w); err != nil {
			return err
		}
	}
	return nil
}

// triggerWindows lists the current key's windows for a custom trigger:
// those with contents or trigger state.
func (o *operator[K, T, OUT]) triggerWindows() ([]span, error) {
	if o.a.kind == kindGlobal {
		return append(o.buf[:0], globalSpan), nil
	}
	ws, err := o.cont.windows(o.buf[:0])
	if err != nil {
		return nil, err
	}
	n := len(ws)
	err = o.tstate.Range(func(w span, _ []byte) bool {
		for _, x := range ws[:n] {
			if x == w {
				return true
			}
		}
		ws = append(ws, w)
		return true
	})
	o.buf = ws
	return ws, err
}

// triggerOps, for TriggerContext.

func (o *operator[K, T, OUT]) now() time.Time { return o.ctx.Now() }

func (o *operator[K, T, OUT]) registerEventTimer(ts int64) error {
	return o.ctx.RegisterEventTimer(time.Unix(0, ts))
}

func (o *operator[K, T, OUT]) registerProcessingTimer(ts int64) error {
	return o.ctx.RegisterProcessingTimer(time.Unix(0, ts))
}

func (o *operator[K, T, OUT]) triggerState(w span) ([]byte, bool, error) { return o.tstate.Get(w) }

func (o *operator[K, T, OUT]) setTriggerState(w span, b []byte) error { return o.tstate.Put(w, b) }

func (o *operator[K, T, OUT]) clearTriggerState(w span) error { return o.tstate.Delete(w) }
