package checkpoint

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/runnel-dev/runnel/checkpoint/internal/storefs"
)

// FormatVersion is the on-disk format this build writes. Stores and
// savepoints record the version that wrote them; Open ratchets an older store
// forward and refuses a newer one with ErrFormatTooNew.
const FormatVersion uint32 = 1

// Options configure a Store. The zero value is usable: Retain defaults to 3
// and an empty Fingerprint skips the fingerprint check (inspection tools).
type Options struct {
	// Logger receives the store's few log lines; nil discards them.
	Logger *slog.Logger
	// Retain is how many completed checkpoints' metadata are kept for
	// inspection (History). Restore is always from the latest; older
	// checkpoints are kept portable as savepoints. Default 3, minimum 1.
	Retain int
	// Fingerprint describes the running job. Open compares it with the one
	// stored with the latest completed checkpoint and fails with
	// ErrFingerprintMismatch when an operator's kind or codecs changed, an
	// operator with state disappeared, or MaxParallelism changed. Operators new
	// to the job are fine (they start empty). A zero Fingerprint (no operators,
	// MaxParallelism 0) skips the check.
	Fingerprint Fingerprint
	// MemTableSize bounds Pebble's memtable (default 64 MiB).
	MemTableSize uint64
	// FS runs the store on a Pebble virtual filesystem. Only packages under
	// checkpoint/ can build one (crash tests); leave nil for the OS's files.
	FS *storefs.FS
}

// Fingerprint identifies a job's state layout: changing it incompatibly makes
// restoring a checkpoint unsafe.
type Fingerprint struct {
	// MaxParallelism is the number of key groups.
	MaxParallelism int `json:"maxParallelism"`
	// Operators lists every stateful operator (or every operator: stateless
	// ones do no harm).
	Operators []OperatorInfo `json:"operators"`
}

// OperatorInfo is one operator's entry in a Fingerprint.
type OperatorInfo struct {
	// UID is the operator's stable unique id (the key of its state).
	UID string `json:"uid"`
	// Kind names the operator type (e.g. "keyed-process", "reduce").
	Kind string `json:"kind"`
	// Codecs lists the state and key codec ids, e.g. "count=int64;key=string".
	Codecs string `json:"codecs"`
}

// Metadata describes one completed checkpoint.
type Metadata struct {
	ID             uint64        `json:"id"`
	Time           time.Time     `json:"time"`
	FormatVersion  uint32        `json:"formatVersion"`
	Fingerprint    Fingerprint   `json:"fingerprint"`
	Bytes          int64         `json:"bytes"`          // size of the committed batch
	Offsets        int           `json:"offsets"`        // offsets written by this checkpoint
	StateChanges   int           `json:"stateChanges"`   // puts, deletes and range deletes
	PendingCommits int           `json:"pendingCommits"` // pending sink commits after it
	Duration       time.Duration `json:"duration"`       // Commit call duration (parts + sync)
	// Savepoint is set on the metadata written by RestoreSavepoint.
	Savepoint bool `json:"savepoint,omitempty"`
}

// PendingCommit is a sink's pre-committed transaction recorded by a
// checkpoint: after a restart the sink commits every pending record listed by
// the latest checkpoint (idempotently) and aborts anything else.
type PendingCommit struct {
	SinkUID      string `json:"sinkUID"`
	Subtask      int    `json:"subtask"`
	CheckpointID uint64 `json:"checkpointID"`
	Data         []byte `json:"data"`
}

// Store is a job's durable store: one Pebble database per job directory
// holding the committed state, source offsets, pending sink commits and
// checkpoint metadata. It is safe for concurrent use; Commit calls are
// serialised.
type Store struct {
	opts Options
}

// Open opens (creating if needed) the store in dir. It reads only the format
// record and the latest metadata (no scan), ratchets an older format forward,
// and checks opts.Fingerprint against the latest completed checkpoint.
func Open(dir string, opts Options) (*Store, error) {
	return nil, errNotImplemented
}

// Close closes the store. It is idempotent and safe to call concurrently;
// later calls return nil.
func (s *Store) Close() error { return nil }

// Latest returns the last completed checkpoint; false when there is none.
func (s *Store) Latest() (Metadata, bool) { return Metadata{}, false }

// History returns the retained completed checkpoints, newest first.
func (s *Store) History() []Metadata { return nil }

// Offsets returns the source offsets as of the latest completed checkpoint,
// keyed by SplitKey(sourceUID, splitID).
func (s *Store) Offsets() (map[string][]byte, error) { return nil, errNotImplemented }

// PendingCommits returns the sink pre-commits that the latest completed
// checkpoint lists as not known to be committed, ordered by (SinkUID,
// Subtask, CheckpointID).
func (s *Store) PendingCommits() ([]PendingCommit, error) { return nil, errNotImplemented }

// SplitKey is the Offsets key of one source split.
func SplitKey(sourceUID, splitID string) string { return sourceUID + "\x00" + splitID }

// GetState returns the committed value of (operatorUID, keyGroup, key). The
// returned slice is the caller's.
func (s *Store) GetState(operatorUID string, keyGroup uint16, key []byte) ([]byte, bool, error) {
	return nil, false, errNotImplemented
}

// ScanState calls fn for each committed entry of (operatorUID, keyGroup) whose
// key starts with prefix, in key order, until fn returns false. key and value
// are valid only during the call.
func (s *Store) ScanState(operatorUID string, keyGroup uint16, prefix []byte, fn func(key, value []byte) bool) error {
	return errNotImplemented
}

// NewStateReader returns a reader of one operator's committed state with its
// own scratch buffers: the allocation-light path the state package uses. A
// StateReader is for one goroutine at a time.
func (s *Store) NewStateReader(operatorUID string) *StateReader {
	return &StateReader{s: s, uid: operatorUID}
}

// StateReader reads one operator's committed state (see NewStateReader).
type StateReader struct {
	s   *Store
	uid string
	buf []byte
}

// AppendValue appends the committed value of (keyGroup, key) to dst.
func (r *StateReader) AppendValue(dst []byte, keyGroup uint16, key []byte) ([]byte, bool, error) {
	return dst, false, errNotImplemented
}

// Scan is ScanState for the reader's operator.
func (r *StateReader) Scan(keyGroup uint16, prefix []byte, fn func(key, value []byte) bool) error {
	return errNotImplemented
}

// WriteSavepoint writes the latest completed checkpoint (metadata, offsets,
// pending commits, all state) to w in the savepoint format (see doc.go). It
// reads a consistent Pebble snapshot, so commits may continue meanwhile.
func (s *Store) WriteSavepoint(ctx context.Context, w io.Writer) error { return errNotImplemented }

// RestoreSavepoint loads a savepoint into the store in dir, which must hold
// no completed checkpoint. When the savepoint's fingerprint does not match
// opts.Fingerprint it fails with ErrFingerprintMismatch unless every
// differing operator is listed in dropOperators, whose state is then left out.
func RestoreSavepoint(ctx context.Context, dir string, r io.Reader, opts Options, dropOperators ...string) error {
	return errNotImplemented
}
