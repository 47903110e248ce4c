package pipeline

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/state"
)

// Watermarks, in one place: the strategies a source is given (options),
// the per-split generator state of a source task (splitWatermarks), and the
// combination of input watermarks in a keyed task (inputWatermarks).
//
// Semantics follow Flink's. Each source split generates its own watermark
// from the event times it sees; a keyed subtask's watermark is the minimum
// over its live, active inputs, and never decreases. A split that stays
// quiet for its idle timeout is marked idle: it is left out of the minimum
// until it emits records again (so one quiet queue does not hold the job
// back). Records of a split that comes back from idleness behind the
// others' watermark are late, as in Flink.
//
// On the channels, a watermark message carries the value idleWatermark to
// mark its sender idle; any other watermark message marks the sender active
// again. Watermarks are checkpointed, so that a restored job never runs
// behind the watermarks it had reached (a record that was late before a
// crash is late after it): a source split's last emitted watermark as state
// of the source operator (key group 0, key watermarkStateName NUL split id,
// written by the source task's checkpoint Part next to its offset), a keyed
// subtask's watermark in its keyed state (state watermarkStateName).

const (
	// idleWatermark marks the sender of a watermark message idle.
	idleWatermark = math.MinInt64
	// activeNoWatermark marks a sender active again before it has any
	// watermark of its own.
	activeNoWatermark = math.MinInt64 + 1
	// watermarkStateName is the keyed state holding a keyed subtask's
	// watermark.
	watermarkStateName = "runnel.watermark"
)

// WatermarkGenerator generates one source split's watermarks (Flink's
// WatermarkGenerator). The runtime creates one per split and calls it from
// the split's task only, so it needs no locking.
//
// The watermark is a promise that no more records with an event time at or
// before it will come from the split; records that break it are late.
type WatermarkGenerator interface {
	// OnEvent sees the event time of every record of the split, in split
	// order (after timestamp assignment).
	OnEvent(eventTime time.Time)
	// Watermark returns the split's current watermark (ok false: none yet).
	// The runtime asks after every polled batch and when the split is quiet;
	// values that do not advance the split's watermark are ignored.
	Watermark() (wm time.Time, ok bool)
}

// watermarkOptions are the source options of this file; sourceConfig holds
// them.
type watermarkOptions struct {
	newGen func() WatermarkGenerator
	idle   time.Duration
}

// BoundedOutOfOrderness sets how far out of event-time order records may
// arrive: up to maxOutOfOrder behind the largest event time seen on their
// split. Each split's watermark is that largest time minus maxOutOfOrder
// minus 1 ns. The default is 0: event times never decrease within a split
// (Flink's monotonous timestamps).
func BoundedOutOfOrderness(maxOutOfOrder time.Duration) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) { c.outOfOrder = maxOutOfOrder })
}

// CustomWatermarks makes each split generate its watermarks with a
// generator from newGenerator (called once per split, in the split's task).
// It replaces the bounded out-of-orderness strategy.
func CustomWatermarks(newGenerator func() WatermarkGenerator) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) { c.wmx.newGen = newGenerator })
}

// IdleTimeout marks a split idle when it has produced no record for d (by
// the job's clock): its watermark then no longer holds back the operators
// downstream, until it produces records again. 0 (the default) never marks
// splits idle. With idleness on, the split's Poll is given a deadline so
// that a blocking source returns to notice the timeout.
func IdleTimeout(d time.Duration) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) { c.wmx.idle = d })
}

