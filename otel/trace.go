package otel

import (
	"context"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/runnel-dev/runnel/runtime"
	srcrocketmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// runnel's own span attributes.
const (
	AttrJob              = attribute.Key("runnel.job")
	AttrOperator         = attribute.Key("runnel.operator.uid")
	AttrOperatorKind     = attribute.Key("runnel.operator.kind")
	AttrSource           = attribute.Key("runnel.source.uid")
	AttrSplit            = attribute.Key("runnel.split")
	AttrQueueOffset      = attribute.Key("runnel.queue.offset")
	AttrCheckpointID     = attribute.Key("runnel.checkpoint.id")
	AttrCheckpointKind   = attribute.Key("runnel.checkpoint.kind")
	AttrCheckpointBytes  = attribute.Key("runnel.checkpoint.bytes")
	AttrCheckpointOffs   = attribute.Key("runnel.checkpoint.offsets")
	AttrCheckpointTxns   = attribute.Key("runnel.checkpoint.sink_transactions")
	AttrCheckpointStates = attribute.Key("runnel.checkpoint.state_changes")
	AttrLinkDurable      = attribute.Key("runnel.link.durable")
)

// sendSpanKey marks the context OnProduce returned with the span it
// started, so that OnProduced ends exactly that span.
type sendSpanKey struct{}

// OnProduce implements client.HookProduce: it starts the PRODUCER span of
// a send call (a child of ctx's span) and injects its context into the
// messages' properties. Sends without a sampled parent are traced with the
// WithSampleRatio probability; the others cost one random number.
func (t *Telemetry) OnProduce(ctx context.Context, topic string, msgs []*client.Message, props *client.Injector) context.Context {
	if !t.tracing {
		return ctx
	}
	if parent := trace.SpanContextFromContext(ctx); parent.IsValid() {
		if !parent.IsSampled() {
			return ctx
		}
	} else if !t.sampleRoot() {
		return ctx
	}
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs,
		semconv.MessagingSystemRocketMQ,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
		semconv.MessagingDestinationName(topic),
	)
	if len(msgs) > 1 {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(msgs)))
	} else if len(msgs) == 1 && msgs[0] != nil {
		m := msgs[0]
		attrs = append(attrs, semconv.MessagingMessageBodySize(len(m.Body)))
		if m.Tags != "" {
			attrs = append(attrs, semconv.MessagingRocketMQMessageTag(m.Tags))
		}
		if len(m.Keys) > 0 {
			attrs = append(attrs, semconv.MessagingRocketMQMessageKeys(m.Keys...))
		}
	}
	ctx, span := t.tracer.Start(ctx, topic+" send", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	t.prop.Inject(ctx, InjectorCarrier{In: props})
	return context.WithValue(ctx, sendSpanKey{}, span)
}

// OnProduced implements client.HookProduced: it ends the send call's span
// with the message id, queue and broker, and counts the messages sent.
func (t *Telemetry) OnProduced(ctx context.Context, topic string, n int, res client.SendResult, err error) {
	if t.metrics {
		t.inst.sent.Add(context.Background(), int64(n), t.destOpt(topic, err)...)
	}
	if !t.tracing {
		return
	}
	span, ok := ctx.Value(sendSpanKey{}).(trace.Span)
	if !ok {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeOther)
	} else {
		span.SetAttributes(
			semconv.MessagingMessageID(res.MsgID),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(int(res.Queue.QueueID))),
			semconv.ServerAddress(res.BrokerAddr),
		)
	}
	span.End()
}

// OnPull implements client.HookPull: pull latency per queue and the
// messages received.
func (t *Telemetry) OnPull(_ context.Context, req *client.PullRequest, res *client.PullResult, took time.Duration, err error) {
	if !t.metrics {
		return
	}
	opt := t.pullOpt(req.Queue, req.Group, err)
	t.inst.opDuration.Record(context.Background(), took.Seconds(), opt)
	if res != nil && len(res.Messages) > 0 {
		t.inst.consumed.Add(context.Background(), int64(len(res.Messages)), opt)
	}
}

