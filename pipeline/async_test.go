package pipeline_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// chunks is a one-split source that returns one chunk per Poll, each
// record's event time being its value in milliseconds: the source task
// emits a watermark after every chunk.
type chunks struct {
	c [][]int
	// before, when set, runs before Poll returns chunk i.
	before func(i int)
}

func (s *chunks) Splits(context.Context) ([]source.Split, error) {
	return []source.Split{{ID: "0"}}, nil
}

func (s *chunks) Open(_ context.Context, _ source.Split, off []byte) (source.SplitReader[int], error) {
	r := &chunkReader{c: s.c, before: s.before}
	if len(off) == 8 {
		r.i = int(binary.BigEndian.Uint64(off))
	}
	return r, nil
}

type chunkReader struct {
	c      [][]int
	i      int
	before func(i int)
}

func (r *chunkReader) Poll(context.Context, int) ([]source.Record[int], error) {
	if r.i >= len(r.c) {
		return nil, source.ErrEndOfSplit
	}
	if r.before != nil {
		r.before(r.i)
	}
	var out []source.Record[int]
	for _, v := range r.c[r.i] {
		out = append(out, source.Record[int]{Value: v, EventTime: time.UnixMilli(int64(v))})
	}
	r.i++
	return out, nil
}

func (r *chunkReader) Offset() []byte                                         { return binary.BigEndian.AppendUint64(nil, uint64(r.i)) }
func (r *chunkReader) NotifyCheckpointComplete(context.Context, uint64) error { return nil }
func (r *chunkReader) Close() error                                           { return nil }

func seq(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// TestAsyncOrderedExactOutput: requests that complete in the reverse of
// their order (the first is the slowest) come out in input order, in both
// the func and the future form.
func TestAsyncOrderedExactOutput(t *testing.T) {
	in := seq(0, 40)
	delay := func(v int) time.Duration { return time.Duration(40-v) * time.Millisecond / 4 }
	for _, form := range []string{"func", "future"} {
		t.Run(form, func(t *testing.T) {
			job := pipeline.New("async-ordered", pipeline.CheckpointInterval(5*time.Millisecond))
			src := pipeline.FromSource(job, "src", source.NewSlice(in, 1))
			var out *pipeline.Stream[string]
			opts := []pipeline.OperatorOption{pipeline.Parallelism(1), pipeline.AsyncCapacity(16)}
			if form == "func" {
				out = pipeline.OrderedWait(src, "lookup", func(ctx context.Context, v int) (string, error) {
					select {
					case <-time.After(delay(v)):
					case <-ctx.Done():
						return "", ctx.Err()
					}
					return fmt.Sprint("v", v), nil
				}, opts...)
			} else {
				out = pipeline.OrderedWaitFuture(src, "lookup", func(_ context.Context, v int, rf pipeline.ResultFuture[string]) {
					time.AfterFunc(delay(v), func() { rf.Complete(fmt.Sprint("v", v)) })
				}, opts...)
			}
			var got collect[string]
			pipeline.To(out, "out", got.sink())
			runJob(t, job)
			var want []string
			for _, v := range in {
				want = append(want, fmt.Sprint("v", v))
			}
			if g := got.all(); !slices.Equal(g, want) {
				t.Fatalf("output %v\nwant %v", g, want)
			}
		})
	}
}

// TestAsyncUnorderedCompletionOrder: an unordered operator emits each
// result when its request completes: completed one by one in reverse
// order, the results come out reversed. A request may also complete with
// several results, or none.
func TestAsyncUnorderedCompletionOrder(t *testing.T) {
	const n = 8
	var mu sync.Mutex
	futures := map[int]pipeline.ResultFuture[int]{}
	job := pipeline.New("async-unordered")
	src := pipeline.FromSource(job, "src", source.NewSlice(seq(0, n), 1))
	out := pipeline.UnorderedWaitFuture(src, "lookup", func(_ context.Context, v int, rf pipeline.ResultFuture[int]) {
		mu.Lock()
		futures[v] = rf
		mu.Unlock()
	}, pipeline.Parallelism(1), pipeline.AsyncCapacity(n))
	var got collect[int]
	pipeline.To(out, "out", got.sink())
	done := make(chan error, 1)
	go func() { done <- job.Run(context.Background()) }()
	testutil.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(futures) < n {
			return fmt.Errorf("%d requests issued", len(futures))
		}
		return nil
	})
	var want []int
	for v := n - 1; v >= 0; v-- {
		mu.Lock()
		rf := futures[v]
		mu.Unlock()
		switch v {
		case 5:
			rf.Complete() // no result
		case 2:
			rf.Complete(200, 201)
			want = append(want, 200, 201)
		default:
			rf.Complete(v * 100)
			want = append(want, v*100)
		}
		rf.Complete(-1) // a second completion is ignored
		testutil.CheckFor(t, 20*time.Second, time.Millisecond, func() error {
			if g := got.all(); len(g) < len(want) {
				return fmt.Errorf("%d results, want %d", len(g), len(want))
			}
			return nil
		})
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if g := got.all(); !slices.Equal(g, want) {
		t.Fatalf("output %v, want %v", g, want)
	}
}

