package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// rulesFn is a keyed broadcast function: rules ("r" records: name K,
// value V; an empty V deletes the rule) are broadcast state; each event
// ("a" records: key K, rule name V) is emitted with its key's running
// count (keyed state) and the rule's value. It checks that events cannot
// write the rules and that rules have no current key.
type rulesFn struct {
	rules *pipeline.BroadcastMap[string, string]
	count *state.Value[int64]
}

func (f *rulesFn) Open(ctx *pipeline.OpenContext) (err error) {
	if f.rules, err = pipeline.NewBroadcastMap(ctx, "rules", state.StringCodec(), state.StringCodec()); err != nil {
		return err
	}
	f.count, err = state.NewValue(ctx.Backend(), "count", state.Int64Codec())
	return err
}

func (f *rulesFn) ProcessElement(ctx *pipeline.KeyedContext[string, string], e tin) error {
	if err := f.rules.Put("x", "y"); !errors.Is(err, pipeline.ErrBroadcastReadOnly) {
		return fmt.Errorf("Put from the keyed side: %v, want ErrBroadcastReadOnly", err)
	}
	n, _, err := f.count.Get()
	if err != nil {
		return err
	}
	n++
	if err := f.count.Set(n); err != nil {
		return err
	}
	v, ok, err := f.rules.Get(e.V)
	if err != nil {
		return err
	}
	if !ok {
		v = "none"
	}
	return ctx.Emit(fmt.Sprintf("%s#%d:%s=%s/%d", e.K, n, e.V, v, f.rules.Len()))
}

func (f *rulesFn) ProcessBroadcastElement(ctx *pipeline.Context[string], r tin) error {
	if _, _, err := f.count.Get(); !errors.Is(err, state.ErrNoCurrentKey) {
		return fmt.Errorf("keyed state in ProcessBroadcastElement: %v, want ErrNoCurrentKey", err)
	}
	if r.V == "" {
		return f.rules.Delete(r.K)
	}
	return f.rules.Put(r.K, r.V)
}

func (f *rulesFn) OnTimer(*pipeline.KeyedContext[string, string], pipeline.Timer) error { return nil }

func ruleSides(s *pipeline.Stream[tin]) (events, rules *pipeline.Stream[tin]) {
	side := func(name string) func(context.Context, tin) (bool, error) {
		return func(_ context.Context, r tin) (bool, error) { return r.Side == name, nil }
	}
	return pipeline.Filter(s, "events", side("a")), pipeline.Filter(s, "rules", side("r"))
}

func keyedRulesJob(dir string, par int, first []tin, more []tin) (*pipeline.Job, *gather[string]) {
	job := pipeline.New("broadcast", pipeline.CheckpointDir(dir), pipeline.DefaultParallelism(par))
	in := pipeline.FromSource(job, "in", &oneByOne{splits: [][]tin{first}})
	events, rules := ruleSides(in)
	if more != nil {
		events = pipeline.Union(events, pipeline.FromSource(job, "more", &oneByOne{splits: [][]tin{more}}))
	}
	out := pipeline.ProcessKeyedBroadcast(pipeline.KeyBy(events, tkey), pipeline.Broadcast(rules), "apply",
		func() pipeline.KeyedBroadcastProcessFunc[string, tin, tin, string] { return &rulesFn{} })
	g := &gather[string]{}
	pipeline.To(out, "out", g.sink())
	return job, g
}

// TestBroadcastKeyedRules: every subtask applies every rule broadcast
// before an event (in the input's order), deletions included; the keyed
// side reads broadcast state only, the broadcast side has no key.
func TestBroadcastKeyedRules(t *testing.T) {
	var recs []tin
	recs = append(recs, tin{"r", "color", 0, "red"}, tin{"r", "size", 0, "xl"})
	keys := []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"}
	var want []string
	for _, k := range keys {
		recs = append(recs, tin{"a", k, 1, "color"})
		want = append(want, k+"#1:color=red/2")
	}
	recs = append(recs, tin{"r", "color", 2, "blue"}, tin{"r", "size", 2, ""})
	for _, k := range keys {
		recs = append(recs, tin{"a", k, 3, "color"}, tin{"a", k, 3, "size"})
		want = append(want, k+"#2:color=blue/1", k+"#3:size=none/1")
	}
	job, g := keyedRulesJob(t.TempDir(), 3, recs, nil)
	runTJob(t, job)
	equalStrings(t, "outputs", sortedCopy(g.all()), sortedCopy(want))
}

