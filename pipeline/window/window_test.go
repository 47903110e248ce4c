package window_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/state"
)

// byKey orders formatted results by key, keeping each key's order (the
// order across keys within one watermark step is the timers' order, not
// part of the contract).
func byKey(s []string) []string {
	s = slices.Clone(s)
	slices.SortStableFunc(s, func(a, b string) int {
		ka, _, _ := strings.Cut(a, " ")
		kb, _, _ := strings.Cut(b, " ")
		return strings.Compare(ka, kb)
	})
	return s
}

func newJob(t *testing.T, name string, opts ...pipeline.JobOption) *pipeline.Job {
	opts = append([]pipeline.JobOption{pipeline.CheckpointDir(t.TempDir()), pipeline.DefaultParallelism(2),
		pipeline.CheckpointInterval(5 * time.Millisecond)}, opts...)
	return pipeline.New(name, opts...)
}

func TestTumblingLatenessAndLateRecords(t *testing.T) {
	in := []ev{
		{"a", 1, 0}, {"a", 3, 0}, {"b", 2, 0},
		{"a", 12, 0}, // watermark 10s-1ns: [0,10) fires (a=2, b=1)
		{"a", 9, 0},  // late but within the 5 s lateness: a[0,10) re-fires with 3
		{"a", 18, 0}, // watermark 16s-1ns: [0,10) expires (cleanup at 15s-1ns)
		{"a", 4, 0},  // after the lateness: side output
		{"b", 11, 0},
		{"a", 25, 0}, // watermark 23s-1ns: [10,20) fires
	}
	job := newJob(t, "tumbling")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}}, pipeline.BoundedOutOfOrderness(2*time.Second))
	lateTag := pipeline.NewOutputTag[ev]("late")
	counts := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second), window.Count[ev](),
		window.AllowedLateness(5*time.Second), window.LateRecords(lateTag))
	var out collect[window.Result[string, int64]]
	var late collect[ev]
	pipeline.To(counts, "out", out.sink())
	pipeline.To(pipeline.SideOutput(counts, lateTag), "late", late.sink())
	runJob(t, job)
	equal(t, "results", byKey(fmtResults(out.all())), []string{
		"a [0s,10s) 2 #0", "a [0s,10s) 3 #1", "a [10s,20s) 2 #0", "a [20s,30s) 1 #0",
		"b [0s,10s) 1 #0", "b [10s,20s) 1 #0",
	})
	var lateS []string
	for _, e := range late.all() {
		lateS = append(lateS, e.String())
	}
	equal(t, "late records", lateS, []string{"a@4s"})
}

// TestTumblingNoLatenessDropsLate: without lateness a record for a fired
// window is late at once; with no tag it is dropped.
func TestTumblingNoLatenessDropsLate(t *testing.T) {
	in := []ev{{"a", 1, 5}, {"a", 11, 7}, {"a", 2, 100}, {"a", 13, 1}}
	job := newJob(t, "tumbling-drop")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}})
	sums := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second),
		window.ReduceFn(func(a, b ev) ev { a.V += b.V; return a }, nil))
	var out collect[window.Result[string, ev]]
	pipeline.To(sums, "out", out.sink())
	runJob(t, job)
	var got []string
	for _, r := range out.all() {
		got = append(got, fmt.Sprintf("[%v,%v) %d #%d", r.Start.Sub(base), r.End.Sub(base), r.Value.V, r.Firing))
	}
	equal(t, "sums", got, []string{"[0s,10s) 5 #0", "[10s,20s) 8 #0"})
}

func TestTumblingOffset(t *testing.T) {
	in := []ev{{"a", 1, 0}, {"a", 4, 0}, {"a", 6, 0}}
	job := newJob(t, "offset")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}})
	counts := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second).WithOffset(5*time.Second), window.Count[ev]())
	var out collect[window.Result[string, int64]]
	pipeline.To(counts, "out", out.sink())
	runJob(t, job)
	equal(t, "results", fmtResults(out.all()), []string{"a [-5s,5s) 2 #0", "a [5s,15s) 1 #0"})
}

