package otel_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/runnel-dev/runnel/internal/testutil"
	rotel "github.com/runnel-dev/runnel/otel"
	"github.com/runnel-dev/runnel/pipeline"
	sinkmq "github.com/runnel-dev/runnel/sink/rocketmq"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// TestTraceEndToEnd follows one record: a runnel producer sends it with a
// trace context, the embedded broker stores it, a job reads it
// (source/rocketmq), maps it and writes it with sink/rocketmq, and a
// downstream consumer pulls the output message. Every step must be one
// trace with the right parents, and the checkpoint that committed the
// record must link to its receive span.
func TestTraceEndToEnd(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tel, err := rotel.New(rotel.WithTracerProvider(tp), rotel.WithConsumerGroup("trace_job"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()

	cl := newCluster(t)
	admin := cl.client()
	cl.createTopic(admin, "trace_in", 1)
	cl.createTopic(admin, "trace_out", 1)

	// Upstream producer: a hooked client, a parent span in the caller's ctx.
	up := cl.producer(cl.client(tel), "up_producer")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rootCtx, root := tp.Tracer("test").Start(ctx, "upstream work")
	q := queue("trace_in", 0)
	res, err := up.Send(rootCtx, &client.Message{Topic: "trace_in", Queue: &q, Body: []byte("hello"), Tags: "greeting"})
	if err != nil {
		t.Fatal(err)
	}
	root.End()

	// The job: source/rocketmq -> Map -> sink/rocketmq, bounded.
	jobClient := cl.client(tel)
	src, err := srcmq.New(jobClient, "trace_in", srcmq.WithGroup("trace_job"), srcmq.WithStop(srcmq.StopAtLatest()))
	if err != nil {
		t.Fatal(err)
	}
	out := queue("trace_out", 0)
	sk, err := sinkmq.New(cl.producer(jobClient, "job_producer"), func(b []byte) (*client.Message, error) {
		return &client.Message{Topic: "trace_out", Queue: &out, Body: b}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	job := pipeline.New("trace-job", pipeline.Hooks(tel), pipeline.CheckpointDir(t.TempDir()))
	msgs := pipeline.FromSource(job, "in", src)
	upper := pipeline.Map(msgs, "upper", func(ctx context.Context, m srcmq.Message) ([]byte, error) {
		if !trace.SpanContextFromContext(ctx).IsSampled() {
			return nil, fmt.Errorf("handler ctx carries no sampled span")
		}
		return bytes.ToUpper(m.Body), nil
	})
	pipeline.To(upper, "out-sink", sk)
	if err := job.Run(ctx); err != nil {
		t.Fatal(err)
	}

	// Downstream consumer: a plain pull, with a receive span per message.
	var pulled *client.PullResult
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		var err error
		pulled, err = admin.Pull(ctx, client.PullRequest{Queue: out, Offset: 0, Group: "downstream"})
		if err != nil {
			return err
		}
		if len(pulled.Messages) != 1 {
			return fmt.Errorf("pulled %d messages (status %v)", len(pulled.Messages), pulled.Status)
		}
		return nil
	})
	if got := string(pulled.Messages[0].Body); got != "HELLO" {
		t.Fatalf("output body %q", got)
	}
	_, span := tel.ReceiveMessage(ctx, "downstream", &pulled.Messages[0])
	span.End()

	_, checkpoints, get := indexSpans(t, rec.Ended())
	rootSpan := get("upstream work")
	send := get("trace_in send")
	receive := get("trace_in receive")
	mapSpan := get("map upper")
	sinkSpan := get("sink out-sink")
	outSend := get("trace_out send")
	outReceive := get("trace_out receive")

	traceID := rootSpan.SpanContext().TraceID()
	parentOf := map[string][2]sdktrace.ReadOnlySpan{
		"trace_in send":     {send, rootSpan},
		"trace_in receive":  {receive, send},
		"map upper":         {mapSpan, receive},
		"sink out-sink":     {sinkSpan, receive},
		"trace_out send":    {outSend, sinkSpan},
		"trace_out receive": {outReceive, outSend},
	}
	for name, p := range parentOf {
		child, parent := p[0], p[1]
		if child.SpanContext().TraceID() != traceID {
			t.Errorf("%s: trace %s, want %s", name, child.SpanContext().TraceID(), traceID)
		}
		if child.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: parent %s, want %s (%s)", name, child.Parent().SpanID(), parent.SpanContext().SpanID(), parent.Name())
		}
	}
	wantKind := map[sdktrace.ReadOnlySpan]trace.SpanKind{
		send: trace.SpanKindProducer, outSend: trace.SpanKindProducer,
		receive: trace.SpanKindConsumer, outReceive: trace.SpanKindConsumer,
		mapSpan: trace.SpanKindInternal, sinkSpan: trace.SpanKindInternal,
	}
	for s, k := range wantKind {
		if s.SpanKind() != k {
			t.Errorf("%s: kind %v, want %v", s.Name(), s.SpanKind(), k)
		}
	}

	// Messaging semantic conventions.
	attrs := func(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			m[kv.Key] = kv.Value
		}
		return m
	}
	want := func(s sdktrace.ReadOnlySpan, key, value string) {
		t.Helper()
		if got, ok := attrs(s)[attribute.Key(key)]; !ok || got.Emit() != value {
			t.Errorf("%s: %s = %q (present %v), want %q", s.Name(), key, got.Emit(), ok, value)
		}
	}
	for _, s := range []sdktrace.ReadOnlySpan{send, receive, outSend, outReceive} {
		want(s, "messaging.system", "rocketmq")
	}
	want(send, "messaging.operation.type", "send")
	want(send, "messaging.destination.name", "trace_in")
	want(send, "messaging.message.id", res.MsgID)
	want(send, "messaging.destination.partition.id", "0")
	want(send, "messaging.rocketmq.message.tag", "greeting")
	want(receive, "messaging.operation.type", "receive")
	want(receive, "messaging.destination.name", "trace_in")
	want(receive, "messaging.message.id", res.MsgID)
	want(receive, "messaging.consumer.group.name", "trace_job")
	want(receive, "messaging.destination.partition.id", "0")
	want(mapSpan, "runnel.operator.uid", "upper")
	want(outSend, "messaging.destination.name", "trace_out")
	want(outReceive, "messaging.consumer.group.name", "downstream")
	want(outReceive, "messaging.message.id", string(mustProp(t, pulled.Messages[0].Properties, "UNIQ_KEY")))

	// The checkpoint that made the record durable links to its receive span.
	var linked sdktrace.ReadOnlySpan
	for _, cp := range checkpoints {
		for _, l := range cp.Links() {
			if l.SpanContext.SpanID() == receive.SpanContext().SpanID() {
				if linked != nil {
					t.Errorf("record linked from %s and %s", linked.Name(), cp.Name())
				}
				linked = cp
			}
		}
	}
	if linked == nil {
		t.Fatalf("no checkpoint span (of %d) links to the record's receive span", len(checkpoints))
	}
	if linked.SpanContext().TraceID() == traceID {
		t.Errorf("checkpoint span %s is in the record's trace; want its own trace", linked.Name())
	}
	if linked.StartTime().Before(receive.EndTime().Add(-time.Second)) && linked.EndTime().Before(receive.EndTime()) {
		t.Errorf("checkpoint %s ended before the record was processed", linked.Name())
	}
	ca := attrs(linked)
	if ca["runnel.checkpoint.offsets"].AsInt64() != 1 || ca["runnel.checkpoint.bytes"].AsInt64() <= 0 {
		t.Errorf("checkpoint attributes %v", linked.Attributes())
	}
}

