package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/source"
)

const envDSN = "RUNNEL_TEST_POSTGRES_DSN"

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testDB returns the test server's DSN and a connection for checks, or
// skips the test when RUNNEL_TEST_POSTGRES_DSN is unset.
func testDB(t testing.TB) (string, *pgx.Conn) {
	t.Helper()
	dsn := os.Getenv(envDSN)
	if dsn == "" {
		t.Skipf("%s is not set: skipping the PostgreSQL test (.ci/run sets it when PostgreSQL runs locally)", envDSN)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to %s: %v", envDSN, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return dsn, c
}

// uniq returns a lower-case name unique to this test run.
func uniq(t testing.TB, what string) string {
	name := strings.ToLower(t.Name())
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name)
	if len(name) > 30 {
		name = name[len(name)-30:]
	}
	return fmt.Sprintf("pgt_%s_%s_%x", what, name, rand.Uint32())
}

func mustExec(t testing.TB, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryInt(t testing.TB, c *pgx.Conn, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := c.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// newTable creates a table (id bigint, v text [, replays]) dropped at the
// end of the test; pk adds a primary key on id.
func newTable(t testing.TB, c *pgx.Conn, pk bool) string {
	t.Helper()
	name := uniq(t, "t")
	ddl := "CREATE TABLE " + name + " (id bigint NOT NULL, v text, replays integer NOT NULL DEFAULT 0)"
	if pk {
		ddl = "CREATE TABLE " + name + " (id bigint PRIMARY KEY, v text, replays integer NOT NULL DEFAULT 0)"
	}
	mustExec(t, c, ddl)
	t.Cleanup(func() { _, _ = c.Exec(context.Background(), "DROP TABLE IF EXISTS "+name) })
	return name
}

// rollbackJob rolls back the prepared transactions of job at the end of the
// test (a failed test must not leave locks and slots behind).
func rollbackJob(t testing.TB, c *pgx.Conn, job string) {
	t.Cleanup(func() {
		ctx := context.Background()
		rows, err := c.Query(ctx, "SELECT gid FROM pg_prepared_xacts WHERE left(gid, length($1)) = $1", "runnel:"+escapeGID(job)+":")
		if err != nil {
			return
		}
		gids, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, g := range gids {
			_, _ = c.Exec(ctx, "ROLLBACK PREPARED "+quoteLiteral(g))
		}
		_, _ = c.Exec(ctx, "DELETE FROM runnel_commits WHERE job = $1", job)
	})
}

func preparedOf(t testing.TB, c *pgx.Conn, job string) int64 {
	return queryInt(t, c, "SELECT count(*) FROM pg_prepared_xacts WHERE left(gid, length($1)) = $1", "runnel:"+escapeGID(job)+":")
}

type rec struct {
	ID int64
	V  string
}

func recMapping(table string) Mapping[rec] {
	return Mapping[rec]{Table: table, Columns: []string{"id", "v"}, Row: func(dst []any, r rec) ([]any, error) {
		return append(dst, r.ID, r.V), nil
	}}
}

func newSink(t testing.TB, dsn string, m Mapping[rec], opts ...Option) *Sink[rec] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := New(ctx, dsn, m, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func writeN(t testing.TB, s *Sink[rec], from, to int64) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := s.Write(context.Background(), rec{ID: i, V: fmt.Sprint("v", i)}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPostgresAtLeastOnce(t *testing.T) {
	dsn, c := testDB(t)
	table := newTable(t, c, false)
	s := newSink(t, dsn, recMapping(table), WithBatchSize(1000))
	writeN(t, s, 0, 2500)
	if n := queryInt(t, c, "SELECT count(*) FROM "+table); n != 2000 {
		t.Fatalf("before Flush: %d rows visible, want the 2 full batches (2000)", n)
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM "+table); n != 2500 {
		t.Fatalf("%d rows, want 2500", n)
	}
	if st := s.Stats(); st.Rows != 2500 || st.Batches != 3 {
		t.Fatalf("stats %+v", st)
	}
	// The runtime drives every mode through PreCommit: here it flushes.
	writeN(t, s, 2500, 2600)
	txn, err := s.PreCommit(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM "+table); n != 2600 {
		t.Fatalf("%d rows after PreCommit, want 2600", n)
	}
	if err := s.Recover(context.Background(), [][]byte{txn}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background(), txn); err != nil {
		t.Fatal(err)
	}
}

func TestPostgresIdempotentReplays(t *testing.T) {
	dsn, c := testDB(t)
	table := newTable(t, c, true)
	s := newSink(t, dsn, recMapping(table), WithIdempotent("id"), WithReplayCounter("replays"), WithBatchSize(400))
	writeN(t, s, 0, 1000)
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A replay of 300 records, with a duplicate inside one batch (the
	// batch keeps its last row).
	writeN(t, s, 0, 300)
	if err := s.Write(context.Background(), rec{ID: 299, V: "last"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM "+table); n != 1000 {
		t.Fatalf("%d rows, want 1000", n)
	}
	if n := queryInt(t, c, "SELECT sum(replays) FROM "+table); n != 300 {
		t.Fatalf("replay counter %d, want 300", n)
	}
	var v string
	if err := c.QueryRow(context.Background(), "SELECT v FROM "+table+" WHERE id = 299").Scan(&v); err != nil || v != "last" {
		t.Fatalf("row 299: %q, %v; want the last write", v, err)
	}
}

func exactlyOnce(job string) Option { return WithExactlyOnce(job, "pg-out", 0) }

func TestPostgresExactlyOnceCommit(t *testing.T) {
	dsn, c := testDB(t)
	table := newTable(t, c, false)
	job := uniq(t, "job")
	rollbackJob(t, c, job)
	s := newSink(t, dsn, recMapping(table), exactlyOnce(job), WithBatchSize(100))
	ctx := context.Background()
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	writeN(t, s, 0, 250)
	txn, err := s.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM "+table); n != 0 {
		t.Fatalf("%d rows visible before Commit", n)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", GID(job, "pg-out", 0, 1)); n != 1 {
		t.Fatalf("prepared transaction %s not found", GID(job, "pg-out", 0, 1))
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, txn); err != nil { // idempotent: the marker proves the commit
		t.Fatalf("second commit: %v", err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM "+table); n != 250 {
		t.Fatalf("%d rows after Commit, want 250", n)
	}
	// An epoch without rows prepares nothing; its Commit deletes the
	// markers of earlier checkpoints.
	empty, err := s.PreCommit(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, gid, _ := decodeTxn(empty); gid != "" {
		t.Fatalf("empty epoch prepared %q", gid)
	}
	if err := s.Commit(ctx, empty); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM runnel_commits WHERE job = $1", job); n != 0 {
		t.Fatalf("%d commit markers left after a later checkpoint completed", n)
	}
	if st := s.Stats(); st.Prepared != 1 || st.Committed != 1 || st.Rows != 250 {
		t.Fatalf("stats %+v", st)
	}
}

// TestPostgresExactlyOnceRecovery: a crashed run left two prepared
// transactions and an open one; the latest checkpoint lists only the first.
// Recovery commits it and rolls back the other; the lost one is reported.
func TestPostgresExactlyOnceRecovery(t *testing.T) {
	dsn, c := testDB(t)
	table := newTable(t, c, false)
	job := uniq(t, "job")
	rollbackJob(t, c, job)
	ctx := context.Background()
	a := newSink(t, dsn, recMapping(table), exactlyOnce(job))
	if err := a.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	writeN(t, a, 0, 100)
	txn1, err := a.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	writeN(t, a, 100, 200)
	txn2, err := a.PreCommit(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	writeN(t, a, 200, 300)
	if err := a.Flush(ctx); err != nil { // into the open epoch transaction
		t.Fatal(err)
	}
	if err := a.Close(); err != nil { // the crash: nothing committed
		t.Fatal(err)
	}
	if n := preparedOf(t, c, job); n != 2 {
		t.Fatalf("%d prepared transactions after the crash, want 2", n)
	}
	b := newSink(t, dsn, recMapping(table), exactlyOnce(job))
	if err := b.Recover(ctx, [][]byte{txn1}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(ctx, txn1); err != nil { // what the runtime does next
		t.Fatal(err)
	}
	if n := preparedOf(t, c, job); n != 0 {
		t.Fatalf("%d prepared transactions left after recovery", n)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM "+table); n != 100 {
		t.Fatalf("%d rows after recovery, want the 100 of checkpoint 1", n)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM "+table+" WHERE id >= 100"); n != 0 {
		t.Fatalf("%d rows of uncheckpointed epochs visible", n)
	}
	if st := b.Stats(); st.Committed != 1 || st.RolledBack != 1 {
		t.Fatalf("stats %+v, want 1 committed and 1 rolled back", st)
	}
	if err := b.Commit(ctx, txn2); !errors.Is(err, ErrTransactionLost) {
		t.Fatalf("commit of the rolled back transaction: %v, want ErrTransactionLost", err)
	}
	// The new run's checkpoint 2 reuses the gid of the rolled back one.
	writeN(t, b, 100, 300)
	txn2b, err := b.PreCommit(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(ctx, txn2b); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(DISTINCT id) FROM "+table+" HAVING count(*) = count(DISTINCT id)"); n != 300 {
		t.Fatalf("%d distinct rows (or duplicates), want 300 exactly once", n)
	}
}

func TestPostgresAbort(t *testing.T) {
	dsn, c := testDB(t)
	table := newTable(t, c, false)
	job := uniq(t, "job")
	rollbackJob(t, c, job)
	ctx := context.Background()
	s := newSink(t, dsn, recMapping(table), exactlyOnce(job))
	writeN(t, s, 0, 10) // recovers by itself: no Recover call
	txn, err := s.PreCommit(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := s.Abort(ctx, txn); err != nil {
			t.Fatal(err)
		}
	}
	if n := preparedOf(t, c, job) + queryInt(t, c, "SELECT count(*) FROM "+table); n != 0 {
		t.Fatal("aborted transaction left rows or a prepared transaction")
	}
	writeN(t, s, 0, 10)
	txn, err = s.PreCommit(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	if err := s.Abort(ctx, txn); err == nil || !strings.Contains(err.Error(), "already committed") {
		t.Fatalf("abort of a committed transaction: %v", err)
	}
}

// terminate kills the server backends of application name app that are in
// a transaction (the sink's data connection).
func terminate(t testing.TB, c *pgx.Conn, app string) int64 {
	return queryInt(t, c, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND xact_start IS NOT NULL AND pid <> pg_backend_pid()", app)
}

func withApp(dsn, app string) string {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "application_name=" + app
}

// TestPostgresExactlyOnceConnectionLoss kills the data connection in the
// middle of an epoch: the sink reconnects, replays the epoch's rows into a
// new transaction, and the epoch commits exactly once.
func TestPostgresExactlyOnceConnectionLoss(t *testing.T) {
	dsn, c := testDB(t)
	table := newTable(t, c, false)
	job := uniq(t, "job")
	app := uniq(t, "app")
	rollbackJob(t, c, job)
	ctx := context.Background()
	s := newSink(t, withApp(dsn, app), recMapping(table), exactlyOnce(job), WithBatchSize(100), WithRetry(10, time.Millisecond, 50*time.Millisecond))
	writeN(t, s, 0, 250) // 2 batches in the open transaction
	if n := terminate(t, c, app); n != 1 {
		t.Fatalf("terminated %d backends, want the data connection", n)
	}
	writeN(t, s, 250, 400)
	txn, err := s.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(DISTINCT id) FROM "+table+" HAVING count(*) = count(DISTINCT id)"); n != 400 {
		t.Fatalf("%d distinct rows (or duplicates), want 400", n)
	}
	if st := s.Stats(); st.Replayed != 200 || st.Retries == 0 {
		t.Fatalf("stats %+v: want the 200 sent rows replayed after a retry", st)
	}
}

// TestPostgresConnectionLossAtLeastOnce: the plain mode resends the batch.
func TestPostgresConnectionLossAtLeastOnce(t *testing.T) {
	dsn, c := testDB(t)
	table := newTable(t, c, true)
	app := uniq(t, "app")
	s := newSink(t, withApp(dsn, app), recMapping(table), WithIdempotent("id"), WithBatchSize(100), WithRetry(10, time.Millisecond, 50*time.Millisecond))
	writeN(t, s, 0, 150)
	mustExec(t, c, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app)
	writeN(t, s, 150, 300)
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM "+table); n != 300 {
		t.Fatalf("%d rows, want 300", n)
	}
	if s.Stats().Retries == 0 {
		t.Fatal("no retry after the connection was killed")
	}
}

// flakyStatement creates a function failing with SQLSTATE code on its
// first fails calls (counted by a sequence, which no rollback undoes), and
// returns a statement inserting through it.
func flakyStatement(t testing.TB, c *pgx.Conn, table, code string, fails int) string {
	fn := uniq(t, "fn")
	seq := fn + "_seq"
	mustExec(t, c, "CREATE SEQUENCE "+seq)
	mustExec(t, c, fmt.Sprintf(`CREATE FUNCTION %s(i bigint, v text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF nextval('%s') <= %d THEN
		RAISE EXCEPTION 'injected failure' USING ERRCODE = '%s';
	END IF;
	INSERT INTO %s (id, v) VALUES (i, v);
END $$`, fn, seq, fails, code, table))
	t.Cleanup(func() {
		_, _ = c.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+fn+"(bigint, text)")
		_, _ = c.Exec(context.Background(), "DROP SEQUENCE IF EXISTS "+seq)
	})
	return "SELECT " + fn + "($1, $2)"
}

// TestPostgresSerializationAndDeadlockRetried: real 40001 and 40P01 errors
// from the server roll back the epoch transaction; the sink replays it.
func TestPostgresSerializationAndDeadlockRetried(t *testing.T) {
	for _, code := range []string{"40001", "40P01"} {
		t.Run(code, func(t *testing.T) {
			dsn, c := testDB(t)
			table := newTable(t, c, false)
			job := uniq(t, "job")
			rollbackJob(t, c, job)
			stmt := flakyStatement(t, c, table, code, 2)
			ctx := context.Background()
			s := newSink(t, dsn, recMapping(table), exactlyOnce(job), WithStatement(stmt), WithBatchSize(50),
				WithRetry(5, time.Millisecond, 10*time.Millisecond))
			writeN(t, s, 0, 120)
			txn, err := s.PreCommit(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(ctx, txn); err != nil {
				t.Fatal(err)
			}
			if n := queryInt(t, c, "SELECT count(DISTINCT id) FROM "+table+" HAVING count(*) = count(DISTINCT id)"); n != 120 {
				t.Fatalf("%d distinct rows (or duplicates), want 120", n)
			}
			if s.Stats().Retries < 2 {
				t.Fatalf("stats %+v: want 2 retries", s.Stats())
			}
		})
	}
}

// TestPostgresPersistentFailure: a failure outlasting the retries, and a
// non-transient one, are returned and keep the rows for the next attempt.
func TestPostgresPersistentFailure(t *testing.T) {
	dsn, c := testDB(t)
	table := newTable(t, c, false)
	stmt := flakyStatement(t, c, table, "40001", 1_000_000)
	s := newSink(t, dsn, recMapping(table), WithStatement(stmt), WithBatchSize(10), WithRetry(3, time.Millisecond, time.Millisecond))
	writeN(t, s, 0, 5)
	err := s.Flush(context.Background())
	if err == nil || pgCode(err) != "40001" {
		t.Fatalf("flush: %v, want the serialization failure after the retries", err)
	}
	if st := s.Stats(); st.Retries != 2 || st.Rows != 0 {
		t.Fatalf("stats %+v, want 3 attempts and no rows", st)
	}
	if len(s.buf) != 5 {
		t.Fatalf("%d rows kept for the next flush, want 5", len(s.buf))
	}

	bad := newSink(t, dsn, Mapping[rec]{Table: table, Columns: []string{"id", "nope"}, Row: recMapping(table).Row})
	writeN(t, bad, 0, 1)
	if err := bad.Flush(context.Background()); err == nil || Retryable(err) || bad.Stats().Retries != 0 {
		t.Fatalf("unknown column: %v (retries %d), want a permanent error", err, bad.Stats().Retries)
	}
}

func TestPostgresPreparedDisabledError(t *testing.T) {
	err := checkPreparedSetting("0")
	if !errors.Is(err, ErrPreparedDisabled) || !strings.Contains(err.Error(), "ALTER SYSTEM SET max_prepared_transactions = 64") ||
		!strings.Contains(err.Error(), "restart") {
		t.Fatalf("error %q does not say how to enable prepared transactions", err)
	}
	if err := checkPreparedSetting("64"); err != nil {
		t.Fatal(err)
	}
	if err := checkPreparedSetting("x"); err == nil {
		t.Fatal("garbage setting accepted")
	}
	// Against the server: New agrees with its setting.
	dsn, c := testDB(t)
	var setting string
	if err := c.QueryRow(context.Background(), "SHOW max_prepared_transactions").Scan(&setting); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := New(ctx, dsn, recMapping("unused"), exactlyOnce(uniq(t, "job")))
	if setting == "0" {
		if !errors.Is(err, ErrPreparedDisabled) {
			t.Fatalf("server has max_prepared_transactions = 0, New: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if _, err := New(ctx, dsn, recMapping("unused"), WithIdempotent("id")); err != nil {
		t.Fatal(err)
	}
}

func TestPostgresConfigValidation(t *testing.T) {
	ctx := context.Background()
	m := recMapping("t")
	for name, tc := range map[string]struct {
		m    Mapping[rec]
		opts []Option
		want string
	}{
		"no table":        {Mapping[rec]{Columns: m.Columns, Row: m.Row}, nil, "Table"},
		"no row":          {Mapping[rec]{Table: "t", Columns: m.Columns}, nil, "Row"},
		"idempotent":      {m, []Option{WithIdempotent()}, "conflict columns"},
		"conflict column": {m, []Option{WithIdempotent("nope")}, "not in Mapping.Columns"},
		"replay":          {m, []Option{WithReplayCounter("replays")}, "replay counter"},
		"statement":       {m, []Option{WithStatement("SELECT 1"), WithIdempotent("id")}, "WithStatement"},
		"exactly-once":    {m, []Option{WithExactlyOnce("", "u", 0)}, "job name"},
		"long gid":        {m, []Option{WithExactlyOnce(strings.Repeat("j", 100), strings.Repeat("u", 90), 0)}, "too long"},
		"batch":           {m, []Option{WithBatchSize(0)}, "positive"},
		"dsn":             {m, nil, "dsn"},
	} {
		dsn := "postgres://127.0.0.1:1/x"
		if name == "dsn" {
			dsn = "://bad"
		}
		_, err := New(ctx, dsn, tc.m, tc.opts...)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidConfig about %q", name, err, tc.want)
		}
	}
}

func TestPostgresTxnEncoding(t *testing.T) {
	for _, tc := range []struct {
		id  uint64
		gid string
	}{{0, ""}, {1, "runnel:j:u:0:1"}, {1<<64 - 1, strings.Repeat("g", maxGIDLen)}} {
		id, gid, err := decodeTxn(encodeTxn(tc.id, tc.gid))
		if err != nil || id != tc.id || gid != tc.gid {
			t.Fatalf("round trip of (%d, %q): (%d, %q, %v)", tc.id, tc.gid, id, gid, err)
		}
	}
	for _, b := range [][]byte{nil, {2}, {1}, {1, 5}, {1, 5, 3, 'a'}, append([]byte{1, 1, 201, 1}, make([]byte, 201)...)} {
		if _, _, err := decodeTxn(b); !errors.Is(err, ErrBadTransaction) {
			t.Fatalf("decode %v: %v", b, err)
		}
	}
	if g := GID("my job", "out:1", 2, 9); g != "runnel:my%20job:out%3A1:2:9" {
		t.Fatalf("gid %q", g)
	}
}

func FuzzDecodeTxn(f *testing.F) {
	f.Add(encodeTxn(3, "runnel:a:b:0:3"))
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, gid, err := decodeTxn(b)
		if err != nil {
			return
		}
		if len(gid) > maxGIDLen {
			t.Fatalf("gid of %d bytes accepted", len(gid))
		}
		if id2, gid2, err := decodeTxn(encodeTxn(id, gid)); err != nil || id2 != id || gid2 != gid {
			t.Fatal("re-encoding changed the transaction")
		}
	})
}

// TestPostgresPipelineExactlyOnce runs a job through the exactly-once sink:
// every record is in the table once, and nothing is left prepared.
func TestPostgresPipelineExactlyOnce(t *testing.T) {
	dsn, c := testDB(t)
	table := newTable(t, c, false)
	jobName := uniq(t, "job")
	rollbackJob(t, c, jobName)
	in := make([]rec, 20_000)
	for i := range in {
		in[i] = rec{ID: int64(i), V: "x"}
	}
	s := newSink(t, dsn, recMapping(table), WithExactlyOnce(jobName, "pg", 0), WithBatchSize(500))
	job := pipeline.New(jobName, pipeline.CheckpointDir(t.TempDir()), pipeline.CheckpointInterval(20*time.Millisecond))
	pipeline.To(pipeline.FromSource(job, "in", source.NewSlice(in, 3)), "pg", s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := job.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(DISTINCT id) FROM "+table+" HAVING count(*) = count(DISTINCT id)"); n != int64(len(in)) {
		t.Fatalf("%d distinct rows (or duplicates), want %d", n, len(in))
	}
	if n := preparedOf(t, c, jobName); n != 0 {
		t.Fatalf("%d prepared transactions left", n)
	}
	t.Logf("stats %+v", s.Stats())
}
