// Package store is the embedded broker's durable message store, built on
// Pebble.
//
// It keeps RocketMQ's two logical structures without RocketMQ's files:
//
//   - a "commit log" view: every appended record gets a physical offset from
//     one store-wide byte counter (the sum of the sizes of all records appended
//     before it), so offset message ids (store host + physical offset) are
//     unique and VIEW_MESSAGE_BY_ID can find a record by physical offset;
//   - a "consume queue" view: per (topic, queue id) dense logical offsets
//     0, 1, 2, … assigned at append, with a min offset that moves forward on
//     retention ([Store.TruncateBefore]) and a max offset that is the next
//     offset to be written.
//
// Records are opaque encoded MessageExt records (protocol doc §4.1). The store
// knows only fixed byte positions: TOTALSIZE (int32 at 0, checked against the
// record length), QUEUEOFFSET (int64 at 20) and PHYSICALOFFSET (int64 at 28),
// which it patches in place, and STORETIMESTAMP (int64 at a position the
// caller passes: 56 for an IPv4 born host, 68 for IPv6), which it also patches.
// All integers are big-endian.
//
// # Writes and durability
//
// [Store.Put] hands its messages to a single committer goroutine which owns
// the append lock: it assigns queue offsets, physical offsets and store
// timestamps, patches the records, and writes every message of every Put it
// collected in that round into ONE Pebble batch (its message, physical
// index and key index entries; the keys themselves carry the new max
// offsets, physical counter and last store timestamp). With [FlushSync] the batch
// is committed with an fsync of Pebble's WAL, and all the Put calls of the
// round are released after that single fsync (group commit). With
// [FlushAsync] the batch is committed without fsync; a background goroutine
// fsyncs the WAL every [Options.SyncInterval] when there were writes.
// [Store.PutAsyncInline], in [FlushAsync] mode, runs such a round of one
// call on the caller's goroutine instead, under the same append lock, when
// the committer has no call queued or in hand (an idle store gains nothing
// from the hand-off but its wake-up).
//
// Readers never see data that the committer has not published: the per-queue
// max offset and the physical counter that reads are bounded by are advanced
// in memory only after the batch commit returned (after the fsync in SYNC
// mode). So in SYNC mode nothing that could be lost by a crash is ever served.
//
// # Key layout (all integers big-endian, strings length-prefixed by uint16)
//
//	"v"                                      format version (uint32)
//	"g"                                      next physical offset (int64) | last store timestamp (int64)
//	'm' topic queueId(u32) offset(u64)       message value (see below)
//	'q' topic queueId(u32)                   queue meta: next offset (int64) | min offset (int64)
//	'p' phys(u64)                            physical index: recordLen(u32) queueId(u32) offset(u64) topic(raw)
//	'k' topic key ts(u64, sign-flipped) phys(u64)   key index (KEYS and UNIQ_KEY values), empty value
//	'o' topic group queueId(u32)             consumer offset (int64)
//	't' name                                 topic config (opaque, owned by the broker)
//	's' name                                 subscription group config (opaque)
//	'x' key                                  broker meta KV ([Store.PutMeta])
//	'e' epoch(u32)                           start offset of a log epoch (int64)
//	'l'                                      log id (a master's, copied by its slaves)
//
// A message value is a small header followed by the record:
//
//	tagsCode(int64) storeTimestamp(int64) uvarint(keysLen) keys… record
//
// where keys is a sequence of uvarint(len) key bytes: the keys the message was
// indexed under, so retention can remove the key index entries exactly.
//
// # Non-obvious invariants
//
//   - A message and its physical and key index entries are written in the
//     same Pebble batch, so after any crash they agree. Commit rounds write
//     no queue meta ('q') nor global meta ('g'): Open takes a queue's next
//     offset as the max of its meta and (last message key + 1), the physical
//     counter as the max of the global meta and the end of the last physical
//     index entry, and the last store timestamp as the max of the global
//     meta and that of the message of the last physical index entry. The
//     metas are written where those keys are deleted: TruncateBefore writes
//     the queue's meta (next and min offsets) and the global meta with each
//     chunk, DeleteTopic the global meta with each chunk, so that no deletion
//     moves a counter back at the next Open.
//   - Queue offsets and physical offsets are assigned only under writeMu, by
//     the committer goroutine or an inline PutAsyncInline round;
//     TruncateBefore and DeleteTopic also hold writeMu.
//   - Store timestamps never decrease across the whole store (the clock is
//     clamped to the last assigned timestamp, which is persisted), so per queue
//     they are non-decreasing in offset order, which SearchOffset's binary
//     search relies on.
//   - Index entries are validated on use (the physical offset stored in the
//     record must match), so an index entry left behind can never resolve to
//     another message.
//
// # Replication
//
// The log a master replicates is its records in physical order, read
// through the physical index ([Store.ReadLog]); a slave appends them at the
// master's physical and queue offsets with their tags codes, keys and store
// times ([Store.AppendLog], which refuses an entry that does not extend the
// log: [ErrLogConflict]), so that its store answers every read as the
// master's does. [Store.TruncateLog] removes a diverged tail; epochs
// ([Store.StartEpoch], [Store.AddEpoch]) and the log id tell where two logs
// part. Holes (records removed by DeleteTopic or TruncateBefore) are
// skipped by ReadLog and kept by AppendLog.
//
// # Lock order
//
// writeMu → qmu, writeMu → walMu. walMu (every write to Pebble, from the
// failure check through the WAL append; commitBatch) is a leaf. mu
// (open/closed and active-call count) is never held while calling into
// Pebble.
//
// # Failures
//
// A failed write to Pebble, or a failed WAL write or fsync seen by the
// file system wrapper (walfs.go) even when nobody waits for it (ASYNC
// mode), makes the store fail: writes get ErrFailed from then on and are
// never retried; reads keep working.
package store
