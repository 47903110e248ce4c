package rocketmq

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Exactly-once output (ExactlyOnce).
//
// # Protocol
//
// During epoch n (the records between checkpoint barriers n-1 and n) every
// record is mapped to a message and sent as a transactional half message
// (Producer.SendHalf): the broker stores it invisibly. At barrier n,
// PreCommit waits until every half message of the epoch is acknowledged (a
// send that fails after its retries fails the checkpoint, and the job) and
// returns the epoch's transaction description (its half-message handles in
// a compact binary form), which the runtime writes into checkpoint n's
// Pebble batch. Once that batch is durable the runtime starts the commit
// (StartCommit: the sink is an AsyncCommitter), which ends every half
// message with END_TRANSACTION commit on a goroutine of the sink while the
// job goes on writing epoch n+1; the broker makes each visible exactly
// once, and repeats of a commit are no-ops, so a commit is idempotent and a
// skipped or repeated notification is harmless. The runtime waits for the
// commit (WaitCommits) at barrier n+1 and at the end of the job, and only
// then stops listing the transaction in its checkpoints, so a crash while
// it is being committed commits it again on restore.
//
// # Order
//
// Each message goes to a commit lane by its ShardingKey (else its first
// key): within a lane, half messages are committed one after the other in
// write order, lanes in parallel (WithCommitLanes). Records of one key
// therefore become visible in the order they were written, provided they go
// to one queue (give them a ShardingKey: the sink's producer uses
// client.HashBySharding). Transactions are committed in checkpoint order;
// after a commit that failed, later ones are refused until the job restarts.
//
// # Recovery and orphans
//
// On restore the runtime calls Recover with every transaction the latest
// completed checkpoint lists and then Commit for each. Half messages that no
// completed checkpoint lists (sent during an epoch whose checkpoint never
// completed, or orphans of a send whose outcome was unknown and that was
// sent again) are NOT searched for: they are rolled back when the broker
// checks them back (after its transaction timeout), which reaches this
// process because the producer group belongs to the sink's owner (TxGroup:
// job + sink UID). There is no local journal; until the check-back, such a
// half message is invisible to consumers, so it never duplicates output.
//
// # Check-back answers
//
// Every half message carries the sink's run id (PropRun, new for every
// process) and epoch (PropEpoch). The answer is derived from the checkpoint
// store's view that the runtime hands the sink (Recover's list, and Commit,
// which the runtime calls only after the checkpoint is durable):
//   - a half message this process is about to commit or is committing
//     (listed by a durable checkpoint, or pre-committed for a checkpoint in
//     flight): unknown, asked again later, so that commits stay in lane
//     order;
//   - listed by a durable checkpoint whose commit failed in this process:
//     commit;
//   - of an earlier run and not listed by the latest durable checkpoint:
//     rollback (its records are replayed from the checkpointed offsets);
//   - of this run, from an epoch already pre-committed, but not part of it
//     (an orphan of an uncertain send): rollback;
//   - of this run's open epoch, or asked before Recover: unknown.
//
// # Failing loudly
//
// Every half send and every END_TRANSACTION is retried with backoff
// (WithTxRetry); when the retries are exhausted the error is kept and
// returned by every later Write, PreCommit and Commit, which fails the job.
// An open epoch whose first record is older than three quarters of the
// broker's discard window (WithDiscardWindow: transaction timeout + check
// max × check interval) is rolled back and sent again before it is
// pre-committed, so the broker never discards half messages a checkpoint
// will list (if that rollback fails, the job fails with ErrEpochTooOld). If
// a commit nevertheless finds half messages discarded (the process was
// paused past the window between pre-commit and commit), the sink sends
// those records again from memory as new half messages and commits each at
// once, in its lane before the lane's next record, so records of one key
// stay in order. After a restart it has no copy: Commit then fails with
// ErrDiscarded, naming them (they are in TRANS_CHECK_MAX_TIME_TOPIC), and
// the job cannot proceed without an operator — the one case that needs a
// pause past the window and a crash in the same commit.

// Properties of the messages ExactlyOnce sends (besides the mapper's).
const (
	// PropEpoch is the sink epoch the record was written in: the id of the
	// checkpoint whose completion commits it.
	PropEpoch = "runnel.epoch"
	// PropRun identifies the process (run) that sent the record.
	PropRun = "runnel.run"
	// PropSrcTopic, PropSrcBroker, PropSrcQueue and PropSrcOffset name the
	// input message a record derives from (see Lineage).
	PropSrcTopic  = "runnel.src.topic"
	PropSrcBroker = "runnel.src.broker"
	PropSrcQueue  = "runnel.src.queue"
	PropSrcOffset = "runnel.src.offset"
)

// Defaults of the exactly-once sink.
const (
	// DefaultCommitLanes is the number of lanes committed in parallel: at
	// most one END_TRANSACTION per lane is in flight.
	DefaultCommitLanes = 256
	// DefaultTxMaxInFlight bounds unacknowledged half sends.
	DefaultTxMaxInFlight = 1024
	// DefaultTxAttempts is how many times a half send or END_TRANSACTION is
	// tried before the sink fails.
	DefaultTxAttempts = 10
	// DefaultDiscardWindow is the Apache RocketMQ default window after which
	// an unended half message is discarded: 6 s timeout + 15 checks × 30 s.
	DefaultDiscardWindow = 6*time.Second + 15*30*time.Second
	// DefaultMaxEpochRecords bounds the records of one epoch (one
	// checkpoint interval); more fails the job (the description must fit
	// in one checkpoint value).
	DefaultMaxEpochRecords = 500_000
)

var (
	// ErrDiscarded is returned by Commit when the broker discarded half
	// messages of a durable checkpoint (they outlived its discard window)
	// and the sink has no copy to send again: those records are missing
	// from the output; the error names their message ids.
	ErrDiscarded = errors.New("rocketmq sink: half messages discarded by the broker")
	// ErrRolledBack is returned by Commit when a half message of a durable
	// checkpoint was rolled back: an invariant violation (someone else
	// answered a check-back for the sink's producer group).
	ErrRolledBack = errors.New("rocketmq sink: half message of a durable checkpoint was rolled back")
	// ErrEpochTooOld is returned when an epoch stays open or uncommitted so
	// long that the broker would discard its half messages.
	ErrEpochTooOld = errors.New("rocketmq sink: epoch approaching the broker's discard window")
	// ErrCommitOrder is returned by Commit after an earlier transaction's
	// commit failed: committing later ones first would reorder records.
	ErrCommitOrder = errors.New("rocketmq sink: an earlier transaction is not committed")
)

