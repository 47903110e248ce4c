package pipeline

import (
	"context"
	"fmt"
	"time"
)

// Two-input operators.
//
// Connect and ConnectKeyed join two streams of different types into one
// operator. Under the hood both inputs become one stream of Either records
// (each side tagged by a chained operator in its producers' tasks) that is
// partitioned by key as a keyed operator's input is: so a connected
// operator's subtasks have one inbox fed by the tasks of both inputs, its
// watermark is the minimum over the tasks of both inputs, and checkpoint
// barriers are aligned across both inputs by the same code that aligns a
// keyed operator's senders. Records of one input keep their order per
// sending task; the two inputs interleave in no defined order.

// Either is one record of two connected inputs: A from the first input, or
// B (Second set) from the second. Window joins keep Either records in their
// window state; a KeyedConnectedStreams' Tagged stream carries them.
type Either[A, B any] struct {
	A A
	B B
	// Second reports that the record came from the second input (B).
	Second bool
	// rr spreads a non-keyed connection's records over its subtasks.
	rr uint32
}

// EitherCodec encodes an Either with a's codec for first-input records and
// b's for second-input records: a tag byte (0 or 1), then the record.
func EitherCodec[A, B any](a Codec[A], b Codec[B]) Codec[Either[A, B]] {
	return eitherCodec[A, B]{a: a, b: b}
}

type eitherCodec[A, B any] struct {
	a Codec[A]
	b Codec[B]
}

func (c eitherCodec[A, B]) Append(dst []byte, e Either[A, B]) ([]byte, error) {
	if e.Second {
		return c.b.Append(append(dst, 1), e.B)
	}
	return c.a.Append(append(dst, 0), e.A)
}

func (c eitherCodec[A, B]) Decode(b []byte) (Either[A, B], error) {
	var e Either[A, B]
	if len(b) == 0 || b[0] > 1 {
		return e, fmt.Errorf("pipeline: decode Either: bad tag (%d bytes)", len(b))
	}
	var err error
	if b[0] == 1 {
		e.Second = true
		e.B, err = c.b.Decode(b[1:])
	} else {
		e.A, err = c.a.Decode(b[1:])
	}
	return e, err
}

func (c eitherCodec[A, B]) ID() string { return "either(" + c.a.ID() + "," + c.b.ID() + ")" }

// ConnectedStreams are two streams connected for a two-input operator
// (CoProcess) without keys: the operator's subtasks receive the records of
// both inputs, spread round robin by every sending task.
type ConnectedStreams[A, B any] struct {
	a *Stream[A]
	b *Stream[B]
}

// Connect connects a and b (of the same job) for CoProcess.
func Connect[A, B any](a *Stream[A], b *Stream[B]) *ConnectedStreams[A, B] {
	if a.n.job != b.n.job {
		a.n.job.errorf("Connect(%q, %q): streams of different jobs", a.n.uid, b.n.uid)
	}
	return &ConnectedStreams[A, B]{a: a, b: b}
}

// KeyedConnectedStreams are two keyed streams with the same key type
// connected for a keyed two-input operator (KeyedCoProcess, IntervalJoin,
// window.Join, window.CoGroup): records of both inputs with equal keys go
// to the same subtask and share its keyed state and timers there.
type KeyedConnectedStreams[K comparable, A, B any] struct {
	a *KeyedStream[K, A]
	b *KeyedStream[K, B]
}

// ConnectKeyed connects a and b. Their key codecs must be the same (a
// key's encoding decides its key group): KeyBy's built-in codecs are, for
// equal key types.
func ConnectKeyed[K comparable, A, B any](a *KeyedStream[K, A], b *KeyedStream[K, B]) *KeyedConnectedStreams[K, A, B] {
	j := a.s.n.job
	if a.s.n.job != b.s.n.job {
		j.errorf("ConnectKeyed(%q, %q): streams of different jobs", a.s.n.uid, b.s.n.uid)
	} else if a.codec != nil && b.codec != nil && a.codec.ID() != b.codec.ID() {
		j.errorf("ConnectKeyed(%q, %q): key codecs differ (%s, %s)", a.s.n.uid, b.s.n.uid, a.codec.ID(), b.codec.ID())
	}
	return &KeyedConnectedStreams[K, A, B]{a: a, b: b}
}

