package otel

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// instruments are a Telemetry's metric instruments.
type instruments struct {
	recordsIn, recordsOut, rejected metric.Int64ObservableCounter
	backpressure                    metric.Float64ObservableCounter
	lag                             metric.Int64ObservableGauge
	deadLettered                    metric.Int64Counter
	cpDuration, cpSize, cpStates    metric.Float64Histogram
	checkpoints                     metric.Int64Counter
	sinkCommit                      metric.Float64Histogram
	sourceNotify                    metric.Int64Counter
	opDuration                      metric.Float64Histogram
	sent, consumed                  metric.Int64Counter

	opts            sync.Map // cache key (string) -> metric.MeasurementOption
	sendOK, sendErr sync.Map // topic -> []metric.AddOption
}

func (in *instruments) init(m metric.Meter) error {
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	in.recordsIn, err = m.Int64ObservableCounter("runnel.operator.records.in", metric.WithUnit("{record}"),
		metric.WithDescription("Records received by an operator."))
	add(err)
	in.recordsOut, err = m.Int64ObservableCounter("runnel.operator.records.out", metric.WithUnit("{record}"),
		metric.WithDescription("Records emitted by an operator."))
	add(err)
	in.rejected, err = m.Int64ObservableCounter("runnel.operator.records.rejected", metric.WithUnit("{record}"),
		metric.WithDescription("Records an operator rejected (dead-lettered or skipped)."))
	add(err)
	in.backpressure, err = m.Float64ObservableCounter("runnel.operator.backpressure.time", metric.WithUnit("s"),
		metric.WithDescription("Time an operator's tasks spent blocked sending records downstream."))
	add(err)
	in.lag, err = m.Int64ObservableGauge("runnel.source.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Messages between a split's last checkpointed offset and the broker's max offset."))
	add(err)
	in.deadLettered, err = m.Int64Counter("runnel.records.dead_lettered", metric.WithUnit("{record}"),
		metric.WithDescription("Records rejected by a Skip or DeadLetter policy, by reason."))
	add(err)
	in.cpDuration, err = m.Float64Histogram("runnel.checkpoint.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a checkpoint's trigger to its commit, failure or timeout."))
	add(err)
	in.cpSize, err = m.Float64Histogram("runnel.checkpoint.size", metric.WithUnit("By"),
		metric.WithDescription("Bytes of a completed checkpoint's commit."),
		metric.WithExplicitBucketBoundaries(0, 256, 1024, 4096, 16384, 65536, 262144, 1<<20, 4<<20, 16<<20, 64<<20))
	add(err)
	in.cpStates, err = m.Float64Histogram("runnel.checkpoint.state_changes", metric.WithUnit("{entry}"),
		metric.WithDescription("State entries a checkpoint wrote (the job's state growth)."),
		metric.WithExplicitBucketBoundaries(0, 1, 10, 100, 1000, 10000, 100000, 1e6))
	add(err)
	in.checkpoints, err = m.Int64Counter("runnel.checkpoints", metric.WithUnit("{checkpoint}"),
		metric.WithDescription("Checkpoints that ended, by result (completed, failed)."))
	add(err)
	in.sinkCommit, err = m.Float64Histogram("runnel.sink.commit.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a sink took to commit (or flush) for a checkpoint."))
	add(err)
	in.sourceNotify, err = m.Int64Counter("runnel.source.checkpoint_notifications", metric.WithUnit("{notification}"),
		metric.WithDescription("Completed checkpoints a source split's reader was told of (offsets reported to the broker), by result (ok, failed)."))
	add(err)
	in.opDuration, err = m.Float64Histogram("messaging.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a messaging operation initiated by a producer or consumer client."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
	add(err)
	in.sent, err = m.Int64Counter("messaging.client.sent.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Number of messages producer attempted to send to the broker."))
	add(err)
	in.consumed, err = m.Int64Counter("messaging.client.consumed.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Number of messages that were delivered to the application."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("otel: instruments: %w", err)
	}
	return nil
}

// cachedOpt returns the measurement option for key, built once by mk (the
// per-message paths then allocate nothing for attributes).
func (in *instruments) cachedOpt(key string, mk func() []attribute.KeyValue) metric.MeasurementOption {
	if v, ok := in.opts.Load(key); ok {
		return v.(metric.MeasurementOption)
	}
	v, _ := in.opts.LoadOrStore(key, metric.WithAttributeSet(attribute.NewSet(mk()...)))
	return v.(metric.MeasurementOption)
}

func (t *Telemetry) destOpt(topic string, err error) []metric.AddOption {
	cache := &t.inst.sendOK
	if err != nil {
		cache = &t.inst.sendErr
	}
	if v, ok := cache.Load(topic); ok { // no allocation on the per-send path
		return v.([]metric.AddOption)
	}
	a := []attribute.KeyValue{semconv.MessagingSystemRocketMQ, semconv.MessagingOperationName("send"), semconv.MessagingDestinationName(topic)}
	if err != nil {
		a = append(a, semconv.ErrorTypeOther)
	}
	v, _ := cache.LoadOrStore(topic, []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(a...))})
	return v.([]metric.AddOption)
}

