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
	n := 50_000
	if testing.Short() {
		n = 10_000
	}
	e := startETLBenchEnv(b, n)
	for _, mode := range []string{"exactly-once", "at-least-once"} {
		b.Run("mode="+mode, func(b *testing.B) {
			b.ReportAllocs()
			var recs float64
			var took, cpu time.Duration
			for i := range b.N {
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
				took += time.Since(start)
				cpu += cputime.Process() - cpu0
				recs += float64(n)
			}
			b.ReportMetric(recs/took.Seconds(), "records/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/recs, "cpu-ns/record")
		})
	}
}

func startETLBenchEnv(b *testing.B, n int) *etlEnv {
	b.Helper()
	mq := startMQ(b)
	e := &etlEnv{ns: mq.ns, b: mq.b, c: mq.c}
	mq.createTopic(b, etlIn, 4)
	e.samples = etl.SampleOrders(n, 1000, 100, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := preloadSamples(ctx, e); err != nil {
		b.Fatal(err)
	}
	return e
}

// preloadSamples produces e's samples to the input topic.
func preloadSamples(ctx context.Context, e *etlEnv) error {
	p, err := client.NewProducer(e.c, "etl_e2e_input")
	if err != nil {
		return err
	}
	defer p.Close()
	return etl.Produce(ctx, e.c, p, etlIn, e.samples, nil)
}
