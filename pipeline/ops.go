package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/sink"
)

// Stream is a typed stream of records in a Job. Streams are values to build
// with; they carry no data themselves.
type Stream[T any] struct {
	n *node
	// ts holds the timestamp assigner of a source's stream (WithTimestamps,
	// read by the source tasks at Run); nil for other streams.
	ts *func(T) time.Time
	// codec encodes the stream's records where operators reading it store
	// them in checkpoints (WithCodec); nil is JSON.
	codec Codec[T]
}

// UID returns the UID of the operator producing the stream.
func (s *Stream[T]) UID() string { return s.n.uid }

// WithCodec returns the stream with c as the codec of its records where the
// operators reading it store them in their checkpoints: the requests in
// flight of the async operators (OrderedWait, UnorderedWait and their
// Future forms). Default: JSON (reflection-based); c takes the stream's
// record type, so a mismatch does not compile. Records crossing the
// network after a KeyBy take KeyedStream.WithCodec's codec; an operator's
// own state takes the codec its constructor is given (ReduceCodec,
// AggregateCodec).
func (s *Stream[T]) WithCodec(c Codec[T]) *Stream[T] {
	if c == nil {
		s.n.job.errorf("WithCodec after %q: nil codec", s.n.uid)
	}
	s2 := *s
	s2.codec = c
	return &s2
}

// OperatorOption configures one operator.
type OperatorOption interface{ applyOp(*opConfig) }

type opOptionFunc func(*opConfig)

func (f opOptionFunc) applyOp(c *opConfig) { f(c) }

type opConfig struct {
	policy      *Policy
	retry       retryPolicy
	parallelism int
}

type retryPolicy struct {
	attempts int
	backoff  backoff.Policy
}

// OnError sets the policy for records on which the operator's function
// fails after its retries (default Fail).
func OnError(p Policy) OperatorOption { return opOptionFunc(func(c *opConfig) { c.policy = &p }) }

// Retry re-runs a failing user function up to attempts times in all,
// waiting with exponential backoff from initial to max between attempts.
// Retried functions must tolerate being re-run (FlatMap may have emitted,
// a keyed function may have changed state).
func Retry(attempts int, initial, max time.Duration) OperatorOption {
	return opOptionFunc(func(c *opConfig) {
		c.retry = retryPolicy{attempts: attempts, backoff: backoff.Policy{Initial: initial, Max: max}}
	})
}

// Parallelism sets the number of subtasks of a keyed operator or of a
// parallel stage (Rebalance, the async I/O operators, ProcessStream).
func Parallelism(n int) OperatorOption { return opOptionFunc(func(c *opConfig) { c.parallelism = n }) }

func applyOps(n *node, opts []OperatorOption) opConfig {
	var c opConfig
	for _, o := range opts {
		o.applyOp(&c)
	}
	if c.policy != nil {
		n.policy = *c.policy
	}
	n.retry = c.retry
	n.job.dlqNode(n.policy)
	return c
}

// emitFn passes one record (with its event time, Unix nanoseconds) to the
// next operator of a task.
type emitFn[T any] func(ctx context.Context, v T, ts int64) error

// protect runs fn, turning a panic into an error wrapping ErrPanic.
func protect[A, B, R any](fn func(A, B) (R, error), a A, b B) (r R, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", ErrPanic, p)
		}
	}()
	return fn(a, b)
}

// call runs a user function with panic recovery and the node's retries. It
// takes the function and its arguments separately so that no closure is
// allocated per record.
func call[A, B, R any](ctx context.Context, rp retryPolicy, fn func(A, B) (R, error), a A, b B) (R, error) {
	r, err := protect(fn, a, b)
	for attempt := 1; err != nil && attempt < rp.attempts; attempt++ {
		if backoff.Sleep(ctx, rp.backoff.Delay(attempt-1)) != nil {
			return r, err
		}
		r, err = protect(fn, a, b)
	}
	return r, err
}

// protectErr is protect for functions returning only an error.
func protectErr[A, B any](fn func(A, B) error, a A, b B) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", ErrPanic, p)
		}
	}()
	return fn(a, b)
}

// callErr is call for functions returning only an error.
func callErr[A, B any](ctx context.Context, rp retryPolicy, fn func(A, B) error, a A, b B) error {
	err := protectErr(fn, a, b)
	for attempt := 1; err != nil && attempt < rp.attempts; attempt++ {
		if backoff.Sleep(ctx, rp.backoff.Delay(attempt-1)) != nil {
			return err
		}
		err = protectErr(fn, a, b)
	}
	return err
}

// Map applies fn to every record.
func Map[T, U any](s *Stream[T], uid string, fn func(context.Context, T) (U, error), opts ...OperatorOption) *Stream[U] {
	n := s.n.job.addNode(uid, kindMap, s.n)
	applyOps(n, opts)
	n.buildInput = func(b *chainBuilder) (any, error) {
		next, err := outputs[U](b, n.outs)
		if err != nil {
			return nil, err
		}
		c, reject := b.counter(n), b.rejecter(n)
		return emitFn[T](func(ctx context.Context, v T, ts int64) error {
			c.in++
			var u U
			var err error
			if tr := b.meta.trace; tr != nil {
				u, err = traced(ctx, tr, n.uid, n.kind, n.retry, fn, v) // hooks.go
			} else {
				u, err = call(ctx, n.retry, fn, ctx, v)
			}
			if err != nil {
				return reject(ctx, err, v, ts)
			}
			c.out++
			return next(ctx, u, ts)
		}), nil
	}
	return &Stream[U]{n: n}
}

