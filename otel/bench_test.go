package otel_test

import (
	"context"
	"net/netip"
	"os"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	rotel "github.com/runnel-dev/runnel/otel"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/runtime"
	sinkmq "github.com/runnel-dev/runnel/sink/rocketmq"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// benchRecords is the input of each job BenchmarkTracingOverhead runs: large
// enough that a job's start (routes, checkpoint store) is a small part of
// its run.
const benchRecords = 50_000

// BenchmarkTracingOverhead measures end-to-end job throughput (broker ->
// source/rocketmq -> Map -> sink/rocketmq -> broker) with tracing off, with
// 1 % of the records traced and with every record traced. A round runs a
// job per variant over the same preloaded input of benchRecords records
// (each job reads it from the start); one op is three rounds, the order of
// the variants rotating from round to round, so that the variants share
// the machine's state and drift. It reports each variant's records/s over
// all rounds and the traced variants' time overhead against tracing off,
// measured within each round, and the process's CPU time per record (the
// embedded broker's included) with the traced variants' CPU overhead: on a
// shared machine the CPU figures are the steadier ones. Run it with -count
// 6 or more and read the overhead rows with benchstat (mean and confidence
// interval over the runs).
func BenchmarkTracingOverhead(b *testing.B) {
	cl := newCluster(b)
	admin := cl.client()
	const in, out = "bench_in", "bench_out"
	cl.createTopic(admin, in, 2)
	cl.createTopic(admin, out, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	p := cl.producer(admin, "bench_loader")
	batch := make([]*client.Message, 0, 64)
	for i := range benchRecords {
		q := queue(in, i%2)
		batch = append(batch, &client.Message{Topic: in, Queue: &q, Body: []byte("record-" + strconv.Itoa(i))})
		if len(batch) == cap(batch) || i == benchRecords-1 {
			// One queue per send call: split the batch by queue.
			for qid := range 2 {
				var part []*client.Message
				for _, m := range batch {
					if int(m.Queue.QueueID) == qid {
						part = append(part, m)
					}
				}
				if _, err := p.Send(ctx, part...); err != nil {
					b.Fatal(err)
				}
			}
			batch = batch[:0]
		}
	}
	variants := []struct {
		name  string
		ratio float64 // < 0: no hooks at all
	}{{"off", -1}, {"1pct", 0.01}, {"100pct", 1}}
	took := make([]time.Duration, len(variants))
	cpu := make([]time.Duration, len(variants))
	overhead := make([]float64, len(variants))
	rounds := 0
	b.ResetTimer()
	for range b.N {
		// One op is len(variants) rounds, each variant in each position
		// once, so that a position's advantage (the first job after the
		// load, the output topic's growth) falls on every variant alike.
		for r := range variants {
			var this [3]time.Duration
			for j := range variants {
				v := (r + j) % len(variants)
				cpu0 := cputime.Process()
				// Labelled, so that a CPU profile splits by variant (go
				// tool pprof -tagfocus 'tracing=[1]pct'; a bare 1pct
				// parses as a number).
				pprof.Do(ctx, pprof.Labels("tracing", variants[v].name), func(ctx context.Context) {
					this[v] = runBenchJob(ctx, b, cl, in, out, variants[v].ratio)
				})
				took[v] += this[v]
				cpu[v] += cputime.Process() - cpu0
			}
			b.Logf("round %d: off %v, 1pct %v, 100pct %v", rounds, this[0], this[1], this[2])
			for v := range variants {
				overhead[v] += float64(this[v])/float64(this[0]) - 1
			}
			rounds++
		}
	}
	b.StopTimer()
	for v, x := range variants {
		b.ReportMetric(float64(benchRecords*rounds)/took[v].Seconds(), x.name+"-records/s")
		if cpu[0] > 0 {
			b.ReportMetric(float64(cpu[v].Nanoseconds())/float64(benchRecords*rounds), x.name+"-cpu-ns/record")
		}
		if v > 0 {
			b.ReportMetric(100*overhead[v]/float64(rounds), x.name+"-overhead-%")
			if cpu[0] > 0 {
				b.ReportMetric(100*(float64(cpu[v])/float64(cpu[0])-1), x.name+"-cpu-overhead-%")
			}
		}
	}
	b.ReportMetric(0, "ns/op") // a round's time says nothing the rows above do not
}

// runBenchJob runs the benchmark job over topic in and returns its run time.
func runBenchJob(ctx context.Context, b *testing.B, cl *cluster, in, out string, ratio float64) time.Duration {
	b.Helper()
	var hooks []client.Hook
	var jobHooks []runtime.Hook
	var tp *sdktrace.TracerProvider
	if ratio >= 0 {
		tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
			sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		tel, err := rotel.New(rotel.WithTracerProvider(tp), rotel.WithSampleRatio(ratio))
		if err != nil {
			b.Fatal(err)
		}
		hooks, jobHooks = []client.Hook{tel}, []runtime.Hook{tel}
	}
	c, err := client.New(client.WithNameServers(cl.tc.NameServer), client.WithClientIP(netip.MustParseAddr("127.0.0.1")), client.WithHooks(hooks...))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	prod, err := client.NewProducer(c, "bench_sink")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = prod.Close() }()
	src, err := srcmq.New(c, in, srcmq.WithStop(srcmq.StopAtLatest()), srcmq.WithOffsetReporting(false))
	if err != nil {
		b.Fatal(err)
	}
	sk, err := sinkmq.New(prod, func(v []byte) (*client.Message, error) {
		return &client.Message{Topic: out, Body: v}, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp(b.TempDir(), "job")
	if err != nil {
		b.Fatal(err)
	}
	job := pipeline.New("bench", pipeline.Hooks(jobHooks...), pipeline.CheckpointDir(dir),
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
	start := time.Now()
	if err := job.Run(ctx); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	if tp != nil {
		if err := tp.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
	}
	_ = os.RemoveAll(dir)
	return d
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
