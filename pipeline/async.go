package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/internal/failpoint"
)

// Async I/O (Flink's AsyncDataStream.orderedWait / unorderedWait): an
// operator that calls a service per record without waiting for each
// answer before the next record. Each subtask (a parallel stage,
// rebalance.go) keeps up to AsyncCapacity requests in flight; a record
// that finds it full waits for one to complete. A request completes with
// its results, with an error, or with ErrAsyncTimeout after AsyncTimeout;
// a failed one is issued again under the operator's Retry option (all
// attempts, exponential backoff; AsyncRetryIf picks the errors retried),
// and after its last attempt its record goes to the operator's OnError
// policy (Fail by default), in its place in the output.
//
// Result order: OrderedWait emits results in the order of its input
// (of each subtask's input). UnorderedWait emits a result as soon as its
// request completed, but never across a watermark: the results of records
// before a watermark are all emitted before it, those of records after it
// come after it (Flink's unordered mode in event time).
//
// Exactly-once: every checkpoint stores, in the operator's state, the
// input records (and event times) of the requests not yet emitted when
// its barrier passed; their results are emitted after the barrier, so
// they belong to the next checkpoint. After a restore the records are
// issued again (split evenly over the subtasks when the parallelism
// changed) before any new input: a result is emitted exactly once, while
// the service may see a request more than once (at-least-once calls).

// ErrAsyncTimeout is the error of an async request that did not complete
// within AsyncTimeout.
var ErrAsyncTimeout = errors.New("pipeline: async request timed out")

// DefaultAsyncCapacity is the number of requests in flight per subtask of
// an async operator without AsyncCapacity.
const DefaultAsyncCapacity = 100

// AsyncFunc calls a service for one record and returns its result. It runs
// on a goroutine of its own (up to the operator's capacity at once) and
// must be safe for concurrent use. ctx carries the attempt's deadline
// (AsyncTimeout) and is cancelled when the job stops: fn must return soon
// after it is done; the operator waits for its calls when it stops.
type AsyncFunc[T, U any] func(ctx context.Context, v T) (U, error)

// AsyncFutureFunc starts a request for v and returns at once; the request
// completes later, from any goroutine, through rf (Flink's asyncInvoke
// with its ResultFuture). It is called on the operator's task goroutine
// and must not block. ctx is the request's (its deadline, cancelled when
// the job stops).
type AsyncFutureFunc[T, U any] func(ctx context.Context, v T, rf ResultFuture[U])

// ResultFuture completes one attempt of an async request. Only its first
// completion counts; completions after the attempt timed out, or after the
// job stopped, are ignored. It is safe to use from any goroutine.
type ResultFuture[U any] struct {
	c   *asyncCell[U]
	gen uint64
}

// Complete completes the request with zero or more results (emitted with
// the record's event time). The operator keeps vs: do not change it
// afterwards.
func (f ResultFuture[U]) Complete(vs ...U) {
	if f.c != nil && f.c.claim.CompareAndSwap(f.gen, 0) {
		f.c.box.post(asyncDone[U]{idx: f.c.idx, gen: f.gen, many: vs})
	}
}

// CompleteError fails the attempt with err (retried under the operator's
// Retry option).
func (f ResultFuture[U]) CompleteError(err error) {
	if err == nil {
		err = errors.New("pipeline: async request failed with a nil error")
	}
	if f.c != nil && f.c.claim.CompareAndSwap(f.gen, 0) {
		f.c.box.post(asyncDone[U]{idx: f.c.idx, gen: f.gen, err: err})
	}
}

// asyncCell is the part of a request slot that other goroutines touch:
// claim holds the attempt (generation) that may still complete, 0 when
// none; whoever swaps it to 0 posts the attempt's one completion.
type asyncCell[U any] struct {
	claim atomic.Uint64
	box   *asyncBox[U]
	idx   int32
}