func TestSliding(t *testing.T) {
	in := []ev{{"a", 1, 0}, {"a", 6, 0}, {"a", 12, 0}}
	job := newJob(t, "sliding")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}})
	counts := window.Apply(pipeline.KeyBy(src, key), "w", window.Sliding(10*time.Second, 5*time.Second), window.Count[ev]())
	var out collect[window.Result[string, int64]]
	pipeline.To(counts, "out", out.sink())
	runJob(t, job)
	equal(t, "results", fmtResults(out.all()), []string{
		"a [-5s,5s) 1 #0", "a [0s,10s) 2 #0", "a [5s,15s) 2 #0", "a [10s,20s) 1 #0",
	})
}

// avg averages values; it implements window.Merger, so it works on
// session windows.
type avg struct{}

type avgAcc struct{ Sum, N int64 }

func (avg) CreateAccumulator() avgAcc { return avgAcc{} }
func (avg) Add(a avgAcc, e ev) avgAcc { return avgAcc{a.Sum + e.V, a.N + 1} }
func (avg) Result(a avgAcc) float64   { return float64(a.Sum) / float64(a.N) }
func (avg) Merge(a, b avgAcc) avgAcc  { return avgAcc{a.Sum + b.Sum, a.N + b.N} }

// noMerge is avg without Merge.
type noMerge struct{}

func (noMerge) CreateAccumulator() avgAcc { return avgAcc{} }
func (noMerge) Add(a avgAcc, e ev) avgAcc { return avgAcc{a.Sum + e.V, a.N + 1} }
func (noMerge) Result(a avgAcc) float64   { return float64(a.Sum) / float64(a.N) }

// listTimes is a ProcessFunc listing a window's event times in order.
func listTimes(_ window.Pane[string], elems []ev, emit func(string)) error {
	parts := make([]string, len(elems))
	for i, e := range elems {
		parts[i] = fmt.Sprint(e.T)
	}
	emit(strings.Join(parts, ","))
	return nil
}

// TestSessionMerges: sessions grow, fire on the watermark, and a record
// bridging two sessions merges them (state moved into the first).
func TestSessionMerges(t *testing.T) {
	in := []ev{
		{"a", 0, 1}, {"b", 1, 10}, {"a", 3, 3},
		{"a", 20, 5}, // watermark 10s-1ns: a[0,8) and b[1,6) fire
		{"a", 14, 7}, // a new session [14,19)
		{"a", 17, 9}, // bridges [14,19) and [20,25) into [14,25)
	}
	job := newJob(t, "sessions")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}}, pipeline.BoundedOutOfOrderness(10*time.Second))
	keyed := pipeline.KeyBy(src, key)
	counts := window.Apply(keyed, "count", window.Session(5*time.Second), window.Count[ev]())
	means := window.Apply(keyed, "avg", window.Session(5*time.Second), window.AggregateFn[ev, avgAcc, float64](avg{}, nil))
	lists := window.Process(keyed, "list", window.Session(5*time.Second), listTimes, nil)
	var c collect[window.Result[string, int64]]
	var m collect[window.Result[string, float64]]
	var l collect[window.Result[string, string]]
	pipeline.To(counts, "c", c.sink())
	pipeline.To(means, "m", m.sink())
	pipeline.To(lists, "l", l.sink())
	runJob(t, job)
	equal(t, "counts", byKey(fmtResults(c.all())), []string{"a [0s,8s) 2 #0", "a [14s,25s) 3 #0", "b [1s,6s) 1 #0"})
	equal(t, "means", byKey(fmtResults(m.all())), []string{"a [0s,8s) 2 #0", "a [14s,25s) 7 #0", "b [1s,6s) 10 #0"})
	equal(t, "lists", byKey(fmtResults(l.all())), []string{"a [0s,8s) 0,3 #0", "a [14s,25s) 14,20,17 #0", "b [1s,6s) 1 #0"})
}

