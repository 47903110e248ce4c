// Package state is runnel's keyed state: typed handles (Value, List, Map,
// Reducing, Aggregating, Timers) bound to a Backend's current key, stored in
// the job's checkpoint.Store behind a write-back layer so that nothing an
// operator writes becomes durable except through a checkpoint.
//
// # Using it
//
// A keyed operator subtask creates one Backend (NewBackend) and its handles
// once, then per record calls SetCurrentKey and uses the handles. At a
// checkpoint barrier it calls Snapshot(id) and hands the returned Part to the
// coordinator, which puts it in checkpoint.Store.Commit; after the commit it
// calls Committed(id) (or Aborted(id) when the checkpoint failed). Processing
// continues while the commit runs.
//
// # Key groups
//
// KeyGroup hashes a key into [0, maxParallelism) (default 128); a subtask
// owns the contiguous range KeyGroupRange(maxParallelism, parallelism,
// subtask), so parallelism can change between runs without moving keys
// between key groups.
//
// # Layout within (key group, operator)
//
//	Value, List, Reducing, Aggregating   uvarint len, name | uvarint len, key
//	Map                                  uvarint len, name | uvarint len, key | map key (codec)
//	Timers                               uvarint len, name | domain | ts (8 BE, sign flipped) | key
//
// A group timer (domain GroupEventTime, Timers.RegisterGroup) belongs to
// its key group rather than a key: its key part is empty, and its domain
// byte keeps it apart from a key's timer even for an empty key. Windows use
// it to keep one timer per key group and window end.
//
// With a TTL, values carry an 8-byte expiry (Unix ns, BE) before the codec's
// bytes; a List is one value of uvarint-length-prefixed elements.
//
// # Non-obvious invariants
//
//   - Layers: the current layer (mutable) and frozen layers (one per
//     snapshot not yet committed, oldest first). Reads consult current, then
//     frozen newest first, then the read cache, then the store; the first
//     layer with a put, a deletion or a covering range deletion decides.
//   - A frozen layer is never mutated, so Part.WriteTo can read it on the
//     committer's goroutine while the subtask goroutine reads and writes the
//     current layer. (Its sort caches are built lazily by the subtask for
//     ordered iteration; WriteTo does not touch them.)
//   - Aborted does not merge anything back: the Part of every later snapshot
//     also writes all older frozen layers still waiting (oldest first), so
//     committing n+1 is complete even if n failed or its commit notification
//     never came. Committed(id) drops frozen layers with ids <= id; this
//     relies on the store's strictly increasing checkpoint ids.
//   - Within a layer, a range deletion removes that layer's own entries in
//     the range; a later put in the same layer wins over the range. Part
//     writes a layer's range deletions before its points.
//   - The write-back layers are in memory only. They spill through a
//     checkpoint: WantsCheckpoint reports when the changes since the last
//     Snapshot exceed WithWriteBufferLimit (default 64 MiB), and the runtime
//     then takes a checkpoint ahead of its interval, whose one batch writes
//     them with the offsets (so a spill never breaks atomicity).
//   - Reads that reach past the layers hit a cache of committed values
//     (WithReadCacheSize, default 32 MiB) before the store: Committed merges
//     the committed layers into it and store reads fill it; it is emptied
//     when it outgrows its size, or by a committed range deletion.
//   - Nothing writes the store except a Part inside Commit; under the
//     invariants tag the checkpoint.Writer panics outside Commit and
//     Committed sometimes verifies that a committed layer's puts are in the
//     store.
//   - Keys and values of a layer live in an append-only arena; entry keys
//     are strings viewing the arena (never modified). A layer finds its
//     entries through an open-addressing table of 8-byte slots (hash tag and
//     entry index), one cache line per probe. Overwriting a value of the
//     same or smaller size reuses its bytes, so the hot path allocates nothing.
//   - TTL: expired entries are invisible; a read that finds one deletes it in
//     the current layer, and Snapshot turns expired entries of the changes
//     into deletions. Expired entries only in the store are removed when read
//     and by the TTL sweep (ttlsweep.go), whether read or not.
//   - Timers are indexed in memory (a heap per domain plus a set) and loaded
//     at NewTimers from the backend's key groups. A per-domain count moves
//     with every change of the set (so Len is O(1)); deleted timers stay in
//     the heap until they reach its top. Snapshot, Committed and Aborted do
//     not touch the index: it always equals the visible (newest) state.
//   - Timers registered since the last Snapshot are pending: kept in a list,
//     not in the layer, until Snapshot appends the live ones to the layer it
//     freezes. A timer registered and fired (or deleted) between two
//     checkpoints thus never reaches a layer or the store.
//   - A layer entry is fresh when its key had no value below the layer when
//     it was inserted (a read found it absent, or the caller knew it: timers,
//     Map.KnownAbsent). A fresh deletion is neither written by the Part nor
//     cached: state created and deleted within one interval (a window that
//     opened and fired) costs no store write and no tombstone.
package state
