package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/runtime"
)

// Parallel stages. Rebalance, the async I/O operators (async.go) and
// ProcessStream (opstate.go) run in subtasks of their own, Parallelism of
// them (default DefaultParallelism), whatever the number of source splits:
// every task upstream deals its records over the subtasks in batches,
// round robin, skipping subtasks whose queue is full (rrPort), and sends
// its barriers, watermarks and end of stream to all of them. A subtask aligns
// barriers over its senders like a keyed subtask, combines their
// watermarks (the minimum), and runs the operators chained after its
// stage operator, up to the next exchange (a KeyBy, a sink, another
// stage). Their non-keyed state (operator state: OperatorStateStore) is
// stored under the stage operator's UID by every checkpoint and
// redistributed on a restore with another parallelism.
//
// Parallel stages run in one process: RunWorker refuses a job that has
// one (ErrSingleProcessOnly).

// Node kinds of the parallel stages.
const (
	kindRebalance = "rebalance"
	kindAsync     = "async"
	kindOpProcess = "process"
)

// ErrSingleProcessOnly is wrapped (with ErrInvalidGraph) in RunWorker's
// error for a job with an operator that runs in a single process only:
// Rebalance, OrderedWait/UnorderedWait (and their Future forms) and
// ProcessStream. Job.Run runs them.
var ErrSingleProcessOnly = errors.New("pipeline: operator runs in a single process only")

// checkSingleProcess returns an error naming the first operator of the job
// that RunWorker cannot distribute (nil when there is none).
func (j *Job) checkSingleProcess() error {
	for _, n := range j.nodes {
		switch n.kind {
		case kindRebalance, kindAsync, kindOpProcess:
			return fmt.Errorf("%w: %w: operator %q (%s): RunWorker does not distribute Rebalance, async I/O or ProcessStream operators; run the job with Job.Run", ErrInvalidGraph, ErrSingleProcessOnly, n.uid, n.kind)
		}
	}
	return nil
}

// stateOperators lists the parallel stages that keep operator state, for
// the checkpoint fingerprint.
func (j *Job) stateOperators() []checkpoint.OperatorInfo {
	var ops []checkpoint.OperatorInfo
	for _, n := range j.nodes {
		if n.kind == kindAsync || n.kind == kindOpProcess {
			ops = append(ops, checkpoint.OperatorInfo{UID: n.uid, Kind: n.kind, Codecs: n.codecs})
		}
	}
	return ops
}

// Rebalance redistributes s over Parallelism subtasks (default
// DefaultParallelism) that run the operators chained after it (Map,
// Filter, FlatMap, ... up to the next KeyBy or sink): stateless work after
// a source with fewer splits than cores runs on every core. Every task
// upstream deals its records in batches (up to 256 records, or what one
// source poll returned) round robin over the subtasks, skipping subtasks
// whose queue is full: a subtask that falls behind (a slow record, a
// descheduled thread) gets less, instead of holding the others up. Flink
// deals single records strictly round robin; its load-based variant
// (FLIP-339) is what this resembles. Records keep no order across
// subtasks; each subtask sees its records in the order of each of its
// inputs. Its UID is s's followed by "+rebalance"; only
// Parallelism applies of the operator options. It runs in one process
// (see ErrSingleProcessOnly).
func Rebalance[T any](s *Stream[T], opts ...OperatorOption) *Stream[T] {
	return parallelStage[T, T](s, s.n.uid+"+rebalance", kindRebalance, opts, func(e *stageEnv) (stageOp[T], error) {
		next, err := outputs[T](e.b, e.n.outs)
		if err != nil {
			return nil, err
		}
		return &rebalanceOp[T]{next: next, ports: e.b.ports, cnt: e.cnt}, nil
	})
}

// rebalanceOp passes records and watermarks on.
type rebalanceOp[T any] struct {
	next  emitFn[T]
	ports []port
	cnt   *counter
}

