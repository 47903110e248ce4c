package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/examples/postgres/pgorders"
	"github.com/runnel-dev/runnel/sink/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPostgresExample runs the example end to end in both modes (embedded
// broker, sample orders with invalid ones, bounded job, the real
// PostgreSQL) and checks the tables: one row per valid order with its
// values, one dead letter per invalid order with its raw body, no
// prepared transaction left behind.
func TestPostgresExample(t *testing.T) {
	dsn := os.Getenv(envDSN)
	if dsn == "" {
		t.Skipf("%s is not set: skipping the PostgreSQL example test (.ci/run sets it when PostgreSQL runs locally)", envDSN)
	}
	for _, mode := range []pgorders.Mode{pgorders.ExactlyOnce, pgorders.Idempotent} {
		t.Run(string(mode), func(t *testing.T) { testExample(t, dsn, mode) })
	}
}

func testExample(t *testing.T, dsn string, mode pgorders.Mode) {
	const n, invalidEvery, seed = 3000, 6, 11
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) }) // after the drops below (cleanups run last-in first-out)
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	table, job := "example_orders_"+suffix, "example-pg-"+suffix
	dlqTable := table + pgorders.DeadLetterSuffix
	t.Cleanup(func() {
		cctx := context.Background()
		for _, sql := range []string{"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + dlqTable} {
			if _, err := c.Exec(cctx, sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
		if mode == pgorders.ExactlyOnce {
			if _, err := c.Exec(cctx, "DELETE FROM runnel_commits WHERE job = $1", job); err != nil {
				t.Errorf("delete commit markers: %v", err)
			}
		}
	})

	var stdout, stderr bytes.Buffer
	args := []string{"-dsn", dsn, "-mode", string(mode), "-table", table, "-job", job, "-orders", fmt.Sprint(n),
		"-invalid-every", fmt.Sprint(invalidEvery), "-seed", fmt.Sprint(seed), "-checkpoint-interval", "50ms",
		"-state", t.TempDir()}
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "done in") {
		t.Fatalf("no summary on stdout: %q (stderr %q)", stdout.String(), stderr.String())
	}

	samples := pgorders.SampleOrders(n, invalidEvery, seed)
	valid := make(map[string]pgorders.Sample)
	invalid := make(map[string]int) // body → count
	for _, s := range samples {
		if s.Valid {
			valid[s.ID] = s
		} else {
			invalid[s.Body]++
		}
	}
	if len(valid) == 0 || len(invalid) == 0 {
		t.Fatalf("degenerate sample: %d valid, %d invalid", len(valid), len(invalid))
	}

	rows, err := c.Query(ctx, "SELECT id, customer, amount::float8, currency, ts, replays FROM "+table)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool, len(valid))
	var got, bad int
	for rows.Next() {
		var (
			id, cust, cur string
			amount        float64
			ts            time.Time
			replays       int
		)
		if err := rows.Scan(&id, &cust, &amount, &cur, &ts, &replays); err != nil {
			t.Fatal(err)
		}
		got++
		s, ok := valid[id]
		switch {
		case !ok:
			t.Errorf("row of unknown or invalid order %q", id)
			bad++
		case seen[id]:
			t.Errorf("order %s twice", id)
			bad++
		case cust != s.Customer || amount != s.Amount || cur != s.Currency || !ts.Equal(s.TS) || replays != 0:
			t.Errorf("order %s: row (%s, %v, %s, %v, replays %d), want (%s, %v, %s, %v, 0)", id, cust, amount, cur, ts,
				replays, s.Customer, s.Amount, s.Currency, s.TS)
			bad++
		}
		seen[id] = true
		if bad > 10 {
			t.FailNow()
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got != len(valid) || len(seen) != len(valid) {
		t.Fatalf("%d rows of %d distinct orders, want %d", got, len(seen), len(valid))
	}

	dl, err := c.Query(ctx, "SELECT raw, reason, operator FROM "+dlqTable)
	if err != nil {
		t.Fatal(err)
	}
	dead := make(map[string]int)
	var ndead int
	for dl.Next() {
		var (
			raw              []byte
			reason, operator string
		)
		if err := dl.Scan(&raw, &reason, &operator); err != nil {
			t.Fatal(err)
		}
		if reason == "" || operator != pgorders.UIDSource {
			t.Errorf("dead letter %q: reason %q, operator %q", raw, reason, operator)
		}
		dead[string(raw)]++
		ndead++
	}
	if err := dl.Err(); err != nil {
		t.Fatal(err)
	}
	for body, want := range invalid {
		if dead[body] != want {
			t.Errorf("invalid order %q: %d dead letters, want %d", body, dead[body], want)
		}
	}
	if ndead != n-len(valid) {
		t.Fatalf("%d dead letters, want %d", ndead, n-len(valid))
	}

	for _, uid := range []string{pgorders.UIDOut, pgorders.UIDDLQ} {
		var prepared int64
		prefix := postgres.GIDPrefix(job, uid)
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE left(gid, length($1)) = $1", prefix).Scan(&prepared); err != nil {
			t.Fatal(err)
		}
		if prepared != 0 {
			t.Fatalf("%d prepared transactions of %s left", prepared, uid)
		}
	}
	var committed int
	if _, err := fmt.Sscanf(stdout.String()[strings.Index(stdout.String(), "; ")+2:], "%d prepared transactions committed", &committed); err != nil {
		t.Fatalf("summary %q: %v", stdout.String(), err)
	}
	if mode == pgorders.ExactlyOnce && committed < 2 {
		t.Fatalf("%d prepared transactions committed, want several (one per checkpoint with rows, per sink)", committed)
	}
	if mode == pgorders.Idempotent && committed != 0 {
		t.Fatalf("%d prepared transactions committed in the idempotent mode", committed)
	}
	t.Logf("%s: %d orders, %d dead letters; %s", mode, got, ndead, strings.TrimSpace(stdout.String()))
}

