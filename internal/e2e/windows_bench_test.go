package e2e

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// aggRec is a benchmark record: a key among aggKeys and an event time.
type aggRec struct {
	Key int64
	TS  int64
}

const (
	aggKeys = 100_000
	// aggStep spaces event times so that each key gets about 10 records
	// per 1-minute window: a split visits all keys every 50k records, so a
	// minute spans 500k records per split (1M per window).
	aggStep = 120 * time.Microsecond
	// aggRecords is the size of one BenchmarkKeyedAgg run, whatever
	// -benchtime says: 2.4M records span 2 minutes 24 s of event time, so
	// two windows fire on the watermark mid-run and a third at the end of
	// the input, and the run lasts long enough for several 1 s
	// checkpoints.
	aggRecords = 2_400_000
)

func aggSource() *source.Generator[aggRec] {
	origin := time.Date(2025, 1, 6, 0, 0, 0, 0, time.UTC).UnixNano()
	return source.NewGenerator(benchSplits, aggRecords/benchSplits, func(split int, seq uint64) aggRec {
		return aggRec{Key: int64((seq*2 + uint64(split)) % aggKeys), TS: origin + int64(seq)*int64(aggStep)}
	})
}

// countAgg counts records (an int64 accumulator).
type countAgg struct{}

func (countAgg) CreateAccumulator() int64      { return 0 }
func (countAgg) Add(acc int64, _ aggRec) int64 { return acc + 1 }
func (countAgg) Result(acc int64) int64        { return acc }

// BenchmarkKeyedAgg compares, on the same source (100k keys, event time
// from the record, watermarks, checkpoint every second, parallelism 2):
//
//   - kind=keyed-count: a per-key running count (pipeline.Aggregate), one
//     output per record;
//   - kind=window: per-key counts in 1-minute tumbling event-time windows
//     (window.Apply with window.Count), about 10 records per key and
//     window, one output per key and window.
//
// One op is one job of aggRecords records (a fixed size: short runs are
// dominated by start-up and never fire a window). The records/s ratio
// window/keyed-count is the window operator's relative throughput; the
// run also reports the CPU time and allocations per record, the checkpoints taken and the
// windows fired per run, and fails when the outputs do not add up.
func BenchmarkKeyedAgg(b *testing.B) {
	for _, kind := range []string{"keyed-count", "window"} {
		b.Run("kind="+kind, func(b *testing.B) {
			var (
				elapsed time.Duration
				cps     uint64
				outs    int64
				ms0     runtime.MemStats
				ms1     runtime.MemStats
			)
			cpu0 := cputime.Process()
			runtime.ReadMemStats(&ms0)
			for range b.N {
				o, c, d := runKeyedAgg(b, kind)
				outs += o
				cps += c
				elapsed += d
			}
			runtime.ReadMemStats(&ms1)
			cpu := cputime.Process() - cpu0
			recs := float64(b.N) * aggRecords
			b.ReportMetric(recs/elapsed.Seconds(), "records/s")
			b.ReportMetric(float64(elapsed.Nanoseconds())/recs, "ns/record")
			b.ReportMetric(float64(cpu.Nanoseconds())/recs, "cpu-ns/record")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/recs, "allocs/record")
			b.ReportMetric(float64(cps)/float64(b.N), "checkpoints/run")
			if kind == "window" {
				b.ReportMetric(float64(outs)/float64(b.N)/aggKeys, "windows/run")
			}
		})
	}
}

// runKeyedAgg runs one BenchmarkKeyedAgg job and returns its outputs, the
// id of its last completed checkpoint and its wall time.
func runKeyedAgg(b *testing.B, kind string) (outs int64, cps uint64, d time.Duration) {
	b.Helper()
	job := pipeline.New("bench-agg-"+kind, pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second),
		pipeline.DefaultParallelism(2))
	src := pipeline.FromSource(job, "gen", aggSource()).
		WithTimestamps(func(r aggRec) time.Time { return time.Unix(0, r.TS) })
	keyed := pipeline.KeyBy(src, func(r aggRec) int64 { return r.Key })
	var n, sum int64
	count := sink.NewFunc(func(_ context.Context, v int64) error { n++; sum += v; return nil }, nil)
	if kind == "window" {
		res := window.Apply(keyed, "count", window.Tumbling(time.Minute), window.Count[aggRec]())
		vals := pipeline.Map(res, "value", func(_ context.Context, r window.Result[int64, int64]) (int64, error) { return r.Value, nil })
		pipeline.To(vals, "sink", count)
	} else {
		counts := pipeline.AggregateCodec(keyed, "count", state.Aggregator[aggRec, int64, int64](countAgg{}),
			state.VarintCodec())
		pipeline.To(counts, "sink", count)
	}
	start := time.Now()
	if err := job.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	d = time.Since(start)
	// Every record is counted once: in its window's result, or by its own
	// running count.
	if kind == "window" && sum != aggRecords {
		b.Fatalf("window counts add up to %d, want %d", sum, aggRecords)
	}
	if kind != "window" && n != aggRecords {
		b.Fatalf("%d running counts, want %d", n, aggRecords)
	}
	// Checkpoint ids count up from 1; the status keeps the last few.
	for _, c := range job.Status().Checkpoints {
		if c.Result == "completed" {
			cps = max(cps, c.ID)
		}
	}
	return n, cps, d
}
