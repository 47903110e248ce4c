// Package otel is runnel's OpenTelemetry integration: one Telemetry value
// implements the hook interfaces of the client (transport/client.Hook) and
// of jobs (runtime.Hook), so that traces follow records from a producer,
// through the broker, through every operator of a job, into the sink's
// output messages and on to their consumers, and the job, client and broker
// export metrics (to Prometheus on an opt-in address).
//
// Core packages never import OpenTelemetry: they call small hook interfaces
// (convention 18), and this package is the only one that implements them
// with the OpenTelemetry API. Nothing here uses the OpenTelemetry globals:
// providers are injected with options.
//
//	tp, err := otelenv.TracerProvider(ctx)                 // otel/otelenv: OTEL_* variables, OTLP/HTTP or stdout
//	tel, err := otel.New(otel.WithTracerProvider(tp), otel.WithPrometheus())
//	c, err := client.New(client.WithNameServers(ns), client.WithHooks(tel))
//	job := pipeline.New("etl", pipeline.Hooks(tel), pipeline.MetricsAddress(":9464", nil))
//
// # Propagation
//
// W3C trace context (traceparent, tracestate) and baggage travel as RocketMQ
// user properties of the same names (PropertiesCarrier reads them from a
// message's properties, the client's Injector writes them). A producer
// send starts a PRODUCER span "<topic> send" and injects its context; a
// job's source starts, per traced record, a CONSUMER span "<topic> receive"
// that is a child of the producer's span; every operator the record reaches
// runs in an INTERNAL child span of it: the chained ones (map, filter,
// flatmap), keyed handlers past a KeyBy (keyed-process, reduce, aggregate, a
// window operator adding the record; timer firings are not traced) and the
// sink write. A sink that sends with a hooked client starts the next "<topic> send" span
// as a child of the sink's span, so the output message carries the same
// trace to its consumers (ReceiveMessage starts their "receive" spans).
// Attributes follow the OpenTelemetry messaging semantic conventions
// (messaging.system=rocketmq, messaging.destination.name,
// messaging.operation.type/name, messaging.message.id,
// messaging.destination.partition.id, messaging.consumer.group.name, …).
//
// # Checkpoints
//
// Each checkpoint is a span "checkpoint <id>" (attributes runnel.checkpoint.*:
// id, kind, bytes, offsets, sink transactions, state changes). When it
// completes, it is linked to the spans of the traced records whose effects it
// made durable (the records read before the barrier of that checkpoint), so a
// record's trace leads to the checkpoint that committed it. The record spans
// have ended by then, which is why the link is on the checkpoint span; at most
// MaxCheckpointLinks records are linked per checkpoint.
//
// # Sampling
//
// Records and sends without a sampled parent context are traced with the
// probability WithSampleRatio gives (1 by default), decided before anything
// is allocated; records whose producer's context is present follow its
// sampled flag (parent-based). The tracer provider's own sampler applies on
// top. An unsampled record costs a property lookup and a random number;
// an unsampled send a context lookup and a random number (and a cached
// counter update when metrics are on). BenchmarkTracingOverhead measures the
// end-to-end cost (tracing off, 1 % and 100 % sampled, interleaved in one
// run).
//
// # Metrics
//
// Instruments (OpenTelemetry names; the Prometheus exporter turns dots into
// underscores and adds unit and _total suffixes): runnel.operator.records.in,
// runnel.operator.records.out, runnel.operator.records.rejected,
// runnel.operator.backpressure.time (per operator), runnel.records.dead_lettered
// (by reason and policy), runnel.source.lag (per source split),
// runnel.checkpoint.duration, runnel.checkpoint.size, runnel.checkpoints (by
// result), runnel.checkpoint.state_changes, runnel.sink.commit.duration,
// messaging.client.operation.duration (sends and pulls, per queue for pulls),
// messaging.client.sent.messages, messaging.client.consumed.messages, and,
// for a broker registered with ObserveBroker, runnel.broker.*.
//
// # Logs
//
// runnel logs through injected *slog.Logger values with the fields job,
// operator, queue (split) and checkpoint; this package does not log.
package otel
