package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// collect is a concurrency-safe Func sink target.
type collect[T any] struct {
	mu  sync.Mutex
	out []T
}

func (c *collect[T]) sink() *sink.Func[T] {
	return sink.NewFunc(func(_ context.Context, v T) error {
		c.mu.Lock()
		c.out = append(c.out, v)
		c.mu.Unlock()
		return nil
	}, nil)
}

func (c *collect[T]) all() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]T(nil), c.out...)
}

type wc struct {
	Word  string
	Count int64
}

func runJob(t *testing.T, job *pipeline.Job) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := job.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestPipelineWordCount(t *testing.T) {
	for _, par := range []int{1, 3} {
		t.Run(fmt.Sprint("parallelism=", par), func(t *testing.T) {
			lines := []string{"a b c", "a b", "a", "", "skip me", "c c c"}
			job := pipeline.New("wc", pipeline.CheckpointDir(t.TempDir()), pipeline.DefaultParallelism(par),
				pipeline.CheckpointInterval(5*time.Millisecond))
			src := pipeline.FromSource(job, "lines", source.NewSlice(lines, 2))
			kept := pipeline.Filter(src, "no-skip", func(_ context.Context, l string) (bool, error) {
				return !strings.HasPrefix(l, "skip"), nil
			})
			words := pipeline.FlatMap(kept, "split", func(_ context.Context, l string, out *pipeline.Collector[wc]) error {
				for _, w := range strings.Fields(l) {
					out.Emit(wc{Word: w, Count: 1})
				}
				return nil
			})
			counts := pipeline.Reduce(pipeline.KeyBy(words, func(w wc) string { return w.Word }), "count",
				func(_ context.Context, a, b wc) (wc, error) { return wc{a.Word, a.Count + b.Count}, nil })
			upper := pipeline.Map(counts, "upper", func(_ context.Context, w wc) (wc, error) {
				return wc{strings.ToUpper(w.Word), w.Count}, nil
			})
			var got collect[wc]
			pipeline.To(upper, "out", got.sink())
			runJob(t, job)
			final := map[string]int64{}
			for _, w := range got.all() {
				final[w.Word] = max(final[w.Word], w.Count)
			}
			want := map[string]int64{"A": 3, "B": 2, "C": 4}
			if !maps.Equal(final, want) {
				t.Fatalf("counts = %v, want %v", final, want)
			}
			if n := len(got.all()); n != 9 {
				t.Fatalf("%d updates, want 9", n)
			}
			st := job.Status()
			if st.State != "finished" || len(st.Checkpoints) == 0 {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

func TestPipelineInvalidGraph(t *testing.T) {
	job := pipeline.New("bad")
	a := pipeline.FromSource(job, "dup", source.NewSlice([]int{1}, 1))
	b := pipeline.Map(a, "dup", func(_ context.Context, v int) (int, error) { return v, nil })
	pipeline.To(b, "", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
	err := job.Run(context.Background())
	if !errors.Is(err, pipeline.ErrInvalidGraph) || !strings.Contains(err.Error(), `duplicate UID "dup"`) || !strings.Contains(err.Error(), "empty UID") {
		t.Fatalf("Run = %v", err)
	}
}

var _ = slices.Sort[[]int]
var _ = state.EventTime
