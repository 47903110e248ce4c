package pipeline_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// tin is a two-input test record: its input ("a", "b"; "r" for a
// broadcast rule), key, event time (seconds after tbase) and value.
type tin struct {
	Side string  `json:"s"`
	K    string  `json:"k"`
	T    float64 `json:"t"`
	V    string  `json:"v"`
}

var tbase = time.Unix(1_700_000_000, 0)

func tsec(s float64) time.Time { return tbase.Add(time.Duration(s * float64(time.Second))) }

func relSec(t time.Time) string { return strconv.FormatFloat(t.Sub(tbase).Seconds(), 'g', -1, 64) }

// oneByOne is a source whose splits return one record per Poll, so that
// the watermark advances after every record and late records are exactly
// determined. A split with a hold channel blocks after its records until
// the channel is closed.
type oneByOne struct {
	splits [][]tin
	hold   map[int]chan struct{}
}

func (s *oneByOne) Splits(context.Context) ([]source.Split, error) {
	out := make([]source.Split, len(s.splits))
	for i := range out {
		out[i] = source.Split{ID: strconv.Itoa(i)}
	}
	return out, nil
}

func (s *oneByOne) Open(_ context.Context, sp source.Split, restored []byte) (source.SplitReader[tin], error) {
	i, err := strconv.Atoi(sp.ID)
	if err != nil || i < 0 || i >= len(s.splits) {
		return nil, fmt.Errorf("no split %q", sp.ID)
	}
	r := &oneReader{recs: s.splits[i], hold: s.hold[i]}
	if len(restored) == 8 {
		r.next = int(binary.BigEndian.Uint64(restored))
	}
	return r, nil
}

type oneReader struct {
	recs []tin
	next int
	hold chan struct{}
	out  [1]source.Record[tin]
}

func (r *oneReader) Poll(ctx context.Context, _ int) ([]source.Record[tin], error) {
	if r.next < len(r.recs) {
		e := r.recs[r.next]
		r.next++
		r.out[0] = source.Record[tin]{Value: e, EventTime: tsec(e.T), Offset: r.Offset()}
		return r.out[:], nil
	}
	if r.hold != nil {
		select {
		case <-r.hold:
		case <-ctx.Done():
			return nil, nil
		}
	}
	return nil, source.ErrEndOfSplit
}

func (r *oneReader) Offset() []byte { return binary.BigEndian.AppendUint64(nil, uint64(r.next)) }

func (r *oneReader) NotifyCheckpointComplete(context.Context, uint64) error { return nil }

func (r *oneReader) Close() error { return nil }

// gather is a goroutine-safe sink that keeps what it receives.
type gather[T any] struct {
	mu  sync.Mutex
	got []T
}

func (g *gather[T]) sink() *sink.Func[T] {
	return sink.NewFunc(func(_ context.Context, v T) error {
		g.mu.Lock()
		g.got = append(g.got, v)
		g.mu.Unlock()
		return nil
	}, nil)
}

func (g *gather[T]) all() []T {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.got)
}

// sides splits one stream of tin into its "a" and "b" records: both
// inputs then reach a two-input operator from one task, in the source's
// order.
func sides(s *pipeline.Stream[tin]) (a, b *pipeline.Stream[tin]) {
	side := func(name string) func(context.Context, tin) (bool, error) {
		return func(_ context.Context, r tin) (bool, error) { return r.Side == name, nil }
	}
	return pipeline.Filter(s, "side-a", side("a")), pipeline.Filter(s, "side-b", side("b"))
}

func tkey(r tin) string { return r.K }

func runTJob(t *testing.T, job *pipeline.Job) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := job.Run(ctx); err != nil {
		t.Fatalf("job: %v", err)
	}
}

func opStatus(t *testing.T, job *pipeline.Job, uid string) (in, out, late int64) {
	t.Helper()
	for _, o := range job.Status().Operators {
		if o.UID == uid {
			return o.In, o.Out, o.Late
		}
	}
	t.Fatalf("no operator %q in the status", uid)
	return
}

func opIn(job *pipeline.Job, uid string) (int64, bool) {
	for _, o := range job.Status().Operators {
		if o.UID == uid {
			return o.In, true
		}
	}
	return 0, false
}

func equalStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got  %q\n want %q", what, got, want)
	}
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// coFn: first-input records set the key's name, second-input records are
// emitted with it and register an event timer at their time + 1 s.
type coFn struct{ name *state.Value[string] }