// TestSessionLateMerge: a late record within the lateness merges a fired
// session with a newer one; the merged window fires later as an update;
// after the cleanup a record is late.
func TestSessionLateMerge(t *testing.T) {
	in := []ev{
		{"a", 0, 0},
		{"a", 7, 0},  // watermark 7s-1ns: [0,5) fires (1)
		{"a", 3, 0},  // [3,8) bridges [0,5) and [7,12): [0,12), not yet due
		{"a", 30, 0}, // watermark 30s-1ns: [0,12) fires as update #1, expires at 22s-1ns
		{"a", 2, 0},  // [2,7) expired (17s-1ns): late
	}
	for _, fn := range []string{"count", "process"} {
		t.Run(fn, func(t *testing.T) {
			job := newJob(t, "session-late")
			src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}})
			lateTag := pipeline.NewOutputTag[ev]("late")
			opts := []window.Option{window.AllowedLateness(10 * time.Second), window.LateRecords(lateTag)}
			var got []string
			var late collect[ev]
			if fn == "count" {
				res := window.Apply(pipeline.KeyBy(src, key), "w", window.Session(5*time.Second), window.Count[ev](), opts...)
				var out collect[window.Result[string, int64]]
				pipeline.To(res, "out", out.sink())
				pipeline.To(pipeline.SideOutput(res, lateTag), "late", late.sink())
				runJob(t, job)
				got = fmtResults(out.all())
				equal(t, "results", got, []string{"a [0s,5s) 1 #0", "a [0s,12s) 3 #1", "a [30s,35s) 1 #0"})
			} else {
				res := window.Process(pipeline.KeyBy(src, key), "w", window.Session(5*time.Second), listTimes, nil, opts...)
				var out collect[window.Result[string, string]]
				pipeline.To(res, "out", out.sink())
				pipeline.To(pipeline.SideOutput(res, lateTag), "late", late.sink())
				runJob(t, job)
				got = fmtResults(out.all())
				equal(t, "results", got, []string{"a [0s,5s) 0 #0", "a [0s,12s) 0,7,3 #1", "a [30s,35s) 30 #0"})
			}
			if l := late.all(); len(l) != 1 || l[0] != in[4] {
				t.Fatalf("late records %v, want [%v]", l, in[4])
			}
		})
	}
}

func TestSessionNeedsMerger(t *testing.T) {
	job := newJob(t, "no-merge")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{{{"a", 0, 1}}}})
	res := window.Apply(pipeline.KeyBy(src, key), "w", window.Session(time.Second), window.AggregateFn[ev, avgAcc, float64](noMerge{}, nil))
	var out collect[window.Result[string, float64]]
	pipeline.To(res, "out", out.sink())
	err := job.Run(context.Background())
	if !errors.Is(err, window.ErrInvalid) || !strings.Contains(err.Error(), "Merger") {
		t.Fatalf("err = %v, want ErrInvalid naming Merger", err)
	}
}

func TestInvalidDefinitions(t *testing.T) {
	cases := map[string]window.Assigner{
		"zero":              {},
		"tumbling size":     window.Tumbling(0),
		"tumbling offset":   window.Tumbling(time.Second).WithOffset(time.Second),
		"sliding slide":     window.Sliding(time.Second, 0),
		"sliding too many":  window.Sliding(time.Hour, time.Millisecond),
		"session gap":       window.Session(-time.Second),
		"session trigger":   window.Session(time.Second).WithTrigger(window.CountTrigger(2)),
		"global no trigger": window.Global(nil),
	}
	for name, a := range cases {
		t.Run(name, func(t *testing.T) {
			job := newJob(t, "invalid")
			src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{{{"a", 0, 1}}}})
			res := window.Apply(pipeline.KeyBy(src, key), "w", a, window.Count[ev]())
			var out collect[window.Result[string, int64]]
			pipeline.To(res, "out", out.sink())
			if err := job.Run(context.Background()); !errors.Is(err, window.ErrInvalid) {
				t.Fatalf("%v: err = %v, want ErrInvalid", a, err)
			}
		})
	}
	t.Run("late tag type", func(t *testing.T) {
		job := newJob(t, "invalid")
		src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{{{"a", 0, 1}}}})
		res := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(time.Second), window.Count[ev](),
			window.LateRecords(pipeline.NewOutputTag[string]("late")))
		var out collect[window.Result[string, int64]]
		pipeline.To(res, "out", out.sink())
		if err := job.Run(context.Background()); !errors.Is(err, window.ErrInvalid) {
			t.Fatalf("err = %v, want ErrInvalid", err)
		}
	})
}

