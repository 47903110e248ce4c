package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

const (
	benchSplits = 2
	// benchRecords is the size of one op of BenchmarkStatelessMap and
	// BenchmarkKeyedCount: a job over that many generated records, whatever
	// -benchtime says, so that a run spans 1 s checkpoints.
	benchRecords = 8_000_000
)

// benchRun runs b.N jobs built by build, each over benchRecords generated
// records (see benchJobs).
func benchRun(b *testing.B, name string, build func(job *pipeline.Job, seen *int64)) {
	b.Helper()
	benchJobs(b, name, benchRecords, build)
}

// benchJobs runs b.N jobs built by build (each over records records,
// counted by the sink into *seen; build runs with the timer stopped) and
// reports records/s, CPU per record and the checkpoint figures.
func benchJobs(b *testing.B, name string, records int64, build func(job *pipeline.Job, seen *int64)) {
	b.Helper()
	b.ReportAllocs()
	cps := &cpStats{}
	var took, cpu time.Duration
	for range b.N {
		b.StopTimer()
		job := pipeline.New(name, pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second),
			pipeline.DefaultParallelism(2), pipeline.Hooks(cps))
		var seen int64
		build(job, &seen)
		b.StartTimer()
		start, cpu0 := time.Now(), cputime.Process()
		if err := job.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		cpu += cputime.Process() - cpu0
		if seen != records {
			b.Fatalf("sink saw %d records, want %d", seen, records)
		}
	}
	n := float64(b.N) * float64(records)
	b.ReportMetric(n/took.Seconds(), "records/s")
	b.ReportMetric(float64(took.Nanoseconds())/n, "ns/record")
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/record")
	cps.report(b)
}

// BenchmarkStatelessMap: generator source (2 splits), one Map, a counting
// sink; one op is one job over benchRecords records.
func BenchmarkStatelessMap(b *testing.B) {
	benchRun(b, "bench-map", func(job *pipeline.Job, seen *int64) {
		src := pipeline.FromSource(job, "gen", source.NewGenerator(benchSplits, benchRecords/benchSplits,
			func(_ int, seq uint64) int64 { return int64(seq) }))
		m := pipeline.Map(src, "double", func(_ context.Context, v int64) (int64, error) { return 2 * v, nil })
		pipeline.To(m, "count", sink.NewFunc(func(context.Context, int64) error { *seen++; return nil }, nil))
	})
}

// BenchmarkKeyedCount: generator source over 100k keys, KeyBy, a per-key
// count in state (2 subtasks), checkpoint every second; one op is one job
// over benchRecords records: compare with BenchmarkStatelessMap.
func BenchmarkKeyedCount(b *testing.B) {
	benchRun(b, "bench-count", func(job *pipeline.Job, seen *int64) {
		src := pipeline.FromSource(job, "gen", source.NewGenerator(benchSplits, benchRecords/benchSplits,
			func(split int, seq uint64) int64 { return int64((seq*2 + uint64(split)) % 100_000) }))
		counts := pipeline.ReduceCodec(pipeline.KeyBy(src, func(k int64) int64 { return k }), "count",
			func(_ context.Context, a, _ int64) (int64, error) { return a + 1, nil }, state.Int64Codec())
		pipeline.To(counts, "sink", sink.NewFunc(func(context.Context, int64) error { *seen++; return nil }, nil))
	})
}

// BenchmarkRestart1MKeys measures a restart with 1M keys of state as a user
// sees it: from building the job (whose Run opens the checkpoint store and
// restores offsets and state) to the first record that the keyed operator
// processed, reading its key's restored count, reaching the sink. Set-up
// (not timed): one job counts 1M distinct keys to its final checkpoint.
// Each op then restarts the job on that directory with an unbounded
// generator that resumes at the checkpointed offsets, and stops it after
// the first record (a stop checkpoint, timed in ns/op but not in the
// first-record figures).
func BenchmarkRestart1MKeys(b *testing.B) {
	const keys = 1_000_000
	dir := filepath.Join(b.TempDir(), "job")
	build := func(perSplit int64, out func(counted)) *pipeline.Job {
		job := pipeline.New("bench-restart", pipeline.CheckpointDir(dir), pipeline.CheckpointInterval(time.Second),
			pipeline.DefaultParallelism(2))
		src := pipeline.FromSource(job, "gen", source.NewGenerator(benchSplits, perSplit,
			func(split int, seq uint64) uint64 { return (seq*benchSplits + uint64(split)) % keys }))
		counts := pipeline.Process(pipeline.KeyBy(src, func(k uint64) uint64 { return k }), "count",
			func() pipeline.KeyedProcessFunc[uint64, uint64, counted] { return &countFn{} })
		pipeline.To(counts, "sink", sink.NewFunc(func(_ context.Context, c counted) error { out(c); return nil }, nil))
		return job
	}
	if err := build(keys/benchSplits, func(counted) {}).Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithCancel(context.Background())
		var (
			once  sync.Once
			first counted
			took  time.Duration
		)
		start := time.Now()
		job := build(-1, func(c counted) {
			once.Do(func() { took, first = time.Since(start), c; cancel() })
		})
		err := job.Run(ctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		if first.Count < 2 {
			b.Fatalf("first record after the restart: %+v, want a count restored from the checkpoint (>= 2)", first)
		}
		lat = append(lat, took)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "first-record-p50-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "first-record-max-ms")
}
