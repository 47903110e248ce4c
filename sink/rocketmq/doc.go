// Package rocketmq holds runnel's RocketMQ sinks: ExactlyOnce, the
// exactly-once sink, whose records become visible when the checkpoint
// covering them is durable (transactional half messages ended after the
// checkpoint); Sink, an at-least-once sink that maps each record to a
// message and sends it asynchronously; and NewDeadLetter, a Sink of
// pipeline dead letters to a dead-letter topic.
//
// # At-least-once delivery (Sink)
//
// Write maps the record and sends it with Producer.SendAsync, with at most
// WithMaxInFlight sends unanswered (Write blocks, honouring ctx, when that
// many are). Flush, which the runtime calls at every checkpoint barrier,
// waits for every answer; sends that failed are sent again synchronously
// (with the producer's retries), and Flush returns the first error that
// remains, which fails the job: a record is never dropped. After a restart
// the job replays the records since its last checkpoint, so the topic may
// hold duplicates (at-least-once), and a retried message may be stored
// after later ones. Exactly-once output to RocketMQ needs ExactlyOnce.
//
// A Sink does not own its Producer (nor its Client): close them after the
// job ends. It takes no identity from the job (the producer's group is the
// caller's), so it does not implement jobinfo.Binder.
//
// # Exactly-once output (ExactlyOnce)
//
// During epoch n (the records between checkpoint barriers n-1 and n) every
// record is mapped to a message and sent as a transactional half message
// (Producer.SendHalf): the broker stores it invisibly. At barrier n,
// PreCommit waits until every half message of the epoch is acknowledged (a
// send that fails after its retries fails the checkpoint, and the job) and
// returns the epoch's transaction description (its half-message handles in
// a compact binary form), which the runtime writes into checkpoint n's
// Pebble batch. Once that batch is durable the runtime starts the commit
// (StartCommit: the sink is a sink.AsyncCommitter), which ends every half
// message with END_TRANSACTION commit on a goroutine of the sink while the
// job goes on writing epoch n+1. A process commits a transaction once (a
// repeated or skipped notification is harmless). The runtime waits for the
// commit (WaitCommits) at barrier n+1 and at the end of the job, and only
// then stops listing the transaction in its checkpoints, so a crash while
// it is being committed, or before the next checkpoint, commits it again
// on restore — without repeating what the crashed run committed (see
// Recovery).
//
// # Identity
//
// The sink's producer group must be the sink's alone and the same on every
// run of the job, so that the broker's check-backs for half messages of a
// crashed run reach the process that restores it. A pipeline gives the
// sink its identity by calling Bind (jobinfo.Binder) before restoring the
// job: the group is then TxGroup(job name, operator UID), for a dead-letter
// sink the UID its policy was given. WithTxGroup names the group
// explicitly instead (Bind then keeps it); a sink used outside a pipeline
// needs it, and fails with ErrNoTxGroup at its first use without it.
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
// At most one END_TRANSACTION per lane is in flight; the lanes' requests are
// pipelined on the broker connection. A lane whose END_TRANSACTION fails is
// handed over, from that half message on and still in order, to a goroutine
// of its own that retries with backoff, while the other lanes go on; once
// one failed, the other lanes' next requests are handed over too, so that a
// broker gone away costs one retry budget, not one per lane.
// A commit that went out and lost its answer (a timeout, a connection
// closed in flight: client.MaybeApplied) is sent again only once the
// output queue shows that the broker did not apply it — a barrier,
// WithRestoreSettle and a read from the transaction's floors, as a restore
// does (see Recovery) — since Apache RocketMQ's broker stores a repeated
// commit twice.
//
// # Recovery and orphans
//
// On restore the runtime calls Recover with every transaction the latest
// completed checkpoint lists and then Commit for each. The crashed run may
// have committed some or all of them, and Apache RocketMQ's broker (4.9 and
// 5.x) stores a half message again for every END_TRANSACTION commit (it
// finds the half message by its commit log offset whether or not it was
// ended; runnel's broker answers a repeat as done). So every transaction
// description also records, per output queue, an offset observed before
// its pre-commit (its floor: the queues' max offsets, asked at the first
// pre-commit touching a queue and then refreshed in the background after
// every pre-commit), and a restore reads each output queue from its floor
// and commits only the half messages whose committed copy (same UNIQ_KEY)
// is not there, in lane order. When something is left to commit, it first
// sends a barrier — an END_TRANSACTION the broker refuses (a wrong producer
// group) — whose answer comes once the broker took every END_TRANSACTION
// the crashed run left queued (Apache RocketMQ serves them first in, first
// out, and drops any that waited longer than its
// waitTimeMillsInTransactionQueue, 3 s), waits WithRestoreSettle (default
// 500 ms) for those to be stored, and reads the queues' new tails again.
// The reads use the sink's producer group as consumer group (brokers that
// do not create subscription groups on first use need it created). A
// restore reads about the last two epochs' output per queue (the
// measurement is in internal/javatest's ETL test logs: tens of
// milliseconds when everything was committed, plus the settle otherwise).
// A description written by an earlier version has no floors and is
// committed again whole, as before.
//
// Half messages that no
// completed checkpoint lists (sent during an epoch whose checkpoint never
// completed, or orphans of a send whose outcome was unknown and that was
// sent again) are NOT searched for: they are rolled back when the broker
// checks them back (after its transaction timeout), which reaches this
// process because the producer group belongs to the sink's owner. There is
// no local journal; until the check-back, such a half message is invisible
// to consumers, so it never duplicates output.
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
//   - listed by a durable checkpoint whose commit failed in this process,
//     and not ended by it before the failure: commit;
//   - of a transaction this process committed or aborted (the last 4096):
//     rollback, a no-op for the broker once committed (Apache RocketMQ 5.x
//     writes its "ended" records in batches, every 3 s, and checks back
//     half messages whose record is not written yet: a commit answer would
//     store them again);
//   - of an earlier run and not listed by the latest durable checkpoint:
//     rollback (its records are replayed from the checkpointed offsets);
//   - of this run, from an epoch already pre-committed, but not part of it
//     (an orphan of an uncertain send): rollback;
//   - of this run's open epoch, or asked before Recover: unknown.
//
// # What the check-back answer assumes
//
// The answers above come from this process's memory, which is right only
// while one process at a time runs the sink's job:
//   - the broker sends a check-back to any producer of the group; it reaches
//     this process because no other live process registers the group;
//   - the latest checkpoint this process restored or completed is the
//     job's latest: no other process can have a later checkpoint that lists
//     a half message this one has never heard of (which it would roll
//     back);
//   - a half message of another run comes from an earlier process of this
//     job, dead or superseded by this one's restore, whose records this
//     process replays from its checkpointed offsets.
//
// Several processes running one job under one group (workers sharing the
// work) break all three: a worker would roll back a half message another
// worker's durable checkpoint lists. See Scale-out.
//
// # Scale-out
//
// A sink bound to a task of a job on many workers (pipeline.RunWorker:
// jobinfo.Info.Scaleout) tags every half message with its task and owner
// epoch (PropTask, PropOwner), its index in the epoch and its send attempt,
// and answers check-backs from the job's commit chains, which every worker
// reads, instead of its own view: the broker asks any producer of the group,
// so any worker may be asked about any task's half messages. The task's
// published checkpoint covering the half message's epoch decides (rollback
// when it is another owner's, or a newer owner fenced it; unknown while
// none covers it); for a valid one, what the sink attached when it was
// published (TxnInfo: which records were sent again after an uncertain
// attempt, and which attempt the broker acknowledged) tells the accepted
// copy from an orphan (rollback). The accepted copy is the owner's to end:
// the owner ends its transactions after publishing, and a new owner,
// restoring the task's pending transactions, commits them again in lane
// order (leaving out what was committed, as a restore does), so a
// check-back answers unknown for it until it is half the discard window
// old (committing it earlier from another worker would let it overtake its
// lane's earlier records), then commit (such commits, of half messages
// whose owner is gone for long, are not kept in lane order). What the
// asked worker's own sink did with the half message comes first: unknown
// while it is about to commit or committing it, rollback once it committed
// (or aborted) its transaction, so that a check-back of a half message
// already committed, which Apache RocketMQ 5.x sends, is not committed
// again. A worker that did not commit it answers from the chains, which
// cannot tell a committed half message from a pending one: on Apache
// RocketMQ 5.x such a check-back, reaching another worker than the one
// that committed the half message within the broker's batching of its
// "ended" records, after half the discard window, stores it again.
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
package rocketmq