// Lineage names the input message an output record derives from. Its
// properties let any consumer trace a record back to its input.
type Lineage struct {
	Topic  string
	Broker string
	Queue  int32
	Offset int64
}

// LineageOf returns the lineage of a message read by source/rocketmq.
func LineageOf(m *srcmq.Message) Lineage {
	return Lineage{Topic: m.Topic, Broker: m.BrokerName, Queue: m.QueueID, Offset: m.QueueOffset}
}

// SetOn sets the lineage properties (PropSrcTopic …) on m.
func (l Lineage) SetOn(m *client.Message) {
	if m.Properties == nil {
		m.Properties = make(map[string]string, 6)
	}
	m.Properties[PropSrcTopic] = l.Topic
	m.Properties[PropSrcBroker] = l.Broker
	m.Properties[PropSrcQueue] = strconv.FormatInt(int64(l.Queue), 10)
	m.Properties[PropSrcOffset] = strconv.FormatInt(l.Offset, 10)
}

// TxGroup returns the producer group of an exactly-once sink owned by job's
// sink uid: stable across restarts, so that the broker's check-backs for
// half messages of a crashed run reach the process that restores the job.
// Characters RocketMQ does not allow in group names become '_'.
func TxGroup(job, sinkUID string) string {
	g := "runnel_tx_" + job + "_" + sinkUID
	g = strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '%' || r == '|' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, g)
	if len(g) > client.MaxGroupLength {
		g = g[:client.MaxGroupLength]
	}
	return g
}

// Phase is a point of the exactly-once protocol, reported to a phase hook
// (WithPhaseHook) for tracing and for tests that crash the process there.
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

// TxOption configures an ExactlyOnce sink.
type TxOption interface{ applyTx(*txConfig) }

type txOptionFunc func(*txConfig)

func (f txOptionFunc) applyTx(c *txConfig) { f(c) }

type txConfig struct {
	lanes          int
	maxInFlight    int
	attempts       int
	retry          backoff.Policy
	sendTimeout    time.Duration
	sendTimeoutSet bool // else each request gets the client's request timeout
	discardWindow  time.Duration
	maxEpoch       int
	log            *slog.Logger
	hook           func(p Phase, epoch uint64)
	producerOpts   []client.ProducerOption
	faults         TxFaults
}

// TxFaults injects deliberate bugs for tests that prove the exactly-once
// checks can fail. Never set them outside tests.
type TxFaults struct {
	// CommitBeforeDurable commits each epoch's half messages in PreCommit,
	// before the checkpoint that lists them is durable: a crash between the
	// two then replays records whose output is already visible.
	CommitBeforeDurable bool
}

// WithTxFaults enables test-only faults (see TxFaults).
func WithTxFaults(f TxFaults) TxOption { return txOptionFunc(func(c *txConfig) { c.faults = f }) }

// WithCommitLanes sets the number of commit lanes ended in parallel
// (default DefaultCommitLanes, at most 4096).
func WithCommitLanes(n int) TxOption { return txOptionFunc(func(c *txConfig) { c.lanes = n }) }

// WithTxMaxInFlight bounds the half sends awaiting the broker's answer
// (default DefaultTxMaxInFlight); Write blocks beyond it.
func WithTxMaxInFlight(n int) TxOption { return txOptionFunc(func(c *txConfig) { c.maxInFlight = n }) }