func (f *coFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.name, err = state.NewValue(ctx.Backend(), "name", state.StringCodec())
	return err
}

func (f *coFn) ProcessElement1(ctx *pipeline.KeyedContext[string, string], a tin) error {
	return f.name.Set(a.V)
}

func (f *coFn) ProcessElement2(ctx *pipeline.KeyedContext[string, string], b tin) error {
	n, _, err := f.name.Get()
	if err != nil {
		return err
	}
	if err := ctx.RegisterEventTimer(ctx.Timestamp().Add(time.Second)); err != nil {
		return err
	}
	return ctx.Emit(fmt.Sprintf("%s:%s=%s", ctx.Key(), b.V, n))
}

func (f *coFn) OnTimer(ctx *pipeline.KeyedContext[string, string], tm pipeline.Timer) error {
	n, _, err := f.name.Get()
	if err != nil {
		return err
	}
	return ctx.Emit(fmt.Sprintf("timer %s@%s=%s", ctx.Key(), relSec(tm.Time), n))
}

// TestConnectKeyedSharedStateAndTimers: both inputs of a KeyedCoProcess
// see the same keyed state and timers of their key, in the order of the
// input.
func TestConnectKeyedSharedStateAndTimers(t *testing.T) {
	job := pipeline.New("connect", pipeline.DefaultParallelism(1))
	in := pipeline.FromSource(job, "in", &oneByOne{splits: [][]tin{{
		{"a", "x", 1, "alice"}, {"b", "x", 2, "q1"}, {"b", "y", 3, "q2"}, {"a", "y", 4, "bob"},
		{"b", "y", 5, "q3"}, {"a", "x", 6, "carol"}, {"b", "x", 9, "q4"},
	}}})
	a, b := sides(in)
	out := pipeline.KeyedCoProcess(pipeline.ConnectKeyed(pipeline.KeyBy(a, tkey), pipeline.KeyBy(b, tkey)), "co",
		func() pipeline.KeyedCoProcessFunc[string, tin, tin, string] { return &coFn{} })
	var g gather[string]
	pipeline.To(out, "out", g.sink())
	runTJob(t, job)
	equalStrings(t, "outputs", g.all(), []string{
		// A timer at t fires once the watermark reaches t: after the
		// next record (the watermark after a record at t is t - 1 ns).
		"x:q1=alice", "y:q2=", "timer x@3=alice", "y:q3=bob", "timer y@4=bob", "x:q4=carol", "timer y@6=bob", "timer x@10=carol",
	})
}

// TestConnectWatermarkIsMinimumOfInputs: a connected operator's watermark
// waits for both inputs. With the second input held (no records, no
// watermark), no timer fires though the first input's watermark passed
// them; releasing the second input (it ends) fires them.
func TestConnectWatermarkIsMinimumOfInputs(t *testing.T) {
	job := pipeline.New("connect-wm", pipeline.DefaultParallelism(2))
	hold := make(chan struct{})
	as := pipeline.FromSource(job, "as", &oneByOne{splits: [][]tin{{{"b", "x", 1, "q1"}, {"b", "y", 2, "q2"}, {"b", "x", 30, "q3"}, {"b", "x", 31, "q4"}}}})
	bs := pipeline.FromSource(job, "bs", &oneByOne{splits: [][]tin{nil}, hold: map[int]chan struct{}{0: hold}})
	// The first input's records go to ProcessElement2 (they register the
	// timers): connect them as the second input.
	out := pipeline.KeyedCoProcess(pipeline.ConnectKeyed(pipeline.KeyBy(bs, tkey), pipeline.KeyBy(as, tkey)), "co",
		func() pipeline.KeyedCoProcessFunc[string, tin, tin, string] { return &wmCoFn{} })
	var g gather[string]
	pipeline.To(out, "out", g.sink())
	errc := make(chan error, 1)
	go func() { errc <- job.Run(context.Background()) }()
	testutil.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if in, ok := opIn(job, "co"); !ok || in != 4 {
			return fmt.Errorf("co read %d records", in)
		}
		if n := len(g.all()); n != 4 {
			return fmt.Errorf("%d outputs", n)
		}
		return nil
	})
	// The first input's watermark reached 30 s - 1 ns before q4 (past the
	// timers at 2 s and 3 s); the held input has none, so neither has the
	// operator (q4 shows it).
	for _, o := range g.all() {
		if strings.HasPrefix(o, "timer") {
			t.Fatalf("a timer fired while the second input had no watermark: %q", g.all())
		}
	}
	close(hold)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	equalStrings(t, "outputs", sortedCopy(g.all()), []string{"timer x@2=", "timer x@31=", "timer x@32=", "timer y@3=",
		"x:q1= wm=none", "x:q3= wm=none", "x:q4= wm=none", "y:q2= wm=none"})
}