// TestGlobalCountTrigger: global windows fired by count, purging or not.
func TestGlobalCountTrigger(t *testing.T) {
	in := []ev{{"a", 0, 1}, {"b", 0, 100}, {"a", 1, 2}, {"a", 2, 3}, {"a", 3, 4}, {"a", 4, 5}, {"b", 1, 200}}
	job := newJob(t, "global")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}})
	keyed := pipeline.KeyBy(src, key)
	sum := window.ReduceFn(func(a, b ev) ev { a.V += b.V; return a }, nil)
	purged := window.Apply(keyed, "purging", window.Global(window.Purging(window.CountTrigger(2))), sum)
	kept := window.Apply(keyed, "kept", window.Global(window.CountTrigger(2)), sum)
	var p, k collect[window.Result[string, ev]]
	pipeline.To(purged, "p", p.sink())
	pipeline.To(kept, "k", k.sink())
	runJob(t, job)
	show := func(rs []window.Result[string, ev]) []string {
		var out []string
		for _, r := range rs {
			if r.Start.UnixNano() != math.MinInt64 || r.End.UnixNano() != math.MaxInt64 {
				t.Errorf("global window %v", r.Window())
			}
			out = append(out, fmt.Sprintf("%s %d #%d", r.Key, r.Value.V, r.Firing))
		}
		return byKey(out)
	}
	equal(t, "purging", show(p.all()), []string{"a 3 #0", "a 7 #0", "b 300 #0"})
	equal(t, "kept", show(k.all()), []string{"a 3 #0", "a 10 #1", "b 300 #0"})
}

// TestTumblingCustomTrigger: tumbling windows with an early count trigger
// composed by hand (fires every 2 records, and at the end by an event-time
// timer registered in the trigger); the windows are cleaned at their end.
func TestTumblingCustomTrigger(t *testing.T) {
	in := []ev{{"a", 1, 0}, {"a", 2, 0}, {"a", 3, 0}, {"a", 11, 0}, {"a", 12, 0}}
	job := newJob(t, "custom-trigger")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}})
	res := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second).WithTrigger(earlyCount{n: 2}), window.Count[ev]())
	var out collect[window.Result[string, int64]]
	pipeline.To(res, "out", out.sink())
	runJob(t, job)
	equal(t, "results", fmtResults(out.all()), []string{
		"a [0s,10s) 2 #0", "a [0s,10s) 3 #1", "a [10s,20s) 2 #0", "a [10s,20s) 2 #1",
	})
}

// earlyCount fires every n records and at the window's end.
type earlyCount struct{ n int64 }

func (e earlyCount) OnElement(c *window.TriggerContext, ts time.Time, w window.Window) (window.TriggerResult, error) {
	if err := c.RegisterEventTimer(w.MaxTimestamp()); err != nil {
		return window.Continue, err
	}
	return window.CountTrigger(e.n).OnElement(c, ts, w)
}

func (e earlyCount) OnEventTime(_ *window.TriggerContext, t time.Time, w window.Window) (window.TriggerResult, error) {
	if t.Equal(w.MaxTimestamp()) {
		return window.Fire, nil
	}
	return window.Continue, nil
}

func (e earlyCount) OnProcessingTime(*window.TriggerContext, time.Time, window.Window) (window.TriggerResult, error) {
	return window.Continue, nil
}

func (e earlyCount) Clear(c *window.TriggerContext, _ window.Window) error { return c.ClearState() }

// fakeClock is a goroutine-safe settable clock.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time  { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) set(t time.Time) { c.ns.Store(t.UnixNano()) }
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestProcessingTimeTumbling: windows by the job's clock, fired when the
// clock passes their end.
func TestProcessingTimeTumbling(t *testing.T) {
	var clk fakeClock
	clk.set(sec(1))
	hold := make(chan struct{})
	in := []ev{{"a", 100, 0}, {"b", 200, 0}, {"a", 300, 0}} // event times are ignored
	opt, ready := started()
	job := newJob(t, "proc-time", pipeline.Clock(clk.now), opt)
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}, hold: map[int]chan struct{}{0: hold}})
	res := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second).ProcessingTime(), window.Count[ev](),
		window.AllowedLateness(time.Hour)) // no effect in processing time
	var out collect[window.Result[string, int64]]
	pipeline.To(res, "out", out.sink())
	errc := make(chan error, 1)
	go func() { errc <- job.Run(context.Background()) }()
	<-ready
	waitFor(t, "records", func() bool { return inCount(job, "w") == 3 })
	if n := len(out.all()); n != 0 {
		t.Fatalf("%d results before the window's end", n)
	}
	clk.set(sec(10))
	waitFor(t, "results", func() bool { return len(out.all()) == 2 })
	close(hold)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	equal(t, "results", byKey(fmtResults(out.all())), []string{"a [0s,10s) 2 #0", "b [0s,10s) 1 #0"})
}

