package pipeline

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/source"
)

// Hooks adds observability hooks to the job: values implementing any of
// the runtime.Hook* interfaces (package otel provides OpenTelemetry tracing
// and metrics). Records are traced through the job when a hook implements
// runtime.HookRecord: a source task asks it about every record it reads,
// and a traced record carries its trace through the operators chained in
// the task (Map, Filter, FlatMap, each as a child span) and across the
// channel to sink tasks, whose Write gets the record's context (so a sink
// that sends to a broker with a hooked client propagates it into the output
// message). A traced record crossing a keyed exchange (KeyBy) keeps its
// trace: the keyed operator's handler (Process, Reduce, Aggregate, a window
// operator adding the record) runs in an operator span, and the records it
// emits for it carry the trace on to the operators chained after it and to
// sinks. Records a timer emits (window firings, OnTimer) are not traced.
// Every operator span of a record is a child of its receive span.
func Hooks(hooks ...runtime.Hook) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.obs.hooks = append(c.obs.hooks, hooks...) })
}

// MetricsAddress serves the job's metrics on http://addr/metrics (port 0
// picks a free port; onListen, when not nil, receives the actual address
// before the job starts). A hook must provide the handler
// (runtime.HookMetricsHandler, e.g. package otel's Prometheus exporter);
// without one Run fails with runtime.ErrInvalidConfig.
func MetricsAddress(addr string, onListen func(string)) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.obs.metricsAddr, c.obs.onMetricsAddr = addr, onListen })
}

// jobObs is the observability part of a jobConfig.
type jobObs struct {
	hooks         []runtime.Hook
	metricsAddr   string
	onMetricsAddr func(string)
}

// runHooks are a run's type-asserted record-level hooks.
type runHooks struct {
	job        string
	record     []runtime.HookRecord
	deadLetter []runtime.HookDeadLetter
	sinkCommit []runtime.HookSinkCommit
	notify     []runtime.HookSourceNotify
}

func newRunHooks(job string, list []runtime.Hook) *runHooks {
	h := &runHooks{job: job}
	for _, x := range list {
		if v, ok := x.(runtime.HookRecord); ok {
			h.record = append(h.record, v)
		}
		if v, ok := x.(runtime.HookDeadLetter); ok {
			h.deadLetter = append(h.deadLetter, v)
		}
		if v, ok := x.(runtime.HookSinkCommit); ok {
			h.sinkCommit = append(h.sinkCommit, v)
		}
		if v, ok := x.(runtime.HookSourceNotify); ok {
			h.notify = append(h.notify, v)
		}
	}
	return h
}

// startRecord asks the record hooks whether a record is traced (the first
// one that traces it wins). It returns nil for untraced records.
func (h *runHooks) startRecord(ctx context.Context, info *runtime.RecordInfo) runtime.RecordTrace {
	for _, x := range h.record {
		if tr := x.StartRecord(ctx, info); tr != nil {
			return tr
		}
	}
	return nil
}

func (h *runHooks) onDeadLetter(operator, reason, policy string) {
	for _, x := range h.deadLetter {
		x.OnDeadLetter(h.job, operator, reason, policy)
	}
}

func (h *runHooks) onSourceNotify(source, split string, id uint64, err error) {
	for _, x := range h.notify {
		x.OnSourceNotify(h.job, source, split, id, err)
	}
}

func (h *runHooks) onSinkCommit(sink string, id uint64, took time.Duration, err error) {
	for _, x := range h.sinkCommit {
		x.OnSinkCommit(h.job, sink, id, took, err)
	}
}

// traced runs one chained operator's function for a traced record: it
// wraps the operator in the record's operator span and hands the user
// function the span's context.
func traced[A, R any](ctx context.Context, tr runtime.RecordTrace, uid, kind string, rp retryPolicy, fn func(context.Context, A) (R, error), v A) (R, error) {
	octx, end := tr.StartOperator(ctx, uid, kind)
	r, err := call(octx, rp, fn, octx, v)
	end(err)
	return r, err
}

// recordContext returns the context user functions see for the record the
// builder's task is processing: ctx itself when it is not traced.
func (b *chainBuilder) recordContext(ctx context.Context) context.Context {
	if b.meta.trace == nil {
		return ctx
	}
	return b.meta.trace.Context(ctx)
}

// propertied is implemented by source record types that carry broker
// message properties (source/rocketmq.Message).
type propertied interface{ RawProperties() string }

// sourceTracer is a source task's record tracing state.
type sourceTracer struct {
	hooks *runHooks
	info  runtime.RecordInfo
	split *runtime.SplitStats
}

