package pipeline_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"sync"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// ExampleRebalance spreads CPU-bound work after a one-split source over 4
// subtasks: the hashing Map runs in each of them.
func ExampleRebalance() {
	job := pipeline.New("hash")
	words := pipeline.FromSource(job, "words", source.NewSlice([]string{"alpha", "beta", "gamma", "delta", "epsilon"}, 1))
	spread := pipeline.Rebalance(words, pipeline.Parallelism(4))
	hashed := pipeline.Map(spread, "sha256", func(_ context.Context, w string) (string, error) {
		sum := []byte(w)
		for range 1000 { // CPU-bound
			s := sha256.Sum256(sum)
			sum = s[:]
		}
		return fmt.Sprintf("%s %x", w, sum[:4]), nil
	})
	var mu sync.Mutex
	var out []string
	pipeline.To(hashed, "collect", sink.NewFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		out = append(out, s)
		return nil
	}, nil))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	slices.Sort(out) // the subtasks' outputs interleave
	for _, s := range out {
		fmt.Println(s)
	}
	// Output:
	// alpha 7703e62c
	// beta ab76e4d7
	// delta e68cc669
	// epsilon 36035763
	// gamma 9ad25049
}
