package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/runnel-dev/runnel/state"
)

// KeyedStream is a stream partitioned by key: records with equal keys go to
// the same keyed subtask (by key group) and share per-key state there.
type KeyedStream[K comparable, T any] struct {
	s      *Stream[T]
	key    func(T) K
	codec  Codec[K]
	vcodec Codec[T] // records' codec across a repartition topic (scale-out)
	// prePartitioned: the source already partitions records by this key.
	prePartitioned bool
	// all, when set, selects records that go to every subtask instead of
	// their key's (a broadcast connection's, broadcast.go).
	all func(T) bool
}

// WithCodec sets the codec of the stream's records where they cross the
// network: a job running on many workers (RunWorker) sends a keyed
// operator's input through its repartition topic. Default: JSON
// (reflection-based); give a codec of your own on hot paths. A job that
// runs in one process never encodes records.
func (k *KeyedStream[K, T]) WithCodec(c Codec[T]) *KeyedStream[K, T] {
	if c == nil {
		k.s.n.job.errorf("WithCodec after %q: nil codec", k.s.n.uid)
	}
	k2 := *k
	k2.vcodec = c
	return &k2
}

// PrePartitioned declares that the source already partitions the stream by
// this key: every record of one key is read from the same queue (its
// producers used the key as sharding key, with a hash selector). A job
// running on many workers (RunWorker) then runs the keyed operator in each
// source queue's task, with that queue's keys, instead of sending its input
// through a repartition topic. It must be applied to a stream read from a
// single source; if the declaration is false, state of one key is split
// over several tasks. A job that runs in one process ignores it.
func (k *KeyedStream[K, T]) PrePartitioned() *KeyedStream[K, T] {
	k2 := *k
	k2.prePartitioned = true
	return &k2
}

// KeyBy partitions s by key. K must be string, int, int64, uint64, int32 or
// uint32 (built-in key codecs); use KeyByCodec for other key types.
func KeyBy[K comparable, T any](s *Stream[T], key func(T) K) *KeyedStream[K, T] {
	c, ok := defaultKeyCodec[K]()
	if !ok {
		var z K
		s.n.job.errorf("KeyBy after %q: no built-in codec for key type %T: use KeyByCodec", s.n.uid, z)
	}
	return &KeyedStream[K, T]{s: s, key: key, codec: c}
}

// KeyByCodec partitions s by key, encoding keys with codec (the encoding
// decides the key group, so it must be deterministic and stable).
func KeyByCodec[K comparable, T any](s *Stream[T], key func(T) K, codec Codec[K]) *KeyedStream[K, T] {
	if codec == nil {
		s.n.job.errorf("KeyByCodec after %q: nil codec", s.n.uid)
	}
	return &KeyedStream[K, T]{s: s, key: key, codec: codec}
}

func defaultKeyCodec[K comparable]() (Codec[K], bool) {
	var z K
	var c any
	switch any(z).(type) {
	case string:
		c = state.StringCodec()
	case int64:
		c = state.Int64Codec()
	case uint64:
		c = state.Uint64Codec()
	case int:
		c = intCodec[int]{id: "int"}
	case int32:
		c = intCodec[int32]{id: "int32"}
	case uint32:
		c = intCodec[uint32]{id: "uint32"}
	default:
		return nil, false
	}
	kc, ok := c.(Codec[K])
	return kc, ok
}

// intCodec encodes small integer types as 8 ordered big-endian bytes (the
// same bytes as state.Int64Codec for the value).
type intCodec[I int | int32 | uint32] struct{ id string }

func (c intCodec[I]) Append(dst []byte, v I) ([]byte, error) {
	return state.Int64Codec().Append(dst, int64(v))
}

func (c intCodec[I]) Decode(b []byte) (I, error) {
	v, err := state.Int64Codec().Decode(b)
	return I(v), err
}

func (c intCodec[I]) ID() string { return c.id }

// Timer is a timer firing in OnTimer.
type Timer struct {
	// Time is the timer's timestamp.
	Time time.Time
	// Domain is state.EventTime or state.ProcessingTime.
	Domain state.TimeDomain
}

