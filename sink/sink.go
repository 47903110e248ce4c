// Package sink defines runnel's sink contracts and the basic sinks (Stdout,
// Func, KV).
//
// # Contracts
//
// A Sink[T] receives records through Write and is flushed at every checkpoint
// barrier: once Flush returns, everything written before it must be durable
// or visible downstream. Combined with replay after a crash this gives
// at-least-once output, and exactly-once effect when writes are idempotent
// (see KV).
//
// A TwoPhaseCommit[T] sink gives exactly-once output on a transactional
// system. Records of epoch n (between barriers n-1 and n) go into an open
// transaction; at barrier n the runtime calls PreCommit, which seals the
// transaction and returns an opaque description that the runtime stores in
// checkpoint n. Only after checkpoint n is durable does the runtime call
// Commit for it. Commit must be idempotent and tolerate skipped
// notifications: after a crash the runtime calls Recover with every pending
// transaction of the latest completed checkpoint and then Commit for each of
// them again, so a transaction may be committed twice, or committed by a new
// process that never saw PreCommit. If a checkpoint fails, its pre-committed
// transactions stay pending and are committed with the next checkpoint that
// completes (their records are not replayed). Abort is called for
// transactions the runtime knows will never be committed.
//
// A TwoPhaseCommit sink that also implements AsyncCommitter has its commits
// taken off the job's critical path: after checkpoint n is durable the
// runtime calls StartCommit instead of Commit and goes on handing the sink
// the records of the next epoch while the transaction commits. It calls
// WaitCommits at the next barrier, before that barrier's PreCommit, and
// when the job ends; only when WaitCommits returned nil does the runtime
// record the transactions started before it as committed (so the next
// checkpoint no longer lists them). Until then they stay pending in every
// checkpoint, so a crash at any point commits them again on restore. If
// WaitCommits fails, they stay pending and are started again after the
// next completed checkpoint, like a failed Commit.
//
// The runtime calls every method of a sink from one goroutine (the sink's
// task), so implementations need no locking of their own unless they share
// state with other goroutines.
package sink

import (
	"context"
	"errors"
	"time"
)

// Sink is a checkpoint-aware output. Write and Flush may block (backpressure
// reaches the job) and must honour ctx.
type Sink[T any] interface {
	// Write hands one record to the sink.
	Write(ctx context.Context, v T) error
	// Flush makes every record written so far durable or visible. The
	// runtime calls it at each checkpoint barrier and before a graceful stop.
	// TwoPhaseCommit sinks get PreCommit instead.
	Flush(ctx context.Context) error
	// Close releases the sink; it is called once, after the last Flush or
	// Commit.
	Close() error
}

// TwoPhaseCommit is a Sink whose output becomes visible only when the
// checkpoint covering it is durable. See the package documentation for the
// protocol.
type TwoPhaseCommit[T any] interface {
	Sink[T]
	// PreCommit seals the records written since the previous PreCommit into a
	// transaction for checkpointID and returns its opaque description (kept
	// in the checkpoint, at most a few KiB). It is called at the barrier.
	PreCommit(ctx context.Context, checkpointID uint64) ([]byte, error)
	// Commit makes a pre-committed transaction visible. It must be
	// idempotent: committing an already committed transaction succeeds.
	Commit(ctx context.Context, txn []byte) error
	// Abort discards a pre-committed transaction that will never be
	// committed. It must be idempotent.
	Abort(ctx context.Context, txn []byte) error
	// Recover is called once on restore, before any Write, with the pending
	// transactions of the latest completed checkpoint (the runtime commits
	// them right after). The sink should abort any other transaction it left
	// open in an earlier run.
	Recover(ctx context.Context, pending [][]byte) error
}

// DeadLetter is a record that could not be processed: it failed to decode,
// failed validation, or a user function failed on it (after retries). The
// pipeline routes it to the dead-letter sink of the policy in force.
type DeadLetter struct {
	// Source is the UID of the source the record came from.
	Source string
	// Operator is the UID of the operator that rejected the record (the
	// source's UID for decode and validation failures).
	Operator string
	// Split is the split the record was read from (empty when unknown).
	Split string
	// Offset is the split position after the record, in the source's
	// encoding (nil when unknown).
	Offset []byte
	// Raw is the record's original bytes when the source provided them.
	Raw []byte
	// Value is a textual rendering of the record when Raw is absent.
	Value string
	// Reason is the error text.
	Reason string
	// Time is when the record was rejected.
	Time time.Time
}

// AsyncCommitter is implemented by TwoPhaseCommit sinks whose commits may
// run in the background while the sink receives the next epoch's records
// (see the package documentation for when the runtime calls what).
type AsyncCommitter interface {
	// StartCommit starts committing a pre-committed transaction, with
	// Commit's guarantees (idempotent, tolerant of skipped and repeated
	// notifications), and may return before it is committed. Transactions
	// are committed in the order they were started.
	StartCommit(ctx context.Context, txn []byte) error
	// WaitCommits waits until every transaction started so far is
	// committed, and reports the first commit that failed.
	WaitCommits(ctx context.Context) error
}

// RestoreChecker is implemented by TwoPhaseCommit sinks that can tell
// whether they already committed output past a checkpoint. When a job is
// restored from a retained checkpoint or savepoint that is not its latest
// (pipeline.RestoreFrom), the records after that point are processed
// again, and a transactional sink would write their output a second time.
// Before Recover the runtime calls CheckRestore, which must fail
// (wrapping ErrOutputAhead, saying what it found) when the sink's
// committed output holds records of transactions after the restored
// point; the job then fails instead of duplicating output. A sink that
// does not implement it gets a warning in the job's log.
type RestoreChecker interface {
	CheckRestore(ctx context.Context, p RestorePoint) error
}

// RestorePoint is the checkpoint a job is being restored from, as a
// RestoreChecker sees it.
type RestorePoint struct {
	// CheckpointID is the restored checkpoint's id in the run that took it.
	CheckpointID uint64
	// Time is when it was taken.
	Time time.Time
	// Pending are the sink's transactions it lists (what PreCommit
	// returned for it and earlier checkpoints not yet known to be
	// committed).
	Pending [][]byte
}

// ErrOutputAhead is returned (wrapped) by RestoreChecker.CheckRestore when
// the sink committed output after the restore point: restoring it would
// write that output again.
var ErrOutputAhead = errors.New("sink: output already committed past the restore point")
