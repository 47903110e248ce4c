package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

const benchSplits = 2

func benchRun(b *testing.B, job *pipeline.Job) {
	b.Helper()
	start := time.Now()
	if err := job.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
}

// BenchmarkStatelessMap: generator source, one Map, a counting sink; one
// op = one record end to end.
func BenchmarkStatelessMap(b *testing.B) {
	b.ReportAllocs()
	job := pipeline.New("bench-map", pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second))
	per := int64(b.N/benchSplits + 1)
	src := pipeline.FromSource(job, "gen", source.NewGenerator(benchSplits, per, func(_ int, seq uint64) int64 { return int64(seq) }))
	m := pipeline.Map(src, "double", func(_ context.Context, v int64) (int64, error) { return 2 * v, nil })
	var n int64
	pipeline.To(m, "count", sink.NewFunc(func(context.Context, int64) error { n++; return nil }, nil))
	b.ResetTimer()
	benchRun(b, job)
}

// BenchmarkKeyedCount: generator source over 100k keys, KeyBy, a per-key
// count in state, checkpoint every second; compare records/s with
// BenchmarkStatelessMap.
func BenchmarkKeyedCount(b *testing.B) {
	b.ReportAllocs()
	job := pipeline.New("bench-count", pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second),
		pipeline.DefaultParallelism(2))
	per := int64(b.N/benchSplits + 1)
	src := pipeline.FromSource(job, "gen", source.NewGenerator(benchSplits, per, func(split int, seq uint64) int64 {
		return int64((seq*2 + uint64(split)) % 100_000)
	}))
	counts := pipeline.Reduce(pipeline.KeyBy(src, func(k int64) int64 { return k }), "count",
		func(_ context.Context, a, _ int64) (int64, error) { return a + 1, nil }, pipeline.StateCodec(state.Int64Codec()))
	var n int64
	pipeline.To(counts, "sink", sink.NewFunc(func(context.Context, int64) error { n++; return nil }, nil))
	b.ResetTimer()
	benchRun(b, job)
}