// WithTimestamps assigns the event time of each record of a source's
// stream (the stream FromSource, FromBytes or FromSourceDecoded returned)
// with fn, applied to the decoded record; fn takes the stream's record
// type, so a mismatch does not compile. Without it the event time is the
// source record's own (for broker messages their born or store time, as
// the source is configured), or the time it was polled when the source
// sets none. The source's watermark strategy (BoundedOutOfOrderness,
// CustomWatermarks) sees the assigned times.
//
// It configures the source operator itself, so every use of the stream
// sees the assigned times, and returns s. On any other stream, or with a
// nil fn, it is a graph error (Run fails).
func (s *Stream[T]) WithTimestamps(fn func(T) time.Time) *Stream[T] {
	switch {
	case s.ts == nil:
		s.n.job.errorf("WithTimestamps after %q: not the stream of a source", s.n.uid)
	case fn == nil:
		s.n.job.errorf("source %q: nil WithTimestamps function", s.n.uid)
	default:
		*s.ts = fn
	}
	return s
}

// checkWatermarkOptions validates the watermark options of source uid.
func checkWatermarkOptions(j *Job, uid string, cfg *sourceConfig) {
	if cfg.outOfOrder < 0 {
		j.errorf("source %q: negative out-of-orderness %v", uid, cfg.outOfOrder)
	}
	if cfg.wmx.idle < 0 {
		j.errorf("source %q: negative idle timeout %v", uid, cfg.wmx.idle)
	}
}

// splitWatermarks is a source task's watermark state. Not safe for
// concurrent use (the task's goroutine only).
type splitWatermarks struct {
	enabled  bool
	ooo      int64
	maxTs    int64
	gen      WatermarkGenerator // nil: bounded out-of-orderness on maxTs
	emitted  int64              // last watermark sent (or restored)
	idleNs   int64              // 0: idleness off
	idle     bool
	lastSeen int64 // job clock when the split last produced records
	clock    func() time.Time
	noCancel context.CancelFunc
	uid      string
	stateKey []byte
	gauge    *runtime.SplitStats // the status endpoint's: emitted and idle
}

func newSplitWatermarks(eng *runtime.Engine, uid, split string, cfg *sourceConfig, clock func() time.Time) (*splitWatermarks, error) {
	store := eng.Store()
	w := &splitWatermarks{
		enabled: !cfg.noWM, ooo: cfg.outOfOrder.Nanoseconds(), maxTs: math.MinInt64, emitted: math.MinInt64,
		idleNs: cfg.wmx.idle.Nanoseconds(), clock: clock, noCancel: func() {},
		uid: uid, stateKey: []byte(watermarkStateName + "\x00" + split), gauge: eng.Split(uid, split),
	}
	if w.enabled && cfg.wmx.newGen != nil {
		if w.gen = cfg.wmx.newGen(); w.gen == nil {
			return nil, fmt.Errorf("pipeline: watermark generator constructor returned nil")
		}
	}
	restored, found, err := store.GetState(uid, 0, w.stateKey)
	if err != nil {
		return nil, fmt.Errorf("pipeline: restore watermark of split %s: %w", split, err)
	}
	if found {
		if len(restored) != 8 {
			return nil, fmt.Errorf("pipeline: checkpointed watermark of %d bytes, want 8", len(restored))
		}
		w.emitted = int64(binary.BigEndian.Uint64(restored))
	}
	w.gauge.Watermark.Store(w.emitted)
	w.gauge.Idle.Store(false)
	w.lastSeen = clock().UnixNano()
	return w, nil
}

// onEvent feeds one record's event time to the generator.
func (w *splitWatermarks) onEvent(ts int64) {
	if w.gen != nil {
		w.gen.OnEvent(time.Unix(0, ts))
		return
	}
	if ts > w.maxTs {
		w.maxTs = ts
	}
}

// current returns the generator's watermark (math.MinInt64: none).
func (w *splitWatermarks) current() int64 {
	if w.gen != nil {
		t, ok := w.gen.Watermark()
		if !ok {
			return math.MinInt64
		}
		return t.UnixNano()
	}
	if w.maxTs == math.MinInt64 {
		return math.MinInt64
	}
	if w.maxTs < math.MinInt64+w.ooo+1 {
		return activeNoWatermark
	}
	return w.maxTs - w.ooo - 1
}

