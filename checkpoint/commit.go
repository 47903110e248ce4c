package checkpoint

import "context"

// Part is one owner's contribution to a checkpoint (a keyed operator's state
// changes, say). Commit calls WriteTo on the committing goroutine; WriteTo
// must only add to w and must not retain it.
type Part interface {
	WriteTo(w *Writer) error
}

// Writer adds state changes to the checkpoint batch being built. It is valid
// only during Part.WriteTo and is not safe for concurrent use.
type Writer struct {
	s *Store
}

// PutState records key=value for (operatorUID, keyGroup).
func (w *Writer) PutState(operatorUID string, keyGroup uint16, key, value []byte) error {
	return errNotImplemented
}

// DeleteState records the deletion of key in (operatorUID, keyGroup).
func (w *Writer) DeleteState(operatorUID string, keyGroup uint16, key []byte) error {
	return errNotImplemented
}

// DeleteStateRange records the deletion of every key in [from, to) of
// (operatorUID, keyGroup); to == nil means "every key starting with from".
func (w *Writer) DeleteStateRange(operatorUID string, keyGroup uint16, from, to []byte) error {
	return errNotImplemented
}

// Commit is one checkpoint's content.
type Commit struct {
	// ID must be above the latest completed checkpoint's.
	ID uint64
	// Offsets are upserted: splits absent keep their previous offset; a nil
	// value deletes the split's offset.
	Offsets map[string][]byte
	// Pending are sink pre-commits added by this checkpoint (keyed by
	// SinkUID, Subtask, CheckpointID; a repeat overwrites).
	Pending []PendingCommit
	// Resolved are pending commits known to be committed (or aborted) by
	// their sinks; only their key fields are used. They are removed.
	Resolved []PendingCommit
	// Parts write the state changes.
	Parts []Part
}

// Commit writes c atomically: offsets, every part's state changes, pending
// sink commits, the metadata and the "latest" pointer go into ONE Pebble
// batch committed with fsync. Either all of it is durable or none. Commit
// blocks for the sync; calls are serialised. ctx is checked between parts.
func (s *Store) Commit(ctx context.Context, c *Commit) (Metadata, error) {
	return Metadata{}, errNotImplemented
}
