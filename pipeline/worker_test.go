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
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			done <- pipeline.RunWorker(ctx, c, "wkjob", build, opts...)
		}()
		t.Cleanup(func() { // before t.TempDir's removal (see workerRig.start)
			cancel()
			select {
			case <-exited:
			case <-time.After(60 * time.Second):
				t.Error("worker did not stop")
			}
		})
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
	switch os.Getenv("RUNNEL_TEST_WORKER_LOG") {
	case "":
	case "debug":
		return slog.LevelDebug
	default:
		return slog.LevelInfo
	}
	return slog.LevelWarn
}()

// workerRig runs RunWorker processes' worth of workers of one keyed job in
// this test process (each with its own client and state directory).
type workerRig struct {
	t     *testing.T
	cl    *testutil.Cluster
	topic string
	out   *outputs
	log   *slog.Logger
}

type runningWorker struct {
	cancel context.CancelFunc
	done   chan error
	addr   chan string
}

func newWorkerRig(t *testing.T, topic string) *workerRig {
	cl := testutil.RunCluster(t)
	admin := cl.NewClient(t)
	testutil.CreateTopic(t, admin, cl.BrokerAddr, topic, 4)
	return &workerRig{t: t, cl: cl, topic: topic, out: &outputs{seen: map[string][]int64{}},
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: workerLogLevel}))}
}

func (r *workerRig) produce(n int, want map[string]int64) {
	r.t.Helper()
	c := r.cl.NewClient(r.t)
	p := testutil.NewProducer(r.t, c, "rig_producer")
	for i := range n {
		k := fmt.Sprintf("k%02d", (i*7)%40)
		want[k]++
		if _, err := p.Send(context.Background(), &client.Message{Topic: r.topic, Body: []byte(k)}); err != nil {
			r.t.Fatal(err)
		}
	}
}

// start starts a worker named name on dir; countUID names the keyed
// operator (a different one makes another job layout).
func (r *workerRig) start(name, dir, countUID string, opts ...pipeline.JobOption) runningWorker {
	c := r.cl.NewClient(r.t, client.WithInstanceName(name))
	build := func(j *pipeline.Job) error {
		src, err := srcmq.New(c, r.topic)
		if err != nil {
			return err
		}
		lines := pipeline.FromBytes(j, "src", src.Bytes(), state.StringCodec())
		counts := pipeline.Process(pipeline.KeyBy(lines, func(s string) string { return s }).WithCodec(state.StringCodec()), countUID,
			func() pipeline.KeyedProcessFunc[string, string, keyCount] { return &countFn{} })
		pipeline.To(counts, "out", sink.NewFunc(func(_ context.Context, kc keyCount) error { r.out.add(kc); return nil }, nil))
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := runningWorker{cancel: cancel, done: make(chan error, 1), addr: make(chan string, 1)}
	all := append([]pipeline.JobOption{pipeline.CheckpointDir(dir), pipeline.Ranges(4), pipeline.CheckpointInterval(200 * time.Millisecond),
		pipeline.Logger(r.log), pipeline.StatusAddress("127.0.0.1:0", func(a string) { w.addr <- a })}, opts...)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		w.done <- pipeline.RunWorker(ctx, c, "rigjob", build, all...)
	}()
	// A test that fails before stopping it must not remove its directory
	// under a running worker (its store would fail on missing files).
	r.t.Cleanup(func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			r.t.Error("worker did not stop")
		}
	})
	return w
}

func (w runningWorker) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	select {
	case err := <-w.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("worker: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("worker did not stop")
	}
}

func workerStatus(t *testing.T, addr string) pipeline.WorkerStatus {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st pipeline.WorkerStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestWorkerRefusesAnotherFingerprint: a worker built with another keyed
// operator (a job whose checkpoints would not restore) or another number of
// ranges refuses to start while the job's chains hold the running build's
// checkpoints, and says why; the same build starts again (a rolling
// restart) and goes on where the other left off.
func TestWorkerRefusesAnotherFingerprint(t *testing.T) {
	r := newWorkerRig(t, "fp_in")
	want := map[string]int64{}
	a := r.start("fA", filepath.Join(t.TempDir(), "a"), "count")
	r.produce(100, want)
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return r.out.check(want) })
	a.stop(t)
	for _, tc := range []struct {
		name string
		uid  string
		opts []pipeline.JobOption
	}{{"another keyed operator", "count2", nil}, {"another number of ranges", "count", []pipeline.JobOption{pipeline.Ranges(2)}}} {
		b := r.start("fB", filepath.Join(t.TempDir(), "b"), tc.uid, tc.opts...)
		select {
		case err := <-b.done:
			if !errors.Is(err, pipeline.ErrWorkerFingerprint) {
				t.Fatalf("%s: RunWorker returned %v, want ErrWorkerFingerprint", tc.name, err)
			}
			t.Logf("%s: %v", tc.name, err)
		case <-time.After(60 * time.Second):
			b.cancel()
			t.Fatalf("%s: the worker took the job's tasks", tc.name)
		}
		b.cancel()
	}
	c := r.start("fC", filepath.Join(t.TempDir(), "c"), "count")
	r.produce(100, want)
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return r.out.check(want) })
	c.stop(t)
}

// TestWorkerStandbyTakesOver: with Standbys(1) each worker keeps a warm
// copy of the other's tasks; when one leaves, the other restores every task
// it inherits from its copy (applying only the last checkpoints), not from
// the broker's snapshot, and the counts go on exactly.
func TestWorkerStandbyTakesOver(t *testing.T) {
	r := newWorkerRig(t, "sb_in")
	want := map[string]int64{}
	a := r.start("sA", filepath.Join(t.TempDir(), "a"), "count", pipeline.Standbys(1))
	b := r.start("sB", filepath.Join(t.TempDir(), "b"), "count", pipeline.Standbys(1))
	addrA := <-a.addr
	r.produce(400, want)
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return r.out.check(want) })
	// A keeps caught-up copies of B's tasks.
	var mine int
	own := map[string]bool{}
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		st := workerStatus(t, addrA)
		mine = len(st.Tasks)
		clear(own)
		for _, tk := range st.Tasks {
			own[tk.Task] = true
		}
		if mine == 0 || mine == 8 {
			return fmt.Errorf("A owns %d of 8 tasks", mine)
		}
		if len(st.Standbys) != 8-mine {
			return fmt.Errorf("A keeps %d standbys, B owns %d tasks", len(st.Standbys), 8-mine)
		}
		for _, sb := range st.Standbys {
			if sb.At == 0 || sb.Lag > 1 {
				return fmt.Errorf("standby %+v not caught up", sb)
			}
		}
		return nil
	})
	b.stop(t)
	r.produce(400, want)
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return r.out.check(want) })
	st := workerStatus(t, addrA)
	if len(st.Tasks) != 8 {
		t.Fatalf("A owns %d tasks after B left", len(st.Tasks))
	}
	inherited := 0
	for _, tk := range st.Tasks {
		if own[tk.Task] {
			continue // A's before B left (restored however it came to A)
		}
		inherited++
		if tk.Restore == nil || !tk.Restore.Reused || tk.Restore.FromSnapshot {
			t.Fatalf("task %s restored %+v: want its standby copy reused", tk.Task, tk.Restore)
		}
		t.Logf("%s: restored from the standby copy, %d checkpoints applied (%d bytes) in %v", tk.Task, tk.Restore.Segments, tk.Restore.Bytes, tk.Restore.Duration)
	}
	if inherited != 8-mine {
		t.Fatalf("A restored %d inherited tasks, want %d", inherited, 8-mine)
	}
	a.stop(t)
}
