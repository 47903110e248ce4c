package pipeline_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// joinRec is a benchmark record: a key and an event time.
type joinRec struct {
	Key int64
	TS  int64
}

// joinRecCodec is joinRec in 16 bytes.
type joinRecCodec struct{}

func (joinRecCodec) Append(dst []byte, r joinRec) ([]byte, error) {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(dst, uint64(r.Key)), uint64(r.TS)), nil
}

func (joinRecCodec) Decode(b []byte) (joinRec, error) {
	if len(b) != 16 {
		return joinRec{}, errors.New("joinRec: bad length")
	}
	return joinRec{Key: int64(binary.BigEndian.Uint64(b)), TS: int64(binary.BigEndian.Uint64(b[8:]))}, nil
}

func (joinRecCodec) ID() string { return "joinrec-v1" }

const (
	joinBenchRecords = 1_000_000 // per op, whatever -benchtime says
	joinBenchKeys    = 10_000
	joinBenchStep    = 10 * time.Microsecond // a key's records are joinBenchKeys*step = 100 ms apart
)

var joinBenchOrigin = time.Date(2025, 1, 6, 0, 0, 0, 0, time.UTC).UnixNano()

// joinBenchGen: record seq of a split; the second input's (split 1) is
// 1 ms after the first's of the same seq and key.
func joinBenchGen(split int, seq uint64) joinRec {
	return joinRec{Key: int64(seq % joinBenchKeys), TS: joinBenchOrigin + int64(seq)*int64(joinBenchStep) + int64(split)*int64(time.Millisecond)}
}

type benchCount struct{}

func (benchCount) CreateAccumulator() int64       { return 0 }
func (benchCount) Add(acc int64, _ joinRec) int64 { return acc + 1 }
func (benchCount) Result(acc int64) int64         { return acc }

// keyedCountRate and keyedCountCPU are kind=keyed-count's last records/s
// and CPU time per record, for kind=interval-join's ratios to them.
var keyedCountRate, keyedCountCPU float64

// BenchmarkIntervalJoin compares, on the same input volume
// (joinBenchRecords records in two splits, 10k keys, event time from the
// record, checkpoint every second, parallelism 2):
//
//   - kind=keyed-count: a per-key running count (pipeline.Aggregate) of
//     one source with two splits, one output per record;
//   - kind=interval-join: an IntervalJoin of two sources of one split
//     each, [0, 2 ms]: every first-input record meets the second input's
//     record 1 ms later (one output per pair, half as many as records).
//
// One op is one job. kind=interval-join also reports its records/s as a
// percentage of kind=keyed-count's in the same run (the target is
// at least 50 %), and the same ratio per CPU second (%-of-keyed-count-cpu:
// what it is on an otherwise idle machine, where both jobs are CPU-bound).
func BenchmarkIntervalJoin(b *testing.B) {
	for _, kind := range []string{"keyed-count", "interval-join"} {
		b.Run("kind="+kind, func(b *testing.B) {
			var elapsed time.Duration
			cpu0 := cputime.Process()
			for range b.N {
				elapsed += runJoinBench(b, kind)
			}
			recs := float64(b.N) * joinBenchRecords
			cpu := float64((cputime.Process() - cpu0).Nanoseconds()) / recs
			rate := recs / elapsed.Seconds()
			b.ReportMetric(rate, "records/s")
			b.ReportMetric(float64(elapsed.Nanoseconds())/recs, "ns/record")
			if cputime.Supported() {
				b.ReportMetric(cpu, "cpu-ns/record")
			}
			if kind == "keyed-count" {
				keyedCountRate, keyedCountCPU = rate, cpu
			} else if keyedCountRate > 0 {
				b.ReportMetric(100*rate/keyedCountRate, "%-of-keyed-count")
				if cputime.Supported() && cpu > 0 {
					b.ReportMetric(100*keyedCountCPU/cpu, "%-of-keyed-count-cpu")
				}
			}
		})
	}
}

func runJoinBench(b *testing.B, kind string) time.Duration {
	b.Helper()
	job := pipeline.New("bench-"+kind, pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second),
		pipeline.DefaultParallelism(2))
	ts := func(r joinRec) time.Time { return time.Unix(0, r.TS) }
	keyOf := func(r joinRec) int64 { return r.Key }
	var n int64
	want := int64(joinBenchRecords)
	if kind == "keyed-count" {
		src := pipeline.FromSource(job, "gen", source.NewGenerator(2, joinBenchRecords/2, joinBenchGen)).WithTimestamps(ts)
		counts := pipeline.AggregateCodec(pipeline.KeyBy(src, keyOf), "count", state.Aggregator[joinRec, int64, int64](benchCount{}),
			state.VarintCodec())
		pipeline.To(counts, "sink", sink.NewFunc(func(context.Context, int64) error { n++; return nil }, nil))
	} else {
		first := func(_ int, seq uint64) joinRec { return joinBenchGen(0, seq) }
		second := func(_ int, seq uint64) joinRec { return joinBenchGen(1, seq) }
		a := pipeline.FromSource(job, "a", source.NewGenerator(1, joinBenchRecords/2, first)).WithTimestamps(ts)
		c := pipeline.FromSource(job, "b", source.NewGenerator(1, joinBenchRecords/2, second)).WithTimestamps(ts)
		conn := pipeline.ConnectKeyed(pipeline.KeyBy(a, keyOf).WithCodec(joinRecCodec{}), pipeline.KeyBy(c, keyOf).WithCodec(joinRecCodec{}))
		pairs := pipeline.IntervalJoin(conn, "join", 0, 2*time.Millisecond, func(_ context.Context, x, y joinRec) (int64, error) {
			return y.TS - x.TS, nil
		})
		pipeline.To(pairs, "sink", sink.NewFunc(func(_ context.Context, d int64) error {
			if d != int64(time.Millisecond) {
				return errors.New("joined records not 1 ms apart")
			}
			n++
			return nil
		}, nil))
		want = joinBenchRecords / 2
	}
	start := time.Now()
	if err := job.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	if n != want {
		b.Fatalf("%s: %d outputs, want %d", kind, n, want)
	}
	return d
}
