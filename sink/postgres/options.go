package postgres

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/runnel-dev/runnel/internal/failpoint"
)

// Mode is the delivery guarantee of a Sink.
type Mode int

const (
	// AtLeastOnce inserts rows, committing each batch; replays after a crash
	// write rows again.
	AtLeastOnce Mode = iota
	// Idempotent upserts rows on their conflict columns, so replays overwrite.
	Idempotent
	// ExactlyOnce writes each epoch in one transaction, prepared at the
	// barrier and committed after the checkpoint is durable.
	ExactlyOnce
)

// String returns "at-least-once", "idempotent" or "exactly-once".
func (m Mode) String() string {
	switch m {
	case AtLeastOnce:
		return "at-least-once"
	case Idempotent:
		return "idempotent"
	case ExactlyOnce:
		return "exactly-once"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

type config struct {
	mode          Mode
	job, uid      string
	subtask       int
	conflict      []string
	replayCol     string
	statement     string
	batch         int
	maxEpochRows  int
	attempts      int
	initial, max  time.Duration
	commitTable   string
	lockTimeout   time.Duration
	log           *slog.Logger
	faults        failpoint.Postgres
	modeSet       bool
	exactlyOnceID bool
}

// Option configures a Sink.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithExactlyOnce selects the ExactlyOnce mode. job and sinkUID (the uid
// given to pipeline.To) and subtask name the sink's prepared transactions:
// they must be the same in every run of the job, and no other sink may use
// the same pair.
func WithExactlyOnce(job, sinkUID string, subtask int) Option {
	return optionFunc(func(c *config) {
		c.mode, c.modeSet, c.exactlyOnceID = ExactlyOnce, true, true
		c.job, c.uid, c.subtask = job, sinkUID, subtask
	})
}

// WithIdempotent selects the Idempotent mode, upserting on the conflict
// columns (a unique index of the table must cover exactly them).
func WithIdempotent(conflict ...string) Option {
	return optionFunc(func(c *config) {
		c.mode, c.modeSet = Idempotent, true
		c.conflict = append([]string(nil), conflict...)
	})
}

// WithUpsert makes the generated statement an upsert on the conflict columns
// in the AtLeastOnce or ExactlyOnce mode (WithIdempotent implies it).
func WithUpsert(conflict ...string) Option {
	return optionFunc(func(c *config) { c.conflict = append([]string(nil), conflict...) })
}

// WithReplayCounter names an integer column (not in Mapping.Columns, default
// 0) that an upsert increments each time it overwrites an existing row.
func WithReplayCounter(column string) Option {
	return optionFunc(func(c *config) { c.replayCol = column })
}

// WithStatement replaces the generated INSERT with a user statement run once
// per row, with the row's values as $1…$n (n = len(Mapping.Columns)). Rows
// are sent as pipelined batches.
func WithStatement(sql string) Option {
	return optionFunc(func(c *config) { c.statement = sql })
}

// WithBatchSize sets how many rows are sent together (default 1000).
func WithBatchSize(n int) Option { return optionFunc(func(c *config) { c.batch = n }) }

// WithMaxEpochRows bounds the rows of the open epoch kept in memory to replay
// after a failure inside its transaction (ExactlyOnce; default 100000).
// Beyond it, such a failure fails the job instead.
func WithMaxEpochRows(n int) Option { return optionFunc(func(c *config) { c.maxEpochRows = n }) }

// WithRetry sets the retries of transient failures: up to attempts tries in
// all per operation, waiting from initial up to max between them (default 8,
// 50 ms, 2 s).
func WithRetry(attempts int, initial, max time.Duration) Option {
	return optionFunc(func(c *config) { c.attempts, c.initial, c.max = attempts, initial, max })
}

// WithCommitTable names the table of commit markers (default
// "runnel_commits"; created if missing).
func WithCommitTable(name string) Option { return optionFunc(func(c *config) { c.commitTable = name }) }

// WithLockTimeout sets lock_timeout of the data connection in ExactlyOnce
// mode (default 10 s; see the package documentation).
func WithLockTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lockTimeout = d })
}

// WithLogger sets the logger (nil discards).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.log = l }) }
