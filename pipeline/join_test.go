package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/source"
)

// withTime renders each record with its event time (a keyed pass-through
// that sees the timestamp).
func withTime(s *pipeline.Stream[string]) *pipeline.Stream[string] {
	return pipeline.Process(pipeline.KeyBy(s, func(string) string { return "" }), "with-time",
		func() pipeline.KeyedProcessFunc[string, string, string] {
			return &pipeline.ProcessFuncs[string, string, string]{ProcessFn: func(ctx *pipeline.KeyedContext[string, string], v string) error {
				return ctx.Emit(v + " @" + relSec(ctx.Timestamp()))
			}}
		}, pipeline.Parallelism(1))
}

func joinPair(_ context.Context, a, b tin) (string, error) {
	return fmt.Sprintf("%s:%s@%g+%s@%g", a.K, a.V, a.T, b.V, b.T), nil
}

// TestIntervalJoinExact: pairs with a.ts <= b.ts <= a.ts + 2 s, out of
// order within the watermark's bound, with records behind the watermark
// counted late and joined with nothing, and results at the later time.
func TestIntervalJoinExact(t *testing.T) {
	recs := []tin{
		{"a", "x", 10, "a1"},
		{"b", "x", 11, "b1"}, // joins a1
		{"b", "x", 9, "b2"},  // out of order, not late (watermark 9 s - 1 ns); no a in [7 s, 9 s]
		{"a", "x", 8, "a2"},  // late: behind the watermark
		{"a", "x", 11, "a4"}, // joins b1 (equal times)
		{"a", "y", 12, "a3"},
		{"b", "y", 14, "b3"}, // joins a3 at its upper bound
		{"b", "x", 20, "b4"}, // the watermark passes 12 s: a1, a4, b1, b2 are cleaned up
		{"a", "x", 19, "a5"}, // joins b4
		{"b", "x", 13, "b5"}, // late
		{"b", "z", 30, "b6"}, // no partner
	}
	job := pipeline.New("interval", pipeline.DefaultParallelism(2))
	in := pipeline.FromSource(job, "in", &oneByOne{splits: [][]tin{recs}}, pipeline.BoundedOutOfOrderness(2*time.Second))
	a, b := sides(in)
	out := pipeline.IntervalJoin(pipeline.ConnectKeyed(pipeline.KeyBy(a, tkey), pipeline.KeyBy(b, tkey)), "join",
		0, 2*time.Second, joinPair)
	var g gather[string]
	pipeline.To(withTime(out), "out", g.sink())
	runTJob(t, job)
	equalStrings(t, "joined", sortedCopy(g.all()), []string{
		"x:a1@10+b1@11 @11", "x:a4@11+b1@11 @11", "x:a5@19+b4@20 @20", "y:a3@12+b3@14 @14",
	})
	if _, _, late := opStatus(t, job, "join"); late != 2 {
		t.Fatalf("late records: %d, want 2", late)
	}
}

// TestIntervalJoinNegativeBounds: an interval before the first input's
// record, exclusive of nothing: b within [a - 3 s, a - 1 s].
func TestIntervalJoinNegativeBounds(t *testing.T) {
	recs := []tin{
		{"b", "x", 1, "b1"}, {"b", "x", 2, "b2"}, {"b", "x", 3.5, "b3"},
		{"a", "x", 4, "a1"}, // b1 (4-3=1), b2; not b3 (4-1=3 < 3.5)
		{"a", "x", 7, "a2"}, // b in [4, 6]: none
	}
	job := pipeline.New("interval-neg", pipeline.DefaultParallelism(1))
	in := pipeline.FromSource(job, "in", &oneByOne{splits: [][]tin{recs}}, pipeline.BoundedOutOfOrderness(time.Second))
	a, b := sides(in)
	out := pipeline.IntervalJoin(pipeline.ConnectKeyed(pipeline.KeyBy(a, tkey), pipeline.KeyBy(b, tkey)), "join",
		-3*time.Second, -time.Second, joinPair)
	var g gather[string]
	pipeline.To(withTime(out), "out", g.sink())
	runTJob(t, job)
	equalStrings(t, "joined", sortedCopy(g.all()), []string{"x:a1@4+b1@1 @4", "x:a1@4+b2@2 @4"})
}

// TestIntervalJoinEmptyInputs: nothing joins when an input is empty, and
// the job ends.
func TestIntervalJoinEmptyInputs(t *testing.T) {
	for _, c := range []struct {
		name   string
		as, bs int
	}{{"both", 0, 0}, {"first", 0, 5}, {"second", 5, 0}} {
		t.Run(c.name, func(t *testing.T) {
			mk := func(side string, n int) []tin {
				var out []tin
				for i := range n {
					out = append(out, tin{side, "k", float64(i), side + fmt.Sprint(i)})
				}
				return out
			}
			job := pipeline.New("interval-empty", pipeline.DefaultParallelism(2))
			ts := func(r tin) time.Time { return tsec(r.T) }
			a := pipeline.FromSource(job, "as", source.NewSlice(mk("a", c.as), 1)).WithTimestamps(ts)
			b := pipeline.FromSource(job, "bs", source.NewSlice(mk("b", c.bs), 2)).WithTimestamps(ts)
			out := pipeline.IntervalJoin(pipeline.ConnectKeyed(pipeline.KeyBy(a, tkey), pipeline.KeyBy(b, tkey)), "join",
				-time.Hour, time.Hour, joinPair)
			var g gather[string]
			pipeline.To(out, "out", g.sink())
			runTJob(t, job)
			if got := g.all(); len(got) != 0 {
				t.Fatalf("joined %q with an empty input", got)
			}
			if in, _, _ := opStatus(t, job, "join"); in != int64(c.as+c.bs) {
				t.Fatalf("join read %d records, want %d", in, c.as+c.bs)
			}
		})
	}
}

// TestIntervalJoinBadBounds: lower above upper is a graph error.
func TestIntervalJoinBadBounds(t *testing.T) {
	job := pipeline.New("interval-bad")
	in := pipeline.FromSource(job, "in", source.NewSlice([]tin{{"a", "x", 1, ""}}, 1))
	a, b := sides(in)
	out := pipeline.IntervalJoin(pipeline.ConnectKeyed(pipeline.KeyBy(a, tkey), pipeline.KeyBy(b, tkey)), "join",
		time.Second, 0, joinPair)
	pipeline.To(out, "out", (&gather[string]{}).sink())
	if err := job.Run(context.Background()); err == nil {
		t.Fatal("Run accepted an interval with lower > upper")
	}
}