func newSourceTracer(r *jobRun, sourceUID, split string) *sourceTracer {
	st := &sourceTracer{hooks: r.hooks, split: r.engine.Split(sourceUID, split)}
	st.info = runtime.RecordInfo{Job: r.job.name, Source: sourceUID, Split: split}
	return st
}

// barrier notes that the task injected barrier id.
func (t *sourceTracer) barrier(id uint64) { t.info.AfterCheckpoint = id }

// begin asks the record hooks about the record at v, sets b's current
// trace and returns the context the record's processing gets: ctx when it
// is not traced.
func (t *sourceTracer) begin(ctx context.Context, b *chainBuilder, v any) context.Context {
	if len(t.hooks.record) == 0 {
		return ctx
	}
	t.info.Value = v
	tr := t.hooks.startRecord(ctx, &t.info)
	t.info.Value = nil
	if tr == nil {
		return ctx
	}
	b.meta.trace = tr
	return tr.Context(ctx)
}

// end ends the current record's trace in its source task.
func (t *sourceTracer) end(b *chainBuilder, err error) {
	if tr := b.meta.trace; tr != nil {
		b.meta.trace = nil
		tr.End(err)
	}
}

// lag publishes the split's lag when the reader knows it.
func (t *sourceTracer) lag(reader any) {
	if lr, ok := reader.(source.LagReporter); ok {
		if n, ok := lr.Lag(); ok {
			t.split.Lag.Store(n)
		}
	}
}

// blockedCounter is where a port adds the time its task spent blocked on a
// full downstream queue.
func (b *chainBuilder) blockedCounter() *atomic.Int64 {
	return b.r.engine.Backpressure(b.task.node.uid)
}

// setBlocked makes sender's waits for room count into c. Senders are added
// while the job runs (split discovery), so blocked is guarded by in.mu.
func (in *inbox[R]) setBlocked(sender int, c *atomic.Int64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if sender >= len(in.blocked) {
		in.blocked = append(in.blocked, make([]*atomic.Int64, sender+1-len(in.blocked))...)
	}
	in.blocked[sender] = c
}

// addBlocked adds the time since start to sender's backpressure counter
// (called after a wait for room: the slow path, so the lock is cheap).
func (in *inbox[R]) addBlocked(sender int, start time.Time) {
	in.mu.Lock()
	var c *atomic.Int64
	if sender < len(in.blocked) {
		c = in.blocked[sender]
	}
	in.mu.Unlock()
	if c != nil {
		c.Add(int64(time.Since(start)))
	}
}

// writeTraced writes a traced record to the sink inside the record's sink
// span, with the record's context (a broker sink's producer hook propagates
// it into the output message).
func (st *sinkTask[T]) writeTraced(ctx context.Context, r *rec[T]) error {
	octx, end := r.tr.StartOperator(r.tr.Context(ctx), st.uid, kindSink)
	err := callErr(octx, sinkRetry, st.sk.Write, octx, r.v)
	end(err)
	return err
}

// tracedAt is a traced record of a batch crossing a keyed exchange: its
// index in the batch and its trace. A batch carries them in a list next to
// it (message.traces), nil unless a record of the batch is traced, so that
// untraced records pay nothing for tracing on the keyed path.
type tracedAt struct {
	i  int
	tr runtime.RecordTrace
}

// noteTrace notes that the record at index i of the batch for subtask sub
// carries the sending task's current trace.
func (p *keyedPort[K, T]) noteTrace(sub, i int) {
	if p.trs == nil {
		p.trs = make([][]tracedAt, len(p.ins))
	}
	p.trs[sub] = append(p.trs[sub], tracedAt{i: i, tr: p.meta.trace})
}

// takeTraces hands over the traced records of subtask sub's batch, which is
// being sent.
func (p *keyedPort[K, T]) takeTraces(sub int) []tracedAt {
	if p.trs == nil {
		return nil
	}
	t := p.trs[sub]
	p.trs[sub] = nil
	return t
}

// processTraced runs the keyed function for a traced record: in the
// record's operator span, with the span's context as KeyedContext.Context,
// and with the record's trace as the task's current one, so that what the
// function emits for it carries the trace on.
func (kt *keyedTask[K, T, U]) processTraced(ctx context.Context, tr runtime.RecordTrace, process func(*KeyedContext[K, U], T) error, v T) error {
	rctx := tr.Context(ctx)
	octx, end := tr.StartOperator(rctx, kt.n.uid, kt.n.kind)
	kt.b.meta.trace, kt.kctx.ctx, kt.kctx.uctx = tr, rctx, octx
	err := callErr(ctx, kt.n.retry, process, kt.kctx, v)
	kt.b.meta.trace, kt.kctx.ctx, kt.kctx.uctx = nil, ctx, ctx
	end(err)
	return err
}
