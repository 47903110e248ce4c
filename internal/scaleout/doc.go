// Package scaleout holds the mechanics by which one runnel job runs as many
// worker processes, with RocketMQ itself as the distributed engine: consumer
// groups and rebalance assign the work, broker queue locks fence it, and
// everything a new owner needs lives in job-owned topics on the brokers. There
// is no cluster manager and no service beside the brokers. The user-facing
// entry point is pipeline.RunWorker; this package is its machinery.
//
// # Tasks
//
// A job is cut into stages at its keyed operators. A task is the unit a
// worker gains and loses: for a source stage, one queue of the source topic
// (the source's split); for a keyed stage, one range of key groups, fed
// through a repartition topic with one queue per range (Kafka Streams'
// repartition topics, Flink's key groups in contiguous ranges). A keyed
// operator declared pre-partitioned (the input topic is already partitioned
// by its key) is fused into its source stage instead. Every task runs as an
// independent runnel job of its own (its own runtime engine, checkpoints and
// Pebble store under <state dir>/tasks/<task>), so tasks never wait for each
// other's barriers and move one at a time.
//
// # The commit chain
//
// Each stage has a commit topic with the same queue layout as the stage's
// input (the source topic's queues, or the repartition topic's), so task T's
// commit records live on the queue of T's own input. A record is small: the
// task, the writer's owner epoch, the checkpoint id it completes (its seq),
// the offset and seq of the previous valid record, the job's fingerprint,
// where its state changes are (the changelog segments), and what its sink
// transactions contain. The queue's log order decides which records count,
// as Kafka's transaction coordinator decides on its log:
//
//   - the first record of a task is valid;
//   - a later record is valid only when it names the latest valid record as
//     its previous one and its owner epoch is at least that record's;
//   - a claim is a record that completes no checkpoint: a new owner writes
//     one, with an owner epoch above every epoch it has seen, before it
//     processes anything; from then on no record of an older epoch can be
//     valid.
//
// A writer only trusts its record after reading the queue back up to it
// (Confirm). A paused or partitioned former owner whose lock lapsed writes
// records that every reader finds invalid, because the new owner's claim
// precedes them in the log; it learns so at its next confirmation and stops
// before committing any sink transaction. The broker's queue locks keep two
// live workers from doing the same work; the chain is what makes a late
// commit harmless when the locks were not enough (a lock that expired while
// its holder was stopped).
//
// A checkpoint's records are tagged with (owner epoch, epoch id): the id of
// the checkpoint that completes them. A record of seq S whose previous valid
// record has seq P completes the epochs (P, S] (a failed checkpoint's
// records ride with the next one). So any worker decides from a task's chain
// alone whether a tagged message counts (Chain.Decide): valid when the valid
// record covering its epoch has its owner epoch, invalid when that record
// has another, or when a newer owner epoch fenced the tag's; undecided while
// no record covers it yet. Readers of repartition topics read committed
// data this way, and RocketMQ's transaction check-back, which the broker
// sends to any producer of a group, is answered the same way by whichever
// worker it reaches: never "rollback because I do not know it".
//
// # State
//
// A task's Pebble store advances by one batch per checkpoint. That batch
// (offsets, state changes, pending sink transactions, metadata — the very
// bytes Pebble commits) is written, chunked, to the task's queue of the
// stage's changelog topic before the commit record that references it. A
// new owner rebuilds the store exactly by loading the latest snapshot (a
// full copy of the store written to the changelog now and then, at most
// every SnapshotEvery checkpoints or when the changelog since the last one
// outgrows it) and applying, as whole batches, the segments the latest valid
// record lists since that snapshot: a restore reads a bounded amount, never
// the job's history. The snapshot is a savepoint stream in the store's key
// order, so a rebuild writes it straight into sstables that Pebble ingests
// into its bottom level (checkpoint.IngestSavepoint) instead of replaying it
// through batches, and pulls it several messages at a time (a broker answers
// a pull with one 1 MiB chunk) while the segments after it are pulled too.
// A store left on the worker's own disk, or a standby's warm copy that
// follows the changelog, is reused when its last checkpoint lies on the
// valid chain: then only the missing segments are applied.
//
// # Non-obvious invariants
//
//   - Validity depends only on the prefix of a commit queue, and brokers
//     append only, so a record once valid stays valid for every reader;
//     readers that start later (from a hint) reach the same verdicts.
//   - A record never completes an epoch of another owner epoch: a new owner
//     restores to the latest valid record and starts numbering after it.
//   - END_TRANSACTION commit follows Confirm; before it, a sink transaction
//     of the epoch is still undecided for everyone.
//   - The changelog segment of a record precedes the record in time, so a
//     record's segments are readable whenever the record is.
//   - A record that retention deleted cannot be confirmed or restored: a
//     task whose latest valid record or snapshot is gone fails with what is
//     missing, it never starts empty. An empty chain is trusted as a new
//     task only when the task's changelog queue is empty too (a segment is
//     always written after its writer's claim), and a chain whose stored
//     hint lies past its queue's end is refused (the broker lost records).
package scaleout
