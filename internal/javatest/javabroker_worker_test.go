package javatest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

type wkCount struct {
	Key   string
	Count int64
}

type wkCounter struct{ n *state.Value[int64] }

func (f *wkCounter) Open(ctx *pipeline.OpenContext) (err error) {
	f.n, err = state.NewValue(ctx.Backend(), "n", state.Int64Codec())
	return err
}

func (f *wkCounter) ProcessElement(ctx *pipeline.KeyedContext[string, wkCount], _ string) error {
	n, _, err := f.n.Get()
	if err != nil {
		return err
	}
	n++
	if err := f.n.Set(n); err != nil {
		return err
	}
	return ctx.Emit(wkCount{Key: ctx.Key(), Count: n})
}

func (f *wkCounter) OnTimer(*pipeline.KeyedContext[string, wkCount], pipeline.Timer) error {
	return nil
}

// TestJavaBrokerWorkers runs a keyed job as two runnel workers
// (pipeline.RunWorker) on Apache RocketMQ's Java broker: the job's topics
// created on it, tasks assigned by its consumer group and fenced by its
// queue locks, commit chains and changelogs on its queues, the keyed stage
// fed through a repartition topic read-committed; every key's counts come
// out exactly 1..n, also across a worker leaving.
func TestJavaBrokerWorkers(t *testing.T) {
	for _, v := range []string{javapeer.Version5, javapeer.Version4} {
		t.Run(v, func(t *testing.T) { testJavaBrokerWorkers(t, v) })
	}
}

func testJavaBrokerWorkers(t *testing.T, version string) {
	_, jc := javaCluster(t, version)
	newClient := func(name string) *client.Client {
		c, err := client.New(client.WithNameServers(jc.NameServer), client.WithClientIP(netip.MustParseAddr("127.0.0.1")),
			client.WithInstanceName(name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	admin := newClient("admin")
	topic := uniqueName(t, "wk")
	testutil.CreateTopic(t, admin, jc.Broker, topic, 4)
	p := testutil.NewProducer(t, admin, uniqueName(t, "wkp"))
	var mu sync.Mutex
	seen := map[string][]int64{}
	want := map[string]int64{}
	produce := func(n int) {
		for i := range n {
			k := fmt.Sprintf("k%02d", (i*7)%30)
			want[k]++
			if _, err := p.Send(context.Background(), &client.Message{Topic: topic, Body: []byte(k)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func() error {
		mu.Lock()
		defer mu.Unlock()
		for k, n := range want {
			got := seen[k]
			has := map[int64]int{}
			for _, c := range got {
				has[c]++
			}
			for c := int64(1); c <= n; c++ {
				if has[c] != 1 {
					return fmt.Errorf("key %s: count %d seen %d times: %v", k, c, has[c], got)
				}
			}
			if int64(len(got)) != n {
				return fmt.Errorf("key %s: %d counts, want %d", k, len(got), n)
			}
		}
		return nil
	}
	group := uniqueName(t, "wkg")
	job := uniqueName(t, "wkjob")
	type running struct {
		cancel context.CancelFunc
		done   chan error
	}
	start := func(name string) running {
		c := newClient(name)
		build := func(j *pipeline.Job) error {
			src, err := srcmq.New(c, topic, srcmq.WithGroup(group))
			if err != nil {
				return err
			}
			in := pipeline.FromBytes(j, "src", src.Bytes(), state.StringCodec())
			counts := pipeline.Process(pipeline.KeyBy(in, func(s string) string { return s }).WithCodec(state.StringCodec()), "count",
				func() pipeline.KeyedProcessFunc[string, string, wkCount] { return &wkCounter{} })
			pipeline.To(counts, "out", sink.NewFunc(func(_ context.Context, kc wkCount) error {
				mu.Lock()
				seen[kc.Key] = append(seen[kc.Key], kc.Count)
				mu.Unlock()
				return nil
			}, nil))
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		dir := filepath.Join(t.TempDir(), name)
		go func() {
			done <- pipeline.RunWorker(ctx, c, job, build, pipeline.CheckpointDir(dir), pipeline.Ranges(2),
				pipeline.CheckpointInterval(300*time.Millisecond), pipeline.WorkerGroup(group))
		}()
		return running{cancel: cancel, done: done}
	}
	stop := func(r running) {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("worker: %v", err)
			}
		case <-time.After(90 * time.Second):
			t.Fatal("worker did not stop")
		}
	}
	a, b := start("wA"), start("wB")
	produce(300)
	testutil.CheckFor(t, 120*time.Second, 100*time.Millisecond, check)
	stop(a)
	produce(300)
	testutil.CheckFor(t, 120*time.Second, 100*time.Millisecond, check)
	stop(b)
}
