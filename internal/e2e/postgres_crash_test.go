package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink/postgres"
	"github.com/runnel-dev/runnel/source"
)

// The PostgreSQL crash tests re-execute this test binary as the job process
// too; init dispatches before TestMain so crash_test.go's TestMain is left
// as it is.
const (
	envPGChild = "RUNNEL_E2E_PG_CHILD" // mode: exactly-once, control, idempotent
	envPGDSN   = "RUNNEL_TEST_POSTGRES_DSN"
	envPGTable = "RUNNEL_E2E_PG_TABLE"
	envPGJob   = "RUNNEL_E2E_PG_JOB"

	pgSplits   = 4
	pgPerSplit = 25_000 // 100k records
	pgSinkUID  = "pg"
)

func init() {
	if mode := os.Getenv(envPGChild); mode != "" {
		os.Exit(pgCrashChild(mode))
	}
}

type pgRecord struct {
	Split int
	Seq   uint64
}

// pgCrashChild runs the generator job into the PostgreSQL sink until it
// finishes (exit 0) or is killed.
func pgCrashChild(mode string) int {
	dsn, table, jobName, dir := os.Getenv(envPGDSN), os.Getenv(envPGTable), os.Getenv(envPGJob), os.Getenv(envDir)
	ctx := context.Background()
	m := postgres.Mapping[pgRecord]{Table: table, Columns: []string{"id", "split", "seq"},
		Row: func(dst []any, r pgRecord) ([]any, error) {
			return append(dst, int64(r.Split)*pgPerSplit+int64(r.Seq), int32(r.Split), int64(r.Seq)), nil
		}}
	var opts []postgres.Option
	switch mode {
	case "exactly-once":
		// The delays widen the PREPARE .. COMMIT PREPARED window the parent
		// aims some kills at.
		opts = append(opts, postgres.WithExactlyOnce(jobName, pgSinkUID, 0))
		opts = append(opts, pgFaults(failpoint.Postgres{PrepareDelay: 15 * time.Millisecond, CommitDelay: 15 * time.Millisecond})...)
	case "control":
		opts = append(opts, postgres.WithExactlyOnce(jobName, pgSinkUID, 0))
		opts = append(opts, pgFaults(failpoint.Postgres{CommitEarly: true, PrepareDelay: 30 * time.Millisecond})...)
	case "idempotent":
		opts = append(opts, postgres.WithIdempotent("id"), postgres.WithReplayCounter("replays"), postgres.WithBatchSize(200))
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", mode)
		return 2
	}
	s, err := postgres.New(ctx, dsn, m, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sink:", err)
		return 2
	}
	job := pipeline.New(jobName, pipeline.CheckpointDir(filepath.Join(dir, "job")), pipeline.CheckpointInterval(100*time.Millisecond))
	gen := source.NewGenerator(pgSplits, pgPerSplit, func(split int, seq uint64) pgRecord {
		if seq%6 == 5 {
			time.Sleep(time.Millisecond) // throttle: about 4 s per full run
		}
		return pgRecord{Split: split, Seq: seq}
	})
	pipeline.To(pipeline.FromSource(job, "gen", gen), pgSinkUID, s)
	if err := job.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "job:", err)
		return 1
	}
	return 0
}

type pgCrashResult struct {
	rows, distinct, inRange, replays, prepared int64
	killsWithPrepared                          int
}