// OpenContext is given to KeyedProcessFunc.Open: register state handles on
// Backend there.
type OpenContext struct {
	backend     *state.Backend
	subtask     int
	parallelism int
	log         *slog.Logger
	bstate      *broadcastState // a broadcast operator's (broadcast.go); nil otherwise
}

// Backend returns the subtask's keyed state backend (for state.NewValue and
// the other handles). Handles are bound to the current key while the
// function runs.
func (o *OpenContext) Backend() *state.Backend { return o.backend }

// Subtask returns the subtask's index.
func (o *OpenContext) Subtask() int { return o.subtask }

// Parallelism returns the operator's number of subtasks.
func (o *OpenContext) Parallelism() int { return o.parallelism }

// Logger returns the job's logger.
func (o *OpenContext) Logger() *slog.Logger { return o.log }

// KeyedContext is given to ProcessElement and OnTimer. It is valid only
// during the call.
type KeyedContext[K comparable, U any] struct {
	ctx     context.Context // for emits: the task's, or the traced record's context
	uctx    context.Context // Context: ctx, or the traced record's operator span (hooks.go)
	key     K
	ts      int64
	wm      int64
	emit    emitFn[U]
	timers  *state.Timers
	backend *state.Backend
	sides   map[string][]any
	clock   func() time.Time
	out     *counter
	task    keyTask[K, U] // keyedtimers.go
}

// Context returns the task's context (cancelled when the job fails); for a
// traced record it carries the record's operator span (see Hooks).
func (c *KeyedContext[K, U]) Context() context.Context { return c.uctx }

// Key returns the current key.
func (c *KeyedContext[K, U]) Key() K { return c.key }

// Timestamp returns the event time of the current record, or the firing
// timer's time in OnTimer.
func (c *KeyedContext[K, U]) Timestamp() time.Time { return time.Unix(0, c.ts) }

// Watermark returns the subtask's current event-time watermark.
func (c *KeyedContext[K, U]) Watermark() time.Time {
	if c.wm == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, c.wm)
}

// Now returns the processing time (the job's clock).
func (c *KeyedContext[K, U]) Now() time.Time { return c.clock() }

// Backend returns the subtask's state backend.
func (c *KeyedContext[K, U]) Backend() *state.Backend { return c.backend }

// Emit sends v downstream with the current timestamp.
func (c *KeyedContext[K, U]) Emit(v U) error {
	c.out.out++
	return c.emit(c.ctx, v, c.ts)
}

// EmitAt sends v downstream with event time ts.
func (c *KeyedContext[K, U]) EmitAt(v U, ts time.Time) error {
	c.out.out++
	return c.emit(c.ctx, v, ts.UnixNano())
}

// RegisterEventTimer registers a timer for the current key that fires when
// the watermark reaches t (or when the input ends). t must be representable
// in int64 Unix nanoseconds (years 1678 to 2262): other times return an
// error wrapping ErrTimerOutOfRange instead of silently overflowing.
func (c *KeyedContext[K, U]) RegisterEventTimer(t time.Time) error {
	ns, err := timerNanos(t)
	if err != nil {
		return err
	}
	return c.timers.Register(state.EventTime, ns)
}

// DeleteEventTimer deletes the current key's event timer at t (an error
// wrapping ErrTimerOutOfRange for a t no timer can have).
func (c *KeyedContext[K, U]) DeleteEventTimer(t time.Time) error {
	ns, err := timerNanos(t)
	if err != nil {
		return err
	}
	return c.timers.Delete(state.EventTime, ns)
}

// RegisterProcessingTimer registers a timer for the current key that fires
// when the job's clock reaches t. t must be representable in int64 Unix
// nanoseconds (years 1678 to 2262): other times return an error wrapping
// ErrTimerOutOfRange.
func (c *KeyedContext[K, U]) RegisterProcessingTimer(t time.Time) error {
	ns, err := timerNanos(t)
	if err != nil {
		return err
	}
	return c.timers.Register(state.ProcessingTime, ns)
}

// DeleteProcessingTimer deletes the current key's processing timer at t (an
// error wrapping ErrTimerOutOfRange for a t no timer can have).
func (c *KeyedContext[K, U]) DeleteProcessingTimer(t time.Time) error {
	ns, err := timerNanos(t)
	if err != nil {
		return err
	}
	return c.timers.Delete(state.ProcessingTime, ns)
}

