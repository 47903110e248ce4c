package pipeline_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// TestJobStatusDuringRun calls Status from another goroutine while Run sets
// the job's engine and runs it (run with -race: an unsynchronised engine
// field is reported).
func TestJobStatusDuringRun(t *testing.T) {
	job := pipeline.New("status-race", pipeline.CheckpointDir(t.TempDir()), pipeline.CheckpointInterval(5*time.Millisecond))
	src := pipeline.FromSource(job, "gen", source.NewGenerator(1, -1, func(_ int, seq uint64) uint64 { return seq }))
	var seen atomic.Int64
	pipeline.To(src, "out", sink.NewFunc(func(context.Context, uint64) error { seen.Add(1); return nil }, nil))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var sawRunning atomic.Bool
	wg.Go(func() {
		defer cancel() // stops the job once Status saw it running
		for ctx.Err() == nil {
			st := job.Status()
			if st.Job != "status-race" {
				t.Errorf("Status().Job = %q", st.Job)
				return
			}
			if st.State == "running" && seen.Load() > 1000 && len(st.Checkpoints) > 0 {
				sawRunning.Store(true)
				return
			}
		}
	})
	err := job.Run(ctx)
	wg.Wait()
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !sawRunning.Load() {
		t.Fatal("Status never reported the running job with a checkpoint")
	}
	if st := job.Status(); st.State != "finished" {
		t.Fatalf("state after Run = %q, want finished", st.State)
	}
}

// TestTimerOutOfRange: timers beyond int64 nanoseconds (after 2262) are
// refused with ErrTimerOutOfRange instead of wrapping into the past and
// firing at once; the extreme representable times are accepted.
func TestTimerOutOfRange(t *testing.T) {
	far := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	early := time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)
	job := pipeline.New("timers-range", pipeline.CheckpointDir(t.TempDir()), pipeline.DefaultParallelism(1))
	src := pipeline.FromSource(job, "in", source.NewSlice([]int64{1, 2, 3}, 1), pipeline.NoWatermarks())
	var mu sync.Mutex
	var errs []error
	var fired []pipeline.Timer
	out := pipeline.Process(pipeline.KeyBy(src, func(v int64) int64 { return v }), "p", func() pipeline.KeyedProcessFunc[int64, int64, int64] {
		return &pipeline.ProcessFuncs[int64, int64, int64]{
			ProcessFn: func(ctx *pipeline.KeyedContext[int64, int64], v int64) error {
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs,
					ctx.RegisterEventTimer(far),
					ctx.RegisterProcessingTimer(far),
					ctx.RegisterEventTimer(early),
					ctx.DeleteProcessingTimer(far))
				// The last representable instant is fine (fires at the end of input).
				if err := ctx.RegisterEventTimer(time.Unix(0, math.MaxInt64)); err != nil {
					t.Errorf("RegisterEventTimer(max) = %v", err)
				}
				return nil
			},
			TimerFn: func(ctx *pipeline.KeyedContext[int64, int64], tm pipeline.Timer) error {
				mu.Lock()
				fired = append(fired, tm)
				mu.Unlock()
				return nil
			},
		}
	})
	pipeline.To(out, "sink", sink.NewFunc(func(context.Context, int64) error { return nil }, nil))
	runJob(t, job)
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 12 {
		t.Fatalf("%d results, want 12", len(errs))
	}
	for i, err := range errs {
		if !errors.Is(err, pipeline.ErrTimerOutOfRange) {
			t.Fatalf("result %d = %v, want ErrTimerOutOfRange", i, err)
		}
	}
	if len(fired) != 3 {
		t.Fatalf("fired %v, want only the 3 max-time timers", fired)
	}
	for _, tm := range fired {
		if tm.Time.UnixNano() != math.MaxInt64 {
			t.Fatalf("timer at %v fired", tm.Time)
		}
	}
}