// started returns a job option whose callback closes the returned channel
// once the job's engine exists: Job.Status is safe to call after that
// (Status is not synchronised with Run's start).
func started() (pipeline.JobOption, <-chan struct{}) {
	ready := make(chan struct{})
	return pipeline.StatusAddress("127.0.0.1:0", func(string) { close(ready) }), ready
}

func inCount(job *pipeline.Job, uid string) int64 {
	for _, o := range job.Status().Operators {
		if o.UID == uid {
			return o.In
		}
	}
	return -1
}

// TestIdleSplit: split 1 sends one record and then stays quiet without
// ending. With an idle timeout the windows fire on split 0's watermark
// while split 1 is quiet; without one (the control) nothing fires until
// split 1 ends.
func TestIdleSplit(t *testing.T) {
	s0 := []ev{{"a", 1, 0}, {"a", 5, 0}, {"a", 12, 0}, {"a", 15, 0}, {"a", 23, 0}, {"a", 31, 0}}
	s1 := []ev{{"b", 0, 0}}
	want := []string{"a [0s,10s) 2 #0", "a [10s,20s) 2 #0", "a [20s,30s) 1 #0", "a [30s,40s) 1 #0", "b [0s,10s) 1 #0"}
	for _, idle := range []bool{true, false} {
		t.Run(fmt.Sprint("idle=", idle), func(t *testing.T) {
			hold := make(chan struct{})
			opt, ready := started()
			job := newJob(t, "idle", opt)
			opts := []pipeline.SourceOption{pipeline.BoundedOutOfOrderness(time.Second)}
			if idle {
				opts = append(opts, pipeline.IdleTimeout(30*time.Millisecond))
			}
			src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{s0, s1}, hold: map[int]chan struct{}{1: hold}}, opts...)
			res := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second), window.Count[ev]())
			var out collect[window.Result[string, int64]]
			pipeline.To(res, "out", out.sink())
			errc := make(chan error, 1)
			go func() { errc <- job.Run(context.Background()) }()
			<-ready
			waitFor(t, "all records", func() bool { return inCount(job, "w") == 7 })
			if idle {
				// Split 0's watermark (30s-1ns) fires everything before 30s.
				waitFor(t, "windows fired on an idle split", func() bool { return len(out.all()) == 4 })
			} else {
				// Split 1 holds the watermark at -1s-1ns: give the job time
				// to (wrongly) fire, then check it did not.
				time.Sleep(200 * time.Millisecond)
				if n := len(out.all()); n != 0 {
					t.Fatalf("%d windows fired while a split without idleness held the watermark", n)
				}
			}
			close(hold)
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			equal(t, "results", byKey(fmtResults(out.all())), want)
		})
	}
}

