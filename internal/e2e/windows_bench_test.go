package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// aggRec is a benchmark record: a key among 100k and an event time.
type aggRec struct {
	Key int64
	TS  int64
}

// aggStep spaces event times so that each key gets about 10 records per
// 1-minute window: a split visits all 100k keys every 50k records, so a
// minute spans 500k records per split.
const aggStep = 120 * time.Microsecond

func aggSource(b *testing.B) *source.Generator[aggRec] {
	per := int64(b.N/benchSplits + 1)
	origin := time.Date(2025, 1, 6, 0, 0, 0, 0, time.UTC).UnixNano()
	return source.NewGenerator(benchSplits, per, func(split int, seq uint64) aggRec {
		return aggRec{Key: int64((seq*2 + uint64(split)) % 100_000), TS: origin + int64(seq)*int64(aggStep)}
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
// One op = one record end to end; the records/s ratio window/keyed-count
// is the window operator's relative throughput.
func BenchmarkKeyedAgg(b *testing.B) {
	for _, kind := range []string{"keyed-count", "window"} {
		b.Run("kind="+kind, func(b *testing.B) {
			b.ReportAllocs()
			job := pipeline.New("bench-agg-"+kind, pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second),
				pipeline.DefaultParallelism(2))
			src := pipeline.FromSource(job, "gen", aggSource(b),
				pipeline.Timestamps(func(r aggRec) time.Time { return time.Unix(0, r.TS) }))
			keyed := pipeline.KeyBy(src, func(r aggRec) int64 { return r.Key })
			var n int64
			count := sink.NewFunc(func(context.Context, int64) error { n++; return nil }, nil)
			if kind == "window" {
				res := window.Apply(keyed, "count", window.Tumbling(time.Minute), window.Count[aggRec]())
				vals := pipeline.Map(res, "value", func(_ context.Context, r window.Result[int64, int64]) (int64, error) { return r.Value, nil })
				pipeline.To(vals, "sink", count)
			} else {
				counts := pipeline.Aggregate(keyed, "count", state.Aggregator[aggRec, int64, int64](countAgg{}),
					pipeline.StateCodec(state.VarintCodec()))
				pipeline.To(counts, "sink", count)
			}
			b.ResetTimer()
			benchRun(b, job)
		})
	}
}