// ReceiveMessage starts the CONSUMER span "<topic> receive" of a message a
// consumer pulled, as a child of the producer's context carried in its
// properties (ctx's span when it carries none). The caller processes the
// message with the returned context and ends the span. It does not sample:
// use it for messages the application handles one by one.
func (t *Telemetry) ReceiveMessage(ctx context.Context, group string, m *protocol.MessageExt) (context.Context, trace.Span) {
	pctx := t.prop.Extract(ctx, PropertiesCarrier(m.Properties))
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemRocketMQ,
		semconv.MessagingOperationTypeReceive,
		semconv.MessagingOperationName("receive"),
		semconv.MessagingDestinationName(m.Topic),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(int(m.QueueID))),
		semconv.MessagingMessageBodySize(len(m.Body)),
		AttrQueueOffset.Int64(m.QueueOffset),
	}
	if id, ok := protocol.PropertyValue(m.Properties, protocol.PropUniqKey); ok {
		attrs = append(attrs, semconv.MessagingMessageID(id))
	}
	if group != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(group))
	}
	return t.tracer.Start(pctx, m.Topic+" receive", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// propertied is a source record with broker message properties.
type propertied interface{ RawProperties() string }

// StartRecord implements runtime.HookRecord. A record whose properties carry
// a trace context follows its sampled flag; one without is traced with the
// WithSampleRatio probability. Untraced records allocate nothing.
func (t *Telemetry) StartRecord(ctx context.Context, r *runtime.RecordInfo) runtime.RecordTrace {
	if !t.tracing {
		return nil
	}
	var msg *srcrocketmq.Message
	var props string
	switch v := r.Value.(type) {
	case *srcrocketmq.Message:
		msg, props = v, v.RawProperties()
	case propertied:
		props = v.RawProperties()
	}
	hasParent := false
	if tp, ok := protocol.PropertyValue(props, PropTraceparent); ok {
		sampled, valid := traceparentSampled(tp)
		if valid && !sampled {
			return nil
		}
		hasParent = valid
	}
	if !hasParent && !t.sampleRoot() {
		return nil
	}
	pctx := ctx
	if hasParent {
		pctx = t.prop.Extract(ctx, PropertiesCarrier(props))
	}
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs,
		semconv.MessagingSystemRocketMQ,
		semconv.MessagingOperationTypeReceive,
		semconv.MessagingOperationName("receive"),
		AttrJob.String(r.Job), AttrSource.String(r.Source), AttrSplit.String(r.Split),
	)
	name := r.Source + " receive"
	if msg != nil {
		name = msg.Topic + " receive"
		attrs = append(attrs,
			semconv.MessagingDestinationName(msg.Topic),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(int(msg.QueueID))),
			semconv.MessagingMessageBodySize(len(msg.Body)),
			AttrQueueOffset.Int64(msg.QueueOffset),
		)
		if id := msg.MsgID(); id != "" {
			attrs = append(attrs, semconv.MessagingMessageID(id))
		}
		if tag := msg.Tags(); tag != "" {
			attrs = append(attrs, semconv.MessagingRocketMQMessageTag(tag))
		}
	}
	if t.cfg.group != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(t.cfg.group))
	}
	_, span := t.tracer.Start(pctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	if !span.IsRecording() {
		span.End()
		return nil
	}
	return &recordTrace{t: t, span: span, job: r.Job, after: r.AfterCheckpoint}
}

// recordTrace is runtime.RecordTrace over the record's receive span.
type recordTrace struct {
	t     *Telemetry
	span  trace.Span
	job   string
	after uint64
}

// Context implements runtime.RecordTrace.
func (r *recordTrace) Context(parent context.Context) context.Context {
	return trace.ContextWithSpan(parent, r.span)
}

