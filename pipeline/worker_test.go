package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// countFn emits (key, running count) for every record of its key.
type countFn struct{ n *state.Value[int64] }

type keyCount struct {
	Key   string
	Count int64
}

func (f *countFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.n, err = state.NewValue(ctx.Backend(), "n", state.Int64Codec())
	return err
}

func (f *countFn) ProcessElement(ctx *pipeline.KeyedContext[string, keyCount], _ string) error {
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

func (f *countFn) OnTimer(*pipeline.KeyedContext[string, keyCount], pipeline.Timer) error { return nil }

// outputs collects what every worker's sink wrote.
type outputs struct {
	mu   sync.Mutex
	seen map[string][]int64
	n    int
}

func (o *outputs) add(kc keyCount) {
	o.mu.Lock()
	o.seen[kc.Key] = append(o.seen[kc.Key], kc.Count)
	o.n++
	o.mu.Unlock()
}

// check reports whether every key's counts are exactly 1..want[key] once.
func (o *outputs) check(want map[string]int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, n := range want {
		got := o.seen[k]
		if int64(len(got)) < n {
			return fmt.Errorf("key %s: %d of %d counts so far", k, len(got), n)
		}
		have := map[int64]int{}
		for _, c := range got {
			have[c]++
		}
		for c := int64(1); c <= n; c++ {
			if have[c] != 1 {
				return fmt.Errorf("key %s: count %d seen %d times (all: %v)", k, c, have[c], got)
			}
		}
		if int64(len(got)) != n {
			return fmt.Errorf("key %s: %d counts, want %d: %v", k, len(got), n, got)
		}
	}
	return nil
}

// TestWorkerKeyedStageAcrossWorkers runs a source → KeyBy → count → sink
// job as two worker processes' worth of RunWorker in one test (two clients,
// two state directories): the keyed stage gets its input through the
// repartition topic, and every key's counts come out exactly 1..n, also
// across a third worker joining and one leaving (graceful hand-offs).
func TestWorkerKeyedStageAcrossWorkers(t *testing.T) {
	cl := testutil.RunCluster(t)
	admin := cl.NewClient(t)
	const topic, keys, perPhase = "wk_in", 40, 400
	testutil.CreateTopic(t, admin, cl.BrokerAddr, topic, 4)
	p := testutil.NewProducer(t, admin, "wk_producer")
	want := map[string]int64{}
	produce := func(n int) {
		t.Helper()
		for i := range n {
			k := fmt.Sprintf("k%02d", (i*7)%keys)
			want[k]++
			if _, err := p.Send(context.Background(), &client.Message{Topic: topic, Body: []byte(k)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := &outputs{seen: map[string][]int64{}}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: workerLogLevel}))
	type running struct {
		cancel context.CancelFunc
		done   chan error
	}
	statusAddr := make(chan string, 1)
	start := func(name string) running {
		c := cl.NewClient(t, client.WithInstanceName(name))
		build := func(j *pipeline.Job) error {
			src, err := srcmq.New(c, topic, srcmq.WithGroup("wk_group"))
			if err != nil {
				return err
			}
			lines := pipeline.FromBytes(j, "src", src.Bytes(), state.StringCodec())
			counts := pipeline.Process(pipeline.KeyBy(lines, func(s string) string { return s }).WithCodec(state.StringCodec()), "count",
				func() pipeline.KeyedProcessFunc[string, string, keyCount] { return &countFn{} })
			pipeline.To(counts, "out", sink.NewFunc(func(_ context.Context, kc keyCount) error { out.add(kc); return nil }, nil))
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		dir := filepath.Join(t.TempDir(), name)
		opts := []pipeline.JobOption{pipeline.CheckpointDir(dir), pipeline.Ranges(4),
			pipeline.CheckpointInterval(200 * time.Millisecond), pipeline.Logger(log), pipeline.WorkerGroup("wk_group")}
		if name == "wA" {
			opts = append(opts, pipeline.StatusAddress("127.0.0.1:0", func(a string) { statusAddr <- a }))
		}
		go func() { done <- pipeline.RunWorker(ctx, c, "wkjob", build, opts...) }()
		return running{cancel: cancel, done: done}
	}
	stop := func(r running) {
		t.Helper()
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("worker: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("worker did not stop")
		}
	}
	a, b := start("wA"), start("wB")
	produce(perPhase)
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return out.check(want) })
	// Worker A's /status: the tasks it runs, and every task's owner as the
	// commit chains say (each of the 8 tasks owned by A or B).
	addr := <-statusAddr
	testutil.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		resp, err := http.Get("http://" + addr + "/status")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var st pipeline.WorkerStatus
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return err
		}
		running := 0
		for _, tk := range st.Tasks {
			if tk.State == "running" {
				running++
			}
		}
		owners := map[string]int{}
		for _, ch := range st.Chains {
			owners[ch.Owner]++
		}
		if running == 0 || len(st.Chains) != 8 || owners["127.0.0.1@wA"]+owners["127.0.0.1@wB"] != 8 || owners["127.0.0.1@wA"] != running {
			return fmt.Errorf("status: %d running tasks, chains %+v", running, st.Chains)
		}
		return nil
	})
	c3 := start("wC")
	produce(perPhase)
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return out.check(want) })
	stop(a)
	produce(perPhase)
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return out.check(want) })
	stop(b)
	stop(c3)
}

var workerLogLevel = func() slog.Level {
	if os.Getenv("RUNNEL_TEST_WORKER_LOG") != "" {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}()
