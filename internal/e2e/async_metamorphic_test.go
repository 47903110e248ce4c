package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// runAsyncMetamorphic runs the metamorphic job with its doubling done by
// the HTTP service (async I/O after a Rebalance) under one configuration,
// and returns the last aggregate per key.
func runAsyncMetamorphic(t *testing.T, svc *asyncService, in []event, splits, par int, interval time.Duration, ordered bool) map[int64]total {
	t.Helper()
	client := newAsyncClient(svc.URL, 8*par)
	defer client.close()
	job := pipeline.New("meta-async", pipeline.CheckpointDir(t.TempDir()), pipeline.DefaultParallelism(par),
		pipeline.CheckpointInterval(interval))
	src := pipeline.FromSource(job, "events", source.NewSlice(in, splits))
	kept := pipeline.Filter(pipeline.Rebalance(src), "filter", func(_ context.Context, e event) (bool, error) { return e.Value%7 != 0, nil })
	double := func(ctx context.Context, e event) (event, error) {
		v, err := client.get(ctx, e.Value)
		return event{Key: e.Key, Value: v}, err
	}
	opts := []pipeline.OperatorOption{pipeline.AsyncCapacity(8), pipeline.AsyncTimeout(10 * time.Second), pipeline.Retry(5, time.Millisecond, 100*time.Millisecond)}
	var doubled *pipeline.Stream[event]
	if ordered {
		doubled = pipeline.OrderedWait(kept, "double", double, opts...)
	} else {
		doubled = pipeline.UnorderedWait(kept, "double", double, opts...)
	}
	aggs := pipeline.Aggregate(pipeline.KeyBy(doubled, func(e event) int64 { return e.Key }), "aggregate", totalAgg{})
	var mu sync.Mutex
	got := make(map[int64]total)
	pipeline.To(aggs, "aggs", sink.NewFunc(func(_ context.Context, v total) error {
		mu.Lock()
		defer mu.Unlock()
		if v.Count > got[v.Key].Count { // a key's updates may come from several async subtasks
			got[v.Key] = v
		}
		return nil
	}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := job.Run(ctx); err != nil {
		t.Fatalf("splits=%d par=%d interval=%v ordered=%v: %v", splits, par, interval, ordered, err)
	}
	return got
}

// TestE2EAsyncMetamorphic: the metamorphic job with Rebalance and async
// I/O against an HTTP service of random latency gives the oracle's result
// at parallelism 1, 2 and 4, with several checkpoint intervals and split
// counts, ordered and unordered.
func TestE2EAsyncMetamorphic(t *testing.T) {
	seed := testSeed(t)
	in := metamorphicInput(seed)
	in = in[:min(len(in), 4000)] // the service's latency makes every record cost
	if testing.Short() {
		in = in[:min(len(in), 1500)]
	}
	want := oracle(in)
	var lmu sync.Mutex
	lrng := rand.New(rand.NewPCG(seed, 9))
	svc := startAsyncService(t, func(v int64) int64 { return 2 * v }, func() time.Duration {
		lmu.Lock()
		defer lmu.Unlock()
		return time.Duration(lrng.IntN(1000)) * time.Microsecond
	})
	rng := rand.New(rand.NewPCG(seed, 10))
	intervals := []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond}
	for _, par := range []int{1, 2, 4} {
		for _, ordered := range []bool{true, false} {
			splits := 1 + rng.IntN(4)
			interval := intervals[rng.IntN(len(intervals))]
			t.Run(fmt.Sprintf("par=%d,ordered=%v,splits=%d,interval=%v", par, ordered, splits, interval), func(t *testing.T) {
				got := runAsyncMetamorphic(t, svc, in, splits, par, interval, ordered)
				if !maps.Equal(got, want) {
					n, ex := diffMaps(got, want, func(v total) string { return fmt.Sprintf("%+v", v) })
					t.Fatalf("seed %d: %d aggregates differ from the oracle (%s)", seed, n, ex)
				}
			})
		}
	}
}
