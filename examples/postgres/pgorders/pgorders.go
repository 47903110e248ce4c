// Package pgorders is the job of runnel's PostgreSQL example
// (examples/postgres): orders (JSON) read from a RocketMQ topic are decoded
// and validated at the source edge, and written into a PostgreSQL table
// through sink/postgres, exactly once (prepared transactions committed with
// each checkpoint) or idempotently (upserts keyed by the source queue and
// offset). Orders that fail to decode or validate go, with their reason and
// raw bytes, to a dead-letter table written the same way.
//
// # Contract
//
// Input: JSON {"id":"…","customer":"…","amount":12.5,"currency":"EUR","ts":"RFC3339"},
// the contract of examples/etl. An order is valid when id and customer are
// non-empty, amount > 0, currency is three upper-case letters and ts, when
// present, is RFC 3339; anything else (also a body that is not a JSON object
// of that schema) is a dead letter.
//
// Output: one row per valid order in the orders table (see OrdersDDL), keyed
// by where it was read (src_queue "broker/queueId", src_offset); one row per
// rejected record in the dead-letter table (DeadLetterDDL), keyed the same
// way.
package pgorders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/sink/postgres"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// Defaults of the job's settings.
const (
	DefaultTopic    = "orders"
	DefaultTable    = "orders"
	DefaultJob      = "pg-orders"
	DefaultInterval = time.Second
)

// Operator UIDs (stable across versions: they key checkpointed offsets and
// name the sinks' prepared transactions).
const (
	UIDSource = "orders"
	UIDOut    = "orders-pg"
	UIDDLQ    = "dlq-pg"
)

// DeadLetterSuffix is appended to the orders table's name to name the
// dead-letter table.
const DeadLetterSuffix = "_dlq"

var (
	// ErrBadOrder wraps the decode errors of orders.
	ErrBadOrder = errors.New("pgorders: order is not a JSON object of the schema")
	// ErrInvalidConfig is returned by Run for bad settings.
	ErrInvalidConfig = errors.New("pgorders: invalid configuration")
	// ErrNoLineage is returned when a dead letter lacks its source split or
	// offset (the dead-letter table's key).
	ErrNoLineage = errors.New("pgorders: dead letter without source split and offset")
)

// Order is one input order. SrcQueue and SrcOffset say where it was read
// (not part of the JSON).
type Order struct {
	ID        string  `json:"id" validate:"required"`
	Customer  string  `json:"customer" validate:"required"`
	Amount    float64 `json:"amount" validate:"gt=0"`
	Currency  string  `json:"currency" validate:"len=3,uppercase,alpha"`
	TS        string  `json:"ts" validate:"omitempty,datetime=2006-01-02T15:04:05Z07:00"`
	SrcQueue  string  `json:"-"`
	SrcOffset int64   `json:"-"`
}

// SplitID returns the source split ID of a queue ("broker/queueId"), as
// source/rocketmq names splits.
func SplitID(broker string, queue int32) string {
	return broker + "/" + strconv.FormatInt(int64(queue), 10)
}

// DecodeOrder decodes an input message into an Order (the pipeline
// validates it next). Errors wrap ErrBadOrder.
func DecodeOrder(m srcmq.Message) (Order, error) {
	var o Order
	if err := json.Unmarshal(m.Body, &o); err != nil {
		return Order{}, fmt.Errorf("%w: %w", ErrBadOrder, err)
	}
	o.SrcQueue, o.SrcOffset = SplitID(m.BrokerName, m.QueueID), m.QueueOffset
	return o, nil
}

// OrderColumns are the columns OrderMapping fills.
var OrderColumns = []string{"src_queue", "src_offset", "id", "customer", "amount", "currency", "ts"}

// DeadLetterColumns are the columns DeadLetterMapping fills.
var DeadLetterColumns = []string{"src_queue", "src_offset", "operator", "reason", "raw", "rejected_at"}

// KeyColumns are the key of both tables (the sink's upsert conflict columns
// in the idempotent mode).
var KeyColumns = []string{"src_queue", "src_offset"}