// start sends the restored watermark before the split's first record.
func (w *splitWatermarks) start(ctx context.Context, ports []port) error {
	if !w.enabled || w.emitted <= activeNoWatermark {
		return nil
	}
	return watermarkPorts(ctx, ports, w.emitted)
}

// beforeBatch marks an idle split active again before its new records.
func (w *splitWatermarks) beforeBatch(ctx context.Context, ports []port) error {
	w.lastSeen = w.clock().UnixNano()
	if !w.idle {
		return nil
	}
	w.idle = false
	w.gauge.Idle.Store(false)
	return watermarkPorts(ctx, ports, max(w.emitted, activeNoWatermark))
}

// emit sends the generator's watermark when it advanced.
func (w *splitWatermarks) emit(ctx context.Context, ports []port) error {
	if !w.enabled || w.idle {
		return nil
	}
	if wm := w.current(); wm > w.emitted && wm > activeNoWatermark {
		w.emitted = wm
		w.gauge.Watermark.Store(wm)
		return watermarkPorts(ctx, ports, wm)
	}
	return nil
}

// quiet is called after a poll that returned no records: it lets a custom
// generator advance with time and marks the split idle after its timeout.
func (w *splitWatermarks) quiet(ctx context.Context, ports []port) error {
	if !w.enabled || w.idle {
		return nil
	}
	if w.gen != nil {
		if err := w.emit(ctx, ports); err != nil {
			return err
		}
	}
	if w.idleNs > 0 && w.clock().UnixNano()-w.lastSeen >= w.idleNs {
		w.idle = true
		w.gauge.Idle.Store(true)
		return watermarkPorts(ctx, ports, idleWatermark)
	}
	return nil
}

// ended notes that the split's input ended: it holds no watermark back
// any more (its tasks downstream see its end of input).
func (w *splitWatermarks) ended() {
	if w.enabled {
		w.gauge.Watermark.Store(math.MaxInt64)
	}
}

// pollContext bounds a poll by the time left before the split turns idle.
func (w *splitWatermarks) pollContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if !w.enabled || w.idleNs == 0 || w.idle {
		return ctx, w.noCancel
	}
	left := time.Duration(w.lastSeen + w.idleNs - w.clock().UnixNano())
	return context.WithTimeout(ctx, max(left, time.Millisecond))
}

// part returns the checkpoint Part recording the split's watermark (nil
// when it has none).
func (w *splitWatermarks) part() checkpoint.Part {
	if !w.enabled || w.emitted == math.MinInt64 {
		return nil
	}
	return &splitWatermarkPart{uid: w.uid, key: w.stateKey, wm: w.emitted}
}

// splitWatermarkPart writes one split's watermark; it is immutable, so its
// WriteTo may run on the checkpoint committer's goroutine.
type splitWatermarkPart struct {
	uid string
	key []byte
	wm  int64
}

func (p *splitWatermarkPart) WriteTo(w *checkpoint.Writer) error {
	return w.PutState(p.uid, 0, p.key, binary.BigEndian.AppendUint64(nil, uint64(p.wm)))
}

// inputWatermarks combines a keyed task's input watermarks. Not safe for
// concurrent use (the task's goroutine only).
type inputWatermarks struct {
	wms     []int64
	idle    []bool
	outIdle bool // the task told its outputs it is idle
}

func newInputWatermarks(senders int, floor int64) *inputWatermarks {
	w := &inputWatermarks{wms: make([]int64, senders), idle: make([]bool, senders)}
	for i := range w.wms {
		w.wms[i] = floor
	}
	return w
}

// update records a watermark message from sender s and reports whether the
// combined watermark or idleness may have changed.
func (w *inputWatermarks) update(s int, wm int64) bool {
	if wm == idleWatermark {
		if w.idle[s] {
			return false
		}
		w.idle[s] = true
		return true
	}
	changed := w.idle[s]
	w.idle[s] = false
	if wm > w.wms[s] {
		w.wms[s] = wm
		changed = true
	}
	return changed
}

