package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/sink"
)

var (
	// ErrClosed is returned by the methods of a closed Sink.
	ErrClosed = errors.New("postgres: sink closed")
	// ErrPreparedDisabled is returned by New in ExactlyOnce mode when the
	// server has max_prepared_transactions = 0.
	ErrPreparedDisabled = errors.New("postgres: prepared transactions are disabled on the server (max_prepared_transactions = 0)")
	// ErrTransactionLost is returned by Commit when a prepared transaction
	// no longer exists and its commit marker does not either: it was rolled
	// back, and the rows of its epoch are lost.
	ErrTransactionLost = errors.New("postgres: prepared transaction lost (rolled back, not committed)")
	// ErrEpochTooLarge is returned when the open epoch transaction failed
	// and the epoch had more rows than the sink keeps to replay it
	// (WithMaxEpochRows): the job must restart from its last checkpoint.
	ErrEpochTooLarge = errors.New("postgres: epoch transaction failed and its rows exceed the replay buffer")
	// ErrBadTransaction is returned for a pre-commit description the sink
	// cannot decode.
	ErrBadTransaction = errors.New("postgres: malformed transaction description")
	// ErrInvalidConfig is returned by New for a bad Mapping or options.
	ErrInvalidConfig = errors.New("postgres: invalid configuration")
)

// Mapping says how a record becomes a row.
type Mapping[T any] struct {
	// Table is the target table, optionally schema-qualified ("s.t").
	Table string
	// Columns are the columns Row fills, in order (with WithStatement: the
	// names of the statement's parameters $1…$n, for documentation and
	// counting).
	Columns []string
	// Row appends the values of v's row to dst, one per column, and returns
	// the extended slice. Values are anything pgx encodes.
	Row func(dst []any, v T) ([]any, error)
}

// Stats are a Sink's counters.
type Stats struct {
	Rows       int64 // rows written (replays included)
	Batches    int64 // batches sent
	Retries    int64 // retried operations after transient failures
	Replayed   int64 // rows re-sent into a new epoch transaction after a failure
	Prepared   int64 // transactions prepared
	Committed  int64 // COMMIT PREPARED that committed a transaction
	RolledBack int64 // prepared transactions rolled back (recovery, Abort)
}

// Sink writes records to a PostgreSQL table. See the package documentation
// for modes and guarantees. It implements sink.Sink, and in ExactlyOnce mode
// sink.TwoPhaseCommit.
type Sink[T any] struct {
	cfg     config
	m       Mapping[T]
	connCfg *pgx.ConnConfig
	table   string // sanitized
	marker  string // sanitized commit table
	ncols   int
	keyIdx  []int
	policy  backoff.Policy
	log     *slog.Logger

	data, ctl *pgx.Conn

	buf   [][]any
	slab  []any
	args  []any
	sql   map[int]string
	key   []byte
	dedup map[string]int

	// ExactlyOnce state.
	prefix    string // gid prefix of this sink subtask
	uidPrefix string // gid prefix of every subtask of this job and sink
	inTxn     bool   // BEGIN sent on data
	broken    bool   // the epoch transaction failed; reset and replay
	epoch     [][]any
	epochN    int
	overflow  bool
	recovered bool
	highest   uint64 // highest checkpoint pre-committed or recovered
	done      []doneTxn

	closed bool
	stats  struct {
		rows, batches, retries, replayed, prepared, committed, rolledBack atomic.Int64
	}
}

type doneTxn struct {
	gid string
	h   uint64
}

var (
	_ sink.Sink[int]           = (*Sink[int])(nil)
	_ sink.TwoPhaseCommit[int] = (*Sink[int])(nil)
)

// maxGIDLen is PostgreSQL's limit on a prepared transaction's id (GIDSIZE
// 200 bytes including the terminating zero).
const maxGIDLen = 199

