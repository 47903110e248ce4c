package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// countKeys counts each key's records in keyed state.
type countKeys struct{ n *state.Value[int64] }

func (f *countKeys) Open(ctx *pipeline.OpenContext) (err error) {
	f.n, err = state.NewValue(ctx.Backend(), "n", state.Int64Codec())
	return err
}

func (f *countKeys) ProcessElement(ctx *pipeline.KeyedContext[string, int64], _ string) error {
	n, _, err := f.n.Get()
	if err != nil {
		return err
	}
	if err := f.n.Set(n + 1); err != nil {
		return err
	}
	return ctx.Emit(n + 1)
}

func (f *countKeys) OnTimer(*pipeline.KeyedContext[string, int64], pipeline.Timer) error { return nil }

// jobTestWorker is one pipeline.RunWorker of the job commands' test.
type jobTestWorker struct {
	id     string // client id
	status string // status URL
	cancel context.CancelFunc
	done   chan error
}

// statusTasks returns the tasks the worker's /status lists as running.
func (w *jobTestWorker) statusTasks() ([]string, error) {
	resp, err := http.Get(w.status + "/status")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st pipeline.WorkerStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, err
	}
	var ids []string
	for _, t := range st.Tasks {
		if t.State == "running" {
			ids = append(ids, t.Task)
		}
	}
	return ids, nil
}