// StartOperator implements runtime.RecordTrace: an INTERNAL span
// "<kind> <uid>" (a child of ctx's span: the record's receive span).
func (r *recordTrace) StartOperator(ctx context.Context, uid, kind string) (context.Context, func(error)) {
	ctx, span := r.t.tracer.Start(ctx, kind+" "+uid, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrOperator.String(uid), AttrOperatorKind.String(kind), AttrJob.String(r.job),
			semconv.MessagingOperationTypeProcess))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// End implements runtime.RecordTrace: it ends the receive span and queues
// it to be linked from the checkpoint that makes the record durable.
func (r *recordTrace) End(err error) {
	if err != nil {
		r.span.RecordError(err)
		r.span.SetStatus(codes.Error, err.Error())
	}
	r.span.End()
	r.t.job(r.job).pend(r.after, r.span.SpanContext())
}

// jobTrace is the checkpoint tracing state of one job.
type jobTrace struct {
	mu      sync.Mutex
	spans   map[uint64]trace.Span
	pending []pendingLink
	dropped int64
}

// pendingLink is a traced record waiting for a checkpoint > after.
type pendingLink struct {
	after uint64
	sc    trace.SpanContext
}

func (t *Telemetry) job(name string) *jobTrace {
	t.mu.Lock()
	defer t.mu.Unlock()
	j, ok := t.mu.jobs[name]
	if !ok {
		j = &jobTrace{spans: make(map[uint64]trace.Span)}
		t.mu.jobs[name] = j
	}
	return j
}

func (j *jobTrace) pend(after uint64, sc trace.SpanContext) {
	j.mu.Lock()
	if len(j.pending) < maxPendingLinks {
		j.pending = append(j.pending, pendingLink{after: after, sc: sc})
	} else {
		j.dropped++
	}
	j.mu.Unlock()
}

// OnCheckpointBegin implements runtime.HookCheckpointBegin: it starts the
// checkpoint's span (a root span).
func (t *Telemetry) OnCheckpointBegin(job string, id uint64, kind runtime.CheckpointKind, start time.Time) {
	if !t.tracing {
		return
	}
	_, span := t.tracer.Start(context.Background(), "checkpoint "+strconv.FormatUint(id, 10),
		trace.WithNewRoot(), trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrJob.String(job), AttrCheckpointID.Int64(int64(id)), AttrCheckpointKind.String(kind.String())))
	j := t.job(job)
	j.mu.Lock()
	j.spans[id] = span
	j.mu.Unlock()
}

// OnCheckpointEnd implements runtime.HookCheckpointEnd: checkpoint metrics,
// and the end of its span, linked (when it completed) to the traced records
// it made durable.
func (t *Telemetry) OnCheckpointEnd(job string, info runtime.CheckpointInfo) {
	t.recordCheckpoint(job, info)
	if !t.tracing {
		return
	}
	j := t.job(job)
	j.mu.Lock()
	span := j.spans[info.ID]
	delete(j.spans, info.ID)
	var links []trace.Link
	if info.Err == nil {
		kept := j.pending[:0]
		for _, p := range j.pending {
			switch {
			case p.after >= info.ID:
				kept = append(kept, p)
			case len(links) < MaxCheckpointLinks:
				links = append(links, trace.Link{SpanContext: p.sc, Attributes: []attribute.KeyValue{AttrLinkDurable.Bool(true)}})
			default:
				j.dropped++
			}
		}
		clear(j.pending[len(kept):])
		j.pending = kept
	}
	j.mu.Unlock()
	if span == nil {
		return
	}
	span.SetAttributes(
		AttrCheckpointBytes.Int64(info.Bytes),
		AttrCheckpointOffs.Int(info.Offsets),
		AttrCheckpointTxns.Int(info.SinkTxns),
		AttrCheckpointStates.Int(info.StateChanges),
	)
	for _, l := range links {
		span.AddLink(l)
	}
	if info.Err != nil {
		span.RecordError(info.Err)
		span.SetStatus(codes.Error, info.Err.Error())
	}
	span.End(trace.WithTimestamp(info.Start.Add(info.Duration)))
}
