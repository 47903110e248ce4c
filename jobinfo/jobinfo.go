// Package jobinfo is how a job tells its sources and sinks who they are, so
// that users do not retype what the job already knows: the job's name, the
// operator's UID and the job's state directory. From them a source or sink
// derives its consumer and producer groups, its client instance name and
// its transaction group, keeping any explicit override the user gave.
//
// The pipeline calls Bind on every source and sink that implements Binder
// once, when the job runs, before anything is restored or opened. It is a
// leaf package (standard library only) so that sources, sinks and the
// pipeline can all import it.
package jobinfo

// Info describes a source's or sink's place in a job.
type Info struct {
	// Job is the job's name (pipeline.New's name). Every worker process of
	// one job has the same Job.
	Job string
	// UID is the UID of the operator the source or sink belongs to (for a
	// dead-letter sink, the UID its policy was given).
	UID string
	// StateDir is the job's checkpoint directory ("" for a job without
	// checkpoints). It is per worker process: it names this process's
	// state, not the job's.
	StateDir string
	// Scaleout is set when the job runs as one task of a job on many
	// workers (pipeline.RunWorker).
	Scaleout *Scaleout
}

// Binder is implemented by sources and sinks that take their identity from
// the job. Bind is called once, before Open, Recover or the first Write; it
// must not block or do I/O, and an error fails the job's Run with it.
type Binder interface {
	Bind(info Info) error
}

// Scaleout describes the scale-out task (pipeline.RunWorker) a source or
// sink belongs to; Info.Scaleout is nil for a job that runs in one
// process. Every task has its own sources and sinks.
type Scaleout struct {
	// Task is the task's id; OwnerEpoch this worker's owner epoch of it.
	// What the task writes is tagged with both (and with the epoch: the id
	// of the checkpoint that completes it).
	Task       string
	OwnerEpoch uint64
	// Chains answers from the job's commit chains, for any task, whether
	// what it wrote counts. Sinks answer the broker's transaction
	// check-backs with it: the broker asks any producer of a group, so any
	// worker may be asked about any task's half messages.
	Chains Chains
}

// Verdict is whether what a task wrote under (owner epoch, epoch) counts.
type Verdict uint8

const (
	// Undecided: no valid checkpoint of the task covers the epoch yet (ask
	// again later).
	Undecided Verdict = iota
	// Valid: it counts: the task's valid checkpoint covering the epoch is
	// that owner epoch's.
	Valid
	// Invalid: it never will (another owner's checkpoint covers the epoch,
	// or a newer owner fenced that one).
	Invalid
)

// Chains is a view of a job's commit chains. It is safe for concurrent
// use.
type Chains interface {
	// Decide says whether what task wrote under (ownerEpoch, epoch)
	// counts. An error means the chain cannot tell (a truncated chain):
	// treat it as Undecided and report it.
	Decide(task string, ownerEpoch, epoch uint64) (Verdict, error)
	// SinkInfo returns what sink attached to its transaction of task's
	// epoch when that epoch's checkpoint was published (see TxnInfoer);
	// ok is false when the chains do not remember one.
	SinkInfo(task, sink string, epoch uint64) (info []byte, ok bool)
}

// TxnInfoer is implemented by two-phase-commit sinks that take part in
// scale-out: when a task publishes a checkpoint, the sink's transaction
// description (what PreCommit returned) is summarised by TxnInfo into the
// few bytes any worker needs to answer check-backs for it (for RocketMQ
// transactions: which half messages are orphans of uncertain sends). It
// must be a pure function of txn.
type TxnInfoer interface {
	TxnInfo(txn []byte) ([]byte, error)
}