// runPGCrashLoop kills the child kills times, then lets it finish, and
// reads the table. Odd kills hunt: they wait until a transaction of the job
// is prepared (or, in the control mode, committed early) and kill at once.
func runPGCrashLoop(t *testing.T, mode string, kills int) pgCrashResult {
	t.Helper()
	if mode == "control" {
		requireFailpoints(t)
	}
	dsn := os.Getenv(envPGDSN)
	if dsn == "" {
		t.Skipf("%s is not set: skipping the PostgreSQL crash test (.ci/run sets it when PostgreSQL runs locally)", envPGDSN)
	}
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	suffix := fmt.Sprintf("%x", rand.Uint32())
	table := "e2e_pg_" + suffix
	jobName := "e2e-pg-" + mode + "-" + suffix
	prefix := postgres.GIDPrefix(jobName, pgSinkUID)
	exec1 := func(sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	q := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := c.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	key := ""
	if mode == "idempotent" {
		key = " PRIMARY KEY"
	}
	exec1("CREATE TABLE " + table + " (id bigint NOT NULL" + key + ", split integer NOT NULL, seq bigint NOT NULL, replays integer NOT NULL DEFAULT 0)")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept table %s and job %s for inspection", table, jobName)
			return
		}
		cctx := context.Background()
		cc, err := pgx.Connect(cctx, dsn)
		if err != nil {
			return
		}
		defer cc.Close(cctx)
		_, _ = cc.Exec(cctx, "DROP TABLE IF EXISTS "+table)
		_, _ = cc.Exec(cctx, "DELETE FROM runnel_commits WHERE job = $1", jobName)
	})
	prepared := func() int64 {
		return q("SELECT count(*) FROM pg_prepared_xacts WHERE left(gid, length($1)) = $1", prefix)
	}
	committedMax := func() int64 {
		return q("SELECT coalesce(max(checkpoint), 0) FROM runnel_commits WHERE job = $1", jobName)
	}
	dir := t.TempDir()
	start := func() (*exec.Cmd, chan error) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envPGChild+"="+mode, envPGTable+"="+table, envPGJob+"="+jobName, envDir+"="+dir)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, done
	}
	var res pgCrashResult
	hit := 0
	for i := 0; hit < kills && i < 4*kills; i++ {
		cmd, done := start()
		hunt := i%2 == 1 && mode != "idempotent"
		delay := time.Duration(150+rng.IntN(450)) * time.Millisecond
		if hunt {
			delay = time.Duration(100+rng.IntN(250)) * time.Millisecond
		}
		timer := time.NewTimer(delay)
		var finished bool
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("child run %d failed: %v", i, err)
			}
			finished = true
		case <-timer.C:
		}
		timer.Stop()
		if finished {
			continue
		}
		if hunt {
			base := committedMax()
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				if mode == "control" && committedMax() > base || mode != "control" && prepared() > 0 {
					break
				}
				select {
				case err := <-done:
					t.Fatalf("child run %d ended while hunted: %v", i, err)
				case <-time.After(time.Millisecond):
				}
			}
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		hit++
		if n := prepared(); n > 0 {
			res.killsWithPrepared++
		}
	}
	if hit < kills {
		t.Fatalf("only %d of %d kills landed while the child ran", hit, kills)
	}
	_, done := start()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("final child run: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("final child run did not finish in 2 minutes")
	}
	res.rows = q("SELECT count(*) FROM " + table)
	res.distinct = q("SELECT count(DISTINCT id) FROM " + table)
	res.inRange = q("SELECT count(DISTINCT id) FROM "+table+" WHERE id >= 0 AND id < $1", pgSplits*pgPerSplit)
	res.replays = q("SELECT coalesce(sum(replays), 0) FROM " + table)
	res.prepared = prepared()
	t.Logf("seed %d, %s: %d kills (%d left a prepared transaction behind), %d rows, %d distinct, %d replays, %d commit markers left",
		seed, mode, hit, res.killsWithPrepared, res.rows, res.distinct, res.replays,
		q("SELECT count(*) FROM runnel_commits WHERE job = $1", jobName))
	return res
}

func pgKills() int {
	if testing.Short() {
		return 3
	}
	return 10
}

// TestE2EPostgresCrashExactlyOnce: 100k generated records through the
// exactly-once PostgreSQL sink, the job SIGKILLed at random points (some
// between PREPARE TRANSACTION and COMMIT PREPARED): one row per record and
// no prepared transaction of the job left.
func TestE2EPostgresCrashExactlyOnce(t *testing.T) {
	r := runPGCrashLoop(t, "exactly-once", pgKills())
	const want = pgSplits * pgPerSplit
	if r.rows != want || r.distinct != want || r.inRange != want {
		t.Fatalf("%d rows, %d distinct, %d distinct in range; want %d exactly once", r.rows, r.distinct, r.inRange, want)
	}
	if r.prepared != 0 {
		t.Fatalf("%d prepared transactions of the job left", r.prepared)
	}
	if r.killsWithPrepared == 0 {
		t.Fatal("no kill landed between PREPARE and COMMIT PREPARED: the recovery paths were not exercised")
	}
}

// TestE2EPostgresCrashControl proves the check above can fail: committing
// before the checkpoint is durable duplicates the rows of the epochs a
// crash makes the job replay.
func TestE2EPostgresCrashControl(t *testing.T) {
	r := runPGCrashLoop(t, "control", pgKills())
	if r.rows == r.distinct {
		t.Fatalf("the early-committing sink passed the exactly-once check (%d rows, all distinct): the check cannot fail", r.rows)
	}
	t.Logf("control run failed the check as it must: %d rows, %d distinct", r.rows, r.distinct)
}

// TestE2EPostgresCrashIdempotent: the same loop in the idempotent upsert
// mode: one row per record, and the replay counter proves replays happened.
func TestE2EPostgresCrashIdempotent(t *testing.T) {
	r := runPGCrashLoop(t, "idempotent", pgKills())
	const want = pgSplits * pgPerSplit
	if r.rows != want || r.inRange != want {
		t.Fatalf("%d rows, %d distinct in range; want %d", r.rows, r.inRange, want)
	}
	if r.replays == 0 {
		t.Fatal("the replay counter is 0: no replay was overwritten, the test proved nothing")
	}
}