// Codec returns the codec of the connection's Either records: the inputs'
// record codecs (KeyedStream.WithCodec; JSON by default) side by side.
func (c *KeyedConnectedStreams[K, A, B]) Codec() Codec[Either[A, B]] {
	return EitherCodec(recordCodec(c.a), recordCodec(c.b))
}

func recordCodec[K comparable, T any](k *KeyedStream[K, T]) Codec[T] {
	if k.vcodec != nil {
		return k.vcodec
	}
	return JSON[T]()
}

// Tagged returns both inputs as one keyed stream of Either records, for
// operators of one input (the window joins use it with window.Process).
// uid names the two tagging operators, uid+"/in1" and uid+"/in2": call it
// once per uid.
func (c *KeyedConnectedStreams[K, A, B]) Tagged(uid string) *KeyedStream[K, Either[A, B]] {
	ka, kb := c.a.key, c.b.key
	u := tagUnion(c.a.s, c.b.s, uid, false)
	return &KeyedStream[K, Either[A, B]]{
		s: u, codec: c.a.codec, vcodec: c.Codec(),
		key: func(e Either[A, B]) K {
			if e.Second {
				return kb(e.B)
			}
			return ka(e.A)
		},
	}
}

// kindConnectInput tags one input of a two-input operator.
const kindConnectInput = "connect-input"

// tagUnion is the union of a and b as Either records: two chained tagging
// operators, uid+"/in1" and uid+"/in2". With rr, each task numbers its
// records (Either.rr) to spread them over the subtasks.
func tagUnion[A, B any](a *Stream[A], b *Stream[B], uid string, rr bool) *Stream[Either[A, B]] {
	ta := tagInput(a, uid+"/in1", rr, func(v A, n uint32) Either[A, B] { return Either[A, B]{A: v, rr: n} })
	tb := tagInput(b, uid+"/in2", rr, func(v B, n uint32) Either[A, B] { return Either[A, B]{B: v, Second: true, rr: n} })
	return Union(ta, tb)
}

func tagInput[T, E any](s *Stream[T], uid string, rr bool, wrap func(T, uint32) E) *Stream[E] {
	n := s.n.job.addNode(uid, kindConnectInput, s.n)
	n.policy = Fail() // it never rejects a record
	n.buildInput = func(b *chainBuilder) (any, error) {
		next, err := outputs[E](b, n.outs)
		if err != nil {
			return nil, err
		}
		if !rr {
			return emitFn[T](func(ctx context.Context, v T, ts int64) error { return next(ctx, wrap(v, 0), ts) }), nil
		}
		// Each task starts at its own index, so that tasks with few
		// records do not all start on the same subtask.
		cnt := uint32(b.task.idx) * 7919
		return emitFn[T](func(ctx context.Context, v T, ts int64) error {
			cnt++
			return next(ctx, wrap(v, cnt), ts)
		}), nil
	}
	return &Stream[E]{n: n}
}

// KeyedCoProcessFunc is a keyed two-input operator's user code
// (KeyedCoProcess; Flink's KeyedCoProcessFunction): one instance per
// subtask, called from that subtask's goroutine only. Both inputs' records
// see the same keyed state and timers of their key.
type KeyedCoProcessFunc[K comparable, A, B, U any] interface {
	// Open registers state handles (state.NewValue(ctx.Backend(), …)).
	Open(ctx *OpenContext) error
	// ProcessElement1 handles a record of the first input.
	ProcessElement1(ctx *KeyedContext[K, U], a A) error
	// ProcessElement2 handles a record of the second input.
	ProcessElement2(ctx *KeyedContext[K, U], b B) error
	// OnTimer handles a firing timer of the current key.
	OnTimer(ctx *KeyedContext[K, U], t Timer) error
}

// KeyedCoProcess runs a keyed two-input process function over c: newFn is
// called once per subtask. Records failing in the function go to the
// operator's error policy (OnError) as records of their own input's type.
func KeyedCoProcess[K comparable, A, B, U any](c *KeyedConnectedStreams[K, A, B], uid string, newFn func() KeyedCoProcessFunc[K, A, B, U], opts ...OperatorOption) *Stream[U] {
	if newFn == nil {
		c.a.s.n.job.errorf("KeyedCoProcess %q: nil function constructor", uid)
	}
	return keyedOp(c.Tagged(uid), uid, kindProcess, "op=co-process", func() KeyedProcessFunc[K, Either[A, B], U] {
		return &keyedCoAdapter[K, A, B, U]{fn: newFn()}
	}, opts)
}