func mustProp(t *testing.T, props, name string) string {
	t.Helper()
	v := rotel.PropertiesCarrier(props).Get(name)
	if v == "" {
		t.Fatalf("no property %s in %q", name, props)
	}
	return v
}

// TestTraceAcrossKeyBy follows a traced record across two keyed exchanges:
// source -> Map -> KeyBy -> Process "enrich" -> KeyBy -> Reduce "concat" -> sink,
// with keyed parallelism 2 and untraced records around it in the same
// batches. The traced record's trace must reach both keyed handlers (their
// spans children of its receive span, the handlers' contexts carrying
// them), the sink and the downstream consumer; the untraced records must
// produce no span at all.
func TestTraceAcrossKeyBy(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	// Ratio 0: only records whose context says sampled are traced.
	tel, err := rotel.New(rotel.WithTracerProvider(tp), rotel.WithSampleRatio(0))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()

	cl := newCluster(t)
	admin := cl.client()
	cl.createTopic(admin, "keyed_in", 1)
	cl.createTopic(admin, "keyed_out", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Untraced records before and after the traced one, on the same queue,
	// so that they share its batches; keys a..d spread over both subtasks.
	plain := cl.producer(admin, "plain_producer")
	traced := cl.producer(cl.client(tel), "traced_producer")
	q := queue("keyed_in", 0)
	send := func(p *client.Producer, sctx context.Context, body string) {
		t.Helper()
		if _, err := p.Send(sctx, &client.Message{Topic: "keyed_in", Queue: &q, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []string{"a:1", "b:1", "c:1", "d:1"} {
		send(plain, ctx, b)
	}
	rootCtx, root := tp.Tracer("test").Start(ctx, "upstream work")
	send(traced, rootCtx, "c:traced")
	root.End()
	for _, b := range []string{"a:2", "b:2", "c:2", "d:2"} {
		send(plain, ctx, b)
	}

	jobClient := cl.client(tel)
	src, err := srcmq.New(jobClient, "keyed_in", srcmq.WithGroup("keyed_job"), srcmq.WithStop(srcmq.StopAtLatest()))
	if err != nil {
		t.Fatal(err)
	}
	out := queue("keyed_out", 0)
	sk, err := sinkmq.New(cl.producer(jobClient, "keyed_job_producer"), func(s string) (*client.Message, error) {
		return &client.Message{Topic: "keyed_out", Queue: &out, Body: []byte(s)}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// checkCtx fails the handler unless its context carries a sampled span
	// exactly when it handles the traced record.
	checkCtx := func(ctx context.Context, v string) error {
		sampled := trace.SpanContextFromContext(ctx).IsSampled()
		if want := strings.HasSuffix(v, ":traced"); sampled != want {
			return fmt.Errorf("handler of %q: sampled span %v, want %v", v, sampled, want)
		}
		return nil
	}
	job := pipeline.New("keyed-trace-job", pipeline.Hooks(tel), pipeline.CheckpointDir(t.TempDir()), pipeline.DefaultParallelism(2))
	bodies := pipeline.Map(pipeline.FromSource(job, "in", src), "body", func(_ context.Context, m srcmq.Message) (string, error) {
		return string(m.Body), nil
	})
	keyOf := func(v string) string { k, _, _ := strings.Cut(v, ":"); return k }
	enriched := pipeline.Process(pipeline.KeyBy(bodies, keyOf), "enrich", func() pipeline.KeyedProcessFunc[string, string, string] {
		return &pipeline.ProcessFuncs[string, string, string]{ProcessFn: func(kc *pipeline.KeyedContext[string, string], v string) error {
			if err := checkCtx(kc.Context(), v); err != nil {
				return err
			}
			return kc.Emit(strings.ToUpper(v))
		}}
	})
	concat := pipeline.Reduce(pipeline.KeyBy(enriched, keyOf), "concat", func(ctx context.Context, acc, v string) (string, error) {
		if err := checkCtx(ctx, strings.ToLower(v)); err != nil {
			return "", err
		}
		return acc + "|" + v, nil
	})
	pipeline.To(concat, "out-sink", sk)
	if err := job.Run(ctx); err != nil {
		t.Fatal(err)
	}

	// Downstream: the output message that carries a trace context.
	var pulled *client.PullResult
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		var err error
		pulled, err = admin.Pull(ctx, client.PullRequest{Queue: out, Offset: 0, Group: "downstream", MaxMsgs: 32})
		if err != nil {
			return err
		}
		if len(pulled.Messages) != 9 {
			return fmt.Errorf("pulled %d messages (status %v), want 9", len(pulled.Messages), pulled.Status)
		}
		return nil
	})
	var withCtx []int
	for i, m := range pulled.Messages {
		if rotel.PropertiesCarrier(m.Properties).Get(rotel.PropTraceparent) != "" {
			withCtx = append(withCtx, i)
		}
	}
	if len(withCtx) != 1 {
		t.Fatalf("%d output messages carry a trace context, want 1", len(withCtx))
	}
	tracedOut := &pulled.Messages[withCtx[0]]
	if got := string(tracedOut.Body); got != "C:1|C:TRACED" {
		t.Fatalf("traced output %q, want C:1|C:TRACED", got)
	}
	_, span := tel.ReceiveMessage(ctx, "downstream", tracedOut)
	span.End()

	spans, checkpoints, get := indexSpans(t, rec.Ended())
	rootSpan := get("upstream work")
	sendSpan := get("keyed_in send")
	receive := get("keyed_in receive")
	mapSpan := get("map body")
	process := get("keyed-process enrich")
	reduce := get("reduce concat")
	sinkSpan := get("sink out-sink")
	outSend := get("keyed_out send")
	outReceive := get("keyed_out receive")
	if len(spans) != 9 {
		t.Errorf("%d spans besides checkpoints, want 9", len(spans))
	}
	traceID := rootSpan.SpanContext().TraceID()
	for _, p := range [][2]sdktrace.ReadOnlySpan{
		{sendSpan, rootSpan}, {receive, sendSpan}, {mapSpan, receive}, {process, receive},
		{reduce, receive}, {sinkSpan, receive}, {outSend, sinkSpan}, {outReceive, outSend},
	} {
		child, parent := p[0], p[1]
		if child.SpanContext().TraceID() != traceID {
			t.Errorf("%s: trace %s, want %s", child.Name(), child.SpanContext().TraceID(), traceID)
		}
		if child.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: parent %s, want %s (%s)", child.Name(), child.Parent().SpanID(), parent.SpanContext().SpanID(), parent.Name())
		}
	}
	// The spans follow the record through the tasks, in order.
	for _, p := range [][2]sdktrace.ReadOnlySpan{{mapSpan, process}, {process, reduce}, {reduce, sinkSpan}, {sinkSpan, outSend}} {
		if p[1].StartTime().Before(p[0].StartTime()) {
			t.Errorf("%s started before %s", p[1].Name(), p[0].Name())
		}
	}
	for _, s := range []sdktrace.ReadOnlySpan{process, reduce} {
		attrs := map[attribute.Key]string{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value.Emit()
		}
		if attrs["runnel.operator.kind"] != s.Name()[:strings.IndexByte(s.Name(), ' ')] || attrs["messaging.operation.type"] != "process" {
			t.Errorf("%s: attributes %v", s.Name(), s.Attributes())
		}
	}
	linked := 0
	for _, cp := range checkpoints {
		for _, l := range cp.Links() {
			if l.SpanContext.SpanID() == receive.SpanContext().SpanID() {
				linked++
			}
		}
	}
	if linked != 1 {
		t.Errorf("%d checkpoint spans (of %d) link to the record's receive span, want 1", linked, len(checkpoints))
	}
}

// indexSpans splits ended spans into the checkpoint spans and the others by
// name (a name seen twice is an error: one traced record gives one span per
// step), and returns a getter that fails the test on a missing name.
func indexSpans(t *testing.T, ended []sdktrace.ReadOnlySpan) (map[string]sdktrace.ReadOnlySpan, []sdktrace.ReadOnlySpan, func(string) sdktrace.ReadOnlySpan) {
	t.Helper()
	spans := map[string]sdktrace.ReadOnlySpan{}
	var checkpoints []sdktrace.ReadOnlySpan
	for _, s := range ended {
		if s.InstrumentationScope().Name == rotel.ScopeName && strings.HasPrefix(s.Name(), "checkpoint ") {
			checkpoints = append(checkpoints, s)
			continue
		}
		if _, dup := spans[s.Name()]; dup {
			t.Errorf("span %q recorded more than once (an untraced record was traced?)", s.Name())
		}
		spans[s.Name()] = s
	}
	get := func(name string) sdktrace.ReadOnlySpan {
		t.Helper()
		s, ok := spans[name]
		if !ok {
			names := make([]string, 0, len(spans))
			for n := range spans {
				names = append(names, n)
			}
			t.Fatalf("no span %q among %q", name, names)
		}
		return s
	}
	return spans, checkpoints, get
}
