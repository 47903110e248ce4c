// Package sinktest is a conformance suite for sinks: RunTwoPhaseCommit
// runs a sink.TwoPhaseCommit (and its sink.AsyncCommitter side, when it
// has one) through the exactly-once protocol of package sink, and Run runs
// a plain sink.Sink through Flush's promise, the way watermill's
// pubsub/tests.TestPubSub runs a Pub/Sub through watermill's contract.
// Every sink in runnel passes them (sink/rocketmq, sink/postgres,
// sink/wmsink, and sink's KV, Func and Stdout), and a sink written outside
// runnel can run the same checks from its own tests:
//
//	func TestConformance(t *testing.T) {
//		sinktest.RunTwoPhaseCommit(t, sinktest.Features{}, func(t *testing.T) sinktest.System[Order] {
//			db := newTestDatabase(t) // a fresh table, dropped at the end of the test
//			return sinktest.System[Order]{
//				New: func(ctx context.Context) (sink.Sink[Order], error) {
//					return mysink.New(ctx, db.DSN, "orders", mysink.WithJob("job", "out"))
//				},
//				Record:  func(key string) Order { return Order{ID: key} },
//				Visible: func(ctx context.Context) ([]string, error) { return db.CommittedIDs(ctx) },
//				Open:    func(ctx context.Context) (int, error) { return db.PreparedTransactions(ctx) },
//			}
//		})
//	}
//
// The factory is called once per check and returns a System over a fresh
// part of the external system (its own topic, table or directory): New
// makes an instance of the sink as a new process of the job would (same
// identity: producer group, transaction names; same external system), and
// Visible reads back what a consumer of the external system sees now
// (committed records only), one key per copy. Record turns the keys the
// suite makes up into records. Open, optional, counts the sink's
// transactions left open in the external system.
//
// # The two-phase-commit checks
//
// The suite plays the runtime's part: it calls Recover on every new
// instance before anything else (with nothing, or with the transactions
// the simulated checkpoint lists), writes epochs of Features.Records
// records, pre-commits them with increasing checkpoint ids and commits
// them, then checks Visible against exactly what was committed so far —
// nothing before Commit, everything exactly once after:
//
//   - CommitMakesVisible: nothing is visible after Write or PreCommit;
//     Commit makes the epoch visible, an empty epoch commits too.
//   - CommitIdempotent: a transaction committed twice (or three times) is
//     visible once.
//   - SkippedNotification: two epochs pre-committed before the first
//     commit (the first checkpoint's notification was lost) are both
//     visible once each after their commits.
//   - LateCommit: the second transaction committed before the first (the
//     first commit failed and is retried after a later checkpoint): each
//     commit makes visible its own epoch only.
//   - Abort: an aborted transaction (aborted twice) never becomes
//     visible, and the next epochs commit normally.
//   - CrashBeforeCommit: the instance that pre-committed is closed before
//     the commit (a crash between the phases: the suite never uses a
//     crashed instance again, and Close must not commit); a new instance
//     gets Recover with the transaction and commits it, twice: visible
//     once, and the new instance goes on with the next epoch.
//   - CrashAfterCommit: the transaction is committed, the instance
//     crashes, and a new one recovers and commits it again: still once.
//   - CrashWithSkippedNotification: two pre-committed transactions, a
//     crash, and a new instance that recovers and commits both.
//   - RecoverAbortsOthers: a transaction pre-committed for a checkpoint
//     that never completed and an epoch still open when the instance
//     crashes: the new instance recovers only the completed checkpoint's
//     transaction; the others never become visible (with Open: the
//     external system holds no open transaction of the sink within
//     Features.Timeout), and their records, written again by the new
//     instance under the reused checkpoint id (as a restarted job
//     replays them), are visible exactly once.
//   - AsyncCommit (sinks implementing sink.AsyncCommitter): StartCommit
//     while the next epoch is written, WaitCommits, a repeated
//     StartCommit, and a crash after StartCommit of a transaction that a
//     new instance then recovers and commits.
//
// Every instance is closed exactly once, and Close must return nil. At the
// end of each check the suite waits Features.Quiet and reads Visible once
// more, so that copies arriving late are caught too.
//
// # The plain sink checks
//
// Run checks a sink.Sink: FlushMakesVisible (what was written before
// Flush is visible once Flush returned, exactly once), FlushedSurvivesCrash
// (what a Flush made visible is still there after the instance is closed
// and a new one made; records written after the last Flush are visible at
// most once, and written again by the new instance they are visible at
// least once) and Replay (records flushed, then written and flushed again
// by a new instance as a restarted job replays them: at least once, at
// most twice, or exactly once with Features.Idempotent).
//
// # Failing
//
// A check fails its subtest with the step it was at and the keys missing,
// repeated or unexpected in Visible. Records that must be visible are
// waited for (Features.Timeout); a copy that must not be visible fails the
// check at once, since nothing committed may become invisible again. A
// sink method that fails fails the check with its error.
package sinktest