func (o *rebalanceOp[T]) open(context.Context) error { return nil }
func (o *rebalanceOp[T]) process(ctx context.Context, v T, ts int64) error {
	o.cnt.out++
	return o.next(ctx, v, ts)
}
func (o *rebalanceOp[T]) watermark(ctx context.Context, wm int64) error {
	return watermarkPorts(ctx, o.ports, wm)
}
func (o *rebalanceOp[T]) events() <-chan struct{}       { return nil }
func (o *rebalanceOp[T]) onEvent(context.Context) error { return nil }
func (o *rebalanceOp[T]) timer() <-chan time.Time       { return nil }
func (o *rebalanceOp[T]) onTimer(context.Context) error { return nil }
func (o *rebalanceOp[T]) snapshot(uint64) error         { return nil }
func (o *rebalanceOp[T]) pending() bool                 { return false }
func (o *rebalanceOp[T]) close() error                  { return nil }
func (o *rebalanceOp[T]) stopped()                      {}

// stageOp is a parallel stage's operator in one subtask. The stage task
// calls it from the subtask's goroutine only.
type stageOp[T any] interface {
	// open starts the subtask (after its operator state was restored).
	open(ctx context.Context) error
	// process handles one input record (it may block, for capacity).
	process(ctx context.Context, v T, ts int64) error
	// watermark handles the subtask's combined input watermark, or the
	// idleWatermark and activeNoWatermark markers: it must pass them on
	// to the task's ports in order with its output.
	watermark(ctx context.Context, wm int64) error
	// events, when not nil, signals work for onEvent (completions);
	// timer, when not nil, fires for onTimer (timeouts).
	events() <-chan struct{}
	onEvent(ctx context.Context) error
	timer() <-chan time.Time
	onTimer(ctx context.Context) error
	// snapshot updates the subtask's operator state for checkpoint id
	// (written by the stage task after it).
	snapshot(id uint64) error
	// pending reports work outstanding (requests in flight): after every
	// input ended, the task waits for it to end (handling events and
	// checkpoints) before it ends its own output.
	pending() bool
	// stopped is called after a stop barrier passed: emit nothing more.
	stopped()
	// close releases the operator (after its task's loop ended).
	close() error
}

// stageEnv is what a stage operator is built with, in its subtask's task.
type stageEnv struct {
	b      *chainBuilder
	n      *node
	sub    int
	par    int
	cnt    *counter
	reject func(ctx context.Context, err error, v any, ts int64) error
	state  *OperatorStateStore // opstate.go
}

// stageQueueLen is the number of messages buffered per (sender, subtask)
// pair of a parallel stage (queueLen elsewhere): a deeper queue keeps
// CPU-bound subtasks from running dry between two wake-ups of their
// sender.
const stageQueueLen = 4 * queueLen

// srec is a record on a channel to a parallel stage's subtask.
type srec[T any] struct {
	v  T
	ts int64
}

// rrPort is one task's output to the subtasks of a parallel stage. It
// deals whole batches: records fill one batch (up to batchSize, or what
// is there when the task flushes), which goes to the next subtask in
// round-robin order that has room in its queue, skipping subtasks that
// are behind (a load-based rebalance, as in Flink's FLIP-339); it waits
// only when every subtask's queue is full. Barriers, watermarks and the
// end of stream go to every subtask, after the batch.
type rrPort[T any] struct {
	ins    []*inbox[srec[T]]
	sender int
	pool   *sync.Pool
	buf    *[]srec[T]
	next   int
}

func (p *rrPort[T]) emit(ctx context.Context, v T, ts int64) error {
	if p.buf == nil {
		p.buf = getBatch[srec[T]](p.pool)
	}
	*p.buf = append(*p.buf, srec[T]{v: v, ts: ts})
	if len(*p.buf) >= batchSize {
		return p.flush(ctx)
	}
	return nil
}

func (p *rrPort[T]) flush(ctx context.Context) error {
	if p.buf == nil || len(*p.buf) == 0 {
		return nil
	}
	m := message[srec[T]]{kind: msgData, batch: p.buf}
	p.buf = nil
	n := len(p.ins)
	for k := range n {
		i := (p.next + k) % n
		if p.ins[i].tryPush(p.sender, m) {
			p.next = (i + 1) % n
			return nil
		}
	}
	i := p.next
	p.next = (i + 1) % n
	return p.ins[i].push(ctx, p.sender, m)
}