// TestWatermarkRestored: a job stopped after its watermark passed a window
// is resumed; a record for that window is late after the restore exactly
// as it would have been without the stop (the watermarks are in the
// checkpoint). Without restored watermarks it would open the window again.
// With one split the split's restored watermark is enough; with a second,
// quiet split only the keyed subtask's restored watermark keeps the record
// late (the quiet split holds the minimum back until it turns idle).
func TestWatermarkRestored(t *testing.T) {
	in := []ev{{"a", 1, 0}, {"a", 12, 0}, {"a", 25, 0}, {"a", 4, 0}, {"a", 26, 0}}
	for _, splits := range []int{1, 2} {
		t.Run(fmt.Sprint("splits=", splits), func(t *testing.T) {
			dir := t.TempDir()
			run := func(split0 []ev, stopAfter int64, wantOut int) ([]string, []ev) {
				opt, ready := started()
				job := pipeline.New("restore", pipeline.CheckpointDir(dir), pipeline.DefaultParallelism(2), opt)
				sc := &scripted{splits: [][]ev{split0}, hold: map[int]chan struct{}{}}
				if stopAfter > 0 {
					sc.hold[0] = make(chan struct{}) // never released: the run is stopped
				}
				if splits == 2 {
					sc.splits = append(sc.splits, nil)
					sc.hold[1] = make(chan struct{})
				}
				src := pipeline.FromSource(job, "src", sc, pipeline.IdleTimeout(200*time.Millisecond))
				lateTag := pipeline.NewOutputTag[ev]("late")
				res := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second), window.Count[ev](), window.LateRecords(lateTag))
				var out collect[window.Result[string, int64]]
				var late collect[ev]
				pipeline.To(res, "out", out.sink())
				pipeline.To(pipeline.SideOutput(res, lateTag), "late", late.sink())
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				errc := make(chan error, 1)
				go func() { errc <- job.Run(ctx) }()
				<-ready
				if stopAfter > 0 {
					waitFor(t, "first results", func() bool { return inCount(job, "w") == stopAfter && len(out.all()) == wantOut })
					cancel() // graceful stop with a stop checkpoint
				} else if splits == 2 {
					waitFor(t, "the resumed records", func() bool { return inCount(job, "w") == 2 })
					close(sc.hold[1])
				}
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				return fmtResults(out.all()), late.all()
			}
			first, _ := run(in[:3], 3, 2)
			equal(t, "first run", first, []string{"a [0s,10s) 1 #0", "a [10s,20s) 1 #0"})
			second, late := run(in, 0, 0)
			equal(t, "resumed run", second, []string{"a [20s,30s) 2 #0"})
			if len(late) != 1 || late[0] != in[3] {
				t.Fatalf("late after restore %v, want [%v]", late, in[3])
			}
		})
	}
}

// TestEventTimeFromRecord: WithTimestamps assigns event times from
// the decoded record (the source's own times are ignored), and a custom
// watermark generator drives the windows.
func TestEventTimeFromRecord(t *testing.T) {
	in := []ev{{"a", 1, 0}, {"a", 2, 0}, {"a", 11, 0}, {"a", 3, 0}}
	job := newJob(t, "assigned")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}},
		pipeline.CustomWatermarks(func() pipeline.WatermarkGenerator { return &punctuated{} })).
		WithTimestamps(func(e ev) time.Time { return at(e).Add(time.Hour) })
	res := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second), window.Count[ev](), window.AllowedLateness(time.Minute))
	var out collect[window.Result[string, int64]]
	pipeline.To(res, "out", out.sink())
	runJob(t, job)
	// The generator's watermark is the last event time minus 1 ns: the
	// record at 3 s comes after [0,10) fired (at 11 s) and re-fires it.
	equal(t, "results", fmtResults(out.all()), []string{
		"a [1h0m0s,1h0m10s) 2 #0", "a [1h0m0s,1h0m10s) 3 #1", "a [1h0m10s,1h0m20s) 1 #0",
	})
}

// punctuated's watermark is the latest event time seen minus 1 ns.
type punctuated struct {
	last time.Time
	ok   bool
}

func (p *punctuated) OnEvent(t time.Time) { p.last, p.ok = t, true }

func (p *punctuated) Watermark() (time.Time, bool) { return p.last.Add(-time.Nanosecond), p.ok }

// TestBadTimestamps: WithTimestamps takes the stream's record type (a
// mismatch does not compile); on a stream that is not a source's it is a
// graph error.
func TestBadTimestamps(t *testing.T) {
	job := newJob(t, "bad-ts")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{{{"a", 0, 1}}}})
	mapped := pipeline.Map(src, "id", func(_ context.Context, e ev) (ev, error) { return e, nil }).
		WithTimestamps(func(e ev) time.Time { return at(e) })
	var out collect[ev]
	pipeline.To(mapped, "out", out.sink())
	if err := job.Run(context.Background()); !errors.Is(err, pipeline.ErrInvalidGraph) {
		t.Fatalf("err = %v, want ErrInvalidGraph", err)
	}
}

var _ = state.EventTime