// WithTxRetry sets how many times each half send and END_TRANSACTION is
// tried (default DefaultTxAttempts) and the backoff between tries (zero
// Policy: 10 ms doubling to 1 s).
func WithTxRetry(attempts int, p backoff.Policy) TxOption {
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

// WithTxLogger sets the sink's logger (nil discards).
func WithTxLogger(l *slog.Logger) TxOption { return txOptionFunc(func(c *txConfig) { c.log = l }) }

// WithPhaseHook calls fn at every Phase. fn runs synchronously on the
// goroutine the phase names (see Phase) and must be safe for concurrent
// use; it may block (a test pausing there), which stalls that path.
func WithPhaseHook(fn func(p Phase, epoch uint64)) TxOption {
	return txOptionFunc(func(c *txConfig) { c.hook = fn })
}

// WithProducerOptions passes options to the sink's producer (for example
// client.WithRetries). Its selector is always client.HashBySharding and
// its check listener the sink's.
func WithProducerOptions(opts ...client.ProducerOption) TxOption {
	return txOptionFunc(func(c *txConfig) { c.producerOpts = append(c.producerOpts, opts...) })
}

// slot is one record of an epoch: its message (kept to send it again if
// the broker discarded its half message), lane and, once sent, handle.
type slot struct {
	m    *client.Message
	ep   *epochTxn
	lane uint32
	h    client.TxHandle
}

// HalfSent implements client.HalfCallback: the slot itself receives the
// outcome of its half send (no closure per record).
func (sl *slot) HalfSent(h client.TxHandle, err error) { sl.ep.onHalf(sl, h, err) }

const chunkSize = 1024

// epochTxn is the open (or sealed, not yet committed) transaction of one
// epoch. Slots live in fixed chunks so that send goroutines can fill
// theirs while Write appends.
type epochTxn struct {
	epoch  uint64
	tag    string    // epoch in decimal (PropEpoch)
	first  time.Time // first Write
	n      int
	chunks []*[chunkSize]slot
	desc   []byte   // set by PreCommit
	txn    *txnDesc // desc decoded, set by PreCommit
	cp     uint64   // checkpoint id, set by PreCommit
	// onHalf is the sink's halfSent, called with the outcome of each
	// slot's half send (connection reader goroutines).
	onHalf func(sl *slot, h client.TxHandle, err error)

	mu struct {
		sync.Mutex
		err error // first send that failed for good
	}
}

func (e *epochTxn) slot(i int) *slot { return &e.chunks[i/chunkSize][i%chunkSize] }

func (e *epochTxn) add(m *client.Message, lane uint32) int {
	if e.n%chunkSize == 0 {
		e.chunks = append(e.chunks, new([chunkSize]slot))
	}
	i := e.n
	e.n++
	s := e.slot(i)
	s.m, s.ep, s.lane = m, e, lane
	return i
}

// known states of half messages for check-back answers.
type knownState uint8

const (
	knownSealed    knownState = iota + 1 // pre-committed, checkpoint in flight
	knownDurable                         // listed by a durable checkpoint, commit pending or running
	knownCommitErr                       // durable, but this process failed to commit it
)

// ExactlyOnce is the exactly-once RocketMQ sink: a sink.TwoPhaseCommit
// whose records become visible when the checkpoint covering them is
// durable (see the protocol notes above NewExactlyOnce's options).
//
// Write, PreCommit, Commit, Abort, Recover and Close are for the sink's task
// goroutine (the runtime's contract); sends and check-back answers run on
// goroutines the sink and its producer own. The sink owns its Producer
// (closed by Close) but not the Client.
type ExactlyOnce[T any] struct {
	c      *client.Client
	p      *client.Producer
	group  string
	mapper func(T) (*client.Message, error)
	cfg    txConfig
	log    *slog.Logger
	run    string

	sem     chan struct{}  // one token per half send in flight (or being retried)
	workers sync.WaitGroup // half sends being retried (resend)

	// onHalf is s.halfSent, bound once (epochs hand it to their slots).
	onHalf func(sl *slot, h client.TxHandle, err error)

	// Task-goroutine state.
	epoch    uint64      // tag of the open epoch
	open     *epochTxn   // records written since the last PreCommit
	sealed   []*epochTxn // pre-committed, not yet committed (oldest first)
	rr       uint32      // lane of records without a key
	closed   bool
	done     map[string]bool // transactions (run/epoch) committed in this process
	inflight *commitJob      // the commit running on the committer goroutine

	fatal atomic.Pointer[error]

	mu struct {
		sync.Mutex
		restored   bool
		sealedUpTo uint64 // highest epoch of this run pre-committed
		known      map[string]knownState
	}
}

var (
	_ sink.TwoPhaseCommit[int] = (*ExactlyOnce[int])(nil)
	_ sink.AsyncCommitter      = (*ExactlyOnce[int])(nil)
)

// NewExactlyOnce returns an exactly-once sink sending mapper(v) for each
// record v, through a producer of group on c (use TxGroup(job, sinkUID):
// the group must be the sink's alone and stable across restarts). mapper
// returns a new Message for each call (the sink keeps it until the record's
// transaction is committed); its Topic is required, its ShardingKey decides
// the queue and commit lane (records with equal keys stay in order).
func NewExactlyOnce[T any](c *client.Client, group string, mapper func(T) (*client.Message, error), opts ...TxOption) (*ExactlyOnce[T], error) {
	cfg := txConfig{
		lanes: DefaultCommitLanes, maxInFlight: DefaultTxMaxInFlight, attempts: DefaultTxAttempts,
		sendTimeout: client.DefaultRequestTimeout, discardWindow: DefaultDiscardWindow, maxEpoch: DefaultMaxEpochRecords,
	}
	for _, o := range opts {
		o.applyTx(&cfg)
	}
	switch {
	case c == nil:
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOption)
	case mapper == nil:
		return nil, fmt.Errorf("%w: nil mapper", ErrInvalidOption)
	case group == "":
		return nil, fmt.Errorf("%w: empty producer group", ErrInvalidOption)
	case cfg.lanes < 1 || cfg.lanes > 4096:
		return nil, fmt.Errorf("%w: commit lanes %d outside [1, 4096]", ErrInvalidOption, cfg.lanes)
	case cfg.maxInFlight < 1 || cfg.maxInFlight > 1<<16:
		return nil, fmt.Errorf("%w: max in flight %d outside [1, 65536]", ErrInvalidOption, cfg.maxInFlight)
	case cfg.attempts < 1:
		return nil, fmt.Errorf("%w: attempts %d < 1", ErrInvalidOption, cfg.attempts)
	case cfg.sendTimeout <= 0:
		return nil, fmt.Errorf("%w: send timeout %v <= 0", ErrInvalidOption, cfg.sendTimeout)
	case cfg.discardWindow <= 0:
		return nil, fmt.Errorf("%w: discard window %v <= 0", ErrInvalidOption, cfg.discardWindow)
	case cfg.maxEpoch < 1:
		return nil, fmt.Errorf("%w: max epoch records %d < 1", ErrInvalidOption, cfg.maxEpoch)
	}
	var rb [8]byte
	_, _ = rand.Read(rb[:]) // never fails (crypto/rand panics instead)
	s := &ExactlyOnce[T]{
		c: c, group: group, mapper: mapper, cfg: cfg, log: cfg.log, run: hex.EncodeToString(rb[:]),
		sem: make(chan struct{}, cfg.maxInFlight), epoch: 1,
		done: make(map[string]bool),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mu.known = make(map[string]knownState)
	s.onHalf = s.halfSent
	popts := append(append([]client.ProducerOption(nil), cfg.producerOpts...),
		client.WithSelector(client.HashBySharding()), client.WithCheckListener(s.checkBack))
	if cfg.sendTimeoutSet {
		// Bounds each asynchronous half send (enqueue) without a context
		// per record.
		popts = append(popts, client.WithSendTimeout(cfg.sendTimeout))
	}
	p, err := client.NewProducer(c, group, popts...)
	if err != nil {
		return nil, fmt.Errorf("rocketmq sink: %w", err)
	}
	s.p = p
	return s, nil
}

// Group returns the sink's producer group.
func (s *ExactlyOnce[T]) Group() string { return s.group }

// Run returns this process's run id (PropRun of the records it sends).
func (s *ExactlyOnce[T]) Run() string { return s.run }

func (s *ExactlyOnce[T]) hook(p Phase, epoch uint64) {
	if s.cfg.hook != nil {
		s.cfg.hook(p, epoch)
	}
}

func (s *ExactlyOnce[T]) err() error {
	if e := s.fatal.Load(); e != nil {
		return *e
	}
	return nil
}

// fail records err as the sink's fatal error (the first one wins) and
// returns the fatal error.
func (s *ExactlyOnce[T]) fail(err error) error {
	s.fatal.CompareAndSwap(nil, &err)
	return s.err()
}

// attemptCtx returns the context of one request to the broker: ctx itself
// unless WithTxSendTimeout was given (the client then bounds the request
// by its own request timeout, without a timer per call).
func (s *ExactlyOnce[T]) attemptCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if !s.cfg.sendTimeoutSet {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, s.cfg.sendTimeout)
}