// tryPush appends m to sender's queue if it has room.
func (in *inbox[R]) tryPush(sender int, m message[R]) bool {
	in.mu.Lock()
	q := &in.mu.q[sender]
	if q.n == len(q.buf) {
		in.mu.Unlock()
		return false
	}
	q.push(m)
	in.mu.Unlock()
	poke(in.notify)
	return true
}

func (p *rrPort[T]) broadcast(ctx context.Context, m message[srec[T]]) error {
	if err := p.flush(ctx); err != nil {
		return err
	}
	return pushAll(ctx, p.ins, p.sender, m)
}

func (p *rrPort[T]) barrier(ctx context.Context, id uint64, stop bool) error {
	return p.broadcast(ctx, message[srec[T]]{kind: msgBarrier, id: id, stop: stop})
}

// watermark sends wm to every subtask; where the last message queued
// for a subtask is still an unread watermark, wm replaces it (nothing came
// between them, and watermarks only grow): a subtask that was dealt no
// batch since the last watermark is not sent another message.
func (p *rrPort[T]) watermark(ctx context.Context, wm int64) error {
	if err := p.flush(ctx); err != nil {
		return err
	}
	for _, in := range p.ins {
		if wm > activeNoWatermark && in.replaceWatermark(p.sender, wm) {
			continue
		}
		if err := in.push(ctx, p.sender, message[srec[T]]{kind: msgWatermark, wm: wm}); err != nil {
			return err
		}
	}
	return nil
}

// replaceWatermark sets the watermark at the tail of sender's queue to wm
// when the tail is a (regular) watermark not yet read.
func (in *inbox[R]) replaceWatermark(sender int, wm int64) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	q := &in.mu.q[sender]
	if q.n == 0 {
		return false
	}
	tail := &q.buf[(q.head+q.n-1)%len(q.buf)]
	if tail.kind != msgWatermark || tail.wm <= activeNoWatermark {
		return false
	}
	tail.wm = max(tail.wm, wm)
	return true
}

func (p *rrPort[T]) end(ctx context.Context) error {
	return p.broadcast(ctx, message[srec[T]]{kind: msgEOS})
}

// parallelStage adds a parallel stage node of kind whose subtasks run the
// operator newOp builds (one per subtask, in the subtask's task).
func parallelStage[T, U any](s *Stream[T], uid, kind string, opts []OperatorOption, newOp func(e *stageEnv) (stageOp[T], error)) *Stream[U] {
	j := s.n.job
	n := j.addNode(uid, kind, s.n)
	cfg := applyOps(n, opts)
	n.exchange = true
	n.parallelism = j.cfg.parallelism
	if cfg.parallelism != 0 {
		n.parallelism = cfg.parallelism
	}
	pool := newBatchPool[srec[T]]()
	var ins []*inbox[srec[T]]
	n.setup = func(*jobRun) error {
		ins = make([]*inbox[srec[T]], n.parallelism)
		for i := range ins {
			ins[i] = newInbox[srec[T]](n.senders, pool)
			for s := range ins[i].mu.q {
				ins[i].mu.q[s].buf = make([]message[srec[T]], stageQueueLen)
			}
		}
		return nil
	}
	n.addSender = func() {
		for _, in := range ins {
			in.addSender()
		}
	}
	n.buildInput = func(b *chainBuilder) (any, error) {
		if b.r.scope != nil {
			return nil, fmt.Errorf("%w: operator %q", ErrSingleProcessOnly, uid)
		}
		sd, err := b.sender(n)
		if err != nil {
			return nil, err
		}
		p := &rrPort[T]{ins: ins, sender: sd, pool: pool, next: sd % len(ins)}
		for _, in := range ins {
			in.setBlocked(sd, b.blockedCounter()) // hooks.go
		}
		b.addPort(p)
		return emitFn[T](p.emit), nil
	}
	n.taskCount = func(_ context.Context, r *jobRun) (int, error) {
		if r.scope != nil {
			if r.scope.local[n] {
				return 0, fmt.Errorf("%w: operator %q", ErrSingleProcessOnly, uid)
			}
			return 0, nil
		}
		return n.parallelism, nil
	}
	n.startTask = func(r *jobRun, t *taskInfo) error {
		b := newChainBuilder(r, t)
		env := &stageEnv{b: b, n: n, sub: t.subtask, par: n.parallelism, cnt: b.counter(n), reject: b.rejecter(n),
			state: newOperatorStateStore(r.engine, uid, t.subtask, n.parallelism)}
		op, err := newOp(env)
		if err != nil {
			return err
		}
		st := &stageTask[T]{n: n, env: env, in: ins[t.subtask], op: op, log: r.engine.Logger()}
		_, err = r.engine.AddTask(fmt.Sprintf("%s/%d", uid, t.subtask), runtime.OperatorTask, st.run)
		return err
	}
	return &Stream[U]{n: n}
}

