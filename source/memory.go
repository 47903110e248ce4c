package source

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ErrBadOffset is returned by Open when a restored offset cannot be decoded.
var ErrBadOffset = errors.New("source: bad offset")

// Option configures Slice and Generator sources.
type Option[T any] func(*memOptions[T])

type memOptions[T any] struct {
	eventTime func(T) time.Time
}

// WithEventTime sets the event time of each record from its value.
func WithEventTime[T any](fn func(T) time.Time) Option[T] {
	return func(o *memOptions[T]) { o.eventTime = fn }
}

// encodeIndex and decodeIndex are the offset encoding of the in-memory
// sources: the index of the next record, 8 bytes big-endian.
func decodeIndex(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: %d bytes, want 8", ErrBadOffset, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// indexReader is the SplitReader shared by Slice and Generator: records
// [next, end) of a split, produced by at(i). end == 0 with unbounded set
// means no end.
type indexReader[T any] struct {
	at        func(i uint64) T
	eventTime func(T) time.Time
	next, end uint64
	unbounded bool
	batch     []Record[T]
	offs      []byte
}

func (r *indexReader[T]) Poll(ctx context.Context, max int) ([]Record[T], error) {
	if max <= 0 {
		max = 1
	}
	n := uint64(max)
	if !r.unbounded {
		if r.next >= r.end {
			return nil, ErrEndOfSplit
		}
		n = min(n, r.end-r.next)
	}
	if cap(r.batch) < int(n) {
		r.batch = make([]Record[T], n)
		r.offs = make([]byte, 8*n)
	}
	batch := r.batch[:n]
	for i := range batch {
		v := r.at(r.next)
		r.next++
		off := r.offs[8*i : 8*i+8 : 8*i+8]
		binary.BigEndian.PutUint64(off, r.next)
		rec := Record[T]{Value: v, Offset: off}
		if r.eventTime != nil {
			rec.EventTime = r.eventTime(v)
		}
		batch[i] = rec
	}
	return batch, nil
}

func (r *indexReader[T]) Offset() []byte { return binary.BigEndian.AppendUint64(nil, r.next) }

func (r *indexReader[T]) NotifyCheckpointComplete(context.Context, uint64) error { return nil }

func (r *indexReader[T]) Close() error { return nil }

// Slice is a bounded source over an in-memory slice, cut into contiguous
// splits. Offsets are record indexes within a split, so it is checkpointable
// and deterministic. It is safe for concurrent use; the values are never
// modified.
type Slice[T any] struct {
	values []T
	splits int
	opts   memOptions[T]
}

// NewSlice returns a source over values cut into splits contiguous splits
// (at least 1) named "0", "1", ….
func NewSlice[T any](values []T, splits int, opts ...Option[T]) *Slice[T] {
	s := &Slice[T]{values: values, splits: max(splits, 1)}
	for _, o := range opts {
		o(&s.opts)
	}
	return s
}

func (s *Slice[T]) bounds(i int) (lo, hi int) {
	n := len(s.values)
	return i * n / s.splits, (i + 1) * n / s.splits
}

// Splits implements Source.
func (s *Slice[T]) Splits(context.Context) ([]Split, error) {
	out := make([]Split, s.splits)
	for i := range out {
		out[i] = Split{ID: strconv.Itoa(i)}
	}
	return out, nil
}

// Open implements Source.
func (s *Slice[T]) Open(_ context.Context, split Split, restored []byte) (SplitReader[T], error) {
	i, err := strconv.Atoi(split.ID)
	if err != nil || i < 0 || i >= s.splits {
		return nil, fmt.Errorf("source: slice has no split %q", split.ID)
	}
	lo, hi := s.bounds(i)
	r := &indexReader[T]{eventTime: s.opts.eventTime, end: uint64(hi - lo)}
	r.at = func(j uint64) T { return s.values[lo+int(j)] }
	if restored != nil {
		if r.next, err = decodeIndex(restored); err != nil {
			return nil, err
		}
		if r.next > r.end {
			return nil, fmt.Errorf("%w: index %d past the end %d of split %s", ErrBadOffset, r.next, r.end, split.ID)
		}
	}
	return r, nil
}

// Generator is a deterministic source: record seq of split i is
// gen(i, seq). It is bounded (perSplit records per split) or unbounded
// (perSplit < 0), checkpointable (offset = next seq), and safe for
// concurrent use if gen is.
type Generator[T any] struct {
	splits   int
	perSplit int64
	gen      func(split int, seq uint64) T
	opts     memOptions[T]
}

// NewGenerator returns a generator with splits splits (at least 1) named
// "0", "1", … of perSplit records each (unbounded when perSplit < 0).
func NewGenerator[T any](splits int, perSplit int64, gen func(split int, seq uint64) T, opts ...Option[T]) *Generator[T] {
	g := &Generator[T]{splits: max(splits, 1), perSplit: perSplit, gen: gen}
	for _, o := range opts {
		o(&g.opts)
	}
	return g
}

// Splits implements Source.
func (g *Generator[T]) Splits(context.Context) ([]Split, error) {
	out := make([]Split, g.splits)
	for i := range out {
		out[i] = Split{ID: strconv.Itoa(i)}
	}
	return out, nil
}

// Open implements Source.
func (g *Generator[T]) Open(_ context.Context, split Split, restored []byte) (SplitReader[T], error) {
	i, err := strconv.Atoi(split.ID)
	if err != nil || i < 0 || i >= g.splits {
		return nil, fmt.Errorf("source: generator has no split %q", split.ID)
	}
	r := &indexReader[T]{eventTime: g.opts.eventTime, unbounded: g.perSplit < 0}
	if !r.unbounded {
		r.end = uint64(g.perSplit)
	}
	r.at = func(seq uint64) T { return g.gen(i, seq) }
	if restored != nil {
		if r.next, err = decodeIndex(restored); err != nil {
			return nil, err
		}
		if !r.unbounded && r.next > r.end {
			return nil, fmt.Errorf("%w: seq %d past the end %d of split %s", ErrBadOffset, r.next, r.end, split.ID)
		}
	}
	return r, nil
}
