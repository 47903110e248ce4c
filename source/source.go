// Package source defines runnel's source contract and the in-memory sources
// (Slice, Generator) used by tests and demos.
//
// # Contract
//
// A Source[T] is pull-mode and split-based, in the manner of Flink's FLIP-27
// sources and franz-go's PollFetches: the runtime asks a Source for its
// Splits, opens one SplitReader per split in its own task, and calls Poll
// whenever it has room downstream. Nothing is pushed; backpressure reaches
// the pull loop because the runtime simply stops calling Poll.
//
// Offsets belong to the job, not to the source: the runtime notes
// SplitReader.Offset at each checkpoint barrier, stores it in the checkpoint
// and passes it back to Open on restore. A source must therefore be able to
// resume exactly after the last record it returned before Offset was read,
// and must never commit positions to an external system on its own except
// informationally in NotifyCheckpointComplete.
//
// A bounded split ends by returning ErrEndOfSplit from Poll (with no
// records). Sources whose splits change while running (new broker queues)
// implement Discoverer.
package source

import (
	"context"
	"errors"
	"time"
)

// ErrEndOfSplit is returned by SplitReader.Poll when a bounded split has no
// more records. It is returned with an empty batch, and again on every later
// call.
var ErrEndOfSplit = errors.New("source: end of split")

// ErrUnavailable is wrapped by the errors of Splits (and Open) when the
// system the source reads cannot be reached for now (no name server or
// broker answered): worth retrying, unlike a missing topic or bad
// credentials. A job retries Splits with backoff while it fails so, within
// its start-up budget (pipeline.StartupTimeout).
var ErrUnavailable = errors.New("source: unavailable")

// Split identifies one independently readable part of a source (a partition,
// a message queue, a file). ID must be stable across runs: it keys the
// split's offset in checkpoints.
type Split struct {
	// ID is the stable identifier of the split, unique within its source.
	ID string
}

// Record is one element read from a split.
//
// Records returned by Poll, and the byte slices they reference (Offset,
// Raw), are owned by the reader and valid only until the next call to Poll
// or Close; the runtime copies what it keeps.
type Record[T any] struct {
	// Value is the decoded element.
	Value T
	// EventTime is the element's event time; the zero time means "none" and
	// the runtime then uses the time the record was polled.
	EventTime time.Time
	// Offset is the split position just AFTER this record, in the source's
	// own opaque encoding (what Open would accept to resume after it). It may
	// be nil when computing it per record is costly; dead letters then carry
	// no offset.
	Offset []byte
	// Raw is the record's original bytes, if any, for dead-lettering.
	Raw []byte
}

// Source is a typed, pull-mode, split-based source. Implementations must be
// safe for concurrent use by several split tasks (each task uses its own
// SplitReader); Splits and Open may block on I/O and honour ctx.
type Source[T any] interface {
	// Splits lists the splits to read at job start.
	Splits(ctx context.Context) ([]Split, error)
	// Open returns a reader for split positioned at restoredOffset (the value
	// of SplitReader.Offset noted by a completed checkpoint), or, when
	// restoredOffset is nil, at the source's configured start position.
	Open(ctx context.Context, split Split, restoredOffset []byte) (SplitReader[T], error)
}

// SplitReader reads one split. It is used by a single goroutine (the split's
// task) and need not be safe for concurrent use.
type SplitReader[T any] interface {
	// Poll returns up to max records. It may block to wait for data but must
	// return promptly (with what it has, possibly nothing) when ctx is done:
	// the runtime cancels ctx to inject a checkpoint barrier or to stop, and
	// treats ctx errors as an empty poll. A cancelled Poll must not lose
	// records: Offset stays at the last record returned. Bounded splits
	// return ErrEndOfSplit once exhausted.
	Poll(ctx context.Context, max int) ([]Record[T], error)
	// Offset is the position after the last record returned by Poll, in the
	// encoding Open accepts. The runtime owns the returned bytes.
	Offset() []byte
	// NotifyCheckpointComplete tells the reader that a checkpoint including
	// its offset up to some point is durable. It is informational (e.g.
	// report consumer progress to a broker for lag tools); errors are logged
	// and counted by the runtime (runtime.HookSourceNotify), not fatal.
	NotifyCheckpointComplete(ctx context.Context, checkpointID uint64) error
	// Close releases the reader. It is called once.
	Close() error
}

// Discoverer is implemented by sources whose split set grows while the job
// runs (new queues). The runtime calls DiscoverSplits periodically and opens
// every split it has not seen, from its start position.
type Discoverer interface {
	// DiscoverSplits returns the current full list of splits.
	DiscoverSplits(ctx context.Context) ([]Split, error)
}