// TestJobTasksCommand runs two workers of a job (source → KeyBy → count;
// its name and its keyed stage's UID make pipeline hash their topic names,
// so the command must recover the stages from the names or the records)
// and checks `runnel job tasks` and `runnel job workers`, table and JSON,
// against what the workers' own /status says they run; then, with both
// workers stopped, that every task shows its last owner as having left;
// and that a job without commit topics fails with a clear message.
func TestJobTasksCommand(t *testing.T) {
	e := newCLIEnv(t)
	ns := "--namesrv=" + e.ns
	const job, topic, keyed = "wk_job", "jt_in", "count.v1"
	if err := e.cl.CreateTopic(e.ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	// A topic whose name looks like one of the job's but is not: it must
	// not be taken for a stage.
	if err := e.cl.CreateTopic(e.ctx, "runnel_commit_wk_job_other_0123456789ab", 1); err != nil {
		t.Fatal(err)
	}
	start := func(name string) *jobTestWorker {
		c, err := e.cl.NewClient(client.WithInstanceName(name))
		if err != nil {
			t.Fatal(err)
		}
		build := func(j *pipeline.Job) error {
			src, err := srcmq.New(c, topic)
			if err != nil {
				return err
			}
			lines := pipeline.FromBytes(j, "src", src.Bytes(), state.StringCodec())
			counts := pipeline.Process(pipeline.KeyBy(lines, func(s string) string { return s }).WithCodec(state.StringCodec()), keyed,
				func() pipeline.KeyedProcessFunc[string, string, int64] { return &countKeys{} })
			pipeline.To(counts, "out", sink.NewFunc(func(context.Context, int64) error { return nil }, nil))
			return nil
		}
		ctx, cancel := context.WithCancel(e.ctx)
		w := &jobTestWorker{id: c.ClientID(), cancel: cancel, done: make(chan error, 1)}
		addr := make(chan string, 1)
		opts := []pipeline.JobOption{pipeline.CheckpointDir(filepath.Join(t.TempDir(), name)), pipeline.Ranges(2),
			pipeline.CheckpointInterval(100 * time.Millisecond), pipeline.StatusAddress("127.0.0.1:0", func(a string) { addr <- a })}
		go func() {
			err := pipeline.RunWorker(ctx, c, job, build, opts...)
			w.done <- errors.Join(err, c.Close())
		}()
		select {
		case a := <-addr:
			w.status = "http://" + a
		case err := <-w.done:
			t.Fatalf("worker %s: %v", name, err)
		case <-e.ctx.Done():
			t.Fatal(e.ctx.Err())
		}
		return w
	}
	stop := func(w *jobTestWorker) {
		t.Helper()
		if w.cancel == nil {
			return
		}
		w.cancel()
		w.cancel = nil
		if err := <-w.done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("worker %s: %v", w.id, err)
		}
	}
	a, b := start("jtA"), start("jtB")
	t.Cleanup(func() { stop(a); stop(b) })
	p, err := e.cl.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	prod := testutil.NewProducer(t, p, "jt_producer")
	for i := range 20 {
		if _, err := prod.Send(e.ctx, &client.Message{Topic: topic, Body: fmt.Appendf(nil, "k%d", i%5)}); err != nil {
			t.Fatal(err)
		}
	}

	// The truth: what each worker's status says it runs, once the 4 tasks
	// (2 source queues, 2 key-group ranges) run on one worker each, both
	// with some, and each has completed a checkpoint.
	owner := map[string]string{}
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		clear(owner)
		for _, w := range []*jobTestWorker{a, b} {
			ids, err := w.statusTasks()
			if err != nil {
				return err
			}
			if len(ids) == 0 {
				return fmt.Errorf("worker %s runs no task yet", w.id)
			}
			for _, id := range ids {
				if owner[id] != "" {
					return fmt.Errorf("task %s runs on %s and %s", id, owner[id], w.id)
				}
				owner[id] = w.id
			}
		}
		if len(owner) != 4 {
			return fmt.Errorf("%d tasks running: %v", len(owner), owner)
		}
		r := e.run("", "job", "tasks", job, "--json", ns)
		if r.code != 0 {
			return errors.New(r.String())
		}
		var v jobView
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			return err
		}
		for _, tk := range v.Tasks {
			if tk.Claimed || tk.Checkpoint == 0 {
				return fmt.Errorf("task %s has not completed a checkpoint since its claim", tk.Task)
			}
		}
		return nil
	})

	var v jobView
	if err := json.Unmarshal([]byte(e.ok("", "job", "tasks", job, "--json", ns)), &v); err != nil {
		t.Fatal(err)
	}
	if v.Job != job || v.Group != scaleout.GroupName(job) {
		t.Errorf("job %q group %q", v.Job, v.Group)
	}
	var stages []string
	for _, s := range v.Stages {
		stages = append(stages, s.Stage)
		if s.CommitTopic != scaleout.TopicName(job, s.Stage, scaleout.KindCommit) || s.Tasks != 2 {
			t.Errorf("stage %+v", s)
		}
	}
	if want := []string{keyed, "src"}; !slices.Equal(stages, want) {
		t.Errorf("stages %v, want %v", stages, want)
	}
	if want := []string{a.id, b.id}; !slices.Equal(v.Members, want) {
		t.Errorf("members %v, want %v", v.Members, want)
	}
	if len(v.Tasks) != 4 {
		t.Fatalf("%d tasks: %+v", len(v.Tasks), v.Tasks)
	}
	for _, tk := range v.Tasks {
		if tk.Owner != owner[tk.Task] || !tk.OwnerMember || tk.OwnerEpoch == 0 || tk.Error != "" {
			t.Errorf("task %+v; its worker's status says %s runs it", tk, owner[tk.Task])
		}
		if age := time.Since(tk.Time); age < -time.Minute || age > time.Minute {
			t.Errorf("task %s: latest record written %v ago", tk.Task, age)
		}
	}

	// The table: one line per task with its owner, then the members.
	out := e.ok("", "job", "tasks", job, ns)
	t.Logf("runnel job tasks:\n%s", out)
	mustMatch(t, out, `(?m)^job wk_job, group wk_job: 4 tasks in 2 stages: count\.v1 \(runnel_commit_wk_job_count_v1_[0-9a-f]{12}, 2\), src \(runnel_commit_wk_job_src_[0-9a-f]{12}, 2\)$`,
		`(?m)^TASK +OWNER +EPOCH +CHECKPOINT +AGE +SNAPSHOT +SEGMENTS$`,
		`(?m)^group wk_job: 2 members: `+regexp.QuoteMeta(a.id+", "+b.id)+`$`)
	for id, w := range owner {
		mustMatch(t, out, `(?m)^`+regexp.QuoteMeta(id)+` +`+regexp.QuoteMeta(w)+` +[1-9]\d* +[1-9]\d* +\S+ +(-|\d+) +\d+$`)
	}

	// Workers: each member with the count its status shows.
	n := map[string]int{}
	for _, w := range owner {
		n[w]++
	}
	var ws struct {
		Workers []jobWorker `json:"workers"`
	}
	if err := json.Unmarshal([]byte(e.ok("", "job", "workers", job, "--json", ns)), &ws); err != nil {
		t.Fatal(err)
	}
	if len(ws.Workers) != 2 {
		t.Fatalf("workers %+v", ws.Workers)
	}
	for _, w := range ws.Workers {
		if !w.Member || len(w.Tasks) != n[w.Worker] {
			t.Errorf("worker %+v; its status shows %d tasks", w, n[w.Worker])
		}
	}
	out = e.ok("", "job", "workers", job, ns)
	t.Logf("runnel job workers:\n%s", out)
	mustMatch(t, out, `(?m)^job wk_job, group wk_job: 2 members, 4 tasks$`, `(?m)^WORKER +MEMBER +TASKS +BY STAGE$`)
	for w, k := range n {
		mustMatch(t, out, `(?m)^`+regexp.QuoteMeta(w)+` +yes +`+fmt.Sprint(k)+` +`)
	}

	// Both stopped: the group has no member, every task's last owner left.
	stop(a)
	stop(b)
	out = e.ok("", "job", "tasks", job, ns)
	t.Logf("runnel job tasks, the workers stopped:\n%s", out)
	mustMatch(t, out, `(?m)^group wk_job has no member: no worker of the job is running$`)
	if got := len(regexp.MustCompile(`(?m)^\S+@broker-\S+/\d +127\.0\.0\.1@jt[AB] \(left\) `).FindAllString(out, -1)); got != 4 {
		t.Errorf("%d tasks shown with an owner that left, want 4:\n%s", got, out)
	}
	mustMatch(t, e.ok("", "job", "workers", job, ns), `(?m)^127\.0\.0\.1@jt[AB] +no \(left\) +\d+ `)

	e.fails(`no commit topic of job "nosuchjob"`, "job", "tasks", "nosuchjob", ns)
	e.fails(`no commit topic of job "nosuchjob"`, "job", "workers", "nosuchjob", "--json", ns)
	e.fails(`unknown command "task" for "runnel job"; did you mean tasks?`, "job", "task", job)
}

