package window

import (
	"math"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/runnel-dev/runnel/pipeline"
)

// Group timers. Event-time tumbling and sliding windows with the default
// trigger are known by their end, and all keys' windows with one end fire
// (and expire) at the same time. Rather than one timer per key and window,
// such an operator registers one group timer per key group and time
// (pipeline.KeyedContext.RegisterGroupEventTimer) and keeps in memory, per
// window end, the keys that have state for that window (windowIndex). When
// a group timer fires, the operator fires (or expires) the windows of the
// index's keys in that key group, one key at a time.
//
// The index holds no state of its own: it lists exactly the (key, window)
// entries of the contents state, so a restored operator rebuilds it from
// that state (one scan per key group, at the first call) and both are
// restored from the same checkpoint, with the group timers. It also tells
// that a key has no state for a window without a store read (stateless).
// On a rebuild the operator registers the group timers of every indexed
// window again (a duplicate is a no-op): a window's firing timer only
// fires windows that have not fired (contents.fire's first), so a timer
// that had fired before the checkpoint fires nothing again; and windows
// restored from a checkpoint with per-key timers (older versions) get
// their group timers, their key timers being ignored.
//
// Processing-time, merging and custom-trigger windows keep per-key timers.

// windowIndex maps window ends to the keys with state for that window, by
// key group.
type windowIndex[K comparable] struct {
	ends    map[int64]*endKeys[K]
	lastEnd int64
	last    *endKeys[K] // ends[lastEnd] (a cache), or nil
	kgStart uint16
	nkg     int
	built   bool
	arena   []byte // key encodings, in chunks (see intern)
}

// endKeys are the keys with a window of one end.
type endKeys[K comparable] struct {
	has map[K]struct{}
	kgs [][]keyRef[K] // by key group - kgStart, in insertion order
}

// keyRef is a key and its encoding (the order that keys fire in).
type keyRef[K comparable] struct {
	k  K
	kb string
}

// arenaChunk is the size of the chunks key encodings are copied to.
const arenaChunk = 16 << 10

func (x *windowIndex[K]) init(kgStart, kgEnd uint16) {
	x.ends = map[int64]*endKeys[K]{}
	x.kgStart, x.nkg = kgStart, int(kgEnd)-int(kgStart)
	x.built = true
}

// intern copies kb to the arena.
func (x *windowIndex[K]) intern(kb []byte) string {
	if len(kb) > arenaChunk/8 {
		return string(kb)
	}
	if cap(x.arena)-len(x.arena) < len(kb) {
		x.arena = make([]byte, 0, arenaChunk)
	}
	n := len(x.arena)
	x.arena = append(x.arena, kb...)
	return unsafeString(x.arena[n:])
}

func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// unsafeBytes is s's bytes, read-only (ForKey copies what it keeps).
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// get returns the keys of windows ending at end (nil: none).
func (x *windowIndex[K]) get(end int64) *endKeys[K] {
	if x.last != nil && x.lastEnd == end {
		return x.last
	}
	e := x.ends[end]
	if e != nil {
		x.last, x.lastEnd = e, end
	}
	return e
}

// has reports whether key k has state for the window ending at end.
func (x *windowIndex[K]) has(end int64, k K) bool {
	e := x.get(end)
	if e == nil {
		return false
	}
	_, ok := e.has[k]
	return ok
}

// add notes that key k (encoding kb, key group kg) has state for the window
// ending at end, which it had not; first reports that no other key of kg
// has.
func (x *windowIndex[K]) add(end int64, k K, kb []byte, kg uint16) (first bool) {
	e := x.get(end)
	if e == nil {
		e = &endKeys[K]{has: map[K]struct{}{}, kgs: make([][]keyRef[K], x.nkg)}
		x.ends[end] = e
		x.last, x.lastEnd = e, end
	}
	if _, dup := e.has[k]; dup {
		return false
	}
	e.has[k] = struct{}{}
	i := int(kg - x.kgStart)
	first = len(e.kgs[i]) == 0
	e.kgs[i] = append(e.kgs[i], keyRef[K]{k: k, kb: x.intern(kb)})
	return first
}

// keys returns the keys of kg with a window ending at end, ordered by their
// encoding (the order per-key timers fired in, whatever the order of
// insertion or of a restore). The slice is the index's: valid until it
// changes.
func (x *windowIndex[K]) keys(end int64, kg uint16) []keyRef[K] {
	e := x.get(end)
	if e == nil {
		return nil
	}
	ks := e.kgs[kg-x.kgStart]
	cmpRef := func(a, b keyRef[K]) int { return strings.Compare(a.kb, b.kb) }
	if !slices.IsSortedFunc(ks, cmpRef) {
		slices.SortFunc(ks, cmpRef)
	}
	return ks
}

