package rocketmq

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/transport/client"
)

// TxOption configures an ExactlyOnce sink.
type TxOption interface{ applyTx(*txConfig) }

type txOptionFunc func(*txConfig)

func (f txOptionFunc) applyTx(c *txConfig) { f(c) }

type txConfig struct {
	group          string
	groupSet       bool // WithTxGroup: Bind keeps group
	lanes          int
	maxInFlight    int
	attempts       int
	retry          backoff.Policy
	sendTimeout    time.Duration
	sendTimeoutSet bool // else each request gets the client's request timeout
	discardWindow  time.Duration
	maxEpoch       int
	restoreSettle  time.Duration
	log            *slog.Logger
	hook           func(p Phase, epoch uint64)
	producerOpts   []client.ProducerOption
	faults         failpoint.Tx
	outputTopics   []string // WithOutputTopics (ahead.go)
}

func defaultTxConfig() txConfig {
	return txConfig{
		lanes: DefaultCommitLanes, maxInFlight: DefaultTxMaxInFlight, attempts: DefaultTxAttempts,
		sendTimeout: client.DefaultRequestTimeout, discardWindow: DefaultDiscardWindow, maxEpoch: DefaultMaxEpochRecords,
		restoreSettle: DefaultRestoreSettle,
	}
}

// WithTxGroup names the sink's producer group, instead of the one Bind
// derives from the job. It must be the sink's alone and stable across
// restarts (see TxGroup); a sink used outside a pipeline needs it.
func WithTxGroup(group string) TxOption {
	return txOptionFunc(func(c *txConfig) { c.group, c.groupSet = group, true })
}

// WithCommitLanes sets the number of commit lanes ended in parallel
// (default DefaultCommitLanes, at most 4096).
func WithCommitLanes(n int) TxOption { return txOptionFunc(func(c *txConfig) { c.lanes = n }) }

// WithTxMaxInFlight bounds the half sends awaiting the broker's answer
// (default DefaultTxMaxInFlight); Write blocks beyond it.
func WithTxMaxInFlight(n int) TxOption { return txOptionFunc(func(c *txConfig) { c.maxInFlight = n }) }

// Backoff is the exponential backoff between tries of WithTxRetry: Initial
// (default 10 ms) doubling (Multiplier) up to Max (default 1 s), with 20 %
// Jitter (negative: none). The zero value is the default. It is an alias of
// the library's internal policy type, so that code outside this module can
// build one.
type Backoff = backoff.Policy

// WithTxRetry sets how many times each half send and END_TRANSACTION is
// tried (default DefaultTxAttempts) and the backoff between tries (zero
// Backoff: 10 ms doubling to 1 s).
func WithTxRetry(attempts int, p Backoff) TxOption {
	return txOptionFunc(func(c *txConfig) { c.attempts, c.retry = attempts, p })
}

// WithTxSendTimeout bounds each request to the broker (default: the
// client's request timeout, client.DefaultRequestTimeout unless the client
// was configured otherwise).
func WithTxSendTimeout(d time.Duration) TxOption {
	return txOptionFunc(func(c *txConfig) { c.sendTimeout, c.sendTimeoutSet = d, true })
}

// WithDiscardWindow sets the broker's discard window: transaction timeout +
// check max × check interval (default DefaultDiscardWindow, Apache
// RocketMQ's defaults). An epoch open or uncommitted for three quarters of
// it fails the job (ErrEpochTooOld).
func WithDiscardWindow(d time.Duration) TxOption {
	return txOptionFunc(func(c *txConfig) { c.discardWindow = d })
}

// WithMaxEpochRecords bounds the records of one epoch (default
// DefaultMaxEpochRecords).
func WithMaxEpochRecords(n int) TxOption { return txOptionFunc(func(c *txConfig) { c.maxEpoch = n }) }

// WithRestoreSettle sets how long a restore that finds a restored
// checkpoint's commit unfinished waits, after its barrier, for the
// END_TRANSACTIONs the crashed run left in flight to be stored before it
// reads the output queues again and commits the rest (default
// DefaultRestoreSettle; see "Recovery and orphans" in the package
// documentation).
func WithRestoreSettle(d time.Duration) TxOption {
	return txOptionFunc(func(c *txConfig) { c.restoreSettle = d })
}

// WithTxLogger sets the sink's logger (nil discards).
func WithTxLogger(l *slog.Logger) TxOption { return txOptionFunc(func(c *txConfig) { c.log = l }) }

// WithProducerOptions passes options to the sink's producer (for example
// client.WithRetries). Its selector is always client.HashBySharding and
// its check listener the sink's.
func WithProducerOptions(opts ...client.ProducerOption) TxOption {
	return txOptionFunc(func(c *txConfig) { c.producerOpts = append(c.producerOpts, opts...) })
}

// Phase is a point of the exactly-once protocol, reported to a phase hook
// (WithPhaseHook, failpoints build tag only) for tests that crash the
// process there.
type Phase int

// Phases.
const (
	// PhaseHalfSent: a half message was acknowledged (the producer's
	// connection reader goroutine, or the sink's goroutine retrying the
	// send: a hook blocking there stalls that connection's answers).
	PhaseHalfSent Phase = iota + 1
	// PhasePreCommitted: PreCommit is about to return the epoch's
	// transaction (the checkpoint batch is written next).
	PhasePreCommitted
	// PhaseCommitStart: Commit of a durable checkpoint's transaction
	// begins, before any END_TRANSACTION.
	PhaseCommitStart
	// PhaseCommitEnded: every END_TRANSACTION of the transaction was
	// answered, before the sink's bookkeeping.
	PhaseCommitEnded
	// PhaseRecoverCommit: Commit of a transaction listed at Recover (the
	// restore path) begins.
	PhaseRecoverCommit
	// PhaseCheckBack: a broker check-back is being answered, before the
	// answer is sent (connection handler goroutine).
	PhaseCheckBack
)

// String returns the phase's name.
func (p Phase) String() string {
	switch p {
	case PhaseHalfSent:
		return "half-sent"
	case PhasePreCommitted:
		return "pre-committed"
	case PhaseCommitStart:
		return "commit-start"
	case PhaseCommitEnded:
		return "commit-ended"
	case PhaseRecoverCommit:
		return "recover-commit"
	case PhaseCheckBack:
		return "check-back"
	}
	return "phase(" + strconv.Itoa(int(p)) + ")"
}