// Filter keeps the records for which fn returns true.
func Filter[T any](s *Stream[T], uid string, fn func(context.Context, T) (bool, error), opts ...OperatorOption) *Stream[T] {
	n := s.n.job.addNode(uid, kindFilter, s.n)
	applyOps(n, opts)
	n.buildInput = func(b *chainBuilder) (any, error) {
		next, err := outputs[T](b, n.outs)
		if err != nil {
			return nil, err
		}
		c, reject := b.counter(n), b.rejecter(n)
		return emitFn[T](func(ctx context.Context, v T, ts int64) error {
			c.in++
			var keep bool
			var err error
			if tr := b.meta.trace; tr != nil {
				keep, err = traced(ctx, tr, n.uid, n.kind, n.retry, fn, v) // hooks.go
			} else {
				keep, err = call(ctx, n.retry, fn, ctx, v)
			}
			if err != nil {
				return reject(ctx, err, v, ts)
			}
			if !keep {
				return nil
			}
			c.out++
			return next(ctx, v, ts)
		}), nil
	}
	return &Stream[T]{n: n}
}

// Collector receives the records a FlatMap function emits. It is valid only
// during the call it is passed to.
type Collector[U any] struct {
	ctx  context.Context
	next emitFn[U]
	ts   int64
	err  error
	n    int64
}

// Emit passes v downstream (with the input record's event time). After a
// downstream error, Emit does nothing and the FlatMap call fails with it.
func (c *Collector[U]) Emit(v U) {
	if c.err != nil {
		return
	}
	c.n++
	c.err = c.next(c.ctx, v, c.ts)
}

// Err returns the first downstream error of the collector.
func (c *Collector[U]) Err() error { return c.err }

// FlatMap calls fn for every record; fn emits any number of records through
// the Collector.
func FlatMap[T, U any](s *Stream[T], uid string, fn func(context.Context, T, *Collector[U]) error, opts ...OperatorOption) *Stream[U] {
	n := s.n.job.addNode(uid, kindFlatMap, s.n)
	applyOps(n, opts)
	n.buildInput = func(b *chainBuilder) (any, error) {
		next, err := outputs[U](b, n.outs)
		if err != nil {
			return nil, err
		}
		c, reject := b.counter(n), b.rejecter(n)
		col := &Collector[U]{next: next}
		fm := func(v T, col *Collector[U]) (struct{}, error) { return struct{}{}, fn(col.ctx, v, col) }
		return emitFn[T](func(ctx context.Context, v T, ts int64) error {
			c.in++
			col.ctx, col.ts, col.err, col.n = ctx, ts, nil, 0
			var end func(error)
			if tr := b.meta.trace; tr != nil {
				col.ctx, end = tr.StartOperator(ctx, n.uid, n.kind) // hooks.go
			}
			_, err := call(ctx, n.retry, fm, v, col)
			if end != nil {
				end(err)
			}
			c.out += col.n
			if col.err != nil {
				return col.err // downstream failure: not the user's record's fault
			}
			if err != nil {
				return reject(ctx, err, v, ts)
			}
			return nil
		}), nil
	}
	return &Stream[U]{n: n}
}

// Union merges streams of the same type. Records keep their per-input order
// only.
func Union[T any](a *Stream[T], others ...*Stream[T]) *Stream[T] {
	ins := []*node{a.n}
	uid := a.n.uid + "+union"
	for _, o := range others {
		ins = append(ins, o.n)
		uid += "+" + o.n.uid
	}
	n := a.n.job.addNode(uid, kindUnion, ins...)
	n.buildInput = func(b *chainBuilder) (any, error) {
		next, err := outputs[T](b, n.outs)
		if err != nil {
			return nil, err
		}
		return next, nil
	}
	return &Stream[T]{n: n}
}

// To writes the stream to a sink. uid identifies the sink (pending
// transactions of TwoPhaseCommit sinks are recorded under it). The sink runs
// in one task of its own; do not pass one sink value to several To calls.
func To[T any](s *Stream[T], uid string, sk sink.Sink[T], opts ...OperatorOption) {
	n := newSinkNode(s.n.job, uid, sk, s.n)
	applyOps(n, opts)
}

// outputs builds the fan-out to the consumer nodes of a producer of T.
func outputs[T any](b *chainBuilder, consumers []*node) (emitFn[T], error) {
	fns := make([]emitFn[T], 0, len(consumers))
	for _, c := range consumers {
		in, err := b.input(c)
		if err != nil {
			return nil, err
		}
		fn, ok := in.(emitFn[T])
		if !ok {
			return nil, fmt.Errorf("pipeline: operator %q: input type mismatch (%T)", c.uid, in)
		}
		fns = append(fns, fn)
	}
	switch len(fns) {
	case 0:
		return func(context.Context, T, int64) error { return nil }, nil
	case 1:
		return fns[0], nil
	}
	return func(ctx context.Context, v T, ts int64) error {
		for _, f := range fns {
			if err := f(ctx, v, ts); err != nil {
				return err
			}
		}
		return nil
	}, nil
}