// timerNanos converts a timer's time to Unix nanoseconds, refusing times
// that do not fit in an int64 (time.Time.UnixNano's result is undefined
// for them: a timer in 2300 would wrap to 1700 and fire at once).
func timerNanos(t time.Time) (int64, error) {
	ns := t.UnixNano()
	if !time.Unix(0, ns).Equal(t) {
		return 0, fmt.Errorf("%w: %s", ErrTimerOutOfRange, t.UTC().Format(time.RFC3339Nano))
	}
	return ns, nil
}

// KeyedProcessFunc is a keyed operator's user code. Process creates one
// instance per keyed subtask; the runtime calls its methods from that
// subtask's goroutine only.
type KeyedProcessFunc[K comparable, T, U any] interface {
	// Open registers state handles (state.NewValue(ctx.Backend(), …)).
	Open(ctx *OpenContext) error
	// ProcessElement handles one record of the current key.
	ProcessElement(ctx *KeyedContext[K, U], v T) error
	// OnTimer handles a firing timer of the current key.
	OnTimer(ctx *KeyedContext[K, U], t Timer) error
}

// ProcessFuncs adapts functions to a KeyedProcessFunc; nil functions do
// nothing.
type ProcessFuncs[K comparable, T, U any] struct {
	OpenFn    func(ctx *OpenContext) error
	ProcessFn func(ctx *KeyedContext[K, U], v T) error
	TimerFn   func(ctx *KeyedContext[K, U], t Timer) error
}

// Open implements KeyedProcessFunc.
func (f *ProcessFuncs[K, T, U]) Open(ctx *OpenContext) error {
	if f.OpenFn == nil {
		return nil
	}
	return f.OpenFn(ctx)
}

// ProcessElement implements KeyedProcessFunc.
func (f *ProcessFuncs[K, T, U]) ProcessElement(ctx *KeyedContext[K, U], v T) error {
	if f.ProcessFn == nil {
		return nil
	}
	return f.ProcessFn(ctx, v)
}

// OnTimer implements KeyedProcessFunc.
func (f *ProcessFuncs[K, T, U]) OnTimer(ctx *KeyedContext[K, U], t Timer) error {
	if f.TimerFn == nil {
		return nil
	}
	return f.TimerFn(ctx, t)
}

// OutputTag names a typed side output of a keyed operator.
type OutputTag[X any] struct{ name string }

// NewOutputTag returns the tag of a side output named name.
func NewOutputTag[X any](name string) OutputTag[X] { return OutputTag[X]{name: name} }

// Name returns the tag's name.
func (t OutputTag[X]) Name() string { return t.name }

// SideOutput selects the side output tag of the keyed operator producing s.
func SideOutput[U, X any](s *Stream[U], tag OutputTag[X]) *Stream[X] {
	j := s.n.job
	switch s.n.kind {
	case kindProcess, kindReduce, kindAggregate:
	default:
		j.errorf("SideOutput(%q, %q): only keyed operators have side outputs", s.n.uid, tag.name)
	}
	uid := s.n.uid + "#" + tag.name
	if n, ok := j.uids[uid]; ok && n.kind == kindSide {
		return &Stream[X]{n: n}
	}
	n := j.addNode(uid, kindSide)
	n.inputs = []*node{s.n}
	s.n.sides = append(s.n.sides, n)
	n.codecs = tag.name
	n.buildInput = func(b *chainBuilder) (any, error) {
		return outputs[X](b, n.outs)
	}
	return &Stream[X]{n: n}
}

// EmitSide sends v to the side output tag.
func EmitSide[K comparable, U, X any](ctx *KeyedContext[K, U], tag OutputTag[X], v X) error {
	for _, f := range ctx.sides[tag.name] {
		fn, ok := f.(emitFn[X])
		if !ok {
			return fmt.Errorf("pipeline: side output %q has another type", tag.name)
		}
		if err := fn(ctx.ctx, v, ctx.ts); err != nil {
			return err
		}
	}
	return nil
}

// Process runs a keyed process function: newFn is called once per keyed
// subtask to create its instance.
func Process[K comparable, T, U any](k *KeyedStream[K, T], uid string, newFn func() KeyedProcessFunc[K, T, U], opts ...OperatorOption) *Stream[U] {
	return keyedOp(k, uid, kindProcess, "", newFn, opts)
}