// TestJobStageOfName checks that a stage is recovered from its commit
// topic's name exactly when scaleout.TopicName gives that name, and never
// for another job's topic.
func TestJobStageOfName(t *testing.T) {
	long := strings.Repeat("s", 120)
	for _, tc := range []struct {
		job, stage string
		found      bool
	}{
		{"etl", "orders", true},
		{"etl", "enrich", true},
		{"wk_job", "src", true},    // hashed: the job has an '_'
		{"etl", "a_b", true},       // hashed: the stage has an '_'
		{"my job", "orders", true}, // hashed: a character replaced in the job
		{"etl", "count.v1", false}, // replaced in the stage: found from the records
		{"etl", long, false},       // shortened: found from the records
		{strings.Repeat("j", 140), "orders", false},
	} {
		topic := scaleout.TopicName(tc.job, tc.stage, scaleout.KindCommit)
		got, ok := stageOfName(tc.job, topic)
		if ok != tc.found || (ok && got != tc.stage) {
			t.Errorf("stageOfName(%q, %q) = %q, %v; want %q, %v", tc.job, topic, got, ok, tc.stage, tc.found)
		}
		for _, other := range []string{tc.job + "x", "x" + tc.job, "etl2"} {
			if s, ok := stageOfName(other, topic); ok {
				t.Errorf("job %q's topic %s taken for job %q's stage %q", tc.job, topic, other, s)
			}
		}
	}
}