// wmCoFn is coFn showing the watermark with each second-input record.
type wmCoFn struct{ coFn }

func (f *wmCoFn) ProcessElement2(ctx *pipeline.KeyedContext[string, string], b tin) error {
	if err := ctx.RegisterEventTimer(ctx.Timestamp().Add(time.Second)); err != nil {
		return err
	}
	wm := "none"
	if w := ctx.Watermark(); !w.IsZero() {
		wm = relSec(w)
	}
	return ctx.Emit(fmt.Sprintf("%s:%s= wm=%s", ctx.Key(), b.V, wm))
}

type nonKeyedFn struct{ sub int }

func (f *nonKeyedFn) Open(ctx *pipeline.OpenContext) error { f.sub = ctx.Subtask(); return nil }

func (f *nonKeyedFn) ProcessElement1(ctx *pipeline.Context[string], a tin) error {
	return ctx.Emit("1:" + a.V)
}

func (f *nonKeyedFn) ProcessElement2(ctx *pipeline.Context[string], b tin) error {
	return ctx.Emit("2:" + b.V + "@" + relSec(ctx.Timestamp()))
}

// TestCoProcessNonKeyed: every record of both inputs reaches the non-keyed
// function once, over several subtasks; an empty input is no obstacle.
func TestCoProcessNonKeyed(t *testing.T) {
	for _, empty := range []bool{false, true} {
		t.Run(fmt.Sprintf("emptySecond=%v", empty), func(t *testing.T) {
			job := pipeline.New("co-nonkeyed", pipeline.DefaultParallelism(3))
			var recsA, recsB []tin
			var want []string
			for i := range 300 {
				recsA = append(recsA, tin{"a", "", float64(i), "a" + strconv.Itoa(i)})
				want = append(want, "1:a"+strconv.Itoa(i))
				if !empty {
					recsB = append(recsB, tin{"b", "", float64(i), "b" + strconv.Itoa(i)})
					want = append(want, "2:b"+strconv.Itoa(i)+"@"+strconv.Itoa(i))
				}
			}
			a := pipeline.FromSource(job, "as", source.NewSlice(recsA, 2)).WithTimestamps(func(r tin) time.Time { return tsec(r.T) })
			b := pipeline.FromSource(job, "bs", source.NewSlice(recsB, 1)).WithTimestamps(func(r tin) time.Time { return tsec(r.T) })
			out := pipeline.CoProcess(pipeline.Connect(a, b), "co",
				func() pipeline.CoProcessFunc[tin, tin, string] { return &nonKeyedFn{} })
			var g gather[string]
			pipeline.To(out, "out", g.sink())
			runTJob(t, job)
			equalStrings(t, "outputs", sortedCopy(g.all()), sortedCopy(want))
		})
	}
}

// TestConnectKeyedCodecMismatch: the keys of both inputs must be encoded
// alike.
func TestConnectKeyedCodecMismatch(t *testing.T) {
	job := pipeline.New("codec-mismatch")
	in := pipeline.FromSource(job, "in", source.NewSlice([]tin{{"a", "x", 1, ""}}, 1))
	a, b := sides(in)
	ka := pipeline.KeyBy(a, tkey)
	kb := pipeline.KeyByCodec(b, tkey, pipeline.JSON[string]())
	out := pipeline.KeyedCoProcess(pipeline.ConnectKeyed(ka, kb), "co",
		func() pipeline.KeyedCoProcessFunc[string, tin, tin, string] { return &coFn{} })
	pipeline.To(out, "out", sink.NewFunc(func(context.Context, string) error { return nil }, nil))
	err := job.Run(context.Background())
	if !errors.Is(err, pipeline.ErrInvalidGraph) || !strings.Contains(err.Error(), "key codecs differ") {
		t.Fatalf("Run = %v, want ErrInvalidGraph naming the key codecs", err)
	}
}
