package pipeline_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// groupSumFn is windowFn with one event-time timer per (key group, window
// end) instead of one per (key, window end): it remembers in memory which
// keys have a sum for each end and, when the group timer fires, selects
// each key with ForKey(k, nil, …), so the key is encoded by the keyed task
// rather than handed over as bytes. Sensor "bad" fails its firing.
type groupSumFn struct {
	sums    *state.Map[int64, int64]
	pending map[uint16]map[int64][]string
}

func (f *groupSumFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.sums, err = state.NewMap(ctx.Backend(), "sums", state.Int64Codec(), state.Int64Codec())
	f.pending = map[uint16]map[int64][]string{}
	return err
}

func (f *groupSumFn) ProcessElement(ctx *pipeline.KeyedContext[string, windowSum], r reading) error {
	end := r.At.Truncate(10 * time.Second).Add(10 * time.Second)
	s, ok, err := f.sums.Get(end.UnixNano())
	if err != nil {
		return err
	}
	if err := f.sums.Put(end.UnixNano(), s+int64(r.Value)); err != nil {
		return err
	}
	if !ok {
		kg := ctx.CurrentKeyGroup()
		if f.pending[kg] == nil {
			f.pending[kg] = map[int64][]string{}
		}
		f.pending[kg][end.UnixNano()] = append(f.pending[kg][end.UnixNano()], ctx.Key())
	}
	return ctx.RegisterGroupEventTimer(ctx.CurrentKeyGroup(), end)
}

func (f *groupSumFn) OnTimer(*pipeline.KeyedContext[string, windowSum], pipeline.Timer) error {
	return errors.New("groupSumFn registers no per-key timer")
}

func (f *groupSumFn) OnGroupTimer(ctx *pipeline.KeyedContext[string, windowSum], kg uint16, t pipeline.Timer) error {
	end := t.Time.UnixNano()
	keys := f.pending[kg][end]
	delete(f.pending[kg], end)
	slices.Sort(keys)
	for _, k := range keys {
		err := ctx.ForKey(k, nil, kg, func(c *pipeline.KeyedContext[string, windowSum]) error {
			if c.Key() != k {
				return errors.New("ForKey selected " + c.Key() + ", want " + k)
			}
			if k == "bad" {
				return errors.New("bad sensor fired")
			}
			s, ok, err := f.sums.Get(end)
			if err != nil {
				return err
			}
			if !ok {
				return errors.New("no sum under " + k + ": ForKey encoded the key differently from the record path")
			}
			if err := f.sums.Delete(end); err != nil {
				return err
			}
			return c.Emit(windowSum{Sensor: k, End: t.Time, Sum: int(s)})
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// TestGroupTimerForKeyEncodes: group timers fire once per (key group,
// end) and ForKey with a nil encoding reaches the state the record path
// wrote for that key; a key whose firing fails is dead-lettered as a timer
// of that key, and the other keys of its group still fire.
func TestGroupTimerForKeyEncodes(t *testing.T) {
	base := time.Unix(1_700_000_000, 0).Truncate(10 * time.Second)
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	in := []reading{
		{"x", at(1), 1}, {"y", at(2), 2}, {"x", at(5), 3}, {"bad", at(6), 7}, {"x", at(12), 4},
		{"z", at(13), 6}, {"y", at(11), 20}, {"y", at(31), 5}, {"z", at(35), 1},
	}
	evt := source.WithEventTime(func(r reading) time.Time { return r.At })
	var dlq collect[sink.DeadLetter]
	job := pipeline.New("group-timers", pipeline.CheckpointDir(t.TempDir()), pipeline.DefaultParallelism(2),
		pipeline.CheckpointInterval(time.Millisecond))
	src := pipeline.FromSource(job, "src", source.NewSlice(in, 1, evt))
	sums := pipeline.Process(pipeline.KeyBy(src, func(r reading) string { return r.Sensor }), "gsum",
		func() pipeline.KeyedProcessFunc[string, reading, windowSum] { return &groupSumFn{} },
		pipeline.OnError(pipeline.DeadLetter("dlq", dlq.sink())))
	var out collect[windowSum]
	pipeline.To(sums, "out", out.sink())
	runJob(t, job)
	got := map[string]int{}
	for _, w := range out.all() {
		k := w.Sensor + "@" + w.End.Sub(base).String()
		if _, dup := got[k]; dup {
			t.Fatalf("window %s fired twice", k)
		}
		got[k] = w.Sum
	}
	want := map[string]int{"x@10s": 4, "y@10s": 2, "x@20s": 4, "y@20s": 20, "z@20s": 6, "y@40s": 5, "z@40s": 1}
	if len(got) != len(want) {
		t.Fatalf("windows %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("windows %v, want %v", got, want)
		}
	}
	dl := dlq.all()
	if len(dl) != 1 || dl[0].Operator != "gsum" || !strings.Contains(dl[0].Reason, "bad sensor fired") {
		t.Fatalf("dead letters %+v, want one from gsum for the bad sensor", dl)
	}
}