// noCancel is attemptCtx's cancel function when it adds no deadline (a
// package-level function: a literal in the generic method would allocate
// a closure per call).
func noCancel() {}

func txKey(run string, epoch uint64) string { return run + "/" + strconv.FormatUint(epoch, 10) }

// laneOf picks the commit lane of m: FNV-32a of its sharding key (else its
// first key), round robin for messages with neither.
func (s *ExactlyOnce[T]) laneOf(m *client.Message) uint32 {
	k := m.ShardingKey
	if k == "" && len(m.Keys) > 0 {
		k = m.Keys[0]
	}
	if k == "" {
		s.rr++
		return s.rr % uint32(s.cfg.lanes)
	}
	h := uint32(2166136261)
	for i := 0; i < len(k); i++ {
		h ^= uint32(k[i])
		h *= 16777619
	}
	return h % uint32(s.cfg.lanes)
}

// tooOld reports whether an epoch that began at first is too close to the
// broker's discard window.
func (s *ExactlyOnce[T]) tooOld(first time.Time) (time.Duration, bool) {
	if first.IsZero() {
		return 0, false
	}
	age := time.Since(first)
	return age, age > s.cfg.discardWindow*3/4
}

// Write implements sink.Sink: it maps v and sends it as a half message of
// the open epoch, asynchronously. It blocks while WithTxMaxInFlight sends
// are unanswered; it fails after a send failed for good, when the epoch is
// too old or too large, and on a mapping error.
func (s *ExactlyOnce[T]) Write(ctx context.Context, v T) error {
	if s.closed {
		return ErrClosed
	}
	if err := s.err(); err != nil {
		return err
	}
	ep := s.openEpoch()
	if err := s.refresh(ctx, ep); err != nil {
		return err
	}
	if s.inflight != nil && !ep.first.IsZero() && time.Since(ep.first) > s.cfg.discardWindow/4 {
		// The previous epoch's commit is slow (a pause, a loaded broker):
		// stop overlapping it before this epoch nears the discard window,
		// which would make it send everything again (refresh).
		if err := s.waitCommit(ctx); err != nil {
			return err
		}
	}
	if ep.n >= s.cfg.maxEpoch {
		return s.fail(fmt.Errorf("rocketmq sink: epoch %d holds more than %d records: checkpoint more often", ep.epoch, s.cfg.maxEpoch))
	}
	m, err := s.mapper(v)
	if err != nil {
		return fmt.Errorf("rocketmq sink: map record: %w", err)
	}
	if m == nil {
		return errors.New("rocketmq sink: mapper returned a nil message")
	}
	if m.Properties == nil {
		m.Properties = make(map[string]string, 2)
	}
	m.Properties[PropEpoch] = ep.tag
	m.Properties[PropRun] = s.run
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if ep.first.IsZero() {
		ep.first = time.Now()
	}
	s.enqueue(ep.slot(ep.add(m, s.laneOf(m))))
	return nil
}

// enqueue sends sl (a slot of the open or refreshed epoch) as a half
// message without waiting for the broker (Producer.SendHalfAsyncTo, the
// slot receiving the outcome: see halfSent); the caller holds a sem token
// for it, released once the half message is acknowledged or failed for
// good. The request is bounded by the producer's send timeout (the
// client's request timeout, or WithTxSendTimeout's, given to the
// producer), not by a context per record.
func (s *ExactlyOnce[T]) enqueue(sl *slot) {
	s.p.SendHalfAsyncTo(context.Background(), sl.m, sl)
}

// halfSent is the outcome of sl's first half send (a connection reader
// goroutine, or enqueue's caller when it failed early). A failed first
// attempt is retried on a goroutine of the sink (resend).
func (s *ExactlyOnce[T]) halfSent(sl *slot, h client.TxHandle, err error) {
	ep := sl.ep
	if err == nil {
		sl.h = h
		s.hook(PhaseHalfSent, ep.epoch)
		<-s.sem
		return
	}
	if s.cfg.attempts <= 1 || !retryableSend(err) {
		s.sendFailed(ep, sl, 1, err)
		return
	}
	// MaybeApplied(err): an orphan half message may exist; it is rolled
	// back by its check-back (not part of the epoch).
	s.workers.Go(func() { s.resend(ep, sl, err) })
}

// warnResend logs that attempt (1-based) of a half send of ep failed with
// err and is tried again.
func (s *ExactlyOnce[T]) warnResend(ep *epochTxn, attempt int, err error) {
	s.log.Warn("rocketmq sink: half message send failed; retrying", "group", s.group, "epoch", ep.epoch,
		"attempt", attempt, "of", s.cfg.attempts, "err", err)
}

// retryableSend reports whether a failed half send is tried again.
func retryableSend(err error) bool {
	return !errors.Is(err, client.ErrInvalidMessage) && !errors.Is(err, client.ErrClosed)
}

// resend sends sl again after its first attempt failed with err, with
// backoff, synchronously (a sink goroutine), and releases the slot's sem
// token. It touches only *sl and ep.mu.
func (s *ExactlyOnce[T]) resend(ep *epochTxn, sl *slot, err error) {
	ctx := context.Background() // bounded per attempt; the sink's retries bound the whole
	s.warnResend(ep, 1, err)
	if err = backoff.Sleep(ctx, s.cfg.retry.Delay(0)); err == nil {
		err = backoff.Retry(ctx, s.cfg.retry, s.cfg.attempts-1, retryableSend, func(i int) error {
			actx, cancel := s.attemptCtx(ctx)
			defer cancel()
			h, err := s.p.SendHalf(actx, sl.m)
			if err != nil {
				if i+2 < s.cfg.attempts && retryableSend(err) {
					s.warnResend(ep, i+2, err)
				}
				return err
			}
			sl.h = h
			return nil
		})
	}
	if err != nil {
		s.sendFailed(ep, sl, s.cfg.attempts, err)
		return
	}
	s.hook(PhaseHalfSent, ep.epoch)
	<-s.sem
}