// arrival is a record seen downstream with the watermark it arrived under.
type arrival struct {
	V  int
	WM int64
}

// observeFn records every record with the subtask's watermark.
type observeFn struct{}

func (observeFn) Open(*pipeline.OperatorContext) error { return nil }
func (observeFn) ProcessElement(ctx *pipeline.ProcessContext[arrival], v int) error {
	return ctx.Emit(arrival{V: v, WM: ctx.Watermark()})
}

// TestAsyncUnorderedWatermarks: results of an unordered operator never
// cross a watermark. Every chunk of the source is followed by a
// watermark; within a chunk the first record is the slowest, so results
// come out of order within each chunk, but none arrives downstream after
// the watermark that followed its chunk (it would be late there). The
// ordered operator keeps the input order.
func TestAsyncUnorderedWatermarks(t *testing.T) {
	var cs [][]int
	for c := range 4 {
		cs = append(cs, seq(c*5+1, c*5+6))
	}
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprint("ordered=", ordered), func(t *testing.T) {
			job := pipeline.New("async-wm")
			src := pipeline.FromSource(job, "src", &chunks{c: cs})
			fn := func(ctx context.Context, v int) (int, error) {
				d := time.Duration(5-(v-1)%5) * 15 * time.Millisecond // 75 ms for a chunk's first, 15 for its last
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return 0, ctx.Err()
				}
				return v, nil
			}
			opts := []pipeline.OperatorOption{pipeline.Parallelism(1), pipeline.AsyncCapacity(20)}
			var res *pipeline.Stream[int]
			if ordered {
				res = pipeline.OrderedWait(src, "lookup", fn, opts...)
			} else {
				res = pipeline.UnorderedWait(src, "lookup", fn, opts...)
			}
			seen := pipeline.ProcessStream(res, "observe", func() pipeline.ProcessFunc[int, arrival] { return observeFn{} }, pipeline.Parallelism(1))
			var got collect[arrival]
			pipeline.To(seen, "out", got.sink())
			runJob(t, job)
			all := got.all()
			var vs []int
			for _, a := range all {
				vs = append(vs, a.V)
				if ts := time.UnixMilli(int64(a.V)).UnixNano(); ts <= a.WM {
					t.Errorf("record %d (event time %d) arrived after watermark %d", a.V, ts, a.WM)
				}
			}
			if want := seq(1, 21); ordered && !slices.Equal(vs, want) {
				t.Fatalf("ordered output %v, want %v", vs, want)
			}
			sorted := slices.Sorted(slices.Values(vs))
			if !slices.Equal(sorted, seq(1, 21)) {
				t.Fatalf("output %v: not every record exactly once", vs)
			}
			if !ordered {
				if slices.Equal(vs, sorted) {
					t.Fatalf("unordered output in input order %v: the test proves nothing", vs)
				}
				for i, v := range vs { // each chunk's results stay among the chunk's
					if (v-1)/5 != i/5 {
						t.Fatalf("output %v: record %d left its chunk", vs, v)
					}
				}
			}
		})
	}
}

