package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// TestRebalanceRunsInParallel: after Rebalance, the operators chained to
// it run in Parallelism subtasks at once, though the source has one
// split: the first call of each of the 4 subtasks waits until 4 calls are
// in progress together (it fails after 20 s, as it would if they ran one
// after the other).
func TestRebalanceRunsInParallel(t *testing.T) {
	const par = 4
	var arrived atomic.Int32
	all := make(chan struct{})
	gate := func() error {
		n := arrived.Add(1)
		if n > par {
			return nil
		}
		if n == par {
			close(all)
		}
		select {
		case <-all:
			return nil
		case <-time.After(20 * time.Second):
			return fmt.Errorf("only %d calls ran at once", arrived.Load())
		}
	}
	job := pipeline.New("rebalance", pipeline.CheckpointInterval(5*time.Millisecond))
	src := pipeline.FromSource(job, "src", source.NewSlice(seq(0, 1000), 1))
	sq := pipeline.Map(pipeline.Rebalance(src, pipeline.Parallelism(par)), "square", func(_ context.Context, v int) (int, error) {
		if err := gate(); err != nil {
			return 0, err
		}
		return v * v, nil
	})
	var got collect[int]
	pipeline.To(sq, "out", got.sink())
	runJob(t, job)
	var want []int
	for v := range 1000 {
		want = append(want, v*v)
	}
	if g := slices.Sorted(slices.Values(got.all())); !slices.Equal(g, want) {
		t.Fatalf("output differs: %d records", len(g))
	}
	found := false
	for _, op := range job.Status().Operators {
		if op.UID == "src+rebalance" {
			found = op.Kind == "rebalance" && op.In == 1000 && op.Out == 1000
		}
	}
	if !found {
		t.Fatalf("status %+v: no src+rebalance with 1000 records in and out", job.Status().Operators)
	}
}

// TestRebalanceKeepsWatermarks: a keyed operator after a Rebalance sees
// the source's watermarks (the minimum over the rebalance subtasks): an
// event-time timer at 20 ms fires before the source reads its last
// chunk (which waits for it), not at the end of input.
func TestRebalanceKeepsWatermarks(t *testing.T) {
	var cs [][]int
	for c := range 10 {
		cs = append(cs, seq(c*10+1, c*10+11))
	}
	fired := make(chan struct{})
	var once sync.Once
	gate := func(i int) {
		if i == len(cs)-1 {
			select {
			case <-fired:
			case <-time.After(20 * time.Second): // the output shows the timer late
			}
		}
	}
	job := pipeline.New("rebalance-wm")
	src := pipeline.FromSource(job, "src", &chunks{c: cs, before: gate})
	mapped := pipeline.Map(pipeline.Rebalance(src, pipeline.Parallelism(3)), "id", func(_ context.Context, v int) (int, error) { return v, nil })
	timers := pipeline.Process(pipeline.KeyBy(mapped, func(int) int { return 0 }), "timer", func() pipeline.KeyedProcessFunc[int, int, string] {
		return &timerAt{fired: func() { once.Do(func() { close(fired) }) }}
	}, pipeline.Parallelism(1))
	var got collect[string]
	pipeline.To(timers, "out", got.sink())
	runJob(t, job)
	g := got.all()
	if len(g) != 81 || slices.Index(g, "timer") < 0 || g[len(g)-1] == "timer" {
		t.Fatalf("output %v: the timer did not fire on a watermark before the end of input", g)
	}
}

// timerAt sets an event-time timer at 20 ms on the first record and emits
// every record and the timer's firing.
type timerAt struct {
	set   bool
	fired func()
}

func (f *timerAt) Open(*pipeline.OpenContext) error { return nil }
func (f *timerAt) ProcessElement(ctx *pipeline.KeyedContext[int, string], v int) error {
	if !f.set {
		f.set = true
		if err := ctx.RegisterEventTimer(time.UnixMilli(20)); err != nil {
			return err
		}
	}
	if v <= 20 {
		return nil // before the timer: not emitted
	}
	return ctx.Emit(fmt.Sprint("record ", v))
}
func (f *timerAt) OnTimer(ctx *pipeline.KeyedContext[int, string], _ pipeline.Timer) error {
	f.fired()
	return ctx.Emit("timer")
}

// TestRebalanceWorkerRefused: RunWorker refuses a job with a parallel
// stage, saying why, before it touches the broker.
func TestRebalanceWorkerRefused(t *testing.T) {
	build := func(job *pipeline.Job) error {
		src := pipeline.FromSource(job, "src", source.NewSlice([]int{1}, 1))
		pipeline.To(pipeline.Rebalance(src), "out", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
		return nil
	}
	err := pipeline.RunWorker(context.Background(), nil, "refused", build, pipeline.CheckpointDir(t.TempDir()))
	if !errors.Is(err, pipeline.ErrSingleProcessOnly) || !errors.Is(err, pipeline.ErrInvalidGraph) {
		t.Fatalf("RunWorker = %v", err)
	}
}