// asyncDone is a completion (or, with retry, a due retry) of slot idx's
// attempt gen.
type asyncDone[U any] struct {
	idx    int32
	gen    uint64
	one    U
	single bool
	many   []U
	err    error
	retry  bool
}

// asyncBox collects completions for the operator's task goroutine.
type asyncBox[U any] struct {
	notify chan struct{} // cap 1
	mu     struct {
		sync.Mutex
		q []asyncDone[U]
	}
}

func (b *asyncBox[U]) post(d asyncDone[U]) {
	b.mu.Lock()
	b.mu.q = append(b.mu.q, d)
	b.mu.Unlock()
	poke(b.notify)
}

// take swaps the posted completions with dst (emptied).
func (b *asyncBox[U]) take(dst []asyncDone[U]) []asyncDone[U] {
	b.mu.Lock()
	q := b.mu.q
	b.mu.q = dst[:0]
	b.mu.Unlock()
	return q
}

type asyncConfig struct {
	capacity int
	timeout  time.Duration
	retryIf  func(error) bool
}

// asyncOption is an OperatorOption of the async operators only (the
// others ignore it).
type asyncOption func(*asyncConfig)

func (asyncOption) applyOp(*opConfig) {}

// AsyncCapacity sets how many requests each subtask of an async operator
// keeps in flight (default DefaultAsyncCapacity). Ordered operators count
// completed requests waiting for an earlier one.
func AsyncCapacity(n int) OperatorOption {
	return asyncOption(func(c *asyncConfig) { c.capacity = n })
}

// AsyncTimeout bounds each attempt of an async request: past d it fails
// with ErrAsyncTimeout (and its ctx is cancelled). 0, the default, waits
// for ever.
func AsyncTimeout(d time.Duration) OperatorOption {
	return asyncOption(func(c *asyncConfig) { c.timeout = d })
}

// AsyncRetryIf retries only the failed attempts for whose error retryable
// returns true (default: every error, timeouts included), under the
// operator's Retry option.
func AsyncRetryIf(retryable func(error) bool) OperatorOption {
	return asyncOption(func(c *asyncConfig) { c.retryIf = retryable })
}

// OrderedWait calls fn for every record of s, up to AsyncCapacity at once
// per subtask, and emits the results in input order. Parallelism (default
// DefaultParallelism) subtasks are fed as by Rebalance. Options: Parallelism,
// AsyncCapacity, AsyncTimeout, Retry, AsyncRetryIf and OnError. The records
// in flight are stored with checkpoints in the codec of s (Stream.WithCodec;
// default JSON).
// It runs in one process (see ErrSingleProcessOnly).
func OrderedWait[T, U any](s *Stream[T], uid string, fn AsyncFunc[T, U], opts ...OperatorOption) *Stream[U] {
	if fn == nil {
		s.n.job.errorf("async operator %q: nil function", uid)
	}
	return asyncWait(s, uid, true, fn, nil, opts)
}

// UnorderedWait is OrderedWait emitting each result as soon as it is
// complete, within the bounds of the watermarks around its record.
func UnorderedWait[T, U any](s *Stream[T], uid string, fn AsyncFunc[T, U], opts ...OperatorOption) *Stream[U] {
	if fn == nil {
		s.n.job.errorf("async operator %q: nil function", uid)
	}
	return asyncWait(s, uid, false, fn, nil, opts)
}

// OrderedWaitFuture is OrderedWait with a function that completes its
// requests through a ResultFuture.
func OrderedWaitFuture[T, U any](s *Stream[T], uid string, fn AsyncFutureFunc[T, U], opts ...OperatorOption) *Stream[U] {
	if fn == nil {
		s.n.job.errorf("async operator %q: nil function", uid)
	}
	return asyncWait(s, uid, true, nil, fn, opts)
}

