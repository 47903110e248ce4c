package pipeline_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// restoredLists is what one subtask's Open found in its operator state.
type restoredLists struct {
	restored bool
	seen     []int
	union    []int
}

// listFn keeps every record it sees in a list state (even split) and its
// mark in a union list state; Open reports what the restore gave it.
type listFn struct {
	mark   int
	report func(sub int, r restoredLists)
	seen   *pipeline.ListState[int]
	union  *pipeline.ListState[int]
	snaps  *atomic.Int64
}

func (f *listFn) Open(ctx *pipeline.OperatorContext) (err error) {
	if f.seen, err = pipeline.NewListState(ctx.OperatorState(), "seen", pipeline.JSON[int]()); err != nil {
		return err
	}
	if f.union, err = pipeline.NewUnionListState(ctx.OperatorState(), "marks", pipeline.JSON[int]()); err != nil {
		return err
	}
	f.report(ctx.Subtask(), restoredLists{restored: ctx.Restored(), seen: slices.Clone(f.seen.Get()), union: slices.Clone(f.union.Get())})
	f.union.Update([]int{f.mark + ctx.Subtask()})
	return nil
}

func (f *listFn) ProcessElement(ctx *pipeline.ProcessContext[int], v int) error {
	f.seen.Add(v)
	return ctx.Emit(v)
}

func (f *listFn) SnapshotState(uint64) error { f.snaps.Add(1); return nil }

