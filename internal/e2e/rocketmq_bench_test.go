package e2e

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/protocol"
)

const (
	mqBenchTopic  = "bench_input"
	mqBenchQueues = 4
	mqBenchKeys   = 100_000
	// mqBenchRecords is the size of one op of BenchmarkRocketMQ: a job
	// reading that many records, whatever -benchtime says, so that a run
	// spans several 1 s checkpoints and job start-up does not dominate.
	mqBenchRecords = 2_000_000
)

// cpStats records the checkpoints of a job (a runtime.HookCheckpointEnd).
type cpStats struct {
	mu      sync.Mutex
	durs    []time.Duration // trigger to durable, completed periodic ones
	changes int             // state entries written by them
	failed  int
}

func (s *cpStats) OnCheckpointEnd(_ string, info runtime.CheckpointInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case info.Err != nil:
		s.failed++
	case info.Kind == runtime.CheckpointPeriodic:
		s.durs = append(s.durs, info.Duration)
		s.changes += info.StateChanges
	}
}

// report adds the checkpoints per op, their p99 (trigger to durable) and
// their mean state changes as metrics.
func (s *cpStats) report(b *testing.B) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed > 0 {
		b.Fatalf("%d checkpoints failed", s.failed)
	}
	b.ReportMetric(float64(len(s.durs))/float64(b.N), "checkpoints/op")
	if len(s.durs) == 0 {
		return
	}
	d := slices.Clone(s.durs)
	slices.Sort(d)
	b.ReportMetric(float64(d[(len(d)*99)/100])/1e6, "cp-p99-ms")
	b.ReportMetric(float64(s.changes)/float64(len(d)), "cp-changes")
}

// mqBench is a broker with a topic preloaded with mqBenchRecords records,
// shared by the sub-benchmarks of one BenchmarkRocketMQ run.
type mqBench struct {
	e  *mqEnv
	qs []protocol.MessageQueue
}

func (m *mqBench) source(b *testing.B) *srcmq.Source {
	stops := make(map[string]int64, len(m.qs))
	for _, q := range m.qs {
		stops[q.BrokerName+"/"+strconv.Itoa(int(q.QueueID))] = mqBenchRecords / mqBenchQueues
	}
	src, err := srcmq.New(m.e.c, mqBenchTopic, srcmq.WithStop(srcmq.StopAtOffsets(stops)), srcmq.WithOffsetReporting(false))
	if err != nil {
		b.Fatal(err)
	}
	return src
}

// runMQBench runs b.N jobs built by build, each over the whole preloaded
// topic (mqBenchRecords records), and reports records/s and the checkpoint
// figures.
func runMQBench(b *testing.B, m *mqBench, build func(job *pipeline.Job, src *srcmq.Source, seen *int64)) {
	b.Helper()
	benchJobs(b, "bench-mq", mqBenchRecords, func(job *pipeline.Job, seen *int64) { build(job, m.source(b), seen) })
}

// BenchmarkRocketMQ measures jobs reading a preloaded 4-queue topic
// (mqBenchRecords records) from the embedded broker in-process, end to end;
// one op is one job over the whole topic (records/s, and cpu-ns/record,
// which a shared machine disturbs less, are the figures to compare): a
// stateless Map, and a keyed count over 100k keys
// (a Value[int64] per key, 2 subtasks, checkpoint every second) to compare
// with it. The broker's store is warmed by one untimed read of the topic
// first, so that neither sub-benchmark pays for the preload's compactions.
func BenchmarkRocketMQ(b *testing.B) {
	m := &mqBench{e: startMQ(b)}
	m.qs = m.e.createTopic(b, mqBenchTopic, mqBenchQueues)
	m.e.preload(b, m.qs, mqBenchRecords/mqBenchQueues, func(q int, seq uint64) []byte {
		return strconv.AppendUint(nil, (uint64(q)+uint64(mqBenchQueues)*seq)%mqBenchKeys, 10)
	})
	parse := func(msg srcmq.Message) (uint64, error) { return strconv.ParseUint(string(msg.Body), 10, 64) }
	mapJob := func(job *pipeline.Job, src *srcmq.Source, seen *int64) {
		keys := pipeline.FromSourceDecoded(job, "input", src, parse)
		doubled := pipeline.Map(keys, "double", func(_ context.Context, k uint64) (uint64, error) { return 2 * k, nil })
		pipeline.To(doubled, "count", sink.NewFunc(func(context.Context, uint64) error { *seen++; return nil }, nil))
	}
	{ // warm-up: one untimed read of the whole topic
		job := pipeline.New("bench-mq-warm", pipeline.CheckpointDir(b.TempDir()))
		var seen int64
		mapJob(job, m.source(b), &seen)
		if err := job.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	keyedJob := func(job *pipeline.Job, src *srcmq.Source, seen *int64) {
		keys := pipeline.FromSourceDecoded(job, "input", src, parse)
		counts := pipeline.Process(pipeline.KeyBy(keys, func(k uint64) uint64 { return k }), "count",
			func() pipeline.KeyedProcessFunc[uint64, uint64, counted] { return &countFn{} })
		pipeline.To(counts, "sink", sink.NewFunc(func(context.Context, counted) error { *seen++; return nil }, nil))
	}
	b.Run("StatelessMap", func(b *testing.B) { runMQBench(b, m, mapJob) })
	b.Run("KeyedCount", func(b *testing.B) { runMQBench(b, m, keyedJob) })
	b.Run("Paired", func(b *testing.B) { runMQPaired(b, m, mapJob, keyedJob) })
}

// runMQPaired runs, per op, the stateless job and then the keyed one over
// the whole preloaded topic, and reports each one's records/s and CPU per
// record and their ratios (keyed ÷ stateless). -count repeats each
// sub-benchmark of BenchmarkRocketMQ in a row, all stateless runs before
// the keyed ones, so a machine whose speed drifts over the run (this
// virtual machine's does, by 10-20 % over a minute) skews the ratio of
// those two rows; taking turns within each op cannot.
func runMQPaired(b *testing.B, m *mqBench, stateless, keyed func(job *pipeline.Job, src *srcmq.Source, seen *int64)) {
	b.Helper()
	var took, cpu [2]time.Duration
	for range b.N {
		for i, build := range [2]func(*pipeline.Job, *srcmq.Source, *int64){stateless, keyed} {
			b.StopTimer()
			job := pipeline.New("bench-mq-paired", pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second),
				pipeline.DefaultParallelism(2))
			var seen int64
			build(job, m.source(b), &seen)
			b.StartTimer()
			start, cpu0 := time.Now(), cputime.Process()
			if err := job.Run(context.Background()); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
			cpu[i] += cputime.Process() - cpu0
			if seen != mqBenchRecords {
				b.Fatalf("sink saw %d records, want %d", seen, mqBenchRecords)
			}
		}
	}
	n := float64(b.N) * mqBenchRecords
	b.ReportMetric(n/took[0].Seconds(), "stateless-records/s")
	b.ReportMetric(n/took[1].Seconds(), "keyed-records/s")
	b.ReportMetric(float64(cpu[0].Nanoseconds())/n, "stateless-cpu-ns/record")
	b.ReportMetric(float64(cpu[1].Nanoseconds())/n, "keyed-cpu-ns/record")
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "keyed/stateless-records/s")
	b.ReportMetric(float64(cpu[0])/float64(cpu[1]), "keyed/stateless-cpu")
}
