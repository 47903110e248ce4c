package pipeline_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

type order struct {
	ID     string `json:"id" validate:"required"`
	Amount int    `json:"amount" validate:"gte=0"`
}

func TestPipelineBadRecordsDeadLetter(t *testing.T) {
	raw := [][]byte{
		[]byte(`{"id":"a","amount":1}`),
		[]byte(`{not json`),
		[]byte(`{"id":"","amount":2}`), // fails "required"
		[]byte(`{"id":"b","amount":-5}`),
		[]byte(`{"id":"c","amount":3}`),
	}
	var dlq collect[sink.DeadLetter]
	var out collect[order]
	job := pipeline.New("bad", pipeline.CheckpointDir(t.TempDir()))
	orders := pipeline.FromBytes(job, "orders", source.NewSlice(raw, 1), pipeline.JSON[order](),
		pipeline.OnBadRecord(pipeline.DeadLetter("dlq", dlq.sink())))
	pipeline.To(orders, "out", out.sink())
	runJob(t, job)
	if ids := idsOf(out.all()); !slices.Equal(ids, []string{"a", "c"}) {
		t.Fatalf("good records %v", ids)
	}
	dl := dlq.all()
	if len(dl) != 3 {
		t.Fatalf("%d dead letters, want 3: %+v", len(dl), dl)
	}
	wantReasons := []string{"decode: cannot decode JSON into pipeline_test.order", "validate: ", "validate: "}
	wantOffsets := []uint64{2, 3, 4}
	for i, d := range dl {
		if d.Source != "orders" || d.Operator != "orders" || d.Split != "0" || !strings.HasPrefix(d.Reason, wantReasons[i]) ||
			string(d.Raw) != string(raw[i+1]) || binary.BigEndian.Uint64(d.Offset) != wantOffsets[i] {
			t.Errorf("dead letter %d = %+v (reason %q)", i, d, d.Reason)
		}
	}
	st := job.Status()
	for _, o := range st.Operators {
		if o.UID == "orders" && (o.In != 5 || o.Out != 2 || o.Errors != 3) {
			t.Errorf("source stats %+v", o)
		}
	}
}

func idsOf(os []order) []string {
	var ids []string
	for _, o := range os {
		ids = append(ids, o.ID)
	}
	slices.Sort(ids)
	return ids
}

func TestPipelineSkipAndFailPolicies(t *testing.T) {
	raw := [][]byte{[]byte(`{"id":"a"}`), []byte(`nope`)}
	job := pipeline.New("skip")
	orders := pipeline.FromBytes(job, "orders", source.NewSlice(raw, 1), pipeline.JSON[order](), pipeline.OnBadRecord(pipeline.Skip()))
	var out collect[order]
	pipeline.To(orders, "out", out.sink())
	runJob(t, job)
	if len(out.all()) != 1 {
		t.Fatalf("skip: %v", out.all())
	}

	job = pipeline.New("fail")
	orders = pipeline.FromBytes(job, "orders", source.NewSlice(raw, 1), pipeline.JSON[order]())
	pipeline.To(orders, "out", sink.NewFunc(func(context.Context, order) error { return nil }, nil))
	err := job.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), `operator "orders"`) {
		t.Fatalf("fail policy: Run = %v", err)
	}
}