// UnorderedWaitFuture is UnorderedWait with a function that completes its
// requests through a ResultFuture.
func UnorderedWaitFuture[T, U any](s *Stream[T], uid string, fn AsyncFutureFunc[T, U], opts ...OperatorOption) *Stream[U] {
	if fn == nil {
		s.n.job.errorf("async operator %q: nil function", uid)
	}
	return asyncWait(s, uid, false, nil, fn, opts)
}

// asyncStateName is the operator state list of the requests in flight.
const asyncStateName = "runnel.async.inflight"

func asyncWait[T, U any](s *Stream[T], uid string, ordered bool, fn AsyncFunc[T, U], ffn AsyncFutureFunc[T, U], opts []OperatorOption) *Stream[U] {
	j := s.n.job
	cfg := asyncConfig{capacity: DefaultAsyncCapacity}
	for _, o := range opts {
		if a, ok := o.(asyncOption); ok {
			a(&cfg)
		}
	}
	codec := s.codec
	if codec == nil {
		codec = JSON[T]()
	}
	if cfg.capacity < 1 {
		j.errorf("async operator %q: capacity %d < 1", uid, cfg.capacity)
	}
	if cfg.timeout < 0 {
		j.errorf("async operator %q: negative timeout %v", uid, cfg.timeout)
	}
	out := parallelStage[T, U](s, uid, kindAsync, opts, func(e *stageEnv) (stageOp[T], error) {
		next, err := outputs[U](e.b, e.n.outs)
		if err != nil {
			return nil, err
		}
		o := &asyncOp[T, U]{env: e, ordered: ordered, fn: fn, ffn: ffn, cfg: cfg, retry: e.n.retry, codec: codec,
			drop: failpoint.Enabled && j.cfg.faults.AsyncDropInFlight, next: next, ports: e.b.ports, cnt: e.cnt,
			slots: make([]asyncSlot[T, U], cfg.capacity), free: make([]int32, 0, cfg.capacity),
			q: asyncQueue{buf: make([]asyncEntry, 2*cfg.capacity+2)}, state: &rawList{name: asyncStateName}}
		o.box.notify = make(chan struct{}, 1)
		for i := range o.slots {
			o.slots[i].cell.box, o.slots[i].cell.idx = &o.box, int32(i)
			o.free = append(o.free, int32(cfg.capacity-1-i))
		}
		return o, nil
	})
	out.n.codecs = "in=" + codec.ID()
	return out
}

// asyncSlot is one request (a record and its current attempt).
type asyncSlot[T, U any] struct {
	cell     asyncCell[U]
	gen      uint64 // the current attempt
	in       T
	ts       int64
	attempt  int
	one      U
	single   bool
	many     []U
	err      error
	done     bool
	ctx      context.Context    // the attempt's
	cancel   context.CancelFunc // the attempt's context; nil when none
	deadline time.Duration      // the attempt's, since the operator's epoch (AsyncTimeout)
	retry    *time.Timer        // a retry waiting for its backoff; nil when none
}

// asyncEntry is a queued record (slot >= 0) or watermark (slot < 0).
type asyncEntry struct {
	slot int32
	wm   int64
}

// asyncQueue is a growable ring of entries.
type asyncQueue struct {
	buf     []asyncEntry
	head, n int
}

func (q *asyncQueue) at(i int) *asyncEntry { return &q.buf[(q.head+i)%len(q.buf)] }

func (q *asyncQueue) push(e asyncEntry) {
	if q.n == len(q.buf) {
		nb := make([]asyncEntry, 2*len(q.buf))
		for i := range q.n {
			nb[i] = *q.at(i)
		}
		q.buf, q.head = nb, 0
	}
	q.buf[(q.head+q.n)%len(q.buf)] = e
	q.n++
}

func (q *asyncQueue) pop() asyncEntry {
	e := q.buf[q.head]
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return e
}

