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

type event struct {
	Key   int64
	Value int64
}

// total is the per-key result: sum and count of the kept, doubled values.
type total struct {
	Key, Sum, Count int64
}

type totalAgg struct{}

func (totalAgg) CreateAccumulator() total { return total{} }
func (totalAgg) Add(acc total, e event) total {
	return total{Key: e.Key, Sum: acc.Sum + e.Value, Count: acc.Count + 1}
}
func (totalAgg) Result(acc total) total { return acc }

// metamorphicInput generates the records of one seed.
func metamorphicInput(seed uint64) []event {
	rng := rand.New(rand.NewPCG(seed, 2))
	n := 2000 + rng.IntN(8000)
	keys := 1 + rng.IntN(300)
	out := make([]event, n)
	for i := range out {
		out[i] = event{Key: int64(rng.IntN(keys)), Value: int64(rng.IntN(1000)) - 100}
	}
	return out
}

// oracle is the single-threaded, failure-free result.
func oracle(in []event) map[int64]total {
	want := make(map[int64]total)
	for _, e := range in {
		if e.Value%7 == 0 {
			continue
		}
		c := want[e.Key]
		want[e.Key] = total{Key: e.Key, Sum: c.Sum + 2*e.Value, Count: c.Count + 1}
	}
	return want
}

// runMetamorphic runs the job under one configuration and returns the last
// aggregate per key and the last reduced sum per key.
func runMetamorphic(t *testing.T, in []event, splits, par int, interval time.Duration) (map[int64]total, map[int64]int64) {
	t.Helper()
	job := pipeline.New("meta", pipeline.CheckpointDir(t.TempDir()), pipeline.DefaultParallelism(par),
		pipeline.CheckpointInterval(interval))
	src := pipeline.FromSource(job, "events", source.NewSlice(in, splits))
	kept := pipeline.Filter(src, "filter", func(_ context.Context, e event) (bool, error) { return e.Value%7 != 0, nil })
	doubled := pipeline.Map(kept, "double", func(_ context.Context, e event) (event, error) {
		return event{Key: e.Key, Value: e.Value * 2}, nil
	})
	byKey := func(e event) int64 { return e.Key }
	aggs := pipeline.Aggregate(pipeline.KeyBy(doubled, byKey), "aggregate", totalAgg{})
	sums := pipeline.Reduce(pipeline.KeyBy(doubled, byKey), "reduce",
		func(_ context.Context, a, b event) (event, error) {
			return event{Key: a.Key, Value: a.Value + b.Value}, nil
		})
	var mu sync.Mutex
	gotAgg := make(map[int64]total)
	gotSum := make(map[int64]int64)
	pipeline.To(aggs, "aggs", sink.NewFunc(func(_ context.Context, v total) error {
		mu.Lock()
		gotAgg[v.Key] = v // per key, updates arrive in order
		mu.Unlock()
		return nil
	}, nil))
	pipeline.To(sums, "sums", sink.NewFunc(func(_ context.Context, e event) error {
		mu.Lock()
		gotSum[e.Key] = e.Value
		mu.Unlock()
		return nil
	}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := job.Run(ctx); err != nil {
		t.Fatalf("splits=%d par=%d interval=%v: %v", splits, par, interval, err)
	}
	return gotAgg, gotSum
}

func TestE2EMetamorphic(t *testing.T) {
	seed := testSeed(t)
	in := metamorphicInput(seed)
	want := oracle(in)
	wantSum := make(map[int64]int64, len(want))
	for k, v := range want {
		wantSum[k] = v.Sum
	}
	rng := rand.New(rand.NewPCG(seed, 3))
	intervals := []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond}
	for _, par := range []int{1, 2, 4} {
		for range 2 {
			splits := 1 + rng.IntN(5)
			interval := intervals[rng.IntN(len(intervals))]
			t.Run(fmt.Sprintf("par=%d,splits=%d,interval=%v", par, splits, interval), func(t *testing.T) {
				gotAgg, gotSum := runMetamorphic(t, in, splits, par, interval)
				if !maps.Equal(gotAgg, want) {
					t.Fatalf("seed %d: aggregates differ from the oracle (%d keys vs %d)", seed, len(gotAgg), len(want))
				}
				if !maps.Equal(gotSum, wantSum) {
					t.Fatalf("seed %d: reduced sums differ from the oracle", seed)
				}
			})
		}
	}
}