// OrderMapping maps orders to rows of table.
func OrderMapping(table string) postgres.Mapping[Order] {
	return postgres.Mapping[Order]{Table: table, Columns: OrderColumns, Row: func(dst []any, o Order) ([]any, error) {
		var ts *time.Time
		if o.TS != "" {
			t, err := time.Parse(time.RFC3339, o.TS)
			if err != nil { // validated at the source: not expected
				return dst, fmt.Errorf("pgorders: order %q: ts: %w", o.ID, err)
			}
			ts = &t
		}
		return append(dst, o.SrcQueue, o.SrcOffset, o.ID, o.Customer, o.Amount, o.Currency, ts), nil
	}}
}

// DeadLetterMapping maps dead letters to rows of table. A dead letter
// without its source split or offset fails with ErrNoLineage (this job's
// dead letters all come from the source edge, which has both).
func DeadLetterMapping(table string) postgres.Mapping[sink.DeadLetter] {
	return postgres.Mapping[sink.DeadLetter]{Table: table, Columns: DeadLetterColumns, Row: func(dst []any, d sink.DeadLetter) ([]any, error) {
		if d.Split == "" || d.Offset == nil {
			return dst, fmt.Errorf("%w (operator %q: %s)", ErrNoLineage, d.Operator, d.Reason)
		}
		o, err := srcmq.DecodeOffset(d.Offset)
		if err != nil {
			return dst, fmt.Errorf("pgorders: dead letter of %s: %w", d.Split, err)
		}
		if o.Next <= 0 {
			return dst, fmt.Errorf("%w (split %s: offset %d)", ErrNoLineage, d.Split, o.Next)
		}
		raw := d.Raw
		if raw == nil {
			raw = []byte(d.Value)
		}
		return append(dst, d.Split, o.Next-1, d.Operator, d.Reason, raw, d.Time), nil
	}}
}

// quote returns name (optionally "schema.table") as a quoted identifier.
func quote(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }

// OrdersDDL is the statement that creates the orders table when missing.
func OrdersDDL(table string) string {
	return "CREATE TABLE IF NOT EXISTS " + quote(table) + ` (
	src_queue  text    NOT NULL,
	src_offset bigint  NOT NULL,
	id         text    NOT NULL,
	customer   text    NOT NULL,
	amount     numeric NOT NULL,
	currency   text    NOT NULL,
	ts         timestamptz,
	replays    integer NOT NULL DEFAULT 0,
	PRIMARY KEY (src_queue, src_offset))`
}

// DeadLetterDDL is the statement that creates the dead-letter table when
// missing.
func DeadLetterDDL(table string) string {
	return "CREATE TABLE IF NOT EXISTS " + quote(table) + ` (
	src_queue   text        NOT NULL,
	src_offset  bigint      NOT NULL,
	operator    text        NOT NULL,
	reason      text        NOT NULL,
	raw         bytea,
	rejected_at timestamptz NOT NULL,
	replays     integer     NOT NULL DEFAULT 0,
	PRIMARY KEY (src_queue, src_offset))`
}

// EnsureTables creates the orders table and its dead-letter table (table +
// DeadLetterSuffix) on dsn when missing.
func EnsureTables(ctx context.Context, dsn, table string) (err error) {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("pgorders: connect: %w", err)
	}
	defer func() { err = errors.Join(err, c.Close(context.WithoutCancel(ctx))) }()
	for _, ddl := range []string{OrdersDDL(table), DeadLetterDDL(table + DeadLetterSuffix)} {
		if _, err := c.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("pgorders: create table: %w", err)
		}
	}
	return nil
}

// Mode is the job's delivery mode into PostgreSQL.
type Mode string

// The modes: ExactlyOnce (prepared transactions committed with each
// checkpoint; the server needs max_prepared_transactions > 0) and
// Idempotent (upserts on KeyColumns; replays after a crash overwrite and
// increment the replays column).
const (
	ExactlyOnce Mode = "exactly-once"
	Idempotent  Mode = "idempotent"
)

// Config configures the job.
type Config struct {
	// DSN of the PostgreSQL database (required).
	DSN string
	// Topic to read orders from (default DefaultTopic).
	Topic string
	// Table of the orders (default DefaultTable); the dead letters go to
	// Table + DeadLetterSuffix. Both are created when missing.
	Table string
	// Job names the job: its consumer group, checkpoint fingerprint and
	// prepared transactions (default DefaultJob). It must stay the same
	// across runs on one StateDir.
	Job string
	// Mode (default ExactlyOnce).
	Mode Mode
	// StateDir is the checkpoint directory (required: it is what makes a
	// restart resume).
	StateDir string
	// CheckpointInterval (default DefaultInterval).
	CheckpointInterval time.Duration
	// Bounded stops the job at the topic's offsets when first opened;
	// otherwise it runs until its ctx ends.
	Bounded bool
	// Logger (nil discards).
	Logger *slog.Logger
}