// TestBroadcastStateRestoredAfterRescale: broadcast state checkpointed by
// a job with 2 subtasks is restored in full on each of 3 subtasks (the
// keyed counts follow their keys), and a rule deleted before the
// checkpoint stays deleted.
func TestBroadcastStateRestoredAfterRescale(t *testing.T) {
	dir := t.TempDir()
	first := []tin{{"r", "color", 0, "red"}, {"r", "size", 0, "xl"}, {"r", "shape", 0, "round"}, {"r", "shape", 0, ""}}
	keys := []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"}
	for _, k := range keys {
		first = append(first, tin{"a", k, 1, "color"})
	}
	job, _ := keyedRulesJob(dir, 2, first, nil)
	runTJob(t, job)
	var want []string
	var moreRecs []tin
	for _, k := range keys {
		moreRecs = append(moreRecs, tin{"a", k, 2, "size"}, tin{"a", k, 2, "shape"})
		want = append(want, k+"#2:size=xl/2", k+"#3:shape=none/2")
	}
	job2, g := keyedRulesJob(dir, 3, first, moreRecs)
	runTJob(t, job2)
	equalStrings(t, "outputs after the restore", sortedCopy(g.all()), sortedCopy(want))
}

// thresholdFn is a non-keyed broadcast function: events pass when their
// value is in the broadcast allow list.
type thresholdFn struct {
	allow *pipeline.BroadcastMap[string, bool]
}

func (f *thresholdFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.allow, err = pipeline.NewBroadcastMap(ctx, "allow", state.StringCodec(), pipeline.JSON[bool]())
	return err
}

func (f *thresholdFn) ProcessElement(ctx *pipeline.Context[string], e tin) error {
	if ok, err := f.allow.Contains(e.V); err != nil || !ok {
		return err
	}
	return ctx.Emit(e.K + ":" + e.V)
}

func (f *thresholdFn) ProcessBroadcastElement(_ *pipeline.Context[string], r tin) error {
	return f.allow.Put(r.K, true)
}

// TestBroadcastNonKeyed: a non-keyed operator over 3 subtasks; every one
// has the allow list.
func TestBroadcastNonKeyed(t *testing.T) {
	recs := []tin{{"r", "ok", 0, ""}, {"r", "fine", 0, ""}}
	var want []string
	for i := range 60 {
		v := []string{"ok", "bad", "fine"}[i%3]
		recs = append(recs, tin{"a", fmt.Sprint(i), 1, v})
		if v != "bad" {
			want = append(want, fmt.Sprint(i)+":"+v)
		}
	}
	job := pipeline.New("broadcast-nonkeyed", pipeline.DefaultParallelism(3))
	in := pipeline.FromSource(job, "in", &oneByOne{splits: [][]tin{recs}})
	events, rules := ruleSides(in)
	out := pipeline.ProcessBroadcast(events, pipeline.Broadcast(rules), "filter",
		func() pipeline.BroadcastProcessFunc[tin, tin, string] { return &thresholdFn{} })
	var g gather[string]
	pipeline.To(out, "out", g.sink())
	runTJob(t, job)
	equalStrings(t, "outputs", sortedCopy(g.all()), sortedCopy(want))
}

// TestBroadcastMapOutsideBroadcastOperator: NewBroadcastMap needs a
// broadcast operator.
func TestBroadcastMapOutsideBroadcastOperator(t *testing.T) {
	job := pipeline.New("no-broadcast")
	in := pipeline.FromSource(job, "in", source.NewSlice([]tin{{"a", "k", 0, ""}}, 1))
	out := pipeline.Process(pipeline.KeyBy(in, tkey), "p", func() pipeline.KeyedProcessFunc[string, tin, string] {
		return &pipeline.ProcessFuncs[string, tin, string]{OpenFn: func(ctx *pipeline.OpenContext) error {
			_, err := pipeline.NewBroadcastMap(ctx, "m", state.StringCodec(), state.StringCodec())
			return err
		}}
	})
	pipeline.To(out, "out", (&gather[string]{}).sink())
	if err := job.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "NewBroadcastMap outside") {
		t.Fatalf("Run = %v, want the NewBroadcastMap error", err)
	}
}
