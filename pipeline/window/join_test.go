package window_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
)

// joinInputs splits one scripted stream into two join inputs: V 1 is the
// first input, V 2 the second. Both then reach the join from one task, in
// the script's order.
func joinInputs(job *pipeline.Job, in []ev, ooo time.Duration) *pipeline.KeyedConnectedStreams[string, ev, ev] {
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}}, pipeline.BoundedOutOfOrderness(ooo))
	side := func(v int64) func(context.Context, ev) (bool, error) {
		return func(_ context.Context, e ev) (bool, error) { return e.V == v, nil }
	}
	a := pipeline.Filter(src, "first", side(1))
	b := pipeline.Filter(src, "second", side(2))
	return pipeline.ConnectKeyed(pipeline.KeyBy(a, key), pipeline.KeyBy(b, key))
}

func pairOf(a, b ev) (string, error) { return fmt.Sprintf("%g+%g", a.T, b.T), nil }

// outer renders a co-group as "as|bs" with "-" for an empty side.
func outer(_ window.Pane[string], as, bs []ev, emit func(string)) error {
	show := func(es []ev) string {
		if len(es) == 0 {
			return "-"
		}
		var p []string
		for _, e := range es {
			p = append(p, fmt.Sprint(e.T))
		}
		return strings.Join(p, ",")
	}
	emit(show(as) + "|" + show(bs))
	return nil
}

// joinScript: key a has both inputs in [0s,10s) and in [10s,20s); key b
// only the first input in [0s,10s) and only the second in [10s,20s); a@5
// of the first input arrives after [0s,10s) fired (late).
func joinScript() []ev {
	return []ev{
		{"a", 1, 1}, {"a", 3, 2}, {"a", 2, 2}, {"b", 4, 1}, // out of order within the bound
		{"b", 15, 2}, {"a", 12, 1},
		{"a", 18, 2}, {"a", 5, 1}, // late: the watermark is past 10 s
		{"a", 19, 1},
	}
}

// TestWindowJoinTumbling: inner join per key and window, nested-loop order,
// late records counted and to the side output; empty sides join nothing.
func TestWindowJoinTumbling(t *testing.T) {
	job := pipeline.New("wjoin", pipeline.DefaultParallelism(2))
	lateTag := pipeline.NewOutputTag[pipeline.Either[ev, ev]]("late")
	res := window.Join(joinInputs(job, joinScript(), 2*time.Second), "join", window.Tumbling(10*time.Second), pairOf,
		window.LateRecords(lateTag))
	var got collect[window.Result[string, string]]
	var late collect[pipeline.Either[ev, ev]]
	pipeline.To(res, "out", got.sink())
	pipeline.To(pipeline.SideOutput(res, lateTag), "late", late.sink())
	runJob(t, job)
	equal(t, "joined", sorted(fmtResults(got.all())), []string{
		"a [0s,10s) 1+2 #0", "a [0s,10s) 1+3 #0", "a [10s,20s) 12+18 #0", "a [10s,20s) 19+18 #0",
	})
	if l := late.all(); len(l) != 1 || l[0].Second || l[0].A.T != 5 {
		t.Fatalf("late: %+v, want the first input's a@5", l)
	}
	if _, _, _, n := operatorStatus(t, job, "join"); n != 1 {
		t.Fatalf("late count %d, want 1", n)
	}
}

// TestWindowCoGroupOuter: CoGroup sees windows with either side empty,
// which a full outer join needs.
func TestWindowCoGroupOuter(t *testing.T) {
	job := pipeline.New("cogroup", pipeline.DefaultParallelism(1))
	res := window.CoGroup(joinInputs(job, joinScript(), 2*time.Second), "cogroup", window.Tumbling(10*time.Second), outer)
	var got collect[window.Result[string, string]]
	pipeline.To(res, "out", got.sink())
	runJob(t, job)
	equal(t, "co-groups", sorted(fmtResults(got.all())), []string{
		"a [0s,10s) 1|3,2 #0", "a [10s,20s) 12,19|18 #0", "b [0s,10s) 4|- #0", "b [10s,20s) -|15 #0",
	})
}

// TestWindowJoinSliding: a pair joins in every sliding window holding both.
func TestWindowJoinSliding(t *testing.T) {
	job := pipeline.New("wjoin-sliding", pipeline.DefaultParallelism(2))
	in := []ev{{"a", 1, 1}, {"a", 6, 2}, {"a", 12, 2}}
	res := window.Join(joinInputs(job, in, 0), "join", window.Sliding(10*time.Second, 5*time.Second), pairOf)
	var got collect[window.Result[string, string]]
	pipeline.To(res, "out", got.sink())
	runJob(t, job)
	// 1 s is in [-5s,5s) and [0s,10s); 6 s in [0s,10s) and [5s,15s).
	equal(t, "joined", sorted(fmtResults(got.all())), []string{"a [0s,10s) 1+6 #0"})
}

// TestWindowJoinSession: sessions merge over the records of both inputs.
func TestWindowJoinSession(t *testing.T) {
	job := pipeline.New("wjoin-session", pipeline.DefaultParallelism(2))
	in := []ev{
		{"a", 1, 1}, {"a", 3, 2}, {"a", 5, 1}, // one session [1s,8s): the second input's 3 s bridges 1 s and 5 s
		{"a", 20, 1}, // alone: no pair
		{"b", 30, 2}, {"b", 31, 1},
	}
	res := window.Join(joinInputs(job, in, 0), "join", window.Session(3*time.Second), pairOf)
	var got collect[window.Result[string, string]]
	pipeline.To(res, "out", got.sink())
	runJob(t, job)
	equal(t, "joined", sorted(fmtResults(got.all())), []string{
		"a [1s,8s) 1+3 #0", "a [1s,8s) 5+3 #0", "b [30s,34s) 31+30 #0",
	})
}

// TestWindowJoinEmptyInputs: one empty input joins nothing; co-group still
// sees the other's windows.
func TestWindowJoinEmptyInputs(t *testing.T) {
	in := []ev{{"a", 1, 1}, {"a", 2, 1}, {"b", 11, 1}}
	job := pipeline.New("wjoin-empty", pipeline.DefaultParallelism(2))
	c := joinInputs(job, in, 0)
	res := window.Join(c, "join", window.Tumbling(10*time.Second), pairOf)
	cg := window.CoGroup(c, "cogroup", window.Tumbling(10*time.Second), outer)
	var got, groups collect[window.Result[string, string]]
	pipeline.To(res, "out", got.sink())
	pipeline.To(cg, "groups", groups.sink())
	runJob(t, job)
	if g := got.all(); len(g) != 0 {
		t.Fatalf("joined %q with an empty second input", fmtResults(g))
	}
	equal(t, "co-groups", sorted(fmtResults(groups.all())), []string{"a [0s,10s) 1,2|- #0", "b [10s,20s) 11|- #0"})
}