// New validates the configuration, connects to dsn and, in ExactlyOnce
// mode, checks that the server allows prepared transactions and creates the
// commit table if missing. It blocks until connected or ctx ends; transient
// connection failures are retried.
func New[T any](ctx context.Context, dsn string, m Mapping[T], opts ...Option) (*Sink[T], error) {
	cfg := config{batch: 1000, maxEpochRows: 100_000, attempts: 8, initial: 50 * time.Millisecond, max: 2 * time.Second,
		commitTable: "runnel_commits", lockTimeout: 10 * time.Second}
	for _, o := range opts {
		o.apply(&cfg)
	}
	s := &Sink[T]{cfg: cfg, m: m, ncols: len(m.Columns), log: cfg.log, sql: make(map[int]string)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	s.policy = backoff.Policy{Initial: cfg.initial, Max: cfg.max}
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: dsn: %w", ErrInvalidConfig, err)
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		cc.RuntimeParams["application_name"] = "runnel-sink"
	}
	s.connCfg = cc
	s.table = identifier(m.Table).Sanitize()
	s.marker = identifier(cfg.commitTable).Sanitize()
	if cfg.mode == ExactlyOnce {
		s.uidPrefix = GIDPrefix(cfg.job, cfg.uid)
		s.prefix = s.uidPrefix + strconv.Itoa(cfg.subtask) + ":"
		if len(s.prefix)+20 > maxGIDLen {
			return nil, fmt.Errorf("%w: job and sink uid too long for a prepared transaction id (%d bytes, max %d)", ErrInvalidConfig, len(s.prefix)+20, maxGIDLen)
		}
	}
	if err := s.start(ctx); err != nil {
		s.closeConns()
		return nil, err
	}
	return s, nil
}

func (s *Sink[T]) validate() error {
	c := &s.cfg
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if s.m.Table == "" {
		bad("Mapping.Table is empty")
	}
	if s.ncols == 0 {
		bad("Mapping.Columns is empty")
	}
	if s.m.Row == nil {
		bad("Mapping.Row is nil")
	}
	if c.batch <= 0 || c.maxEpochRows < 0 || c.attempts <= 0 || c.initial < 0 || c.max < 0 || c.lockTimeout < 0 {
		bad("batch size, retries, epoch rows and timeouts must be positive")
	}
	if c.mode == Idempotent && len(c.conflict) == 0 {
		bad("the Idempotent mode needs conflict columns")
	}
	if c.replayCol != "" && len(c.conflict) == 0 {
		bad("a replay counter needs upserts (conflict columns)")
	}
	if c.statement != "" && (len(c.conflict) > 0 || c.replayCol != "") {
		bad("WithStatement excludes generated upserts and the replay counter")
	}
	if c.mode == ExactlyOnce && (c.job == "" || c.uid == "" || c.subtask < 0) {
		bad("ExactlyOnce needs a job name, a sink uid and a subtask >= 0")
	}
	for _, k := range c.conflict {
		i := indexOf(s.m.Columns, k)
		if i < 0 {
			bad("conflict column %q is not in Mapping.Columns", k)
		}
		s.keyIdx = append(s.keyIdx, i)
	}
	if c.replayCol != "" && indexOf(s.m.Columns, c.replayCol) >= 0 {
		bad("replay counter column %q must not be in Mapping.Columns", c.replayCol)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

// identifier splits a possibly schema-qualified name.
func identifier(name string) pgx.Identifier { return pgx.Identifier(strings.Split(name, ".")) }

// start connects and prepares the server side.
func (s *Sink[T]) start(ctx context.Context) error {
	return s.do(ctx, "connect", func(ctx context.Context) error {
		if _, err := s.dataConn(ctx); err != nil {
			return err
		}
		if s.cfg.mode != ExactlyOnce {
			return nil
		}
		c, err := s.ctlConn(ctx)
		if err != nil {
			return err
		}
		var setting string
		if err := c.QueryRow(ctx, "SHOW max_prepared_transactions").Scan(&setting); err != nil {
			return s.connErr(c, err)
		}
		if err := checkPreparedSetting(setting); err != nil {
			return err
		}
		return s.createCommitTable(ctx, c)
	})
}

// checkPreparedSetting turns the server's max_prepared_transactions into
// ErrPreparedDisabled, with the way to enable it, when it is 0.
func checkPreparedSetting(setting string) error {
	n, err := strconv.Atoi(strings.TrimSpace(setting))
	if err != nil {
		return fmt.Errorf("postgres: unexpected max_prepared_transactions %q: %w", setting, err)
	}
	if n > 0 {
		return nil
	}
	return fmt.Errorf("%w: the exactly-once mode prepares one transaction per sink subtask and checkpoint; "+
		"as a superuser run ALTER SYSTEM SET max_prepared_transactions = 64 (at least twice the number of "+
		"exactly-once sink subtasks) and restart PostgreSQL, or use the Idempotent mode", ErrPreparedDisabled)
}

func (s *Sink[T]) createCommitTable(ctx context.Context, c *pgx.Conn) error {
	_, err := c.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+s.marker+` (
	gid text PRIMARY KEY,
	job text NOT NULL,
	sink text NOT NULL,
	subtask integer NOT NULL,
	checkpoint bigint NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now())`)
	if code := pgCode(err); code == "23505" || code == "42P07" {
		return nil // created concurrently by another sink
	}
	if err != nil {
		return s.connErr(c, fmt.Errorf("create commit table: %w", err))
	}
	return nil
}

func (s *Sink[T]) connect(ctx context.Context, lockTimeout bool) (*pgx.Conn, error) {
	cc := s.connCfg.Copy()
	if lockTimeout && s.cfg.lockTimeout > 0 {
		cc.RuntimeParams["lock_timeout"] = strconv.FormatInt(s.cfg.lockTimeout.Milliseconds(), 10)
	}
	c, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, &connLostError{err: err}
	}
	return c, nil
}