// stageTask is one subtask of a parallel stage: the inputTask of its
// inputLoop (taskloop.go), driving the stage's operator.
type stageTask[T any] struct {
	n   *node
	env *stageEnv
	in  *inbox[srec[T]]
	op  stageOp[T]
	log interface {
		Warn(msg string, args ...any)
	}
}

func (st *stageTask[T]) run(ctx context.Context, h *runtime.Handle) (err error) {
	defer recoverTask(&err)
	op := st.op
	if err := st.env.state.restore(); err != nil {
		return fmt.Errorf("restore operator state: %w", err)
	}
	defer func() {
		if cerr := op.close(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	if err := op.open(ctx); err != nil {
		return fmt.Errorf("open: %w", err)
	}
	b := st.env.b
	return newInputLoop(h, st.in, inputTask[srec[T]](st), b.ports, b.flushCounters, true, math.MinInt64, st.n.stats.Watermark(st.env.sub)).run(ctx)
}

// process implements inputTask.
func (st *stageTask[T]) process(ctx context.Context, m message[srec[T]]) error {
	for i := range *m.batch {
		r := &(*m.batch)[i]
		st.env.cnt.in++
		if err := st.op.process(ctx, r.v, r.ts); err != nil {
			return err
		}
	}
	return nil
}

// snapshot implements checkpointed: the operator's state.
func (st *stageTask[T]) snapshot(_ context.Context, id uint64) (runtime.Ack, error) {
	if err := st.op.snapshot(id); err != nil {
		return runtime.Ack{}, fmt.Errorf("snapshot operator state: %w", err)
	}
	part, err := st.env.state.part()
	if err != nil {
		return runtime.Ack{}, fmt.Errorf("snapshot operator state: %w", err)
	}
	return runtime.Ack{Part: part}, nil
}

// note implements checkpointed: operator state is written whole by every
// checkpoint, there is nothing to do.
func (st *stageTask[T]) note(context.Context, runtime.Note) error { return nil }

// advanced implements inputTask: a stage has no event timers.
func (st *stageTask[T]) advanced(context.Context, int64) error { return nil }

// watermark implements inputTask: the operator passes watermarks on, in
// order with its output.
func (st *stageTask[T]) watermark(ctx context.Context, wm int64) error {
	return st.op.watermark(ctx, wm)
}

// wakeups implements inputTask: the operator's completions and timeouts.
func (st *stageTask[T]) wakeups(context.Context) (<-chan struct{}, <-chan time.Time, error) {
	return st.op.events(), st.op.timer(), nil
}

// wakeup implements inputTask.
func (st *stageTask[T]) wakeup(ctx context.Context, timer bool) error {
	if timer {
		return st.op.onTimer(ctx)
	}
	return st.op.onEvent(ctx)
}

// outstanding implements inputTask.
func (st *stageTask[T]) outstanding() bool { return st.op.pending() }

// stopped implements inputTask.
func (st *stageTask[T]) stopped() { st.op.stopped() }
