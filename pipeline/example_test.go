package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// Example counts words: lines from a slice source (two splits), split
// into words, counted per word by a keyed Reduce, the final counts
// collected. Without CheckpointDir the job checkpoints into a temporary
// directory; a bounded source makes Run return once everything is counted.
func Example() {
	job := pipeline.New("wordcount")
	lines := pipeline.FromSource(job, "lines", source.NewSlice([]string{"to be or", "not to be"}, 2))
	words := pipeline.FlatMap(lines, "split", func(_ context.Context, l string, out *pipeline.Collector[string]) error {
		for _, w := range strings.Fields(l) {
			out.Emit(w)
		}
		return nil
	})
	type count struct {
		Word string
		N    int
	}
	ones := pipeline.Map(words, "one", func(_ context.Context, w string) (count, error) { return count{w, 1}, nil })
	counts := pipeline.Reduce(pipeline.KeyBy(ones, func(c count) string { return c.Word }), "count",
		func(_ context.Context, a, b count) (count, error) { return count{a.Word, a.N + b.N}, nil })

	var mu sync.Mutex
	final := map[string]int{}
	pipeline.To(counts, "collect", sink.NewFunc(func(_ context.Context, c count) error {
		mu.Lock()
		defer mu.Unlock()
		final[c.Word] = max(final[c.Word], c.N) // Reduce emits every update
		return nil
	}, nil))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	keys := make([]string, 0, len(final))
	for w := range final {
		keys = append(keys, w)
	}
	slices.Sort(keys)
	for _, w := range keys {
		fmt.Println(w, final[w])
	}
	// Output:
	// be 2
	// not 1
	// or 1
	// to 2
}

// ExampleFromBytes decodes JSON records at the source edge and validates
// them: records that fail either go to a dead-letter sink, with the raw
// bytes and a reason whose class (decode, validate …) comes first.
func ExampleFromBytes() {
	type order struct {
		ID     string `json:"id" validate:"required"`
		Amount int    `json:"amount" validate:"gte=0"`
	}
	raw := [][]byte{[]byte(`{"id":"a","amount":3}`), []byte(`{"id":`), []byte(`{"id":"b","amount":-1}`)}
	job := pipeline.New("orders")
	var mu sync.Mutex
	var lines []string
	collect := func(s string) {
		mu.Lock()
		lines = append(lines, s)
		mu.Unlock()
	}
	dlq := sink.NewFunc(func(_ context.Context, d sink.DeadLetter) error {
		reason, _, _ := strings.Cut(d.Reason, ":")
		collect(fmt.Sprintf("dead letter (%s): %s", reason, d.Raw))
		return nil
	}, nil)
	orders := pipeline.FromBytes(job, "orders", source.NewSlice(raw, 1), pipeline.JSON[order](),
		pipeline.OnBadRecord(pipeline.DeadLetter("bad-orders", dlq)))
	pipeline.To(orders, "out", sink.NewFunc(func(_ context.Context, o order) error {
		collect(fmt.Sprintf("order %s: %d", o.ID, o.Amount))
		return nil
	}, nil))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	slices.Sort(lines) // two sinks, two tasks
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// dead letter (decode): {"id":
	// dead letter (validate): {"id":"b","amount":-1}
	// order a: 3
}
