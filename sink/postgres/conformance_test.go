package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/sink/sinktest"
)

// pgSystem is a conformance system over a table of its own (one text
// column, unique only with pk, so that copies show) on the test server.
func pgSystem(t *testing.T, pk bool, opts func(job string) []Option) sinktest.System[string] {
	dsn, c := testDB(t)
	table := uniq(t, "t")
	ddl := "CREATE TABLE " + table + " (k text NOT NULL)"
	if pk {
		ddl = "CREATE TABLE " + table + " (k text PRIMARY KEY)"
	}
	mustExec(t, c, ddl)
	job := uniq(t, "job")
	t.Cleanup(func() { _, _ = c.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	rollbackJob(t, c, job) // runs before the table is dropped
	m := Mapping[string]{Table: table, Columns: []string{"k"}, Row: func(dst []any, k string) ([]any, error) {
		return append(dst, k), nil
	}}
	return sinktest.System[string]{
		New: func(ctx context.Context) (sink.Sink[string], error) {
			return New(ctx, dsn, m, append([]Option{WithBatchSize(3)}, opts(job)...)...)
		},
		Record: func(k string) string { return k },
		Visible: func(ctx context.Context) ([]string, error) {
			rows, err := c.Query(ctx, "SELECT k FROM "+table)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[string])
		},
		Open: func(ctx context.Context) (int, error) {
			var n int
			err := c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE left(gid, length($1)) = $1", GIDPrefix(job, "out")).Scan(&n)
			return n, err
		},
	}
}

// TestPostgresConformance runs the PostgreSQL sink through the sinktest
// suites against the server of RUNNEL_TEST_POSTGRES_DSN: ExactlyOnce
// through the two-phase-commit checks (prepared transactions, recovery in
// pg_prepared_xacts), AtLeastOnce and Idempotent through the plain sink
// checks (their PreCommit is a Flush, so they make no exactly-once claim).
func TestPostgresConformance(t *testing.T) {
	testDB(t) // skips without a server
	t.Run("ExactlyOnce", func(t *testing.T) {
		sinktest.RunTwoPhaseCommit(t, sinktest.Features{}, func(t *testing.T) sinktest.System[string] {
			return pgSystem(t, false, func(job string) []Option { return []Option{WithExactlyOnce(job, "out", 0)} })
		})
	})
	t.Run("AtLeastOnce", func(t *testing.T) {
		sinktest.Run(t, sinktest.Features{}, func(t *testing.T) sinktest.System[string] {
			return pgSystem(t, false, func(string) []Option { return nil })
		})
	})
	t.Run("Idempotent", func(t *testing.T) {
		sinktest.Run(t, sinktest.Features{Idempotent: true}, func(t *testing.T) sinktest.System[string] {
			return pgSystem(t, true, func(string) []Option { return []Option{WithIdempotent("k")} })
		})
	})
}