// TestOperatorStateRedistribution restores operator list state with
// another parallelism, run after run: the even-split list is cut into
// contiguous runs of the old subtasks' elements in subtask order (sizes
// differing by one at most), the union list goes whole to every subtask,
// an unchanged parallelism gives each subtask its own list back, and the
// elements of subtasks that no longer exist are not restored twice.
func TestOperatorStateRedistribution(t *testing.T) {
	dir := t.TempDir()
	run := func(par, mark int) map[int]restoredLists {
		var mu sync.Mutex
		got := map[int]restoredLists{}
		var snaps atomic.Int64
		job := pipeline.New("opstate", pipeline.CheckpointDir(dir))
		// One batch per chunk, dealt to subtasks 0, 1, 2 in turn.
		src := pipeline.FromSource(job, "src", &chunks{c: [][]int{seq(20, 30), seq(0, 10), seq(10, 20)}})
		out := pipeline.ProcessStream(src, "acc", func() pipeline.ProcessFunc[int, int] {
			return &listFn{mark: mark, snaps: &snaps, report: func(sub int, r restoredLists) {
				mu.Lock()
				got[sub] = r
				mu.Unlock()
			}}
		}, pipeline.Parallelism(par))
		pipeline.To(out, "out", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
		runJob(t, job)
		if len(got) != par {
			t.Fatalf("parallelism %d: %d subtasks opened", par, len(got))
		}
		if n := snaps.Load(); n < int64(par) {
			t.Fatalf("parallelism %d: SnapshotState called %d times", par, n)
		}
		return got
	}
	check := func(step string, got map[int]restoredLists, seen [][]int, union []int) {
		t.Helper()
		for sub, want := range seen {
			g := got[sub]
			if !g.restored || !slices.Equal(g.seen, want) || !slices.Equal(g.union, union) {
				t.Fatalf("%s: subtask %d restored %+v, want seen %v union %v", step, sub, g, want, union)
			}
		}
	}
	first := run(3, 0)
	for sub, r := range first {
		if r.restored || r.seen != nil || r.union != nil {
			t.Fatalf("first run: subtask %d found state %+v", sub, r)
		}
	}
	// Subtask i of the first run saw chunk i: in subtask order,
	concat := slices.Concat(seq(20, 30), seq(0, 10), seq(10, 20))
	check("3 to 2", run(2, 10), [][]int{concat[:15], concat[15:]}, []int{0, 1, 2})
	check("2 to 3", run(3, 20), [][]int{concat[:10], concat[10:20], concat[20:]}, []int{10, 11})
	check("3 to 3", run(3, 30), [][]int{concat[:10], concat[10:20], concat[20:]}, []int{20, 21, 22})
	check("3 to 4", run(4, 40), [][]int{concat[:8], concat[8:16], concat[16:23], concat[23:]}, []int{30, 31, 32})
	check("4 to 1", run(1, 50), [][]int{concat}, []int{40, 41, 42, 43})
}

// TestOperatorStateNames: names are checked.
func TestOperatorStateNames(t *testing.T) {
	job := pipeline.New("opstate-names")
	src := pipeline.FromSource(job, "src", source.NewSlice([]int{1}, 1))
	out := pipeline.ProcessStream(src, "p", func() pipeline.ProcessFunc[int, int] { return badNamesFn{} }, pipeline.Parallelism(1))
	pipeline.To(out, "out", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
	err := job.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "registered twice") {
		t.Fatalf("Run = %v", err)
	}
}

type badNamesFn struct{}

func (badNamesFn) Open(ctx *pipeline.OperatorContext) error {
	if _, err := pipeline.NewListState(ctx.OperatorState(), "a\x00b", pipeline.JSON[int]()); err == nil {
		return errors.New("a name with a NUL byte was accepted")
	}
	if _, err := pipeline.NewListState(ctx.OperatorState(), "x", pipeline.JSON[int]()); err != nil {
		return err
	}
	_, err := pipeline.NewUnionListState(ctx.OperatorState(), "x", pipeline.JSON[int]())
	return err
}

func (badNamesFn) ProcessElement(*pipeline.ProcessContext[int], int) error { return nil }

// TestProcessStreamErrorPolicy: a ProcessFunc error goes to the
// operator's policy.
func TestProcessStreamErrorPolicy(t *testing.T) {
	job := pipeline.New("process-skip")
	src := pipeline.FromSource(job, "src", source.NewSlice(seq(0, 10), 2))
	out := pipeline.ProcessStream(src, "p", func() pipeline.ProcessFunc[int, int] { return oddFails{} }, pipeline.OnError(pipeline.Skip()))
	var got collect[int]
	pipeline.To(out, "out", got.sink())
	runJob(t, job)
	if g := slices.Sorted(slices.Values(got.all())); !slices.Equal(g, []int{0, 2, 4, 6, 8}) {
		t.Fatalf("output %v", g)
	}
}

type oddFails struct{}

func (oddFails) Open(*pipeline.OperatorContext) error { return nil }
func (oddFails) ProcessElement(ctx *pipeline.ProcessContext[int], v int) error {
	if v%2 == 1 {
		return errors.New("odd")
	}
	return ctx.Emit(v)
}

// countSink counts the records it is written in a list state of one
// element: a sink with operator state.
type countSink struct {
	mu       sync.Mutex
	restored []int64
	n        int64
	state    *pipeline.ListState[int64]
}

func (s *countSink) InitializeState(ctx *pipeline.OperatorContext) (err error) {
	if s.state, err = pipeline.NewListState(ctx.OperatorState(), "count", pipeline.JSON[int64]()); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restored = slices.Clone(s.state.Get())
	for _, c := range s.restored {
		s.n += c
	}
	return nil
}

func (s *countSink) SnapshotState(uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state.Update([]int64{s.n})
	return nil
}

func (s *countSink) Write(context.Context, int) error {
	s.mu.Lock()
	s.n++
	s.mu.Unlock()
	return nil
}

func (s *countSink) Flush(context.Context) error { return nil }
func (s *countSink) Close() error                { return nil }

// TestOperatorStateSink: a sink's operator state is stored by every
// checkpoint and handed back on a restore.
func TestOperatorStateSink(t *testing.T) {
	dir := t.TempDir()
	run := func(srcUID string, n int) *countSink {
		sk := &countSink{}
		job := pipeline.New("opstate-sink", pipeline.CheckpointDir(dir))
		pipeline.To(pipeline.FromSource(job, srcUID, source.NewSlice(seq(0, n), 2)), "count", sk)
		runJob(t, job)
		return sk
	}
	if s := run("a", 30); s.restored != nil || s.n != 30 {
		t.Fatalf("first run: restored %v, count %d", s.restored, s.n)
	}
	// A second source (new to the job): the count goes on from 30.
	if s := run("b", 5); !slices.Equal(s.restored, []int64{30}) || s.n != 35 {
		t.Fatalf("second run: restored %v, count %d", s.restored, s.n)
	}
}