// sendFailed records the failure of sl's half send after tries attempts
// (the sink fails) and releases the slot's sem token.
func (s *ExactlyOnce[T]) sendFailed(ep *epochTxn, sl *slot, tries int, err error) {
	err = fmt.Errorf("rocketmq sink: half message of epoch %d to %s failed after %d attempts: %w", ep.epoch, sl.m.Topic, tries, err)
	ep.mu.Lock()
	if ep.mu.err == nil {
		ep.mu.err = err
	}
	ep.mu.Unlock()
	s.fail(err)
	<-s.sem
}

// refresh replaces the half messages of the open epoch when it has been
// open for three quarters of the discard window (the process was paused,
// or a checkpoint took that long): it rolls them all back (a half message
// the broker discarded counts as rolled back) and sends the epoch's records
// again as new half messages, so that none of them can be lost to the
// broker's discard. If the rollback fails the sink fails (ErrEpochTooOld).
func (s *ExactlyOnce[T]) refresh(ctx context.Context, ep *epochTxn) error {
	age, old := s.tooOld(ep.first)
	if !old {
		return nil
	}
	if err := s.drain(ctx); err != nil {
		return err
	}
	if err := s.err(); err != nil {
		return err
	}
	s.log.Warn("rocketmq sink: epoch open too long for the broker's discard window; sending it again",
		"group", s.group, "epoch", ep.epoch, "age", age, "window", s.cfg.discardWindow, "records", ep.n)
	hs := make([]txnHandle, ep.n)
	for i := range ep.n {
		hs[i] = txnHandle{h: ep.slot(i).h, lane: ep.slot(i).lane}
	}
	if _, err := s.endAll(ctx, hs, false, nil); err != nil {
		return s.fail(fmt.Errorf("%w: epoch %d open for %v (discard window %v): rolling back its half messages: %w",
			ErrEpochTooOld, ep.epoch, age.Round(time.Millisecond), s.cfg.discardWindow, err))
	}
	ep.first = time.Now()
	for i := range ep.n {
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			return s.fail(fmt.Errorf("rocketmq sink: sending epoch %d again: %w", ep.epoch, ctx.Err()))
		}
		sl := ep.slot(i)
		sl.h = client.TxHandle{}
		s.enqueue(sl)
	}
	return nil
}

func (s *ExactlyOnce[T]) openEpoch() *epochTxn {
	if s.open == nil {
		s.open = &epochTxn{epoch: s.epoch, tag: strconv.FormatUint(s.epoch, 10), onHalf: s.onHalf}
	}
	return s.open
}

// drain waits until no half send is in flight.
func (s *ExactlyOnce[T]) drain(ctx context.Context) error { return drainSem(ctx, s.sem, "half sends") }

// PreCommit implements sink.TwoPhaseCommit: it waits until every half
// message of the open epoch is acknowledged and returns the epoch's
// transaction description for checkpoint id. Any send that failed fails
// it. A repeated call for the same id returns the same description.
func (s *ExactlyOnce[T]) PreCommit(ctx context.Context, id uint64) ([]byte, error) {
	if s.closed {
		return nil, ErrClosed
	}
	if n := len(s.sealed); n > 0 && s.sealed[n-1].cp == id {
		return s.sealed[n-1].desc, nil
	}
	if err := s.waitCommit(ctx); err != nil {
		return nil, err
	}
	if err := s.err(); err != nil {
		return nil, err
	}
	if err := s.drain(ctx); err != nil {
		return nil, err
	}
	if err := s.err(); err != nil {
		return nil, err
	}
	ep := s.openEpoch()
	if err := s.refresh(ctx, ep); err != nil {
		return nil, err
	}
	if err := s.drain(ctx); err != nil {
		return nil, err
	}
	if err := s.err(); err != nil {
		return nil, err
	}
	d := &txnDesc{checkpoint: id, run: s.run, epoch: ep.epoch, handles: make([]txnHandle, ep.n)}
	for i := range ep.n {
		sl := ep.slot(i)
		d.handles[i] = txnHandle{h: sl.h, lane: sl.lane}
	}
	ep.desc = appendTxn(make([]byte, 0, 64+48*ep.n), d)
	ep.txn, ep.cp = d, id
	s.mu.Lock()
	for i := range d.handles {
		s.mu.known[d.handles[i].h.MsgID] = knownSealed
	}
	s.mu.sealedUpTo = ep.epoch
	s.mu.Unlock()
	s.sealed = append(s.sealed, ep)
	s.open = nil
	s.epoch = max(ep.epoch, id) + 1
	if s.cfg.faults.CommitBeforeDurable {
		if _, err := s.endAll(ctx, d.handles, true, nil); err != nil {
			return nil, s.fail(err)
		}
	}
	s.hook(PhasePreCommitted, ep.epoch)
	return ep.desc, nil
}

// Commit implements sink.TwoPhaseCommit: it commits every half message of
// the transaction, lane by lane (see the package notes), and returns when
// all are committed (StartCommit, then WaitCommits). Commit is idempotent;
// after a failure that outlasted the retries the sink fails for good.
func (s *ExactlyOnce[T]) Commit(ctx context.Context, txn []byte) error {
	if err := s.StartCommit(ctx, txn); err != nil {
		return err
	}
	return s.WaitCommits(ctx)
}