func (t *Telemetry) pullOpt(q protocol.MessageQueue, group string, err error) metric.MeasurementOption {
	qid := strconv.Itoa(int(q.QueueID))
	key := "pull\x00" + q.Topic + "\x00" + q.BrokerName + "\x00" + qid + "\x00" + group
	if err != nil {
		key += "\x00err"
	}
	return t.inst.cachedOpt(key, func() []attribute.KeyValue {
		a := []attribute.KeyValue{
			semconv.MessagingSystemRocketMQ, semconv.MessagingOperationName("pull"),
			semconv.MessagingOperationTypeReceive,
			semconv.MessagingDestinationName(q.Topic), semconv.MessagingDestinationPartitionID(qid),
			semconv.MessagingConsumerGroupName(group), attribute.String("runnel.broker.name", q.BrokerName),
		}
		if err != nil {
			a = append(a, semconv.ErrorTypeOther)
		}
		return a
	})
}

// recordCheckpoint records a checkpoint's metrics.
func (t *Telemetry) recordCheckpoint(job string, info runtime.CheckpointInfo) {
	result := "completed"
	if info.Err != nil {
		result = "failed"
	}
	ctx := context.Background()
	opt := metric.WithAttributes(AttrJob.String(job), attribute.String("runnel.checkpoint.result", result))
	t.inst.checkpoints.Add(ctx, 1, opt)
	t.inst.cpDuration.Record(ctx, info.Duration.Seconds(), opt)
	if info.Err == nil {
		jobOpt := metric.WithAttributes(AttrJob.String(job))
		t.inst.cpSize.Record(ctx, float64(info.Bytes), jobOpt)
		t.inst.cpStates.Record(ctx, float64(info.StateChanges), jobOpt)
	}
}

// OnJobStart implements runtime.HookJobStart: it registers the job's
// observable instruments (operator counters, backpressure, split lag),
// read from the job's view at each collection.
func (t *Telemetry) OnJobStart(v runtime.JobView) {
	job := v.Name()
	reg, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := v.Status()
		for _, op := range st.Operators {
			opt := metric.WithAttributes(AttrJob.String(job), AttrOperator.String(op.UID), AttrOperatorKind.String(op.Kind))
			o.ObserveInt64(t.inst.recordsIn, op.In, opt)
			o.ObserveInt64(t.inst.recordsOut, op.Out, opt)
			o.ObserveInt64(t.inst.rejected, op.Errors, opt)
		}
		for uid, d := range v.Backpressure() {
			o.ObserveFloat64(t.inst.backpressure, d.Seconds(), metric.WithAttributes(AttrJob.String(job), AttrOperator.String(uid)))
		}
		for _, s := range v.Splits() {
			if s.Lag >= 0 {
				o.ObserveInt64(t.inst.lag, s.Lag, metric.WithAttributes(AttrJob.String(job), AttrSource.String(s.Source), AttrSplit.String(s.Split)))
			}
		}
		return nil
	}, t.inst.recordsIn, t.inst.recordsOut, t.inst.rejected, t.inst.backpressure, t.inst.lag)
	if err != nil {
		return // only for instruments of another meter: cannot happen
	}
	t.mu.Lock()
	t.mu.regs[v] = reg
	t.mu.Unlock()
}

// OnJobEnd implements runtime.HookJobEnd: it unregisters the job's
// observable instruments and forgets its checkpoint spans.
func (t *Telemetry) OnJobEnd(v runtime.JobView, _ error) {
	t.mu.Lock()
	reg, ok := t.mu.regs[v]
	delete(t.mu.regs, v)
	j := t.mu.jobs[v.Name()]
	delete(t.mu.jobs, v.Name())
	t.mu.Unlock()
	if ok {
		_ = reg.Unregister() // only fails for a foreign registration
	}
	if j != nil {
		j.mu.Lock()
		for id, span := range j.spans {
			span.End()
			delete(j.spans, id)
		}
		j.mu.Unlock()
	}
}

// OnDeadLetter implements runtime.HookDeadLetter.
func (t *Telemetry) OnDeadLetter(job, operator, reason, policy string) {
	t.inst.deadLettered.Add(context.Background(), 1, metric.WithAttributes(AttrJob.String(job), AttrOperator.String(operator),
		attribute.String("runnel.reason", reason), attribute.String("runnel.policy", policy)))
}

// OnSourceNotify implements runtime.HookSourceNotify.
func (t *Telemetry) OnSourceNotify(job, source, _ string, _ uint64, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	t.inst.sourceNotify.Add(context.Background(), 1, metric.WithAttributes(AttrJob.String(job), AttrOperator.String(source),
		attribute.String("runnel.result", result)))
}

// OnSinkCommit implements runtime.HookSinkCommit.
func (t *Telemetry) OnSinkCommit(job, sink string, _ uint64, took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	t.inst.sinkCommit.Record(context.Background(), took.Seconds(), metric.WithAttributes(AttrJob.String(job), AttrOperator.String(sink),
		attribute.String("runnel.result", result)))
}