// dataConn returns the connection for rows, reconnecting a closed one.
func (s *Sink[T]) dataConn(ctx context.Context) (*pgx.Conn, error) {
	if s.data != nil && !s.data.IsClosed() {
		return s.data, nil
	}
	if s.data != nil {
		s.inTxn = false // the server rolled it back with the connection
	}
	c, err := s.connect(ctx, s.cfg.mode == ExactlyOnce)
	if err != nil {
		return nil, err
	}
	s.data = c
	return c, nil
}

// ctlConn returns the connection for commits and recovery.
func (s *Sink[T]) ctlConn(ctx context.Context) (*pgx.Conn, error) {
	if s.ctl != nil && !s.ctl.IsClosed() {
		return s.ctl, nil
	}
	c, err := s.connect(ctx, false)
	if err != nil {
		return nil, err
	}
	s.ctl = c
	return c, nil
}

// connLostError marks a failure of the connection itself (retryable).
type connLostError struct{ err error }

func (e *connLostError) Error() string { return "connection lost: " + e.err.Error() }
func (e *connLostError) Unwrap() error { return e.err }

// connErr classifies err from c: a closed connection makes it retryable.
func (s *Sink[T]) connErr(c *pgx.Conn, err error) error {
	if err == nil {
		return nil
	}
	if c.IsClosed() && !isCtxErr(err) {
		return &connLostError{err: err}
	}
	return err
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// Retryable reports whether err is a transient PostgreSQL failure that the
// sink retries: a lost or refused connection, a serialization failure
// (40001), a deadlock (40P01), a server shutting down or starting (57P01-3)
// or out of connections (53300). Context errors are not retryable.
func Retryable(err error) bool {
	if err == nil || isCtxErr(err) {
		return false
	}
	var cl *connLostError
	if errors.As(err, &cl) {
		return true
	}
	if code := pgCode(err); code != "" {
		switch code {
		case "40001", "40P01", "57P01", "57P02", "57P03", "53300":
			return true
		}
		return strings.HasPrefix(code, "08")
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err)
}

// do runs fn, retrying transient failures with backoff.
func (s *Sink[T]) do(ctx context.Context, what string, fn func(ctx context.Context) error) error {
	err := backoff.Retry(ctx, s.policy, s.cfg.attempts, Retryable, func(attempt int) error {
		if attempt > 0 {
			s.stats.retries.Add(1)
		}
		err := fn(ctx)
		if err != nil && Retryable(err) {
			s.log.Warn("postgres sink: transient failure, retrying", "op", what, "attempt", attempt+1, "err", err)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: %s: %w", what, err)
	}
	return nil
}

// Write implements sink.Sink: it maps v to a row and sends the batch when
// it is full. It blocks while a batch is sent.
func (s *Sink[T]) Write(ctx context.Context, v T) error {
	if s.closed {
		return ErrClosed
	}
	if cap(s.slab)-len(s.slab) < s.ncols {
		s.slab = make([]any, 0, s.ncols*s.cfg.batch)
	}
	start := len(s.slab)
	out, err := s.m.Row(s.slab, v)
	if err != nil {
		clear(s.slab[start:cap(s.slab)])
		return fmt.Errorf("postgres: map record: %w", err)
	}
	if len(out) != start+s.ncols {
		return fmt.Errorf("postgres: Mapping.Row returned %d values, want %d (it must append to dst)", len(out)-start, s.ncols)
	}
	s.slab = out
	s.buf = append(s.buf, out[start:len(out):len(out)])
	if len(s.buf) >= s.cfg.batch {
		return s.send(ctx)
	}
	return nil
}

// Flush implements sink.Sink: it sends the buffered rows. In AtLeastOnce
// and Idempotent mode they are then committed; in ExactlyOnce mode they go
// into the open epoch transaction (PreCommit seals it).
func (s *Sink[T]) Flush(ctx context.Context) error {
	if s.closed {
		return ErrClosed
	}
	if len(s.buf) == 0 {
		return nil
	}
	return s.send(ctx)
}

func (s *Sink[T]) send(ctx context.Context) error {
	if s.cfg.mode == ExactlyOnce {
		return s.sendEpoch(ctx)
	}
	err := s.do(ctx, "write", func(ctx context.Context) error {
		c, err := s.dataConn(ctx)
		if err != nil {
			return err
		}
		return s.connErr(c, s.writeRows(ctx, c, s.buf))
	})
	if err != nil {
		return err // rows stay buffered: the next Flush sends them again
	}
	s.stats.rows.Add(int64(len(s.buf)))
	clear(s.buf)
	s.buf = s.buf[:0]
	clear(s.slab)
	s.slab = s.slab[:0]
	return nil
}

// writeRows sends rows on c with the configured statement.
func (s *Sink[T]) writeRows(ctx context.Context, c *pgx.Conn, rows [][]any) error {
	if len(rows) == 0 {
		return nil
	}
	s.stats.batches.Add(1)
	switch {
	case s.cfg.statement != "":
		b := &pgx.Batch{}
		for _, r := range rows {
			b.Queue(s.cfg.statement, r...)
		}
		br := c.SendBatch(ctx, b)
		for range rows {
			if _, err := br.Exec(); err != nil {
				_ = br.Close() // the batch's first error is the one to report
				return err
			}
		}
		return br.Close()
	case len(s.cfg.conflict) > 0:
		rows = s.dedupe(rows)
		per := max(1, min(s.cfg.batch, 65535/s.ncols))
		for len(rows) > 0 {
			n := min(per, len(rows))
			s.args = s.args[:0]
			for _, r := range rows[:n] {
				s.args = append(s.args, r...)
			}
			_, err := c.Exec(ctx, s.upsertSQL(n), s.args...)
			clear(s.args)
			if err != nil {
				return err
			}
			rows = rows[n:]
		}
		return nil
	default:
		_, err := c.CopyFrom(ctx, identifier(s.m.Table), s.m.Columns, pgx.CopyFromRows(rows))
		return err
	}
}

// dedupe keeps the last row of each conflict key (one statement may not
// upsert a row twice), in first-seen order.
func (s *Sink[T]) dedupe(rows [][]any) [][]any {
	if len(rows) < 2 {
		return rows
	}
	if s.dedup == nil {
		s.dedup = make(map[string]int, len(rows))
	}
	clear(s.dedup)
	out := make([][]any, 0, len(rows))
	for _, r := range rows {
		s.key = s.key[:0]
		for _, i := range s.keyIdx {
			s.key = appendKey(s.key, r[i])
		}
		if j, ok := s.dedup[string(s.key)]; ok {
			out[j] = r
			continue
		}
		s.dedup[string(s.key)] = len(out)
		out = append(out, r)
	}
	return out
}

func appendKey(b []byte, v any) []byte {
	switch x := v.(type) {
	case string:
		b = append(strconv.AppendInt(append(b, 's'), int64(len(x)), 10), ':')
		return append(b, x...)
	case []byte:
		b = append(strconv.AppendInt(append(b, 'b'), int64(len(x)), 10), ':')
		return append(b, x...)
	case int64:
		return append(strconv.AppendInt(append(b, 'i'), x, 10), ';')
	case int:
		return append(strconv.AppendInt(append(b, 'i'), int64(x), 10), ';')
	case int32:
		return append(strconv.AppendInt(append(b, 'i'), int64(x), 10), ';')
	case uint64:
		return append(strconv.AppendUint(append(b, 'u'), x, 10), ';')
	default:
		s := fmt.Sprintf("%T=%v", v, v)
		b = append(strconv.AppendInt(append(b, 'x'), int64(len(s)), 10), ':')
		return append(b, s...)
	}
}

// upsertSQL is the multi-row upsert of n rows (cached for the sizes used).
func (s *Sink[T]) upsertSQL(n int) string {
	if q, ok := s.sql[n]; ok {
		return q
	}
	var sb strings.Builder
	sb.WriteString("INSERT INTO ")
	sb.WriteString(s.table)
	sb.WriteString(" AS t (")
	for i, c := range s.m.Columns {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(pgx.Identifier{c}.Sanitize())
	}
	sb.WriteString(") VALUES ")
	p := 1
	for r := range n {
		if r > 0 {
			sb.WriteByte(',')
		}
		sb.WriteByte('(')
		for i := range s.ncols {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteByte('$')
			sb.WriteString(strconv.Itoa(p))
			p++
		}
		sb.WriteByte(')')
	}
	sb.WriteString(" ON CONFLICT (")
	for i, c := range s.cfg.conflict {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(pgx.Identifier{c}.Sanitize())
	}
	sb.WriteString(") DO ")
	var sets []string
	for _, c := range s.m.Columns {
		if indexOf(s.cfg.conflict, c) < 0 {
			q := pgx.Identifier{c}.Sanitize()
			sets = append(sets, q+" = EXCLUDED."+q)
		}
	}
	if s.cfg.replayCol != "" {
		q := pgx.Identifier{s.cfg.replayCol}.Sanitize()
		sets = append(sets, q+" = t."+q+" + 1")
	}
	if len(sets) == 0 {
		sb.WriteString("NOTHING")
	} else {
		sb.WriteString("UPDATE SET ")
		sb.WriteString(strings.Join(sets, ", "))
	}
	q := sb.String()
	if len(s.sql) < 8 {
		s.sql[n] = q
	}
	return q
}

// Stats returns the sink's counters. It is safe to call from any goroutine.
func (s *Sink[T]) Stats() Stats {
	return Stats{
		Rows: s.stats.rows.Load(), Batches: s.stats.batches.Load(), Retries: s.stats.retries.Load(),
		Replayed: s.stats.replayed.Load(), Prepared: s.stats.prepared.Load(),
		Committed: s.stats.committed.Load(), RolledBack: s.stats.rolledBack.Load(),
	}
}

// Close implements sink.Sink. It closes the connections: rows not yet sent,
// and an open (not prepared) epoch transaction, are dropped as a crash would
// drop them (a restart replays them); prepared transactions stay for
// Recover. Close is idempotent.
func (s *Sink[T]) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.closeConns()
}

func (s *Sink[T]) closeConns() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, c := range []*pgx.Conn{s.data, s.ctl} {
		if c != nil {
			errs = append(errs, c.Close(ctx))
		}
	}
	s.data, s.ctl = nil, nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("postgres: close: %w", err)
	}
	return nil
}
