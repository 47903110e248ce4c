package postgres

import (
	"context"
	"testing"
	"time"
)

// BenchmarkPostgresSink writes rows into a real PostgreSQL table in each
// mode, with a checkpoint every 10k rows (PreCommit + Commit: prepared
// transaction and COMMIT PREPARED in exactly-once mode, a flush in the
// others). One op is one row. Compare with -col /mode.
func BenchmarkPostgresSink(b *testing.B) {
	for _, bc := range []struct {
		name string
		pk   bool
		opts func(job string) []Option
	}{
		{"mode=exactly-once", false, func(job string) []Option { return []Option{WithExactlyOnce(job, "bench", 0)} }},
		{"mode=idempotent", true, func(string) []Option { return []Option{WithIdempotent("id"), WithReplayCounter("replays")} }},
		{"mode=plain", false, func(string) []Option { return nil }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			dsn, c := testDB(b)
			table := newTable(b, c, bc.pk)
			job := uniq(b, "job")
			rollbackJob(b, c, job)
			s := newSink(b, dsn, recMapping(table), bc.opts(job)...)
			ctx := context.Background()
			if err := s.Recover(ctx, nil); err != nil {
				b.Fatal(err)
			}
			var id uint64
			checkpoint := func() {
				id++
				txn, err := s.PreCommit(ctx, id)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Commit(ctx, txn); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				if err := s.Write(ctx, rec{ID: int64(i), V: "benchmark row payload"}); err != nil {
					b.Fatal(err)
				}
				if i%10_000 == 9_999 {
					checkpoint()
				}
			}
			checkpoint()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
		})
	}
}
