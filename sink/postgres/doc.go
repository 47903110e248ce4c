// Package postgres is runnel's PostgreSQL sink, on pgx. The user maps each
// typed record to one row (Mapping); rows are batched and written with COPY
// (plain inserts), multi-row INSERT … ON CONFLICT statements (upserts) or a
// pipelined batch of a user statement.
//
// # Modes
//
// AtLeastOnce (the default) commits every batch on its own and at every
// checkpoint barrier (Flush): after a crash the records since the last
// checkpoint are written again, so rows may repeat.
//
// Idempotent upserts every row on a deterministic record id (WithUpsert: the
// conflict columns, e.g. the source split and offset, or a business key), so
// a record replayed after a crash overwrites its earlier copy. With
// WithReplayCounter, a counter column is incremented on every overwrite: it
// shows how many replays the table absorbed. No prepared transactions are
// needed.
//
// Every mode implements sink.TwoPhaseCommit (the runtime then calls
// PreCommit at barriers; outside ExactlyOnce it is a Flush). ExactlyOnce
// (WithExactlyOnce) uses it for real: all rows of epoch n (between barriers n-1 and n) go into ONE transaction of the
// sink subtask; at barrier n, PreCommit inserts a marker row into the commit
// table (runnel_commits by default) and runs PREPARE TRANSACTION with the
// deterministic global id
//
//	runnel:<job>:<sink uid>:<subtask>:<checkpoint id>
//
// (job and uid with bytes outside [A-Za-z0-9._-] %-escaped). That id is the
// pre-commit data the runtime stores in checkpoint n. After checkpoint n is
// durable the runtime calls Commit, which runs COMMIT PREPARED. The server
// must allow prepared transactions: New fails with ErrPreparedDisabled, and
// says how to enable them, when max_prepared_transactions is 0.
//
// Commit is idempotent and tells "already committed" from "rolled back" by
// the marker row: it is written inside the prepared transaction, so it exists
// if and only if that transaction committed. COMMIT PREPARED of an id that no
// longer exists therefore succeeds when the marker is there and fails with
// ErrTransactionLost (loudly: the epoch's rows are gone, e.g. someone ran
// ROLLBACK PREPARED by hand) when it is not.
//
// Recover, called by the runtime on every start before any write, commits the
// prepared transactions of the latest checkpoint and rolls back every other
// prepared transaction of this job and sink uid found in pg_prepared_xacts
// (those of epochs whose checkpoint never completed: their records are
// replayed). It also deletes the markers no checkpoint can ask about again;
// while running, a marker is deleted once a later checkpoint, which no longer
// lists its transaction, has completed. The commit table therefore holds a
// few rows per sink subtask.
//
// # Failures
//
// Lost connections, serialization failures (40001) and deadlocks (40P01) are
// retried with a ctx-aware exponential backoff (WithRetry). In ExactlyOnce
// mode a failure inside the open epoch transaction rolls it back and replays
// the epoch's rows, which the sink keeps in memory up to WithMaxEpochRows;
// beyond that it fails instead, and the job restarts from its last checkpoint
// and replays them from the source. A failure that outlasts the retries, or
// any other error (a constraint violation, a bad statement), is returned:
// the runtime fails the checkpoint and the job. Rows are never dropped.
//
// In ExactlyOnce mode the rows of epoch n+1 may need a row lock held by the
// still prepared transaction of epoch n (the same unique key written in both
// epochs). Commits run on the sink's goroutine, so such a wait cannot end by
// itself: the data connection sets lock_timeout (WithLockTimeout, 10 s by
// default) and the write then fails loudly. Tables whose rows repeat keys
// across epochs (latest value per key) suit the Idempotent mode better.
//
// # Concurrency
//
// A Sink is used by one goroutine, the sink task of the runtime (as the sink
// contracts require); only Stats may be called from any goroutine. It owns two
// connections: one for the epoch's rows, one for commits and recovery.
package postgres