// drop removes the keys of kg from the window ending at end.
func (x *windowIndex[K]) drop(end int64, kg uint16) {
	e := x.get(end)
	if e == nil {
		return
	}
	i := int(kg - x.kgStart)
	for _, r := range e.kgs[i] {
		delete(e.has, r.k)
	}
	clear(e.kgs[i])
	e.kgs[i] = nil
	if len(e.has) == 0 {
		delete(x.ends, end)
		x.last = nil
	}
}

// grouped reports whether the operator uses group timers.
func (o *operator[K, T, OUT]) grouped() bool { return o.idx != nil }

// ensureIndex builds the index from the contents state at the operator's
// first call, and registers the group timers of its windows again.
func (o *operator[K, T, OUT]) ensureIndex(ctx *pipeline.KeyedContext[K, Result[K, OUT]]) error {
	if o.idx.built {
		return nil
	}
	start, end := ctx.Backend().KeyGroupRange()
	o.idx.init(start, end)
	for kg := start; kg < end; kg++ {
		err := o.cont.entries(kg, func(kb []byte, w span) (bool, error) {
			k, err := ctx.DecodeKey(kb)
			if err != nil {
				return false, err
			}
			o.idx.add(w.end, k, kb, kg)
			return true, nil
		})
		if err != nil {
			return err
		}
	}
	for e, ek := range o.idx.ends {
		for i, ks := range ek.kgs {
			if len(ks) == 0 {
				continue
			}
			if err := o.registerGroupTimers(start+uint16(i), span{start: e - o.a.size, end: e}, math.MinInt64); err != nil {
				return err
			}
		}
	}
	return nil
}

// registerGroupTimers registers key group kg's timers of window w: firing
// at its end (unless already due at watermark wm) and cleanup after the
// lateness.
func (o *operator[K, T, OUT]) registerGroupTimers(kg uint16, w span, wm int64) error {
	m := w.maxTs()
	if m > wm {
		if err := o.ctx.RegisterGroupEventTimer(kg, time.Unix(0, m)); err != nil {
			return err
		}
	}
	if c := o.cleanupTime(w); c != m && c != math.MaxInt64 {
		return o.ctx.RegisterGroupEventTimer(kg, time.Unix(0, c))
	}
	return nil
}

// indexWindow notes that the current key's window w was created (its state
// added), registering the key group's timers for w if it is the group's
// first.
func (o *operator[K, T, OUT]) indexWindow(w span, wm int64) error {
	kg := o.ctx.CurrentKeyGroup()
	if !o.idx.add(w.end, o.ctx.Key(), o.ctx.CurrentKeyBytes(), kg) {
		return nil
	}
	return o.registerGroupTimers(kg, w, wm)
}

// OnGroupTimer implements pipeline.GroupTimerFunc: it fires the windows of
// key group kg that end at t + 1 ns (their first firing) and expires those
// whose cleanup time is t, each key through ForKey.
func (o *operator[K, T, OUT]) OnGroupTimer(ctx *pipeline.KeyedContext[K, Result[K, OUT]], kg uint16, t pipeline.Timer) error {
	o.ctx = ctx
	if !o.grouped() {
		return nil
	}
	if err := o.ensureIndex(ctx); err != nil {
		return err
	}
	ts := t.Time.UnixNano()
	if ts == math.MaxInt64 {
		return nil
	}
	e := ts + 1
	o.gw = span{start: e - o.a.size, end: e}
	for _, r := range o.idx.keys(e, kg) {
		if err := ctx.ForKey(r.k, unsafeBytes(r.kb), kg, o.fireKeyFn); err != nil {
			return err
		}
	}
	if o.lateness == 0 {
		o.idx.drop(e, kg) // purged
		return nil
	}
	e = ts + 1 - o.lateness
	o.gw = span{start: e - o.a.size, end: e}
	for _, r := range o.idx.keys(e, kg) {
		if err := ctx.ForKey(r.k, unsafeBytes(r.kb), kg, o.clearKeyFn); err != nil {
			return err
		}
	}
	o.idx.drop(e, kg)
	return nil
}

// fireKey fires window o.gw of the current key, unless it fired before.
func (o *operator[K, T, OUT]) fireKey(ctx *pipeline.KeyedContext[K, Result[K, OUT]]) error {
	o.ctx = ctx
	return o.fireFirst(o.gw, o.lateness == 0, true)
}

// clearKey drops window o.gw of the current key.
func (o *operator[K, T, OUT]) clearKey(ctx *pipeline.KeyedContext[K, Result[K, OUT]]) error {
	o.ctx = ctx
	return o.cont.clear(o.gw)
}
