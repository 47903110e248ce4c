// Package checkpoint is a runnel job's durable store: one Pebble database per
// job directory holding committed keyed state, source offsets, pending sink
// commits and checkpoint metadata, all advanced together by ONE synced
// Pebble batch per checkpoint (Store.Commit). Savepoints are portable files
// of the latest completed checkpoint (WriteSavepoint, RestoreSavepoint).
//
// # Using it
//
// The runtime opens the store with the job's Fingerprint, restores from
// Offsets, PendingCommits and the state (read lazily by package state through
// GetState, ScanState and StateReader), and commits each checkpoint with a
// Commit holding the source offsets, the sinks' pending transactions and one
// Part per keyed operator subtask (state.Backend.Snapshot). Only after Commit
// returns may sinks commit their transactions.
//
// # Key layout
//
// Every key begins with a one-byte family:
//
//	0x00 'f'                       format version (u32 BE), written at creation
//	0x00 'l'                       latest completed checkpoint id (u64 BE)
//	0x00 'r'                       present only while a savepoint restore runs
//	0x00 'a'                       spec of the last RestoreFrom applied
//	0x01 id(u64 BE)                metadata JSON of a retained checkpoint
//	0x02 SplitKey                  source offset (opaque bytes)
//	0x03 uvarint len, sink UID, subtask(u32 BE), checkpoint id(u64 BE)
//	                               pending sink commit data
//	0x04 keyGroup(u16 BE), uidLen(u16 BE), operator UID, state key
//	                               committed state value
//
// State is keyed by key group FIRST, so everything of one key group (all
// operators) is one contiguous range: a later issue can move key groups
// between processes by copying ranges. Within (key group, operator) the
// state package lays out its own keys.
//
// # Non-obvious invariants
//
//   - Atomicity comes from the single batch: offsets, state changes, pending
//     records, the metadata and the latest pointer of checkpoint n are in one
//     Pebble batch committed with pebble.Sync. Pebble's WAL makes a batch all
//     or nothing, so no atomic-rename marker is needed for the pointer.
//     TestCheckpointCrashAtomicity takes a crash clone before every write
//     operation and checks the recovered content is exactly one checkpoint;
//     its controls (two batches; no sync) must fail the same check.
//   - The committed data IS the latest checkpoint. Older ones are restorable
//     only as retained copies (KeepCopy: a Pebble db.Checkpoint of hard
//     links plus WAL and MANIFEST copies, taken when the job asks, not per
//     checkpoint by default) and savepoint files (retain.go); RestoreFrom
//     makes one of them the latest again under a new, higher id, and records
//     its spec so that it is applied once. Retain keeps older checkpoints'
//     metadata (History) for inspection.
//   - With Options.RotateMemTableAt, a large commit makes Pebble start a
//     new memtable first (rotateForLargeBatch), unless the previous such
//     memtable is still being flushed: a sorted batch inserts into an empty
//     memtable at a pointer update per key, into one holding the previous
//     checkpoints' versions of the same keys at a full skiplist search per
//     key. It moves CPU from the commit to a background flush per large
//     checkpoint (more CPU in all when checkpoints rewrite the same keys,
//     which one memtable would otherwise have deduplicated). Atomicity does
//     not change: the rotation only flushes commits already durable.
//   - Checkpoint ids strictly increase (ErrStaleID). Commits are serialised
//     by commitMu; readers never take it.
//   - Offsets are upserted (nil deletes); pending commits accumulate until a
//     later Commit lists them in Resolved, so a checkpoint never forgets a
//     transaction whose commit notification was lost.
//   - Writers are valid only inside Commit; under the invariants tag a
//     Writer used elsewhere panics (state reaches Pebble only through a
//     checkpoint batch).
//   - A fatal Pebble error during a commit (failed log write or sync) poisons
//     the store (ErrFailed): the process must restart and recover. Pebble
//     panics on some write errors (e.g. while rotating its log) with its own
//     locks held; those end the process, which is the fail-stop behaviour a
//     checkpoint store needs.
//   - FormatVersion only ratchets forward: Open rewrites an older version
//     and refuses a newer one (ErrFormatTooNew); savepoints carry it too.
//   - The fingerprint check treats an operator removed from the job as a
//     mismatch only when it has committed state (one seek per key group).
//   - RestoreSavepoint writes in several unsynced batches under a restore
//     marker and finishes with one synced batch that sets the metadata and
//     the latest pointer and removes the marker; Open refuses a store with
//     the marker (ErrIncompleteRestore).
//   - Close flushes the memtable so that a restart replays no log: Open reads
//     the format record and the retained metadata only (no scan of state).
package checkpoint