// combined returns the minimum watermark over the senders that have not
// ended and are not idle (math.MaxInt64 when every sender ended). When
// some sender has not ended and all such senders are idle, it returns idle
// true and, as Flink's StatusWatermarkValve does, the largest watermark of
// any sender: nothing active holds the watermark back any more.
func (w *inputWatermarks) combined(ended []bool) (wm int64, idle bool) {
	wm = math.MaxInt64
	highest := int64(math.MinInt64)
	live, active := false, false
	for s, x := range w.wms {
		highest = max(highest, x)
		if ended[s] {
			continue
		}
		live = true
		if w.idle[s] {
			continue
		}
		active = true
		wm = min(wm, x)
	}
	if live && !active {
		return highest, true
	}
	return wm, false
}

// keyedWatermarkStore keeps a keyed subtask's watermark in its keyed state,
// under a synthetic key of the subtask's first key group (state name
// watermarkStateName, which no user key can reach).
type keyedWatermarkStore struct {
	v     *state.Value[int64]
	key   []byte
	kg    uint16
	saved int64
	ok    bool // the subtask owns a key group to store under
}

func newKeyedWatermarkStore(b *state.Backend) (*keyedWatermarkStore, error) {
	v, err := state.NewValue(b, watermarkStateName, state.Int64Codec())
	if err != nil {
		return nil, err
	}
	s := &keyedWatermarkStore{v: v, saved: math.MinInt64}
	start, end := b.KeyGroupRange()
	if start == end {
		return s, nil
	}
	// Find a key of the first key group: about MaxParallelism tries.
	for i := uint64(0); i < 1<<24; i++ {
		k := binary.AppendUvarint([]byte("wm"), i)
		if state.KeyGroup(k, b.MaxParallelism()) == start {
			s.key, s.kg, s.ok = k, start, true
			break
		}
	}
	return s, nil
}

// restore returns the smallest watermark stored in the subtask's key groups
// (after a rescale a subtask may own several former subtasks' entries, or
// none: math.MinInt64). Entries other than the subtask's own are cleared:
// the next save writes the combined value under its own key.
func (s *keyedWatermarkStore) restore(b *state.Backend) (int64, error) {
	wm, found, own := int64(math.MaxInt64), false, false
	start, end := b.KeyGroupRange()
	for kg := start; kg < end; kg++ {
		var keys [][]byte
		if err := s.v.Keys(kg, func(k []byte) bool { keys = append(keys, k); return true }); err != nil {
			return 0, err
		}
		for _, k := range keys {
			b.SetCurrentKeyGroup(k, kg)
			x, ok, err := s.v.Get()
			if err != nil {
				return 0, err
			}
			if ok {
				wm, found = min(wm, x), true
			}
			if s.ok && kg == s.kg && string(k) == string(s.key) {
				own = true
			} else if err := s.v.Clear(); err != nil {
				return 0, err
			}
		}
	}
	if !found {
		return math.MinInt64, nil
	}
	if own && len(s.key) > 0 {
		s.saved = wm // stored as is unless a foreign entry lowered it
		b.SetCurrentKeyGroup(s.key, s.kg)
		if x, _, err := s.v.Get(); err != nil {
			return 0, err
		} else if x != wm {
			s.saved = math.MinInt64
		}
	}
	return wm, nil
}

// save writes wm (before a snapshot) when it changed. It changes the
// backend's current key.
func (s *keyedWatermarkStore) save(b *state.Backend, wm int64) error {
	if !s.ok || wm == s.saved {
		return nil
	}
	b.SetCurrentKeyGroup(s.key, s.kg)
	if err := s.v.Set(wm); err != nil {
		return err
	}
	s.saved = wm
	return nil
}