// TestWindowStateRestored: windows open when a job stops keep their
// accumulators in the checkpoint. After the restore the operator's memory
// knows neither window state nor its absence: a record for a restored
// window must read its state from the store (the window index rebuilt from
// the state says it exists), and a record for a new window must start it
// empty (not indexed). Key b's window gets no record after the restore: its
// state is never read, only fired from the restored group timer.
func TestWindowStateRestored(t *testing.T) {
	in := []ev{{"a", 1, 0}, {"b", 2, 0}, {"a", 3, 0}, {"c", 4, 0}, {"a", 15, 0}}
	dir := t.TempDir()
	run := func(stopAfter int64) []string {
		opt, ready := started()
		job := pipeline.New("restore-state", pipeline.CheckpointDir(dir), pipeline.DefaultParallelism(2), opt)
		sc := &scripted{splits: [][]ev{in}, hold: map[int]chan struct{}{}}
		if stopAfter > 0 {
			sc.splits[0] = in[:stopAfter]
			sc.hold[0] = make(chan struct{}) // never released: the run is stopped
		}
		src := pipeline.FromSource(job, "src", sc)
		res := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second), window.Count[ev]())
		var out collect[window.Result[string, int64]]
		pipeline.To(res, "out", out.sink())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- job.Run(ctx) }()
		<-ready
		if stopAfter > 0 {
			waitFor(t, "the first records", func() bool { return inCount(job, "w") == stopAfter })
			cancel() // graceful stop with a stop checkpoint
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		return sorted(fmtResults(out.all()))
	}
	equal(t, "first run", run(2), []string{})
	storedWindowState(t, dir, 2) // a and b in [0s,10s), with their group timers
	equal(t, "resumed run", run(0), sorted([]string{
		"a [0s,10s) 2 #0", "b [0s,10s) 1 #0", "c [0s,10s) 1 #0", "a [10s,20s) 1 #0",
	}))
	// Every window fired: the windows stored by the first run were
	// deleted from the store, and those of the second run (created and
	// fired between two checkpoints) left nothing.
	storedWindowState(t, dir, 0)
}

// storedWindowState checks that the window operator "w" of a job with
// checkpoints in dir has want window accumulators in the store, no key
// timers, and the group timers of their key groups: one at the windows'
// end for each key group with an accumulator (the tests' windows have no
// lateness).
func storedWindowState(t *testing.T, dir string, want int) {
	t.Helper()
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	scan := func(name string, fn func(kg uint16, k []byte)) {
		prefix := append([]byte{byte(len(name))}, name...)
		for kg := range uint16(state.DefaultMaxParallelism) {
			if err := s.ScanState("w", kg, prefix, func(k, _ []byte) bool { fn(kg, k[len(prefix):]); return true }); err != nil {
				t.Fatal(err)
			}
		}
	}
	n, groups := 0, map[uint16]bool{}
	scan("window.acc", func(kg uint16, _ []byte) { n++; groups[kg] = true })
	if n != want {
		t.Errorf("window.acc: %d entries in the store, want %d", n, want)
	}
	scan("runnel.timers", func(kg uint16, k []byte) {
		if state.TimeDomain(k[0]) != state.GroupEventTime || len(k) != 9 {
			t.Errorf("key group %d: a stored timer %x that is not a group timer", kg, k)
			return
		}
		if !groups[kg] {
			t.Errorf("key group %d: a stored group timer without windows", kg)
		}
		delete(groups, kg)
	})
	if len(groups) != 0 {
		t.Errorf("key groups %v have windows but no stored group timer", groups)
	}
}