// ObserveBroker exports an embedded broker's counters as observable
// instruments (runnel.broker.send.requests, .send.bytes, .pull.requests,
// .pulled.messages, .longpoll.waiters, .consumer_groups), and its
// replication (runnel.broker.ha.log_end; per slave of a master, labelled
// with its runnel.broker.slave_id, .ha.slave.ack_offset, .ha.slave.lag,
// .ha.slave.buffer (the memory the master holds for it) and .ha.sent.bytes;
// on a slave .ha.master.lag and .ha.received.bytes; a
// SYNC_MASTER's .ha.sync.waiting, .ha.sync.timeouts and
// .ha.slave_not_available), labelled with name. Call the returned function
// to stop observing it.
func (t *Telemetry) ObserveBroker(b *broker.Broker, name string) (unregister func() error, err error) {
	m := t.meter
	var errs []error
	counter := func(n, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(n, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(n, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(n, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	sends := counter("runnel.broker.send.requests", "{request}", "Send requests the broker accepted.")
	sendBytes := counter("runnel.broker.send.bytes", "By", "Bytes of send request bodies (messages stored).")
	pulls := counter("runnel.broker.pull.requests", "{request}", "Pull requests the broker served.")
	pulled := counter("runnel.broker.pulled.messages", "{message}", "Messages returned by pulls.")
	waiters := gauge("runnel.broker.longpoll.waiters", "{request}", "Pulls parked by long polling now.")
	groups := gauge("runnel.broker.consumer_groups", "{group}", "Consumer groups the broker knows.")
	logEnd := gauge("runnel.broker.ha.log_end", "By", "The broker's log end (physical offset of its next record).")
	ackOff := gauge("runnel.broker.ha.slave.ack_offset", "By", "The log end a slave acknowledged to its master.")
	slaveLag := gauge("runnel.broker.ha.slave.lag", "By", "How far a slave is behind its master's log end.")
	slaveBuf := gauge("runnel.broker.ha.slave.buffer", "By", "Memory a master holds for a slave's transfer (one frame buffer, whatever the slave's lag).")
	sentBytes := counter("runnel.broker.ha.sent.bytes", "By", "Log bytes a master sent a slave.")
	masterLag := gauge("runnel.broker.ha.master.lag", "By", "How far a slave is behind its master, as last heard.")
	recvBytes := counter("runnel.broker.ha.received.bytes", "By", "Log bytes a slave received from its master.")
	syncWaiting := gauge("runnel.broker.ha.sync.waiting", "{request}", "Sends a SYNC_MASTER holds for its slaves now.")
	syncTimeouts := counter("runnel.broker.ha.sync.timeouts", "{request}", "Sends answered FLUSH_SLAVE_TIMEOUT.")
	notAvail := counter("runnel.broker.ha.slave_not_available", "{request}", "Sends answered SLAVE_NOT_AVAILABLE.")
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otel: broker instruments: %w", err)
	}
	opt := metric.WithAttributes(attribute.String("runnel.broker.name", name))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := b.Stats()
		o.ObserveInt64(sends, s.SendRequests, opt)
		o.ObserveInt64(sendBytes, s.SendBytes, opt)
		o.ObserveInt64(pulls, s.PullRequests, opt)
		o.ObserveInt64(pulled, s.PulledMessages, opt)
		o.ObserveInt64(waiters, s.LongPollWaiters, opt)
		o.ObserveInt64(groups, s.ConsumerGroups, opt)
		hs := b.HAStatus()
		o.ObserveInt64(logEnd, hs.LogEnd, opt)
		for _, sl := range hs.Slaves {
			so := metric.WithAttributes(attribute.String("runnel.broker.name", name), attribute.Int64("runnel.broker.slave_id", sl.BrokerID))
			o.ObserveInt64(ackOff, sl.AckOffset, so)
			o.ObserveInt64(slaveLag, sl.Lag, so)
			o.ObserveInt64(slaveBuf, sl.BufferBytes, so)
			o.ObserveInt64(sentBytes, sl.BytesSent, so)
		}
		if ml := hs.Master; ml != nil {
			o.ObserveInt64(masterLag, ml.Lag, opt)
			o.ObserveInt64(recvBytes, ml.BytesReceived, opt)
		}
		if hs.Role == broker.RoleSyncMaster {
			o.ObserveInt64(syncWaiting, hs.SyncWaiting, opt)
			o.ObserveInt64(syncTimeouts, hs.SyncTimeouts, opt)
			o.ObserveInt64(notAvail, hs.SlaveNotAvailable, opt)
		}
		return nil
	}, sends, sendBytes, pulls, pulled, waiters, groups, logEnd, ackOff, slaveLag, slaveBuf, sentBytes, masterLag, recvBytes,
		syncWaiting, syncTimeouts, notAvail)
	if err != nil {
		return nil, fmt.Errorf("otel: broker callback: %w", err)
	}
	return reg.Unregister, nil
}
