package otel_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	rotel "github.com/runnel-dev/runnel/otel"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/runtime"
	sinkmq "github.com/runnel-dev/runnel/sink/rocketmq"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// BenchmarkTracingOverhead measures end-to-end job throughput (broker ->
// source/rocketmq -> Map -> sink/rocketmq -> broker) with tracing off, with
// 1 % of the records traced and with every record traced, in one run so
// that the rows compare (benchstat ".../tracing=off" against the others).
// One op is one record; the input is preloaded with the timer stopped.
func BenchmarkTracingOverhead(b *testing.B) {
	cl := newCluster(b)
	admin := cl.client()
	p := cl.producer(admin, "bench_loader")
	for _, mode := range []string{"off", "1pct", "100pct"} {
		b.Run("tracing="+mode, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			b.StopTimer()
			in, out := "bench_in_"+mode+"_"+strconv.Itoa(b.N), "bench_out_"+mode+"_"+strconv.Itoa(b.N)
			cl.createTopic(admin, in, 2)
			cl.createTopic(admin, out, 2)
			for qid := range 2 {
				q := queue(in, qid)
				left := b.N / 2
				if qid == 0 {
					left += b.N % 2
				}
				for left > 0 {
					batch := make([]*client.Message, min(left, 64))
					for i := range batch {
						batch[i] = &client.Message{Topic: in, Queue: &q, Body: []byte("record-" + strconv.Itoa(i))}
					}
					if _, err := p.Send(ctx, batch...); err != nil {
						b.Fatal(err)
					}
					left -= len(batch)
				}
			}
			var hooks []client.Hook
			var jobHooks []runtime.Hook
			var tp *sdktrace.TracerProvider
			if mode != "off" {
				ratio := 1.0
				if mode == "1pct" {
					ratio = 0.01
				}
				tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
					sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				tel, err := rotel.New(rotel.WithTracerProvider(tp), rotel.WithSampleRatio(ratio))
				if err != nil {
					b.Fatal(err)
				}
				hooks, jobHooks = []client.Hook{tel}, []runtime.Hook{tel}
			}
			c := (&cluster{t: b, ns: cl.ns, b: cl.b}).client(hooks...) // closed when this sub-benchmark ends
			src, err := srcmq.New(c, in, srcmq.WithStop(srcmq.StopAtLatest()), srcmq.WithOffsetReporting(false))
			if err != nil {
				b.Fatal(err)
			}
			sk, err := sinkmq.New((&cluster{t: b, ns: cl.ns, b: cl.b}).producer(c, "bench_sink"), func(v []byte) (*client.Message, error) {
				return &client.Message{Topic: out, Body: v}, nil
			})
			if err != nil {
				b.Fatal(err)
			}
			job := pipeline.New("bench", pipeline.Hooks(jobHooks...), pipeline.CheckpointDir(b.TempDir()),
				pipeline.CheckpointInterval(time.Second))
			mapped := pipeline.Map(pipeline.FromSource(job, "in", src), "upper", func(_ context.Context, m srcmq.Message) ([]byte, error) {
				v := make([]byte, len(m.Body))
				for i, c := range m.Body {
					if c >= 'a' && c <= 'z' {
						c -= 'a' - 'A'
					}
					v[i] = c
				}
				return v, nil
			})
			pipeline.To(mapped, "out", sk)
			b.ReportAllocs()
			b.StartTimer()
			start := time.Now()
			if err := job.Run(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
			if tp != nil {
				if err := tp.Shutdown(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// propsRecord is a source record with message properties.
type propsRecord struct{ props string }

func (r *propsRecord) RawProperties() string { return r.props }

// BenchmarkHotPathUnsampled measures the per-record and per-send hook cost
// of records and sends that are not sampled (the 99 % at 1 % sampling).
func BenchmarkHotPathUnsampled(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tel, err := rotel.New(rotel.WithTracerProvider(tp), rotel.WithSampleRatio(0))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("record=no-context", func(b *testing.B) {
		rec := &propsRecord{props: "UNIQ_KEY\x01AC11000100002A9F0000000000000001\x02TAGS\x01a\x02"}
		info := &runtime.RecordInfo{Job: "j", Source: "s", Split: "broker-a/0"}
		b.ReportAllocs()
		for b.Loop() {
			info.Value = rec
			if tel.StartRecord(ctx, info) != nil {
				b.Fatal("sampled")
			}
		}
	})
	b.Run("record=unsampled-parent", func(b *testing.B) {
		rec := &propsRecord{props: "UNIQ_KEY\x01AC11000100002A9F0000000000000001\x02traceparent\x0100-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00\x02"}
		info := &runtime.RecordInfo{Job: "j", Source: "s", Split: "broker-a/0"}
		b.ReportAllocs()
		for b.Loop() {
			info.Value = rec
			if tel.StartRecord(ctx, info) != nil {
				b.Fatal("sampled")
			}
		}
	})
	b.Run("send", func(b *testing.B) {
		msgs := []*client.Message{{Topic: "t", Body: []byte("x")}}
		var in client.Injector
		b.ReportAllocs()
		for b.Loop() {
			sctx := tel.OnProduce(ctx, "t", msgs, &in)
			tel.OnProduced(sctx, "t", 1, client.SendResult{}, nil)
		}
	})
}
