package window

import (
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/state"
)

// Function is an incremental window function for Apply: it folds each
// record into one accumulator (ACC) per key and window and derives the
// window's result (OUT) from it. Build one with ReduceFn, AggregateFn or
// Count. Values are immutable and may be shared by several operators.
type Function[T, ACC, OUT any] struct {
	add    func(acc ACC, ok bool, v T) ACC // ok false: no accumulator yet
	result func(acc ACC) OUT
	merge  func(a, b ACC) ACC // nil: cannot merge (no session windows)
	codec  pipeline.Codec[ACC]
	kind   string
}

// ReduceFn combines a window's records pairwise with fn (which must be
// associative): the result is fn(…fn(fn(r1, r2), r3)…). codec encodes the
// running value in state (nil: JSON).
func ReduceFn[T any](fn func(a, b T) T, codec pipeline.Codec[T]) Function[T, T, T] {
	if codec == nil {
		codec = pipeline.JSON[T]()
	}
	f := Function[T, T, T]{
		result: func(acc T) T { return acc },
		codec:  codec,
		kind:   "reduce",
	}
	if fn != nil {
		f.add = func(acc T, ok bool, v T) T {
			if !ok {
				return v
			}
			return fn(acc, v)
		}
		f.merge = fn
	}
	return f
}

// Merger is implemented by aggregators that can combine two accumulators
// (Flink's AggregateFunction.merge); session windows need it.
type Merger[ACC any] interface {
	Merge(a, b ACC) ACC
}

// AggregateFn folds a window's records with agg, keeping its accumulator in
// state with codec (nil: JSON). If agg implements Merger[ACC] the function
// also works on session windows.
func AggregateFn[T, ACC, OUT any](agg state.Aggregator[T, ACC, OUT], codec pipeline.Codec[ACC]) Function[T, ACC, OUT] {
	if codec == nil {
		codec = pipeline.JSON[ACC]()
	}
	f := Function[T, ACC, OUT]{codec: codec, kind: "aggregate"}
	if agg == nil {
		return f
	}
	f.add = func(acc ACC, ok bool, v T) ACC {
		if !ok {
			acc = agg.CreateAccumulator()
		}
		return agg.Add(acc, v)
	}
	f.result = agg.Result
	if m, ok := agg.(Merger[ACC]); ok {
		f.merge = m.Merge
	}
	return f
}

// Count counts a window's records (an int64 accumulator in varint
// encoding).
func Count[T any]() Function[T, int64, int64] {
	return Function[T, int64, int64]{
		add:    func(acc int64, _ bool, _ T) int64 { return acc + 1 },
		result: func(acc int64) int64 { return acc },
		merge:  func(a, b int64) int64 { return a + b },
		codec:  state.VarintCodec(),
		kind:   "count",
	}
}

// Pane is what a ProcessFunc is told about the window it is given.
type Pane[K comparable] struct {
	// Key is the record key.
	Key K
	// Window is the firing window.
	Window Window
	// Firing is the firing's index (see Result.Firing).
	Firing int
	// Watermark is the operator's event-time watermark (zero before the
	// first one).
	Watermark time.Time
}

// ProcessFunc computes a firing window's results from its full contents
// (in arrival order; merged session windows keep each part's order, parts
// appended). It emits any number of outputs with emit; each becomes a
// Result with the pane's key, window and firing. elems is valid only during
// the call.
type ProcessFunc[K comparable, T, OUT any] func(p Pane[K], elems []T, emit func(OUT)) error
