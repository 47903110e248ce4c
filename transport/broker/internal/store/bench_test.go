package store

import (
	"context"
	"fmt"
	"github.com/runnel-dev/runnel/internal/testutil/cputime"
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