// asyncOp is one subtask of an async operator.
type asyncOp[T, U any] struct {
	env     *stageEnv
	ordered bool
	fn      AsyncFunc[T, U]
	ffn     AsyncFutureFunc[T, U]
	cfg     asyncConfig
	retry   retryPolicy
	codec   Codec[T]
	drop    bool // Faults.AsyncDropInFlight
	next    emitFn[U]
	ports   []port
	cnt     *counter

	reqCtx    context.Context
	reqCancel context.CancelFunc
	wg        sync.WaitGroup // calls and retry timers started
	// The timeouts: tmr fires at the earliest deadline of the attempts in
	// flight (or a little before, when that attempt completed since);
	// epoch is what deadlines count from.
	tmr       *time.Timer
	armed     bool
	epoch     time.Time
	box       asyncBox[U]
	slots     []asyncSlot[T, U]
	free      []int32
	q         asyncQueue
	inflight  int // records in q
	gen       uint64
	done      []asyncDone[U]
	state     *rawList
	halted    bool
	unflushed bool // results emitted since wait last flushed the ports
}

func (o *asyncOp[T, U]) open(ctx context.Context) error {
	o.reqCtx, o.reqCancel = context.WithCancel(ctx)
	o.epoch = time.Now()
	if o.cfg.timeout > 0 {
		o.tmr = time.NewTimer(time.Hour)
		o.tmr.Stop()
	}
	restored := o.env.state.share(asyncStateName, false)
	if err := o.env.state.register(o.state); err != nil {
		return err
	}
	for _, b := range restored {
		if len(b) < 8 {
			return fmt.Errorf("malformed request in flight (%d bytes)", len(b))
		}
		v, err := o.codec.Decode(b[8:])
		if err != nil {
			return fmt.Errorf("decode request in flight: %w", err)
		}
		if err := o.process(ctx, v, int64(binary.BigEndian.Uint64(b))); err != nil {
			return err
		}
	}
	return nil
}

func (o *asyncOp[T, U]) process(ctx context.Context, v T, ts int64) error {
	for o.inflight >= len(o.slots) {
		if err := o.wait(ctx); err != nil {
			return err
		}
	}
	idx := o.free[len(o.free)-1]
	o.free = o.free[:len(o.free)-1]
	s := &o.slots[idx]
	s.in, s.ts, s.attempt = v, ts, 0
	o.q.push(asyncEntry{slot: idx})
	o.inflight++
	o.issue(idx)
	return nil
}

