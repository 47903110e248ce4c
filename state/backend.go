package state

import (
	"errors"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
)

var (
	// ErrInvalid is returned for invalid arguments (bad names, parallelism).
	ErrInvalid = errors.New("state: invalid argument")
	// ErrNoCurrentKey is returned by handle calls before SetCurrentKey.
	ErrNoCurrentKey = errors.New("state: no current key")
	// ErrSnapshotDropped is returned by a Part's WriteTo when its snapshot was
	// already committed or superseded.
	ErrSnapshotDropped = errors.New("state: snapshot no longer pending")

	errNotImplemented = errors.New("state: not implemented yet")
)

// DefaultWriteBufferLimit is the default size of the write-back layer above
// which WantsCheckpoint reports true.
const DefaultWriteBufferLimit = 64 << 20

// BackendOption configures a Backend.
type BackendOption interface{ apply(*backendConfig) }

type backendConfig struct {
	kgStart, kgEnd uint16
	kgSet          bool
	bufferLimit    int64
}

type backendOptionFunc func(*backendConfig)

func (f backendOptionFunc) apply(c *backendConfig) { f(c) }

// WithKeyGroupRange limits the backend to key groups [start, end) (see
// KeyGroupRange). Default: every key group. Timers are loaded from, and
// iteration covers, only these key groups.
func WithKeyGroupRange(start, end uint16) BackendOption {
	return backendOptionFunc(func(c *backendConfig) { c.kgStart, c.kgEnd, c.kgSet = start, end, true })
}

// WithWriteBufferLimit sets the write-back layer size (bytes) above which
// WantsCheckpoint reports true. Default DefaultWriteBufferLimit.
func WithWriteBufferLimit(bytes int64) BackendOption {
	return backendOptionFunc(func(c *backendConfig) { c.bufferLimit = bytes })
}

// Backend holds the keyed state of one keyed operator subtask. It is NOT
// safe for concurrent use: one goroutine (the subtask's) calls
// SetCurrentKey, the handles, Snapshot, Committed and Aborted. The Part that
// Snapshot returns is the exception: its WriteTo may run on the checkpoint
// committer's goroutine while the subtask keeps processing.
type Backend struct {
	store *checkpoint.Store
	uid   string
	maxP  int
	cfg   backendConfig
}

// NewBackend returns the backend of operatorUID's subtask on store, whose
// committed state it reads lazily (nothing is scanned up front).
func NewBackend(store *checkpoint.Store, operatorUID string, maxParallelism int, opts ...BackendOption) (*Backend, error) {
	return nil, errNotImplemented
}

// OperatorUID returns the operator the backend belongs to.
func (b *Backend) OperatorUID() string { return b.uid }

// MaxParallelism returns the number of key groups.
func (b *Backend) MaxParallelism() int { return b.maxP }

// KeyGroupRange returns the key groups [start, end) of this backend.
func (b *Backend) KeyGroupRange() (start, end uint16) { return b.cfg.kgStart, b.cfg.kgEnd }

// SetCurrentKey selects the key (and its key group) that handles act on. The
// backend copies key.
func (b *Backend) SetCurrentKey(key []byte) {}

// SetCurrentKeyGroup is SetCurrentKey for a caller that already computed the
// key group (it must equal KeyGroup(key, MaxParallelism())).
func (b *Backend) SetCurrentKeyGroup(key []byte, keyGroup uint16) {}

// CurrentKey returns the current key (owned by the backend; do not modify).
func (b *Backend) CurrentKey() []byte { return nil }

// CurrentKeyGroup returns the current key's key group.
func (b *Backend) CurrentKeyGroup() uint16 { return 0 }

// Snapshot freezes the changes made since the previous Snapshot and returns
// them as the checkpoint Part of checkpoint id. Reads keep seeing the frozen
// changes until Committed or Aborted. It takes O(1) (plus expiring TTL
// entries of the changes).
func (b *Backend) Snapshot(id uint64) checkpoint.Part { return nil }

// Committed tells the backend that checkpoint id (and every older one) is
// durable: their frozen changes are dropped from memory.
func (b *Backend) Committed(id uint64) {}

// Aborted tells the backend that checkpoint id failed: its frozen changes
// stay visible (under newer changes) and are written again by the next
// Snapshot's Part.
func (b *Backend) Aborted(id uint64) {}

// BufferedBytes returns the size of the write-back layers (current and
// frozen).
func (b *Backend) BufferedBytes() int64 { return 0 }

// WantsCheckpoint reports that the write-back layer exceeds its limit: the
// runtime should trigger a checkpoint soon (this is the backpressure signal;
// the layer does not spill to disk).
func (b *Backend) WantsCheckpoint() bool { return false }

// Codecs returns "name=codecID;…" of the states registered so far, sorted by
// name: the Codecs field of the operator's checkpoint.OperatorInfo.
func (b *Backend) Codecs() string { return "" }

// StateOption configures one state handle.
type StateOption interface{ applyState(*stateConfig) }

type stateConfig struct {
	ttl   time.Duration
	clock func() time.Time
}

type stateOptionFunc func(*stateConfig)

func (f stateOptionFunc) applyState(c *stateConfig) { f(c) }

// WithTTL expires entries d after their last write (Flink's OnCreateAndWrite):
// expired entries are invisible, deleted when read and when a snapshot finds
// them among the changes. clock nil means time.Now.
func WithTTL(d time.Duration, clock func() time.Time) StateOption {
	return stateOptionFunc(func(c *stateConfig) { c.ttl, c.clock = d, clock })
}
