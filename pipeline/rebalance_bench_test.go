package pipeline_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// cpuRecords is one op of BenchmarkRebalanceCPU; cpuRounds the SHA-256
// rounds per record (about 20-30 µs of CPU).
const (
	cpuRecords = 200_000
	cpuRounds  = 100
)

// burn is the CPU-bound map: cpuRounds chained SHA-256 of the record.
func burn(_ context.Context, v uint64) (uint64, error) {
	var s [32]byte
	binary.BigEndian.PutUint64(s[:], v)
	for range cpuRounds {
		s = sha256.Sum256(s[:])
	}
	return binary.BigEndian.Uint64(s[:]), nil
}

// BenchmarkRebalanceCPU: a CPU-bound Map after a one-split source, to a
// counting sink; one op is one job over 200,000 records.
//
//   - job=chained: the Map runs in the source's task (one core);
//   - job=rebalance: Rebalance to GOMAXPROCS subtasks before the Map;
//   - job=bare: no job, the same records burned by GOMAXPROCS goroutines:
//     the speedup the machine offers at that moment (on a shared machine,
//     less than its core count).
//
// The records/s ratio rebalance/chained is what Rebalance gains (the
// target is 1.7 on 2 cores), bare/chained what it could; cpu-ns/record
// shows what it costs.
func BenchmarkRebalanceCPU(b *testing.B) {
	for _, kind := range []string{"chained", "rebalance", "bare"} {
		b.Run("job="+kind, func(b *testing.B) {
			var took, cpu time.Duration
			for range b.N {
				if kind == "bare" {
					start, cpu0 := time.Now(), cputime.Process()
					burnParallel(runtime.GOMAXPROCS(0))
					took += time.Since(start)
					cpu += cputime.Process() - cpu0
					continue
				}
				b.StopTimer()
				var seen atomic.Int64
				job := pipeline.New("bench-rebalance", pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second))
				src := pipeline.FromSource(job, "gen", source.NewGenerator(1, cpuRecords, func(_ int, seq uint64) uint64 { return seq }))
				if kind == "rebalance" {
					src = pipeline.Rebalance(src)
				}
				out := pipeline.Map(src, "burn", burn)
				pipeline.To(out, "count", sink.NewFunc(func(context.Context, uint64) error { seen.Add(1); return nil }, nil))
				b.StartTimer()
				start, cpu0 := time.Now(), cputime.Process()
				if err := job.Run(context.Background()); err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
				cpu += cputime.Process() - cpu0
				if n := seen.Load(); n != cpuRecords {
					b.Fatalf("%d records, want %d", n, cpuRecords)
				}
			}
			n := float64(b.N) * cpuRecords
			b.ReportMetric(n/took.Seconds(), "records/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/record")
		})
	}
}

// burnParallel burns cpuRecords records on par goroutines.
func burnParallel(par int) {
	var wg sync.WaitGroup
	for g := range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := uint64(g); v < cpuRecords; v += uint64(par) {
				_, _ = burn(context.Background(), v)
			}
		}()
	}
	wg.Wait()
}