// TestAsyncTimeoutsAndRetries: failed and timed-out attempts are retried
// up to the Retry option's attempts; AsyncRetryIf keeps an error from
// being retried; what still fails goes to the dead letters with its
// error, in its place; the number of calls per record is exact.
func TestAsyncTimeoutsAndRetries(t *testing.T) {
	errPermanent := errors.New("permanent failure")
	var mu sync.Mutex
	calls := map[int]int{}
	fn := func(ctx context.Context, v int) (int, error) {
		mu.Lock()
		calls[v]++
		n := calls[v]
		mu.Unlock()
		hang := func() (int, error) { <-ctx.Done(); return 0, ctx.Err() }
		switch {
		case v == 3: // always times out
			return hang()
		case v == 7:
			return 0, errPermanent
		case v%4 == 1 && n == 1:
			return 0, errors.New("transient")
		case v%4 == 2 && n == 1:
			return hang()
		case v == 9 && n < 3: // succeeds on the last attempt
			return 0, errors.New("transient")
		}
		return v * 10, nil
	}
	var dead collect[sink.DeadLetter]
	job := pipeline.New("async-retry")
	src := pipeline.FromSource(job, "src", source.NewSlice(seq(0, 12), 1))
	out := pipeline.OrderedWait(src, "lookup", fn, pipeline.Parallelism(1), pipeline.AsyncCapacity(4),
		pipeline.AsyncTimeout(100*time.Millisecond), pipeline.Retry(3, time.Millisecond, 5*time.Millisecond),
		pipeline.AsyncRetryIf(func(err error) bool { return !errors.Is(err, errPermanent) }),
		pipeline.OnError(pipeline.DeadLetter("dlq", dead.sink())))
	var got collect[int]
	pipeline.To(out, "out", got.sink())
	runJob(t, job)
	want := []int{0, 10, 20, 40, 50, 60, 80, 90, 100, 110}
	if g := got.all(); !slices.Equal(g, want) {
		t.Fatalf("output %v, want %v", g, want)
	}
	wantCalls := map[int]int{0: 1, 1: 2, 2: 2, 3: 3, 4: 1, 5: 2, 6: 2, 7: 1, 8: 1, 9: 3, 10: 2, 11: 1}
	mu.Lock()
	defer mu.Unlock()
	for v, w := range wantCalls {
		if calls[v] != w {
			t.Errorf("record %d: %d calls, want %d", v, calls[v], w)
		}
	}
	d := dead.all()
	if len(d) != 2 || d[0].Value != "3" || !strings.Contains(d[0].Reason, pipeline.ErrAsyncTimeout.Error()) ||
		d[1].Value != "7" || !strings.Contains(d[1].Reason, errPermanent.Error()) || d[0].Operator != "lookup" {
		t.Fatalf("dead letters %+v", d)
	}
}

// TestAsyncFailPolicy: with the default Fail policy a request failing its
// last attempt fails the job, naming the operator.
func TestAsyncFailPolicy(t *testing.T) {
	job := pipeline.New("async-fail")
	src := pipeline.FromSource(job, "src", source.NewSlice(seq(0, 5), 1))
	out := pipeline.UnorderedWait(src, "lookup", func(_ context.Context, v int) (int, error) {
		if v == 3 {
			return 0, errors.New("boom")
		}
		return v, nil
	}, pipeline.Parallelism(1))
	pipeline.To(out, "out", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
	err := job.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), `"lookup"`) || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Run = %v", err)
	}
}

// TestAsyncEmptyInput: no input, no call, no output; the job ends.
func TestAsyncEmptyInput(t *testing.T) {
	for _, ordered := range []bool{true, false} {
		job := pipeline.New("async-empty")
		src := pipeline.FromSource(job, "src", source.NewSlice([]int(nil), 2))
		called := false
		fn := func(context.Context, int) (int, error) { called = true; return 0, nil }
		var out *pipeline.Stream[int]
		if ordered {
			out = pipeline.OrderedWait(src, "lookup", fn)
		} else {
			out = pipeline.UnorderedWait(src, "lookup", fn)
		}
		var got collect[int]
		pipeline.To(out, "out", got.sink())
		runJob(t, job)
		if called || len(got.all()) != 0 {
			t.Fatalf("ordered=%v: called %v, output %v", ordered, called, got.all())
		}
	}
}