// TestPostgresExampleNoDSN checks the example refuses to run without a DSN.
func TestPostgresExampleNoDSN(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-dsn", ""}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), envDSN) {
		t.Fatalf("err = %v, want one naming %s", err, envDSN)
	}
}

// TestPostgresExampleUnbounded runs the example unbounded (exactly once)
// until every order is in the tables, then cancels it as SIGINT would: run
// returns nil after its final checkpoint, with every order written once
// and nothing left prepared.
func TestPostgresExampleUnbounded(t *testing.T) {
	dsn := os.Getenv(envDSN)
	if dsn == "" {
		t.Skipf("%s is not set: skipping the PostgreSQL example test (.ci/run sets it when PostgreSQL runs locally)", envDSN)
	}
	const n, invalidEvery, seed = 500, 5, 3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	table, job := "example_orders_"+suffix, "example-pg-"+suffix
	t.Cleanup(func() {
		cctx := context.Background()
		for _, sql := range []string{"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + table + pgorders.DeadLetterSuffix} {
			if _, err := c.Exec(cctx, sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
		if _, err := c.Exec(cctx, "DELETE FROM runnel_commits WHERE job = $1", job); err != nil {
			t.Errorf("delete commit markers: %v", err)
		}
	})
	count := func(sql string) int {
		var k int
		if err := c.QueryRow(ctx, sql).Scan(&k); err != nil {
			return -1 // the tables may not exist yet
		}
		return k
	}
	valid := 0
	for _, s := range pgorders.SampleOrders(n, invalidEvery, seed) {
		if s.Valid {
			valid++
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"-dsn", dsn, "-table", table, "-job", job, "-orders", fmt.Sprint(n),
			"-invalid-every", fmt.Sprint(invalidEvery), "-seed", fmt.Sprint(seed), "-checkpoint-interval", "50ms",
			"-bounded=false", "-state", t.TempDir()}, &stdout, &stderr)
	}()
	for count("SELECT count(*) FROM "+table) < valid || count("SELECT count(*) FROM "+table+pgorders.DeadLetterSuffix) < n-valid {
		select {
		case err := <-done:
			t.Fatalf("unbounded run ended by itself: %v\nstderr:\n%s", err, stderr.String())
		case <-ctx.Done():
			t.Fatalf("orders never all written\nstderr:\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run after cancel: %v\nstderr:\n%s", err, stderr.String())
	}
	if got := count("SELECT count(DISTINCT id) FROM " + table + " HAVING count(*) = count(DISTINCT id)"); got != valid {
		t.Fatalf("%d distinct order rows (or duplicates), want %d", got, valid)
	}
	if got := count("SELECT count(*) FROM " + table + pgorders.DeadLetterSuffix); got != n-valid {
		t.Fatalf("%d dead letters, want %d", got, n-valid)
	}
	prefix := postgres.GIDPrefix(job, pgorders.UIDOut)
	var prepared int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE left(gid, length($1)) = $1", prefix).Scan(&prepared); err != nil || prepared != 0 {
		t.Fatalf("%d prepared transactions left (%v)", prepared, err)
	}
}