// StartCommit implements sink.AsyncCommitter: it starts committing every
// half message of the transaction on a goroutine of the sink and returns,
// so that the sink goes on writing the next epoch meanwhile. The commit of
// a transaction waits for the one started before it (commits happen in
// checkpoint order). The runtime records the transaction as committed
// only after WaitCommits returned nil; until then every checkpoint still
// lists it, so a restart commits it again. Idempotent.
func (s *ExactlyOnce[T]) StartCommit(ctx context.Context, txn []byte) error {
	if s.closed {
		return ErrClosed
	}
	// The transaction of an epoch this run pre-committed is known decoded
	// (the description is compared, not decoded again).
	var ep *epochTxn
	var d *txnDesc
	for _, e := range s.sealed {
		if bytes.Equal(e.desc, txn) {
			ep, d = e, e.txn
			break
		}
	}
	if d == nil {
		var err error
		if d, err = decodeTxn(txn); err != nil {
			return err
		}
		if d.run == s.run {
			for _, e := range s.sealed {
				if e.epoch == d.epoch {
					ep = e
					break
				}
			}
		}
	}
	// The wait is bounded by the retries of the commit in flight; it
	// ignores cancellation so that a job stopping during its restore does
	// not fail for it.
	if err := s.waitCommit(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	key := txKey(d.run, d.epoch)
	if s.done[key] {
		return nil
	}
	if err := s.err(); err != nil {
		return fmt.Errorf("%w: %w", ErrCommitOrder, err)
	}
	s.mu.Lock()
	for i := range d.handles {
		s.mu.known[d.handles[i].h.MsgID] = knownDurable
	}
	s.mu.Unlock()
	job := &commitJob{key: key, ep: ep, done: make(chan struct{})}
	s.inflight = job
	go func() {
		defer close(job.done)
		job.err = s.commit(d, ep)
	}()
	return nil
}

// WaitCommits implements sink.AsyncCommitter: it waits until the commit
// in flight (if any) ended and returns its error, or the sink's failure (a
// commit that failed makes the sink fail for good, so a failure of an
// earlier commit is never missed).
// The wait ignores ctx's cancellation (it is bounded by the retries of each
// END_TRANSACTION), so that a job stopping does not abandon a commit whose
// transaction it would then list again.
func (s *ExactlyOnce[T]) WaitCommits(ctx context.Context) error {
	if s.closed {
		return ErrClosed
	}
	if err := s.waitCommit(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	return s.err()
}

// commitJob is a transaction being committed by the sink's committer
// goroutine (started by StartCommit; WaitCommits, the next StartCommit,
// PreCommit and Close wait for it).
type commitJob struct {
	key  string
	ep   *epochTxn
	done chan struct{}
	err  error // set before done is closed
}

// waitCommit waits for the commit in flight (if any) and does its
// bookkeeping on the task goroutine.
func (s *ExactlyOnce[T]) waitCommit(ctx context.Context) error {
	job := s.inflight
	if job == nil {
		return nil
	}
	select {
	case <-job.done:
	case <-ctx.Done():
		return fmt.Errorf("rocketmq sink: waiting for the commit in flight: %w", ctx.Err())
	}
	s.inflight = nil
	if job.err != nil {
		return job.err
	}
	if len(s.done) >= maxDone {
		clear(s.done) // a repeated Commit then ends its half messages again: harmless
	}
	s.done[job.key] = true
	if job.ep != nil {
		kept := s.sealed[:0]
		for _, e := range s.sealed {
			if e != job.ep {
				kept = append(kept, e)
			}
		}
		clear(s.sealed[len(kept):])
		s.sealed = kept
	}
	return nil
}

// commit ends every half message of d with commit (committer goroutine).
// ep is the epoch's memory when this run sent it (nil after a restart).
func (s *ExactlyOnce[T]) commit(d *txnDesc, ep *epochTxn) error {
	ctx := context.Background() // bounded by the retries; Close waits for it
	if ep != nil {
		s.hook(PhaseCommitStart, d.epoch)
	} else {
		s.hook(PhaseRecoverCommit, d.epoch)
	}
	var again func(ctx context.Context, i int) error
	if ep != nil && ep.n == len(d.handles) {
		var warned atomic.Bool
		again = func(ctx context.Context, i int) error {
			if !warned.Swap(true) {
				s.log.Warn("rocketmq sink: half messages discarded by the broker (paused past its discard window); sending them again in lane order",
					"group", s.group, "epoch", d.epoch)
			}
			return s.sendAgain(ctx, ep.slot(i).m)
		}
	}
	// endAll returns discarded half messages only when again is nil.
	discarded, err := s.endAll(ctx, d.handles, true, again)
	if err == nil && len(discarded) > 0 {
		err = errDiscardedNoCopy(d, discarded)
	}
	if err != nil {
		s.mu.Lock()
		for i := range d.handles {
			s.mu.known[d.handles[i].h.MsgID] = knownCommitErr
		}
		s.mu.Unlock()
		return s.fail(fmt.Errorf("rocketmq sink: commit of checkpoint %d (epoch %d, %d records): %w", d.checkpoint, d.epoch, len(d.handles), err))
	}
	s.hook(PhaseCommitEnded, d.epoch)
	s.mu.Lock()
	for i := range d.handles {
		delete(s.mu.known, d.handles[i].h.MsgID)
	}
	s.mu.Unlock()
	return nil
}

// maxDone bounds the memory of committed transactions.
const maxDone = 1024

// Flush implements sink.Sink. The runtime calls PreCommit instead on
// two-phase-commit sinks; Flush only waits for the half sends in flight and
// reports a failed one.
func (s *ExactlyOnce[T]) Flush(ctx context.Context) error {
	if s.closed {
		return ErrClosed
	}
	if err := s.drain(ctx); err != nil {
		return err
	}
	if err := s.waitCommit(ctx); err != nil {
		return err
	}
	return s.err()
}

// errDiscardedHalf marks an END_TRANSACTION refused because the broker
// discarded the half message.
var errDiscardedHalf = errors.New("half message discarded")

// endOne ends one half message with retries. It returns errDiscardedHalf
// when the broker discarded it.
func (s *ExactlyOnce[T]) endOne(ctx context.Context, h *client.TxHandle, commit bool) error {
	return s.endRetry(ctx, h, commit, s.endAttempt(ctx, h, commit))
}

// endAttempt sends one END_TRANSACTION for h and classifies its error.
func (s *ExactlyOnce[T]) endAttempt(ctx context.Context, h *client.TxHandle, commit bool) error {
	actx, cancel := s.attemptCtx(ctx)
	defer cancel()
	return classifyEnd(s.p.EndTransaction(actx, *h, commit), h, commit)
}

// classifyEnd names the broker's refusals of an END_TRANSACTION of h that
// no retry can change: errDiscardedHalf, ErrRolledBack (commit of a
// rolled-back half message), abort of a committed one.
func classifyEnd(err error, h *client.TxHandle, commit bool) error {
	var pe *protocol.Error
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	switch {
	case strings.Contains(pe.Remark, "ended with discard"):
		return errDiscardedHalf
	case commit && strings.Contains(pe.Remark, "ended with rollback"):
		return fmt.Errorf("%w: %s: %w", ErrRolledBack, h.MsgID, err)
	case !commit && strings.Contains(pe.Remark, "ended with commit"):
		return fmt.Errorf("rocketmq sink: abort of committed half message %s: %w", h.MsgID, err)
	}
	return err
}

// endRetry retries ending h after a first attempt that ended with err
// (classified), with backoff, up to the configured attempts in all.
func (s *ExactlyOnce[T]) endRetry(ctx context.Context, h *client.TxHandle, commit bool, err error) error {
	for i := 1; i < s.cfg.attempts && err != nil; i++ {
		if errors.Is(err, errDiscardedHalf) || errors.Is(err, ErrRolledBack) || errors.Is(err, client.ErrClosed) || ctx.Err() != nil {
			return err
		}
		s.log.Warn("rocketmq sink: END_TRANSACTION failed; retrying", "group", s.group, "msgId", h.MsgID,
			"commit", commit, "attempt", i, "of", s.cfg.attempts, "err", err)
		if backoff.Sleep(ctx, s.cfg.retry.Delay(i-1)) != nil {
			return err
		}
		err = s.endAttempt(ctx, h, commit)
	}
	return err
}

// endState is the outcome of an endAll, shared by its lanes.
type endState struct {
	cancel    context.CancelFunc
	mu        sync.Mutex
	firstErr  error
	discarded []int
}

func (e *endState) failed(err error) {
	e.mu.Lock()
	if e.firstErr == nil {
		e.firstErr = err
	}
	e.mu.Unlock()
	e.cancel()
}

// endAnswer is an answered END_TRANSACTION of endAll's pipeline.
type endAnswer struct {
	lane uint32
	err  error
}

// endQueue collects the answers of endAll's pipelined END_TRANSACTIONs
// (connection reader goroutines) for the goroutine driving it.
type endQueue struct {
	mu      sync.Mutex
	answers []endAnswer
	wake    chan struct{} // one token: answers is not empty
	failed  atomic.Bool   // an answer was an error
}

func (q *endQueue) put(lane uint32, err error) {
	if err != nil {
		q.failed.Store(true)
	}
	q.mu.Lock()
	q.answers = append(q.answers, endAnswer{lane: lane, err: err})
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// endAll ends every handle, lanes in parallel, each lane in order: one
// END_TRANSACTION per lane is in flight at a time (pipelined on the broker
// connection, answered on its reader goroutine), and a lane's next is sent
// once the previous one is answered, so a broker that processes requests
// in parallel still ends a lane in write order. A lane whose
// END_TRANSACTION fails goes on, from that handle, on a goroutine of its
// own that retries with backoff. When a commit finds a half message
// discarded by the broker, again (when not nil) sends its record again and
// commits it right there, before the lane's next handle, so that records of
// one key stay in order; without again it returns the indexes of discarded
// half messages (commit only).
func (s *ExactlyOnce[T]) endAll(ctx context.Context, hs []txnHandle, commit bool, again func(ctx context.Context, i int) error) ([]int, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	// Handles by lane, in order (a counting sort): lane l's are
	// order[start[l]:start[l+1]]. Lanes of a decoded description may
	// exceed the configured count (it may have changed since).
	nl := uint32(0)
	for i := range hs {
		nl = max(nl, hs[i].lane+1)
	}
	start := make([]int32, nl+1)
	for i := range hs {
		start[hs[i].lane+1]++
	}
	for l := uint32(1); l <= nl; l++ {
		start[l] += start[l-1]
	}
	next := make([]int32, nl) // per lane, the position of its next handle
	copy(next, start[:nl])
	order := make([]int32, len(hs))
	for i := range hs {
		l := hs[i].lane
		order[next[l]] = int32(i)
		next[l]++
	}
	copy(next, start[:nl])

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := &endState{cancel: cancel}
	q := &endQueue{wake: make(chan struct{}, 1)}
	// The pipelined requests are not cancelled with ctx (that would cost a
	// context.AfterFunc each): after a failure no new one is sent, and
	// those in flight end with their answer or the request timeout.
	rctx := context.WithoutCancel(ctx)
	var cancels []context.CancelFunc
	if s.cfg.sendTimeoutSet {
		cancels = make([]context.CancelFunc, nl)
	}
	cbs := make([]func(error), nl)
	inflight := 0
	var lanes sync.WaitGroup // lanes handed over after a failed END_TRANSACTION
	// send sends lane l's next END_TRANSACTION, or, once one of them
	// failed (the broker may be gone, and a send waits here for its
	// connection: a dial window each, one lane after another), hands the
	// rest of the lane, in order, to a goroutine of its own, as a failed
	// lane is.
	send := func(l uint32) {
		if q.failed.Load() {
			rest := order[next[l]:start[l+1]]
			lanes.Go(func() { s.endLane(ctx, hs, rest, commit, again, nil, st) })
			return
		}
		if cbs[l] == nil {
			cbs[l] = func(err error) { q.put(l, err) }
		}
		actx := rctx
		if cancels != nil {
			actx, cancels[l] = context.WithTimeout(rctx, s.cfg.sendTimeout)
		}
		inflight++
		s.p.EndTransactionAsync(actx, hs[order[next[l]]].h, commit, cbs[l])
	}
	for l := range nl {
		if start[l] < start[l+1] {
			send(l)
		}
	}
	var spare []endAnswer
	stopped := false
	for inflight > 0 {
		<-q.wake
		q.mu.Lock()
		answers := q.answers
		q.answers = spare[:0]
		q.mu.Unlock()
		for _, a := range answers {
			inflight--
			l := a.lane
			if cancels != nil {
				cancels[l]()
			}
			if a.err != nil {
				rest, first := order[next[l]:start[l+1]], classifyEnd(a.err, &hs[order[next[l]]].h, commit)
				lanes.Go(func() { s.endLane(ctx, hs, rest, commit, again, first, st) })
				continue
			}
			next[l]++
			if next[l] < start[l+1] {
				if ctx.Err() != nil {
					stopped = true
					continue
				}
				send(l)
			}
		}
		spare = answers
	}
	lanes.Wait()
	st.mu.Lock()
	defer st.mu.Unlock()
	if stopped && st.firstErr == nil {
		// Lanes left unfinished by ctx's end, not by a failure.
		st.firstErr = fmt.Errorf("rocketmq sink: ending half messages: %w", ctx.Err())
	}
	return st.discarded, st.firstErr
}

// endLane ends the handles idx of one lane in order, synchronously with
// retries, the first of them after an attempt that failed with failed (nil:
// none was made).
func (s *ExactlyOnce[T]) endLane(ctx context.Context, hs []txnHandle, idx []int32, commit bool, again func(ctx context.Context, i int) error, failed error, st *endState) {
	for k, i := range idx {
		var err error
		if k == 0 && failed != nil {
			err = s.endRetry(ctx, &hs[i].h, commit, failed)
		} else {
			err = s.endOne(ctx, &hs[i].h, commit)
		}
		if errors.Is(err, errDiscardedHalf) && commit && again != nil {
			err = again(ctx, int(i))
		}
		if errors.Is(err, errDiscardedHalf) && commit {
			st.mu.Lock()
			st.discarded = append(st.discarded, int(i))
			st.mu.Unlock()
			continue
		}
		if err != nil {
			st.failed(err)
			return
		}
	}
}

// errDiscardedNoCopy is the error of a commit that found half messages
// discarded and has no copy of their records (the epoch was sent by an
// earlier run): an operator must act (see ErrDiscarded).
func errDiscardedNoCopy(d *txnDesc, discarded []int) error {
	ids := make([]string, 0, min(len(discarded), 20))
	for _, i := range discarded[:min(len(discarded), 20)] {
		ids = append(ids, d.handles[i].h.MsgID)
	}
	return fmt.Errorf("%w: %d of checkpoint %d (epoch %d of run %s), no copy in this process; first ids %s (see TRANS_CHECK_MAX_TIME_TOPIC)",
		ErrDiscarded, len(discarded), d.checkpoint, d.epoch, d.run, strings.Join(ids, ","))
}

// sendAgain sends m (the record of a discarded half message) as a new half
// message and commits it at once.
func (s *ExactlyOnce[T]) sendAgain(ctx context.Context, m *client.Message) error {
	var h client.TxHandle
	err := backoff.Retry(ctx, s.cfg.retry, s.cfg.attempts, nil, func(int) error {
		actx, cancel := s.attemptCtx(ctx)
		defer cancel()
		var err error
		h, err = s.p.SendHalf(actx, m)
		return err
	})
	if err != nil {
		return fmt.Errorf("rocketmq sink: sending a discarded record again: %w", err)
	}
	if err := s.endOne(ctx, &h, true); err != nil {
		return fmt.Errorf("rocketmq sink: committing a discarded record sent again: %w", err)
	}
	return nil
}

// Abort implements sink.TwoPhaseCommit: it rolls back every half message
// of the transaction (idempotent).
func (s *ExactlyOnce[T]) Abort(ctx context.Context, txn []byte) error {
	if s.closed {
		return ErrClosed
	}
	d, err := decodeTxn(txn)
	if err != nil {
		return err
	}
	if err := s.waitCommit(ctx); err != nil {
		return err
	}
	if _, err := s.endAll(ctx, d.handles, false, nil); err != nil {
		return fmt.Errorf("rocketmq sink: abort of checkpoint %d: %w", d.checkpoint, err)
	}
	s.mu.Lock()
	for i := range d.handles {
		delete(s.mu.known, d.handles[i].h.MsgID)
	}
	s.mu.Unlock()
	return nil
}

// Recover implements sink.TwoPhaseCommit: it learns the transactions the
// latest completed checkpoint lists (the runtime commits them next) and
// starts answering check-backs. It does not search the broker for other
// half messages: those are rolled back by their check-backs.
func (s *ExactlyOnce[T]) Recover(_ context.Context, pending [][]byte) error {
	if s.closed {
		return ErrClosed
	}
	var maxCP uint64
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range pending {
		d, err := decodeTxn(b)
		if err != nil {
			return err
		}
		maxCP = max(maxCP, d.checkpoint)
		for i := range d.handles {
			s.mu.known[d.handles[i].h.MsgID] = knownDurable
		}
	}
	// The latest checkpoint always lists this sink's transaction (possibly
	// empty), so the next epoch is its id + 1.
	if s.open == nil || s.open.n == 0 {
		s.epoch = max(s.epoch, maxCP+1)
		s.open = nil
	}
	s.mu.restored = true
	return nil
}

// checkBack answers the broker's check-back of a half message of the
// sink's group (see the package notes).
func (s *ExactlyOnce[T]) checkBack(_ context.Context, m *protocol.MessageExt) client.TxState {
	run, _ := m.Property(PropRun)
	ep, _ := m.Property(PropEpoch)
	epoch, _ := strconv.ParseUint(ep, 10, 64)
	s.hook(PhaseCheckBack, epoch)
	st := s.decide(run, epoch, m.UniqKey())
	s.log.Debug("rocketmq sink: check-back", "group", s.group, "msgId", m.UniqKey(), "run", run, "epoch", epoch, "answer", st)
	return st
}

func (s *ExactlyOnce[T]) decide(run string, epoch uint64, msgID string) client.TxState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mu.restored {
		return client.TxUnknown
	}
	if k, ok := s.mu.known[msgID]; ok {
		if k == knownCommitErr {
			return client.TxCommit
		}
		return client.TxUnknown
	}
	if run == s.run && epoch > s.mu.sealedUpTo {
		return client.TxUnknown // the open epoch
	}
	return client.TxRollback
}

// Close implements sink.Sink: it waits (up to the send timeout plus a few
// seconds) for half sends in flight and for the commit in flight, closes
// the producer, and returns the sink's failure if it failed. Uncommitted
// half messages stay on the broker for the next run (or its check-backs).
// Idempotent.
func (s *ExactlyOnce[T]) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.sendTimeout+closeWait)
	defer cancel()
	err := s.drain(ctx)
	if err == nil {
		s.workers.Wait() // no token held: every resend is returning
	}
	if job := s.inflight; job != nil {
		<-job.done // bounded by the retries of each END_TRANSACTION
		err = errors.Join(err, s.waitCommit(ctx))
	}
	if err == nil {
		err = s.err() // a failure the runtime may not have seen yet (a background commit)
	}
	return errors.Join(err, s.p.Close())
}
