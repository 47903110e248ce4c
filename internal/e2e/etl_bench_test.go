package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/client"
)

// BenchmarkETL measures examples/etl's job over preloaded orders in this
// process, bounded at the input's end, exactly-once (half messages
// committed per checkpoint) against at-least-once (plain async sends), in
// the same run: records/s is the figure to compare (ns/op is one whole
// job run over the input; cpu-ns/record, the process's CPU time, broker
// included, per record, is steadier on a shared machine).
func BenchmarkETL(b *testing.B) {
	n := etlBenchRecords(b)
	e := startETLBenchEnv(b, n)
	for _, mode := range []string{"exactly-once", "at-least-once"} {
		b.Run("mode="+mode, func(b *testing.B) {
			b.ReportAllocs()
			var took, cpu time.Duration
			for i := range b.N {
				t, c := runETLBench(b, e, mode, i)
				took += t
				cpu += c
			}
			recs := float64(n) * float64(b.N)
			b.ReportMetric(recs/took.Seconds(), "records/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/recs, "cpu-ns/record")
		})
	}
}

// BenchmarkETLPaired runs BenchmarkETL's two jobs in turns within each
// iteration (exactly-once first in even iterations, at-least-once first in
// odd ones), so that the load of a shared machine, which drifts between
// consecutive runs, weighs on both alike: x-records/s is exactly-once's
// records/s over at-least-once's in the same run (the ratio) and
// x-cpu at-least-once's CPU per record over exactly-once's. Run it with an
// even -benchtime (2x: one pair in each order).
func BenchmarkETLPaired(b *testing.B) {
	n := etlBenchRecords(b)
	e := startETLBenchEnv(b, n)
	var took, cpu [2]time.Duration // [0] exactly-once, [1] at-least-once
	modes := [2]string{"exactly-once", "at-least-once"}
	b.ResetTimer()
	for i := range b.N {
		for k := range 2 {
			m := (i + k) % 2
			t, c := runETLBench(b, e, modes[m], i)
			took[m] += t
			cpu[m] += c
		}
	}
	recs := float64(n) * float64(b.N)
	eo, alo := recs/took[0].Seconds(), recs/took[1].Seconds()
	b.ReportMetric(eo, "eo-records/s")
	b.ReportMetric(alo, "alo-records/s")
	b.ReportMetric(float64(cpu[0].Nanoseconds())/recs, "eo-cpu-ns/record")
	b.ReportMetric(float64(cpu[1].Nanoseconds())/recs, "alo-cpu-ns/record")
	b.ReportMetric(eo/alo, "x-records/s")
	b.ReportMetric(cpu[1].Seconds()/cpu[0].Seconds(), "x-cpu")
}

// envETLRecords overrides the ETL benchmarks' input size. With the
// default 50k orders a run lasts about a second, so nearly all of
// exactly-once's END_TRANSACTIONs run after the final checkpoint, when no
// input is left to overlap them with; a larger input measures the steady
// state (each checkpoint's commits overlapping the next epoch's records).
const envETLRecords = "RUNNEL_BENCH_ETL_RECORDS"

// etlBenchRecords is the ETL benchmarks' input size.
func etlBenchRecords(b *testing.B) int {
	n := 50_000
	if testing.Short() {
		n = 10_000
	}
	return envInt(b, envETLRecords, n)
}

// runETLBench runs examples/etl's job once over e's input in mode
// (exactly-once or at-least-once) into new output topics, and returns its
// wall-clock and process CPU time (the topics' creation excluded).
func runETLBench(b *testing.B, e *etlEnv, mode string, i int) (took, cpu time.Duration) {
	b.Helper()
	group := fmt.Sprintf("bench_%s_%d_%d", mode[:1], i, time.Now().UnixNano())
	out, dlq := group+"_out", group+"_dlq"
	mq := &mqEnv{ns: e.ns, b: e.b, c: e.c}
	b.StopTimer()
	mq.createTopic(b, out, 4)
	mq.createTopic(b, dlq, 2)
	dir := filepath.Join(b.TempDir(), "job")
	b.StartTimer()
	start, cpu0 := time.Now(), cputime.Process()
	err := etl.Run(context.Background(), e.c, etl.Config{SingleProcess: true, In: etlIn, Out: out, DLQ: dlq, Group: group, StateDir: dir,
		CheckpointInterval: time.Second, Bounded: true, AtLeastOnce: mode == "at-least-once"})
	if err != nil {
		b.Fatal(err)
	}
	return time.Since(start), cputime.Process() - cpu0
}

func startETLBenchEnv(b *testing.B, n int) *etlEnv {
	b.Helper()
	mq := startMQ(b)
	e := &etlEnv{ns: mq.ns, b: mq.b, c: mq.c}
	mq.createTopic(b, etlIn, 4)
	e.samples = etl.SampleOrders(n, 1000, 100, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := preloadSamples(ctx, e, e.samples); err != nil {
		b.Fatal(err)
	}
	return e
}

// preloadSamples produces e's samples to the input topic.
func preloadSamples(ctx context.Context, e *etlEnv, samples []etl.Sample) error {
	p, err := client.NewProducer(e.c, "etl_e2e_input")
	if err != nil {
		return err
	}
	defer p.Close()
	return etl.Produce(ctx, e.c, p, etlIn, samples, nil)
}