func TestPipelinePanicsAndRetries(t *testing.T) {
	// A panicking Map dead-letters the record; a flaky one succeeds on retry.
	var dlq collect[sink.DeadLetter]
	var out collect[int]
	attempts := 0
	job := pipeline.New("panics")
	nums := pipeline.FromSource(job, "nums", source.NewSlice([]int{1, 2, 3, 4}, 1))
	m := pipeline.Map(nums, "boom", func(_ context.Context, v int) (int, error) {
		if v == 3 {
			panic("three")
		}
		return v, nil
	}, pipeline.OnError(pipeline.DeadLetter("dlq", dlq.sink())))
	flaky := pipeline.Map(m, "flaky", func(_ context.Context, v int) (int, error) {
		if v == 2 && attempts < 2 {
			attempts++
			return 0, errors.New("transient")
		}
		return v * 10, nil
	}, pipeline.Retry(3, time.Microsecond, time.Millisecond))
	pipeline.To(flaky, "out", out.sink())
	runJob(t, job)
	if got := out.all(); !slices.Equal(got, []int{10, 20, 40}) {
		t.Fatalf("out = %v", got)
	}
	dl := dlq.all()
	if len(dl) != 1 || dl[0].Operator != "boom" || !strings.Contains(dl[0].Reason, "panic") || dl[0].Value != "3" {
		t.Fatalf("dead letters %+v", dl)
	}

	// With the default policy, a panic fails the job with ErrPanic.
	job = pipeline.New("panic-fails")
	nums = pipeline.FromSource(job, "nums", source.NewSlice([]int{1}, 1))
	m = pipeline.Map(nums, "boom", func(context.Context, int) (int, error) { panic("boom") })
	pipeline.To(m, "out", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
	if err := job.Run(context.Background()); !errors.Is(err, pipeline.ErrPanic) {
		t.Fatalf("Run = %v, want ErrPanic", err)
	}
}

// reading is an event-time record for the timer test.
type reading struct {
	Sensor string
	At     time.Time
	Value  int
}

type windowSum struct {
	Sensor string
	End    time.Time
	Sum    int
}

// windowFn sums values per sensor in 10 s tumbling windows, emitting each
// window when the watermark passes its end, and sends negative values to a
// side output.
type windowFn struct {
	sums *state.Map[int64, int64]
	neg  pipeline.OutputTag[reading]
}

func (f *windowFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.sums, err = state.NewMap(ctx.Backend(), "sums", state.Int64Codec(), state.Int64Codec())
	return err
}

func (f *windowFn) ProcessElement(ctx *pipeline.KeyedContext[string, windowSum], r reading) error {
	if r.Value < 0 {
		return pipeline.EmitSide(ctx, f.neg, r)
	}
	end := r.At.Truncate(10 * time.Second).Add(10 * time.Second)
	s, _, err := f.sums.Get(end.UnixNano())
	if err != nil {
		return err
	}
	if err := f.sums.Put(end.UnixNano(), s+int64(r.Value)); err != nil {
		return err
	}
	return ctx.RegisterEventTimer(end)
}

func (f *windowFn) OnTimer(ctx *pipeline.KeyedContext[string, windowSum], t pipeline.Timer) error {
	s, ok, err := f.sums.Get(t.Time.UnixNano())
	if err != nil || !ok {
		return err
	}
	if err := f.sums.Delete(t.Time.UnixNano()); err != nil {
		return err
	}
	return ctx.Emit(windowSum{Sensor: ctx.Key(), End: t.Time, Sum: int(s)})
}

func TestPipelineProcessTimersSideOutputsUnion(t *testing.T) {
	base := time.Unix(1_700_000_000, 0).Truncate(10 * time.Second)
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	a := []reading{{"x", at(1), 1}, {"y", at(2), 2}, {"x", at(5), 3}, {"x", at(12), 4}, {"y", at(25), -1}}
	b := []reading{{"x", at(3), 10}, {"y", at(11), 20}, {"x", at(21), -2}, {"y", at(31), 5}}
	evt := source.WithEventTime(func(r reading) time.Time { return r.At })
	job := pipeline.New("windows", pipeline.CheckpointDir(t.TempDir()), pipeline.DefaultParallelism(2),
		pipeline.CheckpointInterval(time.Millisecond))
	sa := pipeline.FromSource(job, "a", source.NewSlice(a, 1, evt))
	sb := pipeline.FromSource(job, "b", source.NewSlice(b, 2, evt))
	neg := pipeline.NewOutputTag[reading]("negative")
	sums := pipeline.Process(pipeline.KeyBy(pipeline.Union(sa, sb), func(r reading) string { return r.Sensor }), "window",
		func() pipeline.KeyedProcessFunc[string, reading, windowSum] { return &windowFn{neg: neg} })
	var out collect[windowSum]
	var negs collect[reading]
	pipeline.To(sums, "out", out.sink())
	pipeline.To(pipeline.SideOutput(sums, neg), "neg", negs.sink())
	runJob(t, job)
	got := map[string]int{}
	for _, w := range out.all() {
		got[w.Sensor+"@"+w.End.Sub(base).String()] = w.Sum
	}
	want := map[string]int{"x@10s": 14, "y@10s": 2, "x@20s": 4, "y@20s": 20, "y@40s": 5}
	if len(got) != len(want) {
		t.Fatalf("windows %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("windows %v, want %v", got, want)
		}
	}
	if n := len(negs.all()); n != 2 {
		t.Fatalf("side output got %d records, want 2", n)
	}
}

func TestPipelineProcessingTimer(t *testing.T) {
	job := pipeline.New("ptimer")
	src := pipeline.FromSource(job, "src", source.NewGenerator(1, -1, func(_ int, seq uint64) string {
		return []string{"k1", "k2"}[seq%2]
	}))
	fired := pipeline.Process(pipeline.KeyBy(src, func(s string) string { return s }), "p",
		func() pipeline.KeyedProcessFunc[string, string, string] {
			var armed *state.Value[bool]
			return &pipeline.ProcessFuncs[string, string, string]{
				OpenFn: func(ctx *pipeline.OpenContext) (err error) {
					armed, err = state.NewValue(ctx.Backend(), "armed", pipeline.JSON[bool]())
					return err
				},
				ProcessFn: func(ctx *pipeline.KeyedContext[string, string], _ string) error {
					if _, ok, err := armed.Get(); ok || err != nil {
						return err
					}
					if err := armed.Set(true); err != nil {
						return err
					}
					return ctx.RegisterProcessingTimer(ctx.Now().Add(20 * time.Millisecond))
				},
				TimerFn: func(ctx *pipeline.KeyedContext[string, string], t pipeline.Timer) error {
					if t.Domain != state.ProcessingTime {
						return errors.New("not a processing-time timer")
					}
					return ctx.Emit(ctx.Key())
				},
			}
		})
	var out collect[string]
	pipeline.To(fired, "out", out.sink())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- job.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(out.all()) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	got := out.all()
	slices.Sort(got)
	if !slices.Equal(got, []string{"k1", "k2"}) {
		t.Fatalf("fired %v", got)
	}
}

// TestPipelineStopAndResume stops an unbounded job, then resumes it bounded
// from its stop checkpoint: the count is exact.
func TestPipelineStopAndResume(t *testing.T) {
	dir := t.TempDir()
	const perSplit = 20000
	build := func(bounded bool, out *collect[int64]) *pipeline.Job {
		n := int64(-1)
		if bounded {
			n = perSplit
		}
		job := pipeline.New("resume", pipeline.CheckpointDir(dir), pipeline.CheckpointInterval(3*time.Millisecond), pipeline.DefaultParallelism(2))
		src := pipeline.FromSource(job, "gen", source.NewGenerator(3, n, func(split int, seq uint64) int64 {
			if bounded && seq >= perSplit {
				panic("read past the end")
			}
			return 1
		}))
		sum := pipeline.ReduceCodec(pipeline.KeyBy(src, func(int64) string { return "all" }), "sum",
			func(_ context.Context, a, b int64) (int64, error) { return a + b, nil }, state.Int64Codec())
		pipeline.To(sum, "out", out.sink())
		return job
	}
	var first collect[int64]
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	job := build(false, &first)
	go func() { errc <- job.Run(ctx) }()
	for len(first.all()) < 100 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("stop: %v", err)
	}
	st := job.Status()
	if len(st.Checkpoints) == 0 || st.Checkpoints[0].Result != "completed" {
		t.Fatalf("no stop checkpoint: %+v", st.Checkpoints)
	}
	var second collect[int64]
	runJob(t, build(true, &second))
	all := second.all()
	if len(all) == 0 || all[len(all)-1] != 3*perSplit {
		t.Fatalf("resumed total %v, want %d", all[len(all)-1:], 3*perSplit)
	}
	if f := first.all(); f[len(f)-1]+int64(len(all)) != 3*perSplit {
		t.Fatalf("first run emitted up to %d, second run %d updates: not exactly-once", f[len(f)-1], len(all))
	}
}

func TestPipelineStatusEndpoint(t *testing.T) {
	addrc := make(chan string, 1)
	job := pipeline.New("status", pipeline.StatusAddress("127.0.0.1:0", func(a string) { addrc <- a }),
		pipeline.CheckpointInterval(2*time.Millisecond))
	src := pipeline.FromSource(job, "gen", source.NewGenerator(2, -1, func(int, uint64) int { return 1 }))
	pipeline.To(src, "out", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- job.Run(ctx) }()
	addr := <-addrc
	var st runtime.Status
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		if len(st.Checkpoints) > 0 && len(st.Splits) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st.Job != "status" || st.State != "running" || len(st.Splits) != 2 || len(st.Operators) != 2 || st.Checkpoints[0].Result != "completed" {
		t.Fatalf("status %+v", st)
	}
}
