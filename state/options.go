// The options of a Backend and of its states.

package state

import (
	"encoding/binary"
	"time"
)

// BackendOption configures a Backend.
type BackendOption interface{ apply(*backendConfig) }

type backendConfig struct {
	kgStart, kgEnd int
	bufferLimit    int64
	cacheSize      int64
	ttlSweep       int // ttlsweep.go
}

type backendOptionFunc func(*backendConfig)

func (f backendOptionFunc) apply(c *backendConfig) { f(c) }

// WithKeyGroupRange limits the backend to key groups [start, end) (see
// KeyGroupRange). Default: every key group. Timers are loaded from these key
// groups only.
func WithKeyGroupRange(start, end uint16) BackendOption {
	return backendOptionFunc(func(c *backendConfig) { c.kgStart, c.kgEnd = int(start), int(end) })
}

// WithWriteBufferLimit sets the size (bytes, approximate) of the changes
// since the last Snapshot above which WantsCheckpoint reports true. Default
// DefaultWriteBufferLimit.
func WithWriteBufferLimit(bytes int64) BackendOption {
	return backendOptionFunc(func(c *backendConfig) { c.bufferLimit = bytes })
}

// WithReadCacheSize sets the size (bytes, approximate) of the backend's
// cache of committed values: the values of committed checkpoints and of
// store reads, so that a key read again after a checkpoint costs a map
// lookup, not a Pebble read. When it grows past size it is emptied and
// refills. 0 or less disables it. Default DefaultReadCacheSize.
func WithReadCacheSize(bytes int64) BackendOption {
	return backendOptionFunc(func(c *backendConfig) { c.cacheSize = bytes })
}

// StateOption configures one state handle.
type StateOption interface{ applyState(*stateConfig) }

type stateConfig struct {
	ttl   time.Duration
	clock func() time.Time
}

type stateOptionFunc func(*stateConfig)

func (f stateOptionFunc) applyState(c *stateConfig) { f(c) }

// WithTTL expires entries d after their last write (Flink's
// OnCreateAndWrite): expired entries are invisible, deleted when a read
// finds them and when a Snapshot finds them among the changes. clock nil
// means time.Now. Entries are stored with an 8-byte expiry prefix, so adding
// or removing a TTL changes the state's codec id (and the fingerprint).
func WithTTL(d time.Duration, clock func() time.Time) StateOption {
	return stateOptionFunc(func(c *stateConfig) { c.ttl, c.clock = d, clock })
}

func stateConfigOf(opts []StateOption) *stateConfig {
	c := &stateConfig{}
	for _, o := range opts {
		o.applyState(c)
	}
	return c
}

// expired reports whether a TTL value (expiry prefix) has expired.
func expired(val []byte, cfg *stateConfig) bool {
	return int64(binary.BigEndian.Uint64(val)) <= cfg.clock().UnixNano()
}
