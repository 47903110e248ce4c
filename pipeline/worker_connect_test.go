package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// coCountFn counts the records of both inputs of a key in one state value
// (the inputs share the key's state) and emits every new count.
type coCountFn struct{ n *state.Value[int64] }

func (f *coCountFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.n, err = state.NewValue(ctx.Backend(), "n", state.Int64Codec())
	return err
}

func (f *coCountFn) add(ctx *pipeline.KeyedContext[string, keyCount]) error {
	n, _, err := f.n.Get()
	if err != nil {
		return err
	}
	n++
	if err := f.n.Set(n); err != nil {
		return err
	}
	return ctx.Emit(keyCount{Key: ctx.Key(), Count: n})
}

func (f *coCountFn) ProcessElement1(ctx *pipeline.KeyedContext[string, keyCount], _ string) error {
	return f.add(ctx)
}

func (f *coCountFn) ProcessElement2(ctx *pipeline.KeyedContext[string, keyCount], _ string) error {
	return f.add(ctx)
}

func (f *coCountFn) OnTimer(*pipeline.KeyedContext[string, keyCount], pipeline.Timer) error {
	return nil
}

// TestWorkerKeyedConnect: a keyed two-input operator on two workers: both
// topics' source stages write to the operator's repartition topic, and
// every key's counts over both inputs come out exactly 1..n. A broadcast
// operator is refused with ErrBroadcastScaleout.
func TestWorkerKeyedConnect(t *testing.T) {
	cl := testutil.RunCluster(t)
	admin := cl.NewClient(t)
	testutil.CreateTopic(t, admin, cl.BrokerAddr, "wc_a", 2)
	testutil.CreateTopic(t, admin, cl.BrokerAddr, "wc_b", 3)
	p := testutil.NewProducer(t, admin, "wc_producer")
	want := map[string]int64{}
	for i := range 600 {
		k := fmt.Sprintf("k%02d", (i*7)%30)
		want[k]++
		topic := "wc_a"
		if i%3 == 0 {
			topic = "wc_b"
		}
		if _, err := p.Send(context.Background(), &client.Message{Topic: topic, Body: []byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	out := &outputs{seen: map[string][]int64{}}
	build := func(c *client.Client, broadcast bool) func(j *pipeline.Job) error {
		return func(j *pipeline.Job) error {
			sa, err := srcmq.New(c, "wc_a", srcmq.WithGroup("wc_group_a"))
			if err != nil {
				return err
			}
			sb, err := srcmq.New(c, "wc_b", srcmq.WithGroup("wc_group_b"))
			if err != nil {
				return err
			}
			a := pipeline.FromBytes(j, "a", sa.Bytes(), state.StringCodec())
			b := pipeline.FromBytes(j, "b", sb.Bytes(), state.StringCodec())
			id := func(s string) string { return s }
			if broadcast {
				outs := pipeline.ProcessBroadcast(a, pipeline.Broadcast(b), "bc",
					func() pipeline.BroadcastProcessFunc[string, string, string] { return nil })
				pipeline.To(outs, "out", sink.NewFunc(func(context.Context, string) error { return nil }, nil))
				return nil
			}
			conn := pipeline.ConnectKeyed(pipeline.KeyBy(a, id).WithCodec(state.StringCodec()), pipeline.KeyBy(b, id).WithCodec(state.StringCodec()))
			counts := pipeline.KeyedCoProcess(conn, "count",
				func() pipeline.KeyedCoProcessFunc[string, string, string, keyCount] { return &coCountFn{} })
			pipeline.To(counts, "out", sink.NewFunc(func(_ context.Context, kc keyCount) error { out.add(kc); return nil }, nil))
			return nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	{
		c := cl.NewClient(t, client.WithInstanceName("wc_bc"))
		err := pipeline.RunWorker(ctx, c, "wcbjob", build(c, true), pipeline.CheckpointDir(t.TempDir()), pipeline.Ranges(2))
		if !errors.Is(err, pipeline.ErrBroadcastScaleout) || !errors.Is(err, pipeline.ErrInvalidGraph) {
			t.Fatalf("RunWorker with a broadcast operator = %v, want ErrBroadcastScaleout", err)
		}
	}
	var dones []chan error
	for _, name := range []string{"wcA", "wcB"} {
		c := cl.NewClient(t, client.WithInstanceName(name))
		done := make(chan error, 1)
		dones = append(dones, done)
		dir := filepath.Join(t.TempDir(), name)
		go func() {
			done <- pipeline.RunWorker(ctx, c, "wcjob", build(c, false), pipeline.CheckpointDir(dir), pipeline.Ranges(4),
				pipeline.CheckpointInterval(200*time.Millisecond), pipeline.WorkerGroup("wc_group"))
		}()
	}
	testutil.CheckFor(t, 90*time.Second, 100*time.Millisecond, func() error { return out.check(want) })
	cancel()
	for _, d := range dones {
		select {
		case err := <-d:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("worker: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("worker did not stop")
		}
	}
}
