package pipeline_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// cacheProbe is a keyed count that records the largest read cache its
// subtask's backend held.
type cacheProbe struct {
	be  *state.Backend
	n   *state.Value[int64]
	max *atomic.Int64
}

func (f *cacheProbe) Open(ctx *pipeline.OpenContext) (err error) {
	f.be = ctx.Backend()
	f.n, err = state.NewValue(f.be, "n", state.Int64Codec())
	return err
}

func (f *cacheProbe) ProcessElement(ctx *pipeline.KeyedContext[int64, int64], k int64) error {
	n, _, err := f.n.Get()
	if err != nil {
		return err
	}
	if err := f.n.Set(n + 1); err != nil {
		return err
	}
	for m := f.max.Load(); f.be.CachedBytes() > m && !f.max.CompareAndSwap(m, f.be.CachedBytes()); m = f.max.Load() {
	}
	return ctx.Emit(n + 1)
}

func (f *cacheProbe) OnTimer(*pipeline.KeyedContext[int64, int64], pipeline.Timer) error { return nil }

// TestStateReadCacheBounds: a keyed count over 20k keys with checkpoints
// every 10 ms fills its subtasks' read caches (the committed values) far
// past 64 KiB by default, and never past StateReadCache(64 KiB) (plus one
// entry) with it; StateReadCache(-1) keeps no cache at all.
func TestStateReadCacheBounds(t *testing.T) {
	const keys, per = 20_000, 40_000 // per split, 2 splits
	run := func(t *testing.T, opts ...pipeline.JobOption) int64 {
		t.Helper()
		var peak atomic.Int64
		job := pipeline.New("readcache", append([]pipeline.JobOption{pipeline.CheckpointDir(t.TempDir()),
			pipeline.CheckpointInterval(10 * time.Millisecond), pipeline.DefaultParallelism(2)}, opts...)...)
		src := pipeline.FromSource(job, "gen", source.NewGenerator(2, per, func(split int, seq uint64) int64 {
			return int64((seq*2 + uint64(split)) % keys)
		}))
		counts := pipeline.Process(pipeline.KeyBy(src, func(k int64) int64 { return k }), "count",
			func() pipeline.KeyedProcessFunc[int64, int64, int64] { return &cacheProbe{max: &peak} })
		var seen atomic.Int64
		pipeline.To(counts, "sink", sink.NewFunc(func(context.Context, int64) error { seen.Add(1); return nil }, nil))
		if err := job.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		if seen.Load() != 2*per {
			t.Fatalf("sink saw %d records, want %d", seen.Load(), 2*per)
		}
		return peak.Load()
	}
	const bound = 64 << 10
	if got := run(t); got <= 2*bound {
		t.Fatalf("default read cache peaked at %d bytes: the test cannot tell the bound from the default", got)
	}
	if got := run(t, pipeline.StateReadCache(bound)); got > bound+256 {
		t.Fatalf("StateReadCache(%d): the read cache peaked at %d bytes", bound, got)
	}
	if got := run(t, pipeline.StateReadCache(-1)); got != 0 {
		t.Fatalf("StateReadCache(-1): the read cache held %d bytes", got)
	}
}
