package main

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/wordcount/wordcount"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// TestSavepointJobCommands runs an unbounded word count with a status
// endpoint and 2 retained checkpoints, takes a savepoint through `runnel
// savepoint create --job`, lists the restore points while it runs, stops it
// with a savepoint (`--stop`: Run returns nil), lists again, and restarts
// it from the first savepoint by id: the counts it then reaches are exact
// (the records after that savepoint are counted again from its state, not
// on top of the later state). Bad requests exit 1.
func TestSavepointJobCommands(t *testing.T) {
	e := newCLIEnv(t)
	c, err := e.cl.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const topic = "splines"
	if err := e.cl.CreateTopic(e.ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	p, err := client.NewProducer(c, "sp_test")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	produce := func(lines []string) {
		if err := wordcount.Produce(e.ctx, c, p, topic, lines, nil); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	type run struct {
		job    *pipeline.Job
		addr   chan string
		done   chan error
		mu     sync.Mutex
		counts map[string]int64
	}
	start := func(opts ...pipeline.JobOption) *run {
		r := &run{addr: make(chan string, 1), done: make(chan error, 1), counts: map[string]int64{}}
		src, err := rocketmq.New(c, topic)
		if err != nil {
			t.Fatal(err)
		}
		out := sink.NewFunc(func(_ context.Context, wc wordcount.WordCount) error {
			r.mu.Lock()
			r.counts[wc.Word] = wc.Count
			r.mu.Unlock()
			return nil
		}, nil)
		opts = append([]pipeline.JobOption{pipeline.CheckpointDir(dir), pipeline.CheckpointInterval(50 * time.Millisecond), pipeline.DefaultParallelism(2),
			pipeline.RetainCheckpoints(2, 0), pipeline.StatusAddress("127.0.0.1:0", func(a string) { r.addr <- a })}, opts...)
		r.job = pipeline.New("sp-wc", opts...)
		buildRunningCount(r.job, src, out)
		go func() { r.done <- r.job.Run(e.ctx) }()
		return r
	}
	read := func(r *run) int64 {
		for _, o := range r.job.Status().Operators {
			if o.UID == "lines" {
				return max(o.In, o.Out)
			}
		}
		return 0
	}
	first, second := wordcount.SampleLines(150, 5), wordcount.SampleLines(120, 6)
	produce(first)
	r := start()
	addr := <-r.addr
	testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := read(r); n < int64(len(first)) {
			return errors.New("the job has not read the first lines yet")
		}
		return nil
	})
	out := e.ok("", "savepoint", "create", "--job", addr)
	m := regexp.MustCompile(`(?m)^savepoint of checkpoint (\d+) written to (\S+) \((\d+) bytes\)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("savepoint create --job: %s", out)
	}
	spID, spPath := m[1], m[2]
	if !strings.HasPrefix(spPath, dir) {
		t.Fatalf("savepoint written to %s, outside the checkpoint directory", spPath)
	}
	list := e.ok("", "checkpoint", "list", dir)
	mustMatch(t, list, `(?m)^`+spID+` +\S+ \S+ +savepoint +\d+ +savepoint +\S+$`, `(?m)^\d+ +\S+ \S+ +retained +\d+ `, `the job is running: its latest checkpoint is not shown`)
	produce(second)
	testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := read(r); n < int64(len(first)+len(second)) {
			return errors.New("the job has not read the second lines yet")
		}
		return nil
	})
	mustMatch(t, e.ok("", "savepoint", "create", "--job", addr, "--stop"), `(?m)^savepoint of checkpoint \d+ written to `, `(?m)^the job stops`)
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("the job stopped with a savepoint returned %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the job did not stop after --stop")
	}
	want := wordcount.Count(append(append([]string(nil), first...), second...))
	check := func(what string, got map[string]int64) {
		t.Helper()
		for w, n := range want {
			if got[w] != n {
				t.Fatalf("%s: %s=%d, want %d", what, w, got[w], n)
			}
		}
	}
	check("first run", r.counts)
	list = e.ok("", "checkpoint", "list", dir)
	mustMatch(t, list, `(?m)^\d+ +\S+ \S+ +latest +\d+ +savepoint +\S+$`, `(?m)^`+spID+` +\S+ \S+ +savepoint `)
	r.job.Status()
	e.fails("is the job running with its status endpoint there?", "savepoint", "create", "--job", addr)

	// Back to the first savepoint: the second lines are counted again from
	// its state, and the counts end exact.
	// No periodic checkpoints in the restored run: its first checkpoint
	// (the one "restored from" the savepoint) stays in the history that
	// `checkpoint list` shows, which dozens of 50 ms checkpoints on a
	// loaded machine pushed out.
	r2 := start(pipeline.RestoreFrom(spID), pipeline.CheckpointInterval(time.Hour))
	<-r2.addr
	testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		r2.mu.Lock()
		defer r2.mu.Unlock()
		for w, n := range wordcount.Count(second) {
			if r2.counts[w] < n {
				return errors.New("the restored job has not counted the second lines yet")
			}
		}
		return nil
	})
	if _, err := r2.job.Savepoint(e.ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := <-r2.done; err != nil {
		t.Fatal(err)
	}
	if n := read(r2); n != int64(len(second)) {
		t.Fatalf("the job restored from savepoint %s read %d lines, want the %d after it", spID, n, len(second))
	}
	for w := range wordcount.Count(second) {
		if r2.counts[w] != want[w] {
			t.Fatalf("restored from the savepoint: %s=%d, want %d", w, r2.counts[w], want[w])
		}
	}
	mustMatch(t, e.ok("", "checkpoint", "list", dir), `restored from `+spID)
}

// buildRunningCount is the word count emitting every new count (the
// example's emits only when a bounded input ends).
func buildRunningCount(job *pipeline.Job, src *rocketmq.Source, out sink.Sink[wordcount.WordCount]) {
	lines := pipeline.FromSource(job, "lines", src)
	words := pipeline.FlatMap(lines, "split", func(_ context.Context, m rocketmq.Message, c *pipeline.Collector[string]) error {
		for _, w := range wordcount.Words(string(m.Body)) {
			c.Emit(w)
		}
		return nil
	})
	counts := pipeline.Process(pipeline.KeyBy(words, func(w string) string { return w }), "count",
		func() pipeline.KeyedProcessFunc[string, string, wordcount.WordCount] { return &runningCount{} })
	pipeline.To(counts, "out", out)
}

type runningCount struct{ n *state.Value[int64] }

func (c *runningCount) Open(ctx *pipeline.OpenContext) (err error) {
	c.n, err = state.NewValue(ctx.Backend(), "n", state.Int64Codec())
	return err
}

func (c *runningCount) ProcessElement(ctx *pipeline.KeyedContext[string, wordcount.WordCount], _ string) error {
	n, _, err := c.n.Get()
	if err != nil {
		return err
	}
	if err := c.n.Set(n + 1); err != nil {
		return err
	}
	return ctx.Emit(wordcount.WordCount{Word: ctx.Key(), Count: n + 1})
}

func (c *runningCount) OnTimer(*pipeline.KeyedContext[string, wordcount.WordCount], pipeline.Timer) error {
	return nil
}
