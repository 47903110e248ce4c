package store

import (
	"context"
	"fmt"
	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchRecord returns a message whose record is exactly size bytes.
func benchRecord(topic string, queue int32, size int) PutMessage {
	rec, _ := makeRecord(topic, queue, nil, false)
	rec, pos := makeRecord(topic, queue, make([]byte, size-len(rec)), false)
	return PutMessage{Topic: topic, QueueID: queue, Record: rec, StoreTimestampPos: pos,
		Keys: []string{"0A00000500002A9F000000000000002A"}}
}

func BenchmarkPut(b *testing.B) {
	for _, mode := range []FlushMode{FlushSync, FlushAsync} {
		for _, conc := range []int{1, 64} {
			for _, size := range []int{128, 1024} {
				b.Run(fmt.Sprintf("%s/c%d/%dB", mode, conc, size), func(b *testing.B) {
					benchPut(b, mode, conc, size)
				})
			}
		}
	}
}

func benchPut(b *testing.B, mode FlushMode, conc, size int) {
	s, err := Open(b.TempDir(), Options{FlushMode: mode})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	b.SetBytes(int64(size))
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	start := time.Now()
	cpu0 := cputime.Process()
	b.ResetTimer()
	for w := range conc {
		wg.Go(func() {
			msgs := []PutMessage{benchRecord("bench", int32(w%8), size)}
			for left.Add(-1) >= 0 {
				if _, err := s.Put(context.Background(), msgs); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	el := time.Since(start)
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(b.N)/float64(max(1, s.Rounds())), "puts/round")
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/msg")
	if mode == FlushSync {
		b.ReportMetric(float64(b.N)/float64(max(1, s.Syncs())), "puts/fsync")
	}
}

func BenchmarkGet(b *testing.B) {
	s, err := Open(b.TempDir(), Options{FlushMode: FlushAsync})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const n = 20000
	batch := make([]PutMessage, 0, 1000)
	for i := range n {
		batch = append(batch, benchRecord("bench", 0, 1024))
		if len(batch) == cap(batch) || i == n-1 {
			if _, err := s.Put(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	b.ReportAllocs()
	var off int64
	var bytes int
	fn := func(rec []byte, _ int64) bool { bytes += len(rec); return true }
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		next, err := s.Get("bench", 0, off, 32, 256<<10, fn)
		if err != nil {
			b.Fatal(err)
		}
		off = next
		if off >= n {
			off = 0
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*32)/time.Since(start).Seconds(), "msgs/s")
}

func BenchmarkCommitOffset(b *testing.B) {
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	for i := range b.N {
		if err := s.CommitOffset("group", "topic", int32(i%8), int64(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPutTransaction models the store writes of one committed
// transaction of the ETL job's output (a 600-byte record, a KEYS value and
// a UNIQ_KEY): the half message's Put, then the final message's Put, one
// after the other (FlushAsync). keys=half-indexed is the key set the broker
// wrote before half messages went unindexed and commits were found by
// their UNIQ_KEY (half: KEYS + UNIQ_KEY; final: KEYS + UNIQ_KEY + commit
// key), keys=unindexed the set it writes now (half: none; final: KEYS +
// UNIQ_KEY).
func BenchmarkPutTransaction(b *testing.B) {
	for _, v := range []struct {
		name        string
		half, final int // index keys
	}{{"half-indexed", 2, 3}, {"unindexed", 0, 2}} {
		b.Run("keys="+v.name, func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{FlushMode: FlushAsync})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			half := []PutMessage{benchRecord("RMQ_SYS_TRANS_HALF_TOPIC", 0, 600)}
			final := []PutMessage{benchRecord("orders-enriched", 1, 600)}
			b.ReportAllocs()
			cpu0 := cputime.Process()
			b.ResetTimer()
			for i := range b.N {
				uniq := fmt.Sprintf("0A0000050000%020d", i)
				keys := [3]string{fmt.Sprintf("order-%d", i), uniq, "RMQ_TX_COMMIT " + fmt.Sprint(i)}
				half[0].Keys, final[0].Keys = keys[:v.half], keys[:v.final]
				if _, err := s.Put(context.Background(), half); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Put(context.Background(), final); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cputime.Process()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/tx")
		})
	}
}

// BenchmarkPutTransactionVolume is BenchmarkPutTransaction's unindexed key
// set at the volume of an ETL run: run it with a large -benchtime (e.g.
// 150000x, about 200 MB of records) so that cpu-us/tx includes Pebble's
// memtable flushes and compactions. Bodies are JSON orders with varying
// values (zero-filled bodies would make compression look free); final
// messages go to four queues, as the ETL job's output topic has; 64 calls
// are in flight, like the pipelined sends of a broker under load.
func BenchmarkPutTransactionVolume(b *testing.B) {
	s, err := Open(b.TempDir(), Options{FlushMode: FlushAsync})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const conc = 64
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	b.ReportAllocs()
	cpu0 := cputime.Process()
	b.ResetTimer()
	for w := range conc {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			var half, final [1]PutMessage
			var body []byte
			for {
				i := left.Add(-1)
				if i < 0 {
					return
				}
				body = fmt.Appendf(body[:0], `{"id":"order-%d","customer":"customer-%d","amount":%d.%02d,"currency":"EUR",`+
					`"ts":"2026-11-30T%02d:%02d:%02d.%03dZ","customerOrderCount":%d,"amountEUR":%d.%02d,`+
					`"src":{"topic":"orders","queue":%d,"offset":%d,"group":"etl-%x"},"note":"`,
					i, rnd.IntN(1000), rnd.IntN(10000), rnd.IntN(100), rnd.IntN(24), rnd.IntN(60), rnd.IntN(60),
					rnd.IntN(1000), rnd.IntN(500), rnd.IntN(10000), rnd.IntN(100), rnd.IntN(4), rnd.Int64N(1<<40), rnd.Uint64())
				for len(body) < 598 {
					body = append(body, "abcdefghijklmnopqrstuvwxyz "[rnd.IntN(27)])
				}
				body = append(body, '"', '}')
				rec, pos := makeRecord("RMQ_SYS_TRANS_HALF_TOPIC", 0, body, false)
				half[0] = PutMessage{Topic: "RMQ_SYS_TRANS_HALF_TOPIC", Record: rec, StoreTimestampPos: pos}
				rec, pos = makeRecord("orders-enriched", int32(w%4), body, false)
				final[0] = PutMessage{Topic: "orders-enriched", QueueID: int32(w % 4), Record: rec, StoreTimestampPos: pos,
					Keys: []string{fmt.Sprintf("order-%d", i), fmt.Sprintf("0A0000050000%020d", i)}}
				if _, err := s.Put(context.Background(), half[:]); err != nil {
					b.Error(err)
					return
				}
				if _, err := s.Put(context.Background(), final[:]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/tx")
}