// Reduce keeps, per key, the reduction of the records so far with fn
// (fn(acc, v)) and emits the new value after each record. The state codec
// is JSON; ReduceCodec takes another.
func Reduce[K comparable, T any](k *KeyedStream[K, T], uid string, fn func(ctx context.Context, acc, v T) (T, error), opts ...OperatorOption) *Stream[T] {
	return ReduceCodec(k, uid, fn, JSON[T](), opts...)
}

// ReduceCodec is Reduce keeping each key's reduction encoded with codec.
func ReduceCodec[K comparable, T any](k *KeyedStream[K, T], uid string, fn func(ctx context.Context, acc, v T) (T, error), codec Codec[T], opts ...OperatorOption) *Stream[T] {
	if codec == nil {
		k.s.n.job.errorf("ReduceCodec %q: nil codec", uid)
		codec = JSON[T]()
	}
	newFn := func() KeyedProcessFunc[K, T, T] { return &reduceFunc[K, T]{fn: fn, codec: codec} }
	return keyedOp(k, uid, kindReduce, "value="+codec.ID(), newFn, opts)
}

type reduceFunc[K comparable, T any] struct {
	fn    func(ctx context.Context, acc, v T) (T, error)
	codec Codec[T]
	v     *state.Value[T]
}

func (r *reduceFunc[K, T]) Open(ctx *OpenContext) (err error) {
	r.v, err = state.NewValue(ctx.Backend(), "reduce", r.codec)
	return err
}

func (r *reduceFunc[K, T]) ProcessElement(ctx *KeyedContext[K, T], v T) error {
	acc, ok, err := r.v.Get()
	if err != nil {
		return err
	}
	if ok {
		if v, err = r.fn(ctx.uctx, acc, v); err != nil {
			return err
		}
	}
	if err := r.v.Set(v); err != nil {
		return err
	}
	return ctx.Emit(v)
}

func (r *reduceFunc[K, T]) OnTimer(*KeyedContext[K, T], Timer) error { return nil }

// Aggregate folds the records of each key with agg and emits the result
// after each record. The accumulator codec is JSON; AggregateCodec takes
// another.
func Aggregate[K comparable, T, ACC, OUT any](k *KeyedStream[K, T], uid string, agg state.Aggregator[T, ACC, OUT], opts ...OperatorOption) *Stream[OUT] {
	return AggregateCodec(k, uid, agg, JSON[ACC](), opts...)
}

// AggregateCodec is Aggregate keeping each key's accumulator encoded with
// codec.
func AggregateCodec[K comparable, T, ACC, OUT any](k *KeyedStream[K, T], uid string, agg state.Aggregator[T, ACC, OUT], codec Codec[ACC], opts ...OperatorOption) *Stream[OUT] {
	if codec == nil {
		k.s.n.job.errorf("AggregateCodec %q: nil codec", uid)
		codec = JSON[ACC]()
	}
	newFn := func() KeyedProcessFunc[K, T, OUT] { return &aggregateFunc[K, T, ACC, OUT]{agg: agg, codec: codec} }
	return keyedOp(k, uid, kindAggregate, "acc="+codec.ID(), newFn, opts)
}

type aggregateFunc[K comparable, T, ACC, OUT any] struct {
	agg   state.Aggregator[T, ACC, OUT]
	codec Codec[ACC]
	st    *state.Aggregating[T, ACC, OUT]
}

func (a *aggregateFunc[K, T, ACC, OUT]) Open(ctx *OpenContext) (err error) {
	a.st, err = state.NewAggregating(ctx.Backend(), "aggregate", a.codec, a.agg)
	return err
}

func (a *aggregateFunc[K, T, ACC, OUT]) ProcessElement(ctx *KeyedContext[K, OUT], v T) error {
	if err := a.st.Add(v); err != nil {
		return err
	}
	out, _, err := a.st.Get()
	if err != nil {
		return err
	}
	return ctx.Emit(out)
}

func (a *aggregateFunc[K, T, ACC, OUT]) OnTimer(*KeyedContext[K, OUT], Timer) error { return nil }