// wait handles completions once they come (after it passed on the
// results emitted so far).
func (o *asyncOp[T, U]) wait(ctx context.Context) error {
	if o.unflushed {
		o.unflushed = false
		if err := flushPorts(ctx, o.ports); err != nil {
			return err
		}
	}
	select {
	case <-o.box.notify:
		return o.onEvent(ctx)
	case <-o.timer():
		return o.onTimer(ctx)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// issue starts a new attempt of slot idx's request.
func (o *asyncOp[T, U]) issue(idx int32) {
	s := &o.slots[idx]
	s.attempt++
	o.gen++
	gen := o.gen
	s.gen = gen
	s.cell.claim.Store(gen)
	var cctx context.Context
	if o.cfg.timeout > 0 {
		cctx, s.cancel = context.WithTimeout(o.reqCtx, o.cfg.timeout)
		s.deadline = time.Since(o.epoch) + o.cfg.timeout
		if !o.armed {
			o.armed = true
			o.tmr.Reset(o.cfg.timeout)
		}
	} else {
		cctx, s.cancel = context.WithCancel(o.reqCtx)
	}
	s.ctx = cctx
	if o.fn != nil {
		o.wg.Add(1)
		go o.call(cctx, &s.cell, gen, s.in)
		return
	}
	o.callFuture(cctx, ResultFuture[U]{c: &s.cell, gen: gen}, s.in)
}

// call runs one attempt of an AsyncFunc (on a goroutine of its own).
func (o *asyncOp[T, U]) call(ctx context.Context, c *asyncCell[U], gen uint64, v T) {
	defer o.wg.Done()
	u, err := protect(o.fn, ctx, v)
	if c.claim.CompareAndSwap(gen, 0) {
		c.box.post(asyncDone[U]{idx: c.idx, gen: gen, one: u, single: err == nil, err: err})
	}
}

// callFuture starts one attempt of an AsyncFutureFunc.
func (o *asyncOp[T, U]) callFuture(ctx context.Context, rf ResultFuture[U], v T) {
	defer func() {
		if p := recover(); p != nil {
			rf.CompleteError(fmt.Errorf("%w: %v", ErrPanic, p))
		}
	}()
	o.ffn(ctx, v, rf)
}

func (o *asyncOp[T, U]) events() <-chan struct{} { return o.box.notify }

// onEvent applies the posted completions and emits what became ready.
func (o *asyncOp[T, U]) onEvent(ctx context.Context) error {
	if o.halted {
		return nil
	}
	o.done = o.box.take(o.done)
	for i := range o.done {
		o.apply(&o.done[i])
	}
	clear(o.done)
	o.done = o.done[:0]
	return o.emitReady(ctx)
}

// timer fires at the earliest deadline of the attempts in flight.
func (o *asyncOp[T, U]) timer() <-chan time.Time {
	if o.tmr == nil {
		return nil
	}
	return o.tmr.C
}

// onTimer fails the attempts past their deadline with ErrAsyncTimeout
// and sets the timer for the next deadline.
func (o *asyncOp[T, U]) onTimer(ctx context.Context) error {
	o.armed = false
	if o.halted {
		return nil
	}
	now := time.Since(o.epoch)
	next := time.Duration(math.MaxInt64)
	for i := range o.slots {
		s := &o.slots[i]
		if s.cancel == nil { // no attempt in flight
			continue
		}
		if s.deadline > now {
			next = min(next, s.deadline)
			continue
		}
		if s.cell.claim.CompareAndSwap(s.gen, 0) { // else its completion is posted
			o.apply(&asyncDone[U]{idx: int32(i), gen: s.gen, err: ErrAsyncTimeout})
		}
	}
	if next != math.MaxInt64 && !o.armed {
		o.armed = true
		o.tmr.Reset(next - now)
	}
	return o.emitReady(ctx)
}

// apply applies one completion (or due retry) to its slot.
func (o *asyncOp[T, U]) apply(d *asyncDone[U]) {
	s := &o.slots[d.idx]
	if d.gen != s.gen || s.done {
		return // cannot happen: one completion per attempt
	}
	if d.retry {
		s.retry = nil
		o.issue(d.idx)
		return
	}
	if d.err != nil && !errors.Is(d.err, ErrAsyncTimeout) && errors.Is(s.ctx.Err(), context.DeadlineExceeded) {
		d.err = fmt.Errorf("%w: %w", ErrAsyncTimeout, d.err) // the function returned its ctx's error
	}
	s.cancel()
	s.cancel, s.ctx = nil, nil
	if d.err != nil && s.attempt < o.retry.attempts && (o.cfg.retryIf == nil || o.cfg.retryIf(d.err)) {
		idx, gen := d.idx, d.gen
		o.wg.Add(1)
		s.retry = time.AfterFunc(o.retry.backoff.Delay(s.attempt-1), func() {
			defer o.wg.Done()
			o.box.post(asyncDone[U]{idx: idx, gen: gen, retry: true})
		})
		return
	}
	s.done, s.err, s.one, s.single, s.many = true, d.err, d.one, d.single, d.many
}

// emitReady emits the completed requests that may go: ordered, those at
// the head of the queue; unordered, those before the first queued
// watermark. A watermark at the head goes once everything before it went.
func (o *asyncOp[T, U]) emitReady(ctx context.Context) error {
	for o.q.n > 0 {
		e := o.q.at(0)
		if e.slot < 0 {
			wm := o.q.pop().wm
			if err := watermarkPorts(ctx, o.ports, wm); err != nil {
				return err
			}
			continue
		}
		if o.slots[e.slot].done {
			idx := o.q.pop().slot
			if err := o.emitSlot(ctx, idx); err != nil {
				return err
			}
			continue
		}
		if o.ordered {
			return nil
		}
		// Unordered: emit the completed records of the head segment (up to
		// the first watermark) and close the gaps they leave.
		end := 1
		for end < o.q.n && o.q.at(end).slot >= 0 {
			end++
		}
		w := 1
		for i := 1; i < end; i++ {
			x := *o.q.at(i)
			if o.slots[x.slot].done {
				if err := o.emitSlot(ctx, x.slot); err != nil {
					return err
				}
				continue
			}
			*o.q.at(w) = x
			w++
		}
		if gap := end - w; gap > 0 {
			for i := end; i < o.q.n; i++ {
				*o.q.at(i - gap) = *o.q.at(i)
			}
			o.q.n -= gap
		}
		return nil
	}
	return nil
}

// emitSlot emits slot idx's results (or hands its error to the policy)
// and frees it.
func (o *asyncOp[T, U]) emitSlot(ctx context.Context, idx int32) error {
	s := &o.slots[idx]
	o.unflushed = true
	var err error
	switch {
	case s.err != nil:
		err = o.env.reject(ctx, s.err, s.in, s.ts)
	case s.single:
		o.cnt.out++
		err = o.next(ctx, s.one, s.ts)
	default:
		for _, u := range s.many {
			o.cnt.out++
			if err = o.next(ctx, u, s.ts); err != nil {
				break
			}
		}
	}
	var zero T
	var zu U
	s.in, s.one, s.many, s.err, s.done, s.single = zero, zu, nil, nil, false, false
	o.free = append(o.free, idx)
	o.inflight--
	return err
}

func (o *asyncOp[T, U]) watermark(ctx context.Context, wm int64) error {
	if o.q.n == 0 {
		return watermarkPorts(ctx, o.ports, wm)
	}
	if last := o.q.at(o.q.n - 1); last.slot < 0 && last.wm > activeNoWatermark && wm > activeNoWatermark {
		last.wm = wm // a newer watermark replaces one waiting at the tail
		return nil
	}
	o.q.push(asyncEntry{slot: -1, wm: wm})
	return nil
}

// snapshot stores the records of the requests not emitted, in queue order.
func (o *asyncOp[T, U]) snapshot(uint64) error {
	clear(o.state.elems)
	o.state.elems = o.state.elems[:0]
	if o.drop {
		return nil // Faults.AsyncDropInFlight: the control of the crash tests
	}
	for i := range o.q.n {
		e := o.q.at(i)
		if e.slot < 0 {
			continue
		}
		s := &o.slots[e.slot]
		b := binary.BigEndian.AppendUint64(make([]byte, 0, 64), uint64(s.ts))
		b, err := o.codec.Append(b, s.in)
		if err != nil {
			return fmt.Errorf("encode request in flight: %w", err)
		}
		o.state.elems = append(o.state.elems, b)
	}
	return nil
}

func (o *asyncOp[T, U]) pending() bool { return o.q.n > 0 && !o.halted }

// stopped: after a stop barrier the requests in flight belong to the
// checkpoint; their results are not emitted.
func (o *asyncOp[T, U]) stopped() {
	o.halted = true
	o.reqCancel()
}

func (o *asyncOp[T, U]) close() error {
	if o.tmr != nil {
		o.tmr.Stop()
	}
	for i := range o.slots {
		s := &o.slots[i]
		if s.retry != nil && s.retry.Stop() {
			o.wg.Done()
		}
		s.retry = nil
	}
	if o.reqCancel != nil {
		o.reqCancel()
	}
	o.wg.Wait()
	for i := range o.slots {
		if c := o.slots[i].cancel; c != nil {
			c()
		}
	}
	return nil
}