// TestGroupTimersManyKeys: sliding event-time windows (group timers) of
// 300 keys over many key groups and both subtasks, with allowed lateness:
// every key's window fires once with its exact count, a record within the
// lateness re-fires its fired window and joins the next one unfired, and a
// record past it goes to the side output.
func TestGroupTimersManyKeys(t *testing.T) {
	const keys = 300
	var in []ev
	want := map[string]int64{} // "key [start,end)" -> count
	add := func(e ev) {
		in = append(in, e)
		s := math.Floor(e.T/10) * 10
		for _, st := range []float64{s - 10, s} {
			want[fmt.Sprintf("%s [%v,%v)", e.K, time.Duration(st)*time.Second, time.Duration(st+20)*time.Second)]++
		}
	}
	for i := range 1200 {
		add(ev{K: fmt.Sprintf("k%03d", i%keys), T: float64(i) * 0.03})
	}
	var wantOut []string
	for w, n := range want {
		wantOut = append(wantOut, fmt.Sprintf("%s %d #0", w, n))
	}
	// At watermark 36 s: [10s,30s) fired and is kept until 40 s, [20s,40s)
	// has not fired; every window of 5 s expired at 30 s.
	in = append(in, ev{K: "k008", T: 21}, ev{K: "k007", T: 5})
	wantOut = append(wantOut, fmt.Sprintf("k008 [10s,30s) %d #1", want["k008 [10s,30s)"]+1))
	for i, r := range wantOut {
		if strings.HasPrefix(r, "k008 [20s,40s) ") {
			wantOut[i] = fmt.Sprintf("k008 [20s,40s) %d #0", want["k008 [20s,40s)"]+1)
		}
	}
	job := newJob(t, "many-keys")
	src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{in}})
	lateTag := pipeline.NewOutputTag[ev]("late")
	res := window.Apply(pipeline.KeyBy(src, key), "w", window.Sliding(20*time.Second, 10*time.Second), window.Count[ev](),
		window.AllowedLateness(10*time.Second), window.LateRecords(lateTag))
	var out collect[window.Result[string, int64]]
	var late collect[ev]
	pipeline.To(res, "out", out.sink())
	pipeline.To(pipeline.SideOutput(res, lateTag), "late", late.sink())
	runJob(t, job)
	equal(t, "results", sorted(fmtResults(out.all())), sorted(wantOut))
	if l := late.all(); len(l) != 1 || l[0] != in[len(in)-1] {
		t.Fatalf("late %v, want [%v]", l, in[len(in)-1])
	}
}

// TestGroupTimersRestoreFired: a window that fired before a checkpoint and
// is kept for its lateness is restored with its group timers, which the
// restored operator registers again: it must not fire again at its end,
// only when a late record updates it, and it expires at its cleanup time.
func TestGroupTimersRestoreFired(t *testing.T) {
	in := []ev{{"a", 1, 0}, {"b", 2, 0}, {"a", 12, 0}, {"a", 5, 0}, {"c", 25, 0}, {"b", 45, 0}, {"b", 3, 0}}
	dir := t.TempDir()
	run := func(stopAfter int64, wantOut int) ([]string, []ev) {
		opt, ready := started()
		job := pipeline.New("restore-fired", pipeline.CheckpointDir(dir), pipeline.DefaultParallelism(2), opt)
		sc := &scripted{splits: [][]ev{in}, hold: map[int]chan struct{}{}}
		if stopAfter > 0 {
			sc.splits[0] = in[:stopAfter]
			sc.hold[0] = make(chan struct{}) // never released: the run is stopped
		}
		src := pipeline.FromSource(job, "src", sc)
		lateTag := pipeline.NewOutputTag[ev]("late")
		res := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second), window.Count[ev](),
			window.AllowedLateness(20*time.Second), window.LateRecords(lateTag))
		var out collect[window.Result[string, int64]]
		var late collect[ev]
		pipeline.To(res, "out", out.sink())
		pipeline.To(pipeline.SideOutput(res, lateTag), "late", late.sink())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- job.Run(ctx) }()
		<-ready
		if stopAfter > 0 {
			waitFor(t, "the first results", func() bool { return inCount(job, "w") == stopAfter && len(out.all()) == wantOut })
			cancel() // graceful stop with a stop checkpoint
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		return sorted(fmtResults(out.all())), late.all()
	}
	first, _ := run(3, 2)
	equal(t, "first run", first, []string{"a [0s,10s) 1 #0", "b [0s,10s) 1 #0"})
	// Resumed: a@5 re-fires [0s,10s); b@45 moves the watermark past the
	// cleanup of [0s,10s) (30 s), so b@3 is late.
	second, late := run(0, 0)
	equal(t, "resumed run", second, sorted([]string{
		"a [0s,10s) 2 #1", "a [10s,20s) 1 #0", "c [20s,30s) 1 #0", "b [40s,50s) 1 #0",
	}))
	if len(late) != 1 || late[0] != in[6] {
		t.Fatalf("late after restore %v, want [%v]", late, in[6])
	}
}
