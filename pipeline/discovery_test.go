package pipeline_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// growingSource is an unbounded generator whose discoverable split set grows
// when grow is called: Splits lists the first splits, DiscoverSplits all
// visible ones.
type growingSource struct {
	*source.Generator[int64]
	visible atomic.Int64
}

func (g *growingSource) Splits(ctx context.Context) ([]source.Split, error) {
	all, err := g.Generator.Splits(ctx)
	return all[:g.visible.Load()], err
}

func (g *growingSource) DiscoverSplits(ctx context.Context) ([]source.Split, error) {
	return g.Splits(ctx)
}

// TestDiscoveryAddsSplits: splits discovered while the job runs get source
// tasks feeding the running keyed and sink tasks, take part in checkpoints
// (their offsets are committed), and are restored on restart.
func TestDiscoveryAddsSplits(t *testing.T) {
	const splits = 3
	dir := t.TempDir()
	newSource := func(visible int64) *growingSource {
		g := &growingSource{Generator: source.NewGenerator(splits, -1, func(split int, seq uint64) int64 {
			return int64(split)<<40 | int64(seq%50)
		})}
		g.visible.Store(visible)
		return g
	}
	type result struct {
		mu      sync.Mutex
		bySplit map[int64]int64
	}
	run := func(t *testing.T, src *growingSource, until func(job *pipeline.Job, r *result) bool) *pipeline.Job {
		t.Helper()
		res := &result{bySplit: map[int64]int64{}}
		job := pipeline.New("discovery", pipeline.CheckpointDir(dir), pipeline.CheckpointInterval(10*time.Millisecond),
			pipeline.DefaultParallelism(2), pipeline.DiscoveryInterval(0))
		in := pipeline.FromSource(job, "gen", src)
		counts := pipeline.Reduce(pipeline.KeyBy(in, func(v int64) int64 { return v }), "count",
			func(_ context.Context, a, _ int64) (int64, error) { return a, nil })
		pipeline.To(counts, "out", sink.NewFunc(func(_ context.Context, v int64) error {
			res.mu.Lock()
			res.bySplit[v>>40]++
			res.mu.Unlock()
			return nil
		}, nil))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		var done atomic.Bool
		wg.Go(func() {
			defer cancel()
			for ctx.Err() == nil {
				if job.Status().State == "running" && until(job, res) {
					done.Store(true)
					return
				}
				time.Sleep(time.Millisecond) // polling interval, not synchronisation
			}
		})
		err := job.Run(ctx)
		wg.Wait()
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if !done.Load() {
			res.mu.Lock()
			defer res.mu.Unlock()
			t.Fatalf("condition not reached in time: records by split %v, committed %v", res.bySplit, job.Status().Splits)
		}
		return job
	}
	committed := func(job *pipeline.Job) map[string]bool {
		out := map[string]bool{}
		for _, s := range job.Status().Splits {
			if s.Source == "gen" {
				out[s.Split] = true
			}
		}
		return out
	}
	src := newSource(1)
	grown := false
	run(t, src, func(job *pipeline.Job, r *result) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !grown {
			if r.bySplit[0] > 100 {
				grown = true
				src.visible.Store(splits)
				job.DiscoverNow()
			}
			return false
		}
		c := committed(job)
		return r.bySplit[1] > 100 && r.bySplit[2] > 100 && c["1"] && c["2"]
	})

	// Restart: Splits lists all three (as a broker's route would), and
	// every split resumes from its committed offset.
	restarted := run(t, newSource(splits), func(job *pipeline.Job, r *result) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.bySplit[0] > 0 && r.bySplit[1] > 0 && r.bySplit[2] > 0
	})
	if c := committed(restarted); !c["0"] || !c["1"] || !c["2"] {
		t.Fatalf("committed splits after restart: %v", c)
	}
}
