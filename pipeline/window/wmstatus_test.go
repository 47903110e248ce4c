package window_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/runtime"
)

// TestWindowWatermarkHeldByEmptySplit is the "8 queues, 3 events" trap: a
// split that never receives a record holds the window operator's watermark
// back, so no window fires. The job's status says so: the window
// operator has no watermark, held back by that split (not idle). With
// IdleTimeout the split turns idle, the status shows the watermark, and
// the window fires.
func TestWindowWatermarkHeldByEmptySplit(t *testing.T) {
	for _, idle := range []time.Duration{0, 50 * time.Millisecond} {
		t.Run(fmt.Sprint("idle=", idle), func(t *testing.T) {
			hold0, hold1 := make(chan struct{}), make(chan struct{})
			src := &scripted{splits: [][]ev{{{"a", 1, 0}, {"a", 11, 0}, {"a", 12, 0}}, nil},
				hold: map[int]chan struct{}{0: hold0, 1: hold1}}
			job := newJob(t, "held")
			var opts []pipeline.SourceOption
			if idle > 0 {
				opts = append(opts, pipeline.IdleTimeout(idle))
			}
			in := pipeline.FromSource(job, "src", src, opts...)
			counts := window.Apply(pipeline.KeyBy(in, key), "w", window.Tumbling(10*time.Second), window.Count[ev]())
			var out collect[window.Result[string, int64]]
			pipeline.To(counts, "out", out.sink())
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- job.Run(ctx) }()
			status := func() runtime.OperatorStatus {
				for _, o := range job.Status().Operators {
					if o.UID == "w" {
						return o
					}
				}
				return runtime.OperatorStatus{}
			}
			if idle == 0 {
				testutil.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
					o := status()
					if o.In != 3 || len(o.HeldBy) != 1 {
						return fmt.Errorf("window operator %+v", o)
					}
					return nil
				})
				o := status()
				if h := o.HeldBy[0]; o.Watermark != nil || h.Source != "src" || h.Split != "1" || h.Watermark != nil || h.Idle {
					t.Errorf("window operator watermark %v, held by %+v: want none, held by split 1 without a watermark, not idle", o.Watermark, o.HeldBy)
				}
				if got := out.all(); len(got) != 0 {
					t.Errorf("windows fired with a split holding the watermark back: %v", fmtResults(got))
				}
			} else {
				want := sec(12).Add(-time.Nanosecond)
				testutil.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
					o := status()
					if o.Watermark == nil || !o.Watermark.Equal(want) || len(out.all()) == 0 {
						return fmt.Errorf("window operator watermark %v held by %+v, %d results", o.Watermark, o.HeldBy, len(out.all()))
					}
					return nil
				})
				equal(t, "fired while running", fmtResults(out.all()), []string{"a [0s,10s) 1 #0"})
			}
			close(hold0)
			close(hold1)
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			equal(t, "results", byKey(fmtResults(out.all())), []string{"a [0s,10s) 1 #0", "a [10s,20s) 2 #0"})
		})
	}
}