// TestAsyncInvalidOptions: bad options are graph errors (a codec of
// another record type does not compile; a nil one is a graph error).
func TestAsyncInvalidOptions(t *testing.T) {
	job := pipeline.New("async-bad")
	src := pipeline.FromSource(job, "src", source.NewSlice([]int{1}, 1))
	out := pipeline.OrderedWait(src.WithCodec(nil), "lookup", func(context.Context, int) (int, error) { return 0, nil },
		pipeline.AsyncCapacity(0), pipeline.AsyncTimeout(-time.Second))
	pipeline.To(out, "out", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
	err := job.Run(context.Background())
	for _, s := range []string{"capacity 0", "negative timeout", "nil codec"} {
		if !errors.Is(err, pipeline.ErrInvalidGraph) || !strings.Contains(err.Error(), s) {
			t.Fatalf("Run = %v, want an invalid graph naming %q", err, s)
		}
	}
}

// TestAsyncRestoresInFlight: requests in flight when the job stops are
// part of its stop checkpoint and are issued again after the restore,
// also with another parallelism: each result is emitted exactly once over
// both runs, and the service saw the requests in flight twice.
func TestAsyncRestoresInFlight(t *testing.T) {
	for _, pars := range [][2]int{{1, 1}, {2, 3}, {3, 1}} {
		t.Run(fmt.Sprintf("parallelism=%d,%d", pars[0], pars[1]), func(t *testing.T) {
			dir := t.TempDir()
			var mu sync.Mutex
			calls := map[int]int{}
			hold := make(chan struct{}) // closed: requests of records >= 4 complete
			fn := func(ctx context.Context, v int) (int, error) {
				mu.Lock()
				calls[v]++
				mu.Unlock()
				if v >= 4 {
					select {
					case <-hold:
					case <-ctx.Done():
						return 0, ctx.Err()
					}
				}
				return v * 10, nil
			}
			var got collect[int]
			build := func(par int) *pipeline.Job {
				job := pipeline.New("async-restore", pipeline.CheckpointDir(dir))
				src := pipeline.FromSource(job, "src", source.NewSlice(seq(0, 20), 1))
				out := pipeline.OrderedWait(src, "lookup", fn, pipeline.Parallelism(par))
				pipeline.To(out, "out", got.sink())
				return job
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- build(pars[0]).Run(ctx) }()
			testutil.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
				mu.Lock()
				defer mu.Unlock()
				if len(calls) < 20 {
					return fmt.Errorf("%d records requested", len(calls))
				}
				// Requested is not emitted: with parallelism > 1 the
				// results of 0..3 may still be on their way to the sink.
				if n := len(got.all()); n < 4 {
					return fmt.Errorf("%d results emitted", n)
				}
				return nil
			})
			cancel() // stop: a stop checkpoint with 16 requests in flight
			if err := <-done; err != nil {
				t.Fatalf("first run: %v", err)
			}
			first := slices.Sorted(slices.Values(got.all()))
			if !slices.Equal(first, []int{0, 10, 20, 30}) {
				t.Fatalf("first run emitted %v", first)
			}
			close(hold)
			runJob(t, build(pars[1]))
			all := slices.Sorted(slices.Values(got.all()))
			var want []int
			for v := range 20 {
				want = append(want, v*10)
			}
			if !slices.Equal(all, want) {
				t.Fatalf("output over both runs %v, want %v", all, want)
			}
			mu.Lock()
			defer mu.Unlock()
			for v := range 20 {
				if w := 1 + min(1, v/4); calls[v] != w {
					t.Errorf("record %d requested %d times, want %d", v, calls[v], w)
				}
			}
		})
	}
}

var _ = math.MaxInt64

// TestAsyncFutureTimeout: a future that never completes times out (the
// operator's own timer: nothing else would end it), is retried, and goes
// to the policy; completing it afterwards changes nothing.
func TestAsyncFutureTimeout(t *testing.T) {
	var mu sync.Mutex
	var stuck []pipeline.ResultFuture[int]
	job := pipeline.New("async-future-timeout")
	src := pipeline.FromSource(job, "src", source.NewSlice(seq(0, 6), 1))
	out := pipeline.UnorderedWaitFuture(src, "lookup", func(_ context.Context, v int, rf pipeline.ResultFuture[int]) {
		if v == 2 {
			mu.Lock()
			stuck = append(stuck, rf)
			mu.Unlock()
			return // never completes
		}
		rf.Complete(v)
	}, pipeline.Parallelism(1), pipeline.AsyncTimeout(50*time.Millisecond), pipeline.Retry(2, time.Millisecond, time.Millisecond),
		pipeline.OnError(pipeline.Skip()))
	var got collect[int]
	pipeline.To(out, "out", got.sink())
	runJob(t, job)
	if g := slices.Sorted(slices.Values(got.all())); !slices.Equal(g, []int{0, 1, 3, 4, 5}) {
		t.Fatalf("output %v", g)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stuck) != 2 {
		t.Fatalf("%d attempts of the stuck request, want 2", len(stuck))
	}
	for _, rf := range stuck {
		rf.Complete(99) // too late: ignored
	}
	for _, op := range job.Status().Operators {
		if op.UID == "lookup" && (op.In != 6 || op.Out != 5 || op.Errors != 1) {
			t.Fatalf("lookup counters %+v", op)
		}
	}
}
