package rocketmq

import (
	"context"
	"errors"
	"testing"

	"github.com/runnel-dev/runnel/source"
)

// BenchmarkReaderPoll reads a preloaded queue through one split reader
// (pull, prefetch buffer, record and offset building); one op = one record.
func BenchmarkReaderPoll(b *testing.B) {
	cl := newCluster(b)
	cl.createTopic("bench", 1)
	n := max(b.N, 1)
	cl.produce("bench", 0, bodies("record-body-", n)...)
	s, err := New(cl.c, "bench", WithStop(StopAtOffsets(map[string]int64{"broker-a/0": int64(n)})), WithOffsetReporting(false))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	r, err := s.Open(context.Background(), source.Split{ID: "broker-a/0"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	got := 0
	for {
		recs, err := r.Poll(context.Background(), 256)
		got += len(recs)
		if errors.Is(err, source.ErrEndOfSplit) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if got != n {
		b.Fatalf("read %d records, want %d", got, n)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
}
