package pipeline_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// passOn is a keyed function without state: it passes every record on.
type passOn[K comparable] struct{}

func (passOn[K]) Open(*pipeline.OpenContext) error { return nil }
func (passOn[K]) ProcessElement(kc *pipeline.KeyedContext[K, int64], v int64) error {
	kc.Emit(v)
	return nil
}
func (passOn[K]) OnTimer(*pipeline.KeyedContext[K, int64], pipeline.Timer) error { return nil }

// BenchmarkKeyedShuffle measures the path of a record through a KeyBy to
// a keyed operator and on to a sink, without state and without
// checkpoints during the run: a 2-split generator, KeyBy over 100k keys,
// a keyed function that passes each record on (2 subtasks), a counting
// sink; key=int64 and key=string differ in the key's codec (8 bytes, or
// the string's bytes). cpu-ns/record is the process's CPU time per record.
func BenchmarkKeyedShuffle(b *testing.B) {
	const records = 2_000_000
	b.Run("key=int64", func(b *testing.B) {
		benchShuffle(b, records, func(src *pipeline.Stream[int64]) *pipeline.Stream[int64] {
			return pipeline.Process(pipeline.KeyBy(src, func(v int64) int64 { return v % 100_000 }), "pass",
				func() pipeline.KeyedProcessFunc[int64, int64, int64] { return passOn[int64]{} })
		})
	})
	b.Run("key=string", func(b *testing.B) {
		names := make([]string, 100_000)
		for i := range names {
			names[i] = "customer-" + strconv.Itoa(i)
		}
		benchShuffle(b, records, func(src *pipeline.Stream[int64]) *pipeline.Stream[int64] {
			return pipeline.Process(pipeline.KeyBy(src, func(v int64) string { return names[v%100_000] }), "pass",
				func() pipeline.KeyedProcessFunc[string, int64, int64] { return passOn[string]{} })
		})
	})
}

func benchShuffle(b *testing.B, records int, keyed func(*pipeline.Stream[int64]) *pipeline.Stream[int64]) {
	var took, cpu time.Duration
	for range b.N {
		b.StopTimer()
		job := pipeline.New("bench-shuffle", pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Hour),
			pipeline.DefaultParallelism(2))
		src := pipeline.FromSource(job, "gen", source.NewGenerator(2, int64(records/2),
			func(split int, seq uint64) int64 { return int64(seq*2 + uint64(split)) }))
		var seen int64
		pipeline.To(keyed(src), "sink", sink.NewFunc(func(context.Context, int64) error { seen++; return nil }, nil))
		b.StartTimer()
		start, cpu0 := time.Now(), cputime.Process()
		if err := job.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		cpu += cputime.Process() - cpu0
		if seen != int64(records) {
			b.Fatalf("sink saw %d records, want %d", seen, records)
		}
	}
	n := float64(b.N) * float64(records)
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/record")
	b.ReportMetric(n/took.Seconds(), "records/s")
}
