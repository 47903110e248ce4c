// Package failpoint holds runnel's deliberate defects and delays: the
// faults that the control variants of the exactly-once crash tests inject
// to prove that their oracles can fail, and the delays that land a crash in
// a narrow window. They are compiled in only with the failpoints build tag
// (`make test` sets it; a production build does not): without it Enabled
// is false, every branch on a fault is dead code the compiler removes, and
// the options that set them (pipeline.InjectFaults,
// pipeline.InjectScaleoutFaults, rocketmq.WithTxFaults,
// rocketmq.WithPhaseHook, postgres.WithFaults) do not exist. This follows
// Pebble's invariants build tag.
package failpoint

import "time"

// Pipeline are defects of a job's checkpoints.
type Pipeline struct {
	// OffsetsBeforeState makes source tasks checkpoint the offset they had
	// BEFORE their last processed batch, so checkpointed state runs ahead of
	// checkpointed offsets and a restore processes some records twice.
	OffsetsBeforeState bool
	// AsyncDropInFlight makes async I/O operators checkpoint no requests
	// in flight, so a restore loses the records whose results were not
	// emitted before the checkpoint's barrier.
	AsyncDropInFlight bool
}

// Scaleout are defects of pipeline.RunWorker's protocol.
type Scaleout struct {
	// ReadUncommitted: keyed stages take repartition batches whether or not
	// their origin's commit chain says they count.
	ReadUncommitted bool
	// SkipConfirm: a task's published checkpoint counts without reading
	// its commit chain back, so a fenced owner goes on committing.
	SkipConfirm bool
	// KeepLostLocks: a task whose broker queue lock was lost (refused at
	// renewal to another member, or lapsed) goes on running and publishing
	// instead of stopping before its next commit.
	KeepLostLocks bool
}

// Tx are defects of the exactly-once RocketMQ sink (sink/rocketmq).
type Tx struct {
	// CommitBeforeDurable commits each epoch's half messages in PreCommit,
	// before the checkpoint that lists them is durable: a crash between the
	// two then replays records whose output is already visible.
	CommitBeforeDurable bool
	// BlindRestoreCommit makes a restore commit every half message of the
	// restored checkpoint again, without looking for those the crashed run
	// committed: Apache RocketMQ's broker then stores them twice.
	BlindRestoreCommit bool
	// LoseEndAnswers reports the first n END_TRANSACTION commits the
	// broker acknowledged as failed with an unknown outcome (an answer
	// lost after the broker applied the commit).
	LoseEndAnswers int
	// BlindEndRetry sends a commit whose answer was lost again without
	// looking whether the broker applied it: Apache RocketMQ's broker then
	// stores it twice.
	BlindEndRetry bool
}

// Postgres are defects and delays of the two-phase-commit PostgreSQL sink
// (sink/postgres).
type Postgres struct {
	// CommitEarly commits each transaction right after preparing it, before
	// the checkpoint that lists it is durable: a crash then duplicates rows.
	CommitEarly bool
	// PrepareDelay waits after PREPARE TRANSACTION before PreCommit returns
	// (a crash then leaves a prepared transaction no checkpoint lists).
	PrepareDelay time.Duration
	// CommitDelay waits before COMMIT PREPARED (a crash then leaves a
	// prepared transaction the latest checkpoint lists).
	CommitDelay time.Duration
}
