package window

import (
	"github.com/runnel-dev/runnel/pipeline"
)

// CoGroupFunc computes a firing window's results from the records of both
// connected inputs in it (in arrival order per input): as from the first,
// bs from the second; either may be empty, not both. It emits any number of
// outputs with emit. as and bs are valid only during the call.
type CoGroupFunc[K comparable, A, B, OUT any] func(p Pane[K], as []A, bs []B, emit func(OUT)) error

// CoGroup groups the records of c's two inputs into windows of a per key
// (Flink's coGroup): when a window fires, fn gets the window's records of
// both inputs, so it can write inner, left, right and full outer joins.
// Results are Results with the pane's key and window, event time End -
// 1 ns. The window's records are kept in its state, encoded with c.Codec()
// (the inputs' WithCodec codecs; JSON by default). Lateness, late records
// and firing are those of Process: a LateRecords tag must be a
// pipeline.OutputTag[pipeline.Either[A, B]]; with AllowedLateness a
// window that gets a late record fires again with all its records. uid
// names the operator; its inputs are tagged by operators uid+"/in1" and
// uid+"/in2". Every Assigner works, sessions included (windows merge over
// the records of both inputs).
func CoGroup[K comparable, A, B, OUT any](c *pipeline.KeyedConnectedStreams[K, A, B], uid string, a Assigner, fn CoGroupFunc[K, A, B, OUT], opts ...Option) *pipeline.Stream[Result[K, OUT]] {
	// pf is shared by the operator's subtasks: its slices are per call.
	pf := func(p Pane[K], elems []pipeline.Either[A, B], emit func(OUT)) error {
		var as []A
		var bs []B
		for i := range elems {
			if elems[i].Second {
				bs = append(bs, elems[i].B)
			} else {
				as = append(as, elems[i].A)
			}
		}
		return fn(p, as, bs, emit)
	}
	return Process(c.Tagged(uid), uid, a, pf, c.Codec(), opts...)
}

// Join joins the records of c's two inputs that have equal keys and fall
// into the same window of a (Flink's window join): when a window fires, fn
// is called for every pair of a first-input and a second-input record in
// it (first-input records in arrival order, for each the second-input
// records in arrival order), and each result is emitted as a Result of the
// window. A window with records of only one input emits nothing (an inner
// join; see CoGroup for outer joins). An error from fn fails the firing
// under the operator's error policy. See CoGroup for state, lateness and
// UIDs.
func Join[K comparable, A, B, OUT any](c *pipeline.KeyedConnectedStreams[K, A, B], uid string, a Assigner, fn func(a A, b B) (OUT, error), opts ...Option) *pipeline.Stream[Result[K, OUT]] {
	return CoGroup(c, uid, a, func(_ Pane[K], as []A, bs []B, emit func(OUT)) error {
		for _, x := range as {
			for _, y := range bs {
				out, err := fn(x, y)
				if err != nil {
					return err
				}
				emit(out)
			}
		}
		return nil
	}, opts...)
}
