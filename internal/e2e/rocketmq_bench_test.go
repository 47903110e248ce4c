package e2e

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/protocol"
)

const (
	mqBenchTopic  = "bench_input"
	mqBenchQueues = 4
	mqBenchKeys   = 100_000
)

// mqBench is a broker with a preloaded topic shared by the sub-benchmarks
// of one BenchmarkRocketMQ run.
type mqBench struct {
	e   *mqEnv
	qs  []protocol.MessageQueue
	per int // records per queue
}

// ensure grows the topic to at least n records in all (timer stopped).
func (m *mqBench) ensure(b *testing.B, n int) {
	per := (n + mqBenchQueues - 1) / mqBenchQueues
	if per <= m.per {
		return
	}
	b.StopTimer()
	defer b.StartTimer()
	from := m.per
	m.e.preload(b, m.qs, per-from, func(q int, seq uint64) []byte {
		return strconv.AppendUint(nil, (uint64(q)+uint64(mqBenchQueues)*(seq+uint64(from)))%mqBenchKeys, 10)
	})
	m.per = per
}

// stops returns per-queue stop offsets reading n records in all.
func (m *mqBench) stops(n int) map[string]int64 {
	stops := make(map[string]int64, len(m.qs))
	for i, q := range m.qs {
		c := n / len(m.qs)
		if i < n%len(m.qs) {
			c++
		}
		stops[q.BrokerName+"/"+strconv.Itoa(int(q.QueueID))] = int64(c)
	}
	return stops
}

func (m *mqBench) source(b *testing.B) *srcmq.Source {
	src, err := srcmq.New(m.e.c, mqBenchTopic, srcmq.WithStop(srcmq.StopAtOffsets(m.stops(b.N))), srcmq.WithOffsetReporting(false))
	if err != nil {
		b.Fatal(err)
	}
	return src
}

func runMQBench(b *testing.B, job *pipeline.Job, seen *int64) {
	b.Helper()
	start := time.Now()
	if err := job.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	if *seen != int64(b.N) {
		b.Fatalf("sink saw %d records, want %d", *seen, b.N)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
}

// BenchmarkRocketMQ measures jobs reading a preloaded 4-queue topic from the
// embedded broker in-process, end to end (one op = one record): a stateless
// Map, and a keyed count over 100k keys (a Value[int64] per key, checkpoint
// every second) to compare with it.
func BenchmarkRocketMQ(b *testing.B) {
	m := &mqBench{e: startMQ(b)}
	m.qs = m.e.createTopic(b, mqBenchTopic, mqBenchQueues)
	parse := func(msg srcmq.Message) (uint64, error) { return strconv.ParseUint(string(msg.Body), 10, 64) }

	b.Run("StatelessMap", func(b *testing.B) {
		b.ReportAllocs()
		m.ensure(b, b.N)
		job := pipeline.New("bench-mq-map", pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second))
		keys := pipeline.FromSourceDecoded(job, "input", m.source(b), parse)
		doubled := pipeline.Map(keys, "double", func(_ context.Context, k uint64) (uint64, error) { return 2 * k, nil })
		var seen int64
		pipeline.To(doubled, "count", sink.NewFunc(func(context.Context, uint64) error { seen++; return nil }, nil))
		b.ResetTimer()
		runMQBench(b, job, &seen)
	})
	b.Run("KeyedCount", func(b *testing.B) {
		b.ReportAllocs()
		m.ensure(b, b.N)
		job := pipeline.New("bench-mq-count", pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second),
			pipeline.DefaultParallelism(2))
		keys := pipeline.FromSourceDecoded(job, "input", m.source(b), parse)
		counts := pipeline.Process(pipeline.KeyBy(keys, func(k uint64) uint64 { return k }), "count",
			func() pipeline.KeyedProcessFunc[uint64, uint64, counted] { return &countFn{} })
		var seen int64
		pipeline.To(counts, "sink", sink.NewFunc(func(context.Context, counted) error { seen++; return nil }, nil))
		b.ResetTimer()
		runMQBench(b, job, &seen)
	})
}
