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
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// TestWorkerStandbysKeptWarm runs a keyed job as two workers with
// Standbys(1): every task (2 source queues, 2 ranges) must have a warm copy
// on the worker that does not own it, kept (not restarted every round of
// the standby loop) and following the task's checkpoints, as both
// workers' /status show.
func TestWorkerStandbysKeptWarm(t *testing.T) {
	cl := testutil.RunCluster(t)
	admin := cl.NewClient(t)
	const topic = "ws_in"
	testutil.CreateTopic(t, admin, cl.BrokerAddr, topic, 2)
	p := testutil.NewProducer(t, admin, "ws_producer")
	produce := func(n int) {
		t.Helper()
		for i := range n {
			if _, err := p.Send(context.Background(), &client.Message{Topic: topic, Body: fmt.Appendf(nil, "k%d", i%10)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: workerLogLevel}))
	type running struct {
		cancel context.CancelFunc
		done   chan error
		addr   chan string
	}
	start := func(name string) running {
		c := cl.NewClient(t, client.WithInstanceName(name))
		build := func(j *pipeline.Job) error {
			src, err := srcmq.New(c, topic, srcmq.WithGroup("ws_group"))
			if err != nil {
				return err
			}
			lines := pipeline.FromBytes(j, "src", src.Bytes(), state.StringCodec())
			counts := pipeline.Process(pipeline.KeyBy(lines, func(s string) string { return s }).WithCodec(state.StringCodec()), "count",
				func() pipeline.KeyedProcessFunc[string, string, keyCount] { return &countFn{} })
			pipeline.To(counts, "out", sink.NewFunc(func(context.Context, keyCount) error { return nil }, nil))
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		r := running{cancel: cancel, done: make(chan error, 1), addr: make(chan string, 1)}
		opts := []pipeline.JobOption{pipeline.CheckpointDir(filepath.Join(t.TempDir(), name)), pipeline.Ranges(2),
			pipeline.CheckpointInterval(200 * time.Millisecond), pipeline.Logger(log), pipeline.WorkerGroup("ws_group"),
			pipeline.Standbys(1), pipeline.StatusAddress("127.0.0.1:0", func(a string) { r.addr <- a })}
		go func() { r.done <- pipeline.RunWorker(ctx, c, "wsjob", build, opts...) }()
		return r
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
	a, b := start("wsA"), start("wsB")
	defer stop(b)
	defer stop(a)
	addrs := []string{<-a.addr, <-b.addr}
	status := func(addr string) (*pipeline.WorkerStatus, error) {
		resp, err := http.Get("http://" + addr + "/status")
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var st pipeline.WorkerStatus
		return &st, json.NewDecoder(resp.Body).Decode(&st)
	}
	produce(100)
	// Every task has its copy on the other worker, and keeps it: the same
	// copies in ten consecutive looks 50 ms apart (the standby loop runs
	// every 500 ms).
	var prev string
	same := 0
	at := map[string]uint64{}
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		owned, copies := map[string]string{}, map[string]string{}
		for _, addr := range addrs {
			st, err := status(addr)
			if err != nil {
				return err
			}
			for _, tk := range st.Tasks {
				owned[tk.Task] = st.Worker
			}
			for _, s := range st.Standbys {
				if s.At == 0 {
					return fmt.Errorf("%s's copy of %s has no checkpoint yet", st.Worker, s.Task)
				}
				copies[s.Task] = st.Worker
				at[s.Task] = s.At
			}
		}
		if len(owned) != 4 || len(copies) != 4 {
			same = 0
			return fmt.Errorf("%d tasks owned, %d with a standby (want 4 and 4): owners %v, copies %v", len(owned), len(copies), owned, copies)
		}
		for task, w := range copies {
			if owned[task] == w {
				return fmt.Errorf("task %s's standby is on its owner %s", task, w)
			}
		}
		if key := fmt.Sprint(copies); key == prev {
			same++
		} else {
			prev, same = key, 1
		}
		if same < 10 {
			return fmt.Errorf("the same standbys in %d looks in a row", same)
		}
		return nil
	})
	// The copies follow the tasks' checkpoints.
	before := map[string]uint64{}
	for k, v := range at {
		before[k] = v
	}
	produce(100)
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		for _, addr := range addrs {
			st, err := status(addr)
			if err != nil {
				return err
			}
			for _, s := range st.Standbys {
				at[s.Task] = s.At
			}
		}
		for task, was := range before {
			if at[task] <= was {
				return fmt.Errorf("the standby of %s is still at checkpoint %d", task, at[task])
			}
		}
		return nil
	})
}