type keyedCoAdapter[K comparable, A, B, U any] struct {
	fn KeyedCoProcessFunc[K, A, B, U]
}

func (f *keyedCoAdapter[K, A, B, U]) Open(ctx *OpenContext) error { return f.fn.Open(ctx) }

func (f *keyedCoAdapter[K, A, B, U]) ProcessElement(ctx *KeyedContext[K, U], e Either[A, B]) error {
	if e.Second {
		return f.fn.ProcessElement2(ctx, e.B)
	}
	return f.fn.ProcessElement1(ctx, e.A)
}

func (f *keyedCoAdapter[K, A, B, U]) OnTimer(ctx *KeyedContext[K, U], t Timer) error {
	return f.fn.OnTimer(ctx, t)
}

func (f *keyedCoAdapter[K, A, B, U]) Close() error {
	if c, ok := f.fn.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// CoProcessFunc is a non-keyed two-input operator's user code (CoProcess;
// Flink's CoProcessFunction): one instance per subtask, called from that
// subtask's goroutine only. It has no keyed state and no timers.
type CoProcessFunc[A, B, U any] interface {
	// Open is called once before the first record.
	Open(ctx *OpenContext) error
	// ProcessElement1 handles a record of the first input.
	ProcessElement1(ctx *Context[U], a A) error
	// ProcessElement2 handles a record of the second input.
	ProcessElement2(ctx *Context[U], b B) error
}

// CoProcess runs a non-keyed two-input process function over c, in
// Parallelism subtasks (default DefaultParallelism): every task of either
// input spreads its records over them round robin. newFn is called once
// per subtask.
func CoProcess[A, B, U any](c *ConnectedStreams[A, B], uid string, newFn func() CoProcessFunc[A, B, U], opts ...OperatorOption) *Stream[U] {
	if newFn == nil {
		c.a.n.job.errorf("CoProcess %q: nil function constructor", uid)
	}
	u := tagUnion(c.a, c.b, uid, true)
	k := KeyBy(u, func(e Either[A, B]) uint32 { return e.rr }).WithCodec(EitherCodec(JSON[A](), JSON[B]()))
	return keyedOp(k, uid, kindProcess, "op=co-process-nonkeyed", func() KeyedProcessFunc[uint32, Either[A, B], U] {
		return &coAdapter[A, B, U]{fn: newFn()}
	}, opts)
}

type coAdapter[A, B, U any] struct {
	fn  CoProcessFunc[A, B, U]
	ctx Context[U]
}

func (f *coAdapter[A, B, U]) Open(ctx *OpenContext) error { return f.fn.Open(ctx) }

func (f *coAdapter[A, B, U]) ProcessElement(ctx *KeyedContext[uint32, U], e Either[A, B]) error {
	f.ctx.c = ctx
	if e.Second {
		return f.fn.ProcessElement2(&f.ctx, e.B)
	}
	return f.fn.ProcessElement1(&f.ctx, e.A)
}

func (f *coAdapter[A, B, U]) OnTimer(*KeyedContext[uint32, U], Timer) error { return nil }

func (f *coAdapter[A, B, U]) Close() error {
	if c, ok := f.fn.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// Context is given to the record methods of non-keyed two-input and
// broadcast functions. It is valid only during the call.
type Context[U any] struct {
	c interface {
		Context() context.Context
		Timestamp() time.Time
		Watermark() time.Time
		Now() time.Time
		Emit(v U) error
		EmitAt(v U, ts time.Time) error
	}
}

// Context returns the task's context (cancelled when the job fails).
func (c *Context[U]) Context() context.Context { return c.c.Context() }

// Timestamp returns the event time of the current record.
func (c *Context[U]) Timestamp() time.Time { return c.c.Timestamp() }

// Watermark returns the subtask's event-time watermark: the minimum over
// the tasks of both inputs (zero before the first one).
func (c *Context[U]) Watermark() time.Time { return c.c.Watermark() }

// Now returns the processing time (the job's clock).
func (c *Context[U]) Now() time.Time { return c.c.Now() }

// Emit sends v downstream with the current timestamp.
func (c *Context[U]) Emit(v U) error { return c.c.Emit(v) }

// EmitAt sends v downstream with event time ts.
func (c *Context[U]) EmitAt(v U, ts time.Time) error { return c.c.EmitAt(v, ts) }
