package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/jobinfo"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// Properties of the messages ExactlyOnce sends (besides the mapper's).
const (
	// PropEpoch is the sink epoch the record was written in: the id of the
	// checkpoint whose completion commits it.
	PropEpoch = "runnel.epoch"
	// PropRun identifies the process (run) that sent the record.
	PropRun = "runnel.run"
	// PropTask and PropOwner name the scale-out task whose sink sent the
	// record and that task's owner epoch (pipeline.RunWorker only).
	PropTask  = "runnel.task"
	PropOwner = "runnel.owner"
	// propSlot and propTry are a scale-out record's index in its epoch and
	// the send attempt (1-based) of this half message.
	propSlot = "runnel.slot"
	propTry  = "runnel.try"
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
	// DefaultRestoreSettle is how long a restore waits, after its barrier,
	// for END_TRANSACTIONs of a crashed run that the broker took but had
	// not stored yet (WithRestoreSettle).
	DefaultRestoreSettle = 500 * time.Millisecond
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
	// ErrNoTxGroup is returned by every method of an ExactlyOnce sink that
	// has no producer group: it was given no WithTxGroup and was not bound
	// to a job (Bind).
	ErrNoTxGroup = errors.New("rocketmq sink: no transaction producer group (add the sink to a pipeline, which binds it, or give WithTxGroup)")
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
// Characters RocketMQ does not allow in group names become '_'. It is the
// group Bind derives; WithTxGroup(TxGroup(job, uid)) names it explicitly.
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

// ExactlyOnce is the exactly-once RocketMQ sink: a sink.TwoPhaseCommit
// whose records become visible when the checkpoint covering them is
// durable (see the package documentation). It maps each record to a
// message and hands it to its transaction engine, which knows nothing of T.
//
// Write, PreCommit, Commit, StartCommit, WaitCommits, Abort, Recover and
// Close are for the sink's task goroutine (the runtime's contract), Bind for
// the pipeline before any of them; sends and check-back answers run on
// goroutines the sink and its producer own. The sink owns its Producer
// (closed by Close) but not the Client.
type ExactlyOnce[T any] struct {
	e      *txEngine
	mapper func(T) (*client.Message, error)
}

var (
	_ sink.TwoPhaseCommit[int] = (*ExactlyOnce[int])(nil)
	_ sink.AsyncCommitter      = (*ExactlyOnce[int])(nil)
	_ jobinfo.Binder           = (*ExactlyOnce[int])(nil)
	_ jobinfo.TxnInfoer        = (*ExactlyOnce[int])(nil)
)

// NewExactlyOnce returns an exactly-once sink sending mapper(v) for each
// record v through a transactional producer on c. The producer's group is
// WithTxGroup's, or else the one Bind derives from the job (TxGroup(job,
// operator UID)); without either the sink fails at its first use with
// ErrNoTxGroup. mapper returns a new Message for each call (the sink keeps
// it until the record's transaction is committed); its Topic is required,
// its ShardingKey decides the queue and commit lane (records with equal
// keys stay in order).
func NewExactlyOnce[T any](c *client.Client, mapper func(T) (*client.Message, error), opts ...TxOption) (*ExactlyOnce[T], error) {
	switch {
	case c == nil:
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOption)
	case mapper == nil:
		return nil, fmt.Errorf("%w: nil mapper", ErrInvalidOption)
	}
	e, err := newTxEngine(c, opts)
	if err != nil {
		return nil, err
	}
	return &ExactlyOnce[T]{e: e, mapper: mapper}, nil
}

// Bind implements jobinfo.Binder: unless WithTxGroup named the producer
// group, the sink's group becomes TxGroup(info.Job, info.UID), the name
// earlier versions had users pass, so existing checkpoints and brokers keep
// working. Bind does no I/O. A repeated Bind deriving the same group is a
// no-op; one deriving another fails.
func (s *ExactlyOnce[T]) Bind(info jobinfo.Info) error { return s.e.bind(info) }

// TxnInfo implements jobinfo.TxnInfoer: the half messages of txn's epoch
// that were sent again after an uncertain attempt, and the attempt the
// broker acknowledged, so that any worker of a scale-out job rolls back the
// orphans of the other attempts and commits the rest.
func (s *ExactlyOnce[T]) TxnInfo(txn []byte) ([]byte, error) { return txnInfo(txn) }