func (c *Config) defaults() error {
	c.Topic = cmpOr(c.Topic, DefaultTopic)
	c.Table = cmpOr(c.Table, DefaultTable)
	c.Job = cmpOr(c.Job, DefaultJob)
	c.Mode = cmpOr(c.Mode, ExactlyOnce)
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultInterval
	}
	switch {
	case c.DSN == "":
		return fmt.Errorf("%w: a PostgreSQL DSN is required", ErrInvalidConfig)
	case c.StateDir == "":
		return fmt.Errorf("%w: a state directory is required", ErrInvalidConfig)
	case c.CheckpointInterval < 0:
		return fmt.Errorf("%w: negative checkpoint interval", ErrInvalidConfig)
	case c.Mode != ExactlyOnce && c.Mode != Idempotent:
		return fmt.Errorf("%w: mode %q (want %s or %s)", ErrInvalidConfig, c.Mode, ExactlyOnce, Idempotent)
	}
	return nil
}

func cmpOr[S ~string](a, b S) S {
	if a == "" {
		return b
	}
	return a
}

// Stats are the sinks' counters after a run.
type Stats struct {
	Orders, DeadLetters postgres.Stats
}

// Run creates the tables when missing and runs the job on c until ctx is
// cancelled (then it takes a final checkpoint and returns nil) or, with
// Bounded, until the input is consumed. It fails on any sink error:
// nothing is dropped. The returned Stats are valid even on error.
func Run(ctx context.Context, c *client.Client, cfg Config) (st Stats, err error) {
	if err := cfg.defaults(); err != nil {
		return st, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := EnsureTables(ctx, cfg.DSN, cfg.Table); err != nil {
		return st, err
	}
	opts := func(uid string) []postgres.Option {
		o := []postgres.Option{postgres.WithLogger(log)}
		if cfg.Mode == Idempotent {
			return append(o, postgres.WithIdempotent(KeyColumns...), postgres.WithReplayCounter("replays"))
		}
		return append(o, postgres.WithExactlyOnce(cfg.Job, uid, 0))
	}
	out, err := postgres.New(ctx, cfg.DSN, OrderMapping(cfg.Table), opts(UIDOut)...)
	if err != nil {
		return st, err
	}
	// The job closes its sinks when it ends; these cover an early failure
	// (Close is idempotent).
	defer func() { st.Orders = out.Stats(); err = errors.Join(err, out.Close()) }()
	dlq, err := postgres.New(ctx, cfg.DSN, DeadLetterMapping(cfg.Table+DeadLetterSuffix), opts(UIDDLQ)...)
	if err != nil {
		return st, err
	}
	defer func() { st.DeadLetters = dlq.Stats(); err = errors.Join(err, dlq.Close()) }()
	// The source's consumer group is the job's name (cfg.Job): the job
	// binds it.
	srcOpts := []srcmq.Option{srcmq.WithLogger(log)}
	if cfg.Bounded {
		srcOpts = append(srcOpts, srcmq.WithStop(srcmq.StopAtLatest()))
	}
	src, err := srcmq.New(c, cfg.Topic, srcOpts...)
	if err != nil {
		return st, err
	}
	job := pipeline.New(cfg.Job, pipeline.CheckpointDir(cfg.StateDir), pipeline.CheckpointInterval(cfg.CheckpointInterval),
		pipeline.Logger(log))
	Build(job, src, out, dlq)
	return st, job.Run(ctx)
}

// Build adds the job's graph to job: src → decode + validate (bad records to
// dlq) → out.
func Build(job *pipeline.Job, src *srcmq.Source, out sink.Sink[Order], dlq sink.Sink[sink.DeadLetter]) {
	orders := pipeline.FromSourceDecoded(job, UIDSource, src, DecodeOrder,
		pipeline.OnBadRecord(pipeline.DeadLetter(UIDDLQ, dlq)), pipeline.NoWatermarks())
	pipeline.To(orders, UIDOut, out)
}