// Group returns the sink's producer group ("" while it has none).
func (s *ExactlyOnce[T]) Group() string { return s.e.group }

// Run returns this process's run id (PropRun of the records it sends).
func (s *ExactlyOnce[T]) Run() string { return s.e.run }

// Write implements sink.Sink: it maps v and sends it as a half message of
// the open epoch, asynchronously. It blocks while WithTxMaxInFlight sends
// are unanswered; it fails after a send failed for good, when the epoch is
// too old or too large, and on a mapping error.
func (s *ExactlyOnce[T]) Write(ctx context.Context, v T) error {
	if err := s.e.beforeWrite(ctx); err != nil {
		return err
	}
	m, err := s.mapper(v)
	if err != nil {
		return fmt.Errorf("rocketmq sink: map record: %w", err)
	}
	return s.e.write(ctx, m)
}

// Flush implements sink.Sink. The runtime calls PreCommit instead on
// two-phase-commit sinks; Flush only waits for the half sends in flight and
// for the commit in flight, and reports a failed one.
func (s *ExactlyOnce[T]) Flush(ctx context.Context) error { return s.e.flush(ctx) }

// PreCommit implements sink.TwoPhaseCommit: it waits until every half
// message of the open epoch is acknowledged and returns the epoch's
// transaction description for checkpoint id. Any send that failed fails
// it. A repeated call for the same id returns the same description.
func (s *ExactlyOnce[T]) PreCommit(ctx context.Context, id uint64) ([]byte, error) {
	return s.e.preCommit(ctx, id)
}

// Commit implements sink.TwoPhaseCommit: it commits every half message of
// the transaction, lane by lane (see the package documentation), and
// returns when all are committed (StartCommit, then WaitCommits). Commit is
// idempotent; after a failure that outlasted the retries the sink fails for
// good.
func (s *ExactlyOnce[T]) Commit(ctx context.Context, txn []byte) error {
	if err := s.e.startCommit(ctx, txn); err != nil {
		return err
	}
	return s.e.waitCommits(ctx)
}

// StartCommit implements sink.AsyncCommitter: it starts committing every
// half message of the transaction on a goroutine of the sink and returns,
// so that the sink goes on writing the next epoch meanwhile. The commit of
// a transaction waits for the one started before it (commits happen in
// checkpoint order). The runtime records the transaction as committed
// only after WaitCommits returned nil; until then every checkpoint still
// lists it, so a restart commits it again. Idempotent.
func (s *ExactlyOnce[T]) StartCommit(ctx context.Context, txn []byte) error {
	return s.e.startCommit(ctx, txn)
}

// WaitCommits implements sink.AsyncCommitter: it waits until the commit
// in flight (if any) ended and returns its error, or the sink's failure (a
// commit that failed makes the sink fail for good, so a failure of an
// earlier commit is never missed).
// The wait ignores ctx's cancellation (it is bounded by the retries of each
// END_TRANSACTION), so that a job stopping does not abandon a commit whose
// transaction it would then list again.
func (s *ExactlyOnce[T]) WaitCommits(ctx context.Context) error { return s.e.waitCommits(ctx) }

// Abort implements sink.TwoPhaseCommit: it rolls back every half message
// of the transaction (idempotent).
func (s *ExactlyOnce[T]) Abort(ctx context.Context, txn []byte) error { return s.e.abort(ctx, txn) }

// Recover implements sink.TwoPhaseCommit: it learns the transactions the
// latest completed checkpoint lists (the runtime commits them next) and
// starts answering check-backs. It does not search the broker for other
// half messages: those are rolled back by their check-backs.
func (s *ExactlyOnce[T]) Recover(ctx context.Context, pending [][]byte) error {
	return s.e.recover(ctx, pending)
}

// Close implements sink.Sink: it waits (up to the send timeout plus a few
// seconds) for half sends in flight and for the commit in flight, closes
// the producer, and returns the sink's failure if it failed. Uncommitted
// half messages stay on the broker for the next run (or its check-backs).
// Idempotent.
func (s *ExactlyOnce[T]) Close() error { return s.e.close() }
