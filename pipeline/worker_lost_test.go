package pipeline_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
)

// TestWorkerTaskStateLost: a keyed job runs as one worker, which stops;
// then the records a new owner needs to rebuild the keyed stage's state
// are really removed from the broker — its commit topic or its changelog
// topic deleted with DELETE_TOPIC_IN_BROKER (what mqadmin deleteTopic
// does; the worker creates the topic again, empty) — and a replacement
// worker starts on an empty state directory while new input waits. It
// must fail with ErrTaskStateLost, naming a task of the keyed stage and
// what is missing, and write nothing: a keyed task started empty would
// count every key from 1 again. The control, with the records present,
// restores every task from the broker and the counts go on exactly.
func TestWorkerTaskStateLost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		delete  string // kind of the keyed stage's topic deleted ("" none)
		missing string // what the error must name
	}{
		{name: "records present"},
		{name: "commit topic deleted", delete: scaleout.KindCommit, missing: "holds no record"},
		{name: "changelog topic deleted", delete: scaleout.KindChangelog, missing: "changelog segment missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newWorkerRig(t, "lost_in")
			want := map[string]int64{}
			a := r.start("lA", filepath.Join(t.TempDir(), "a"), "count")
			r.produce(200, want)
			testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return r.out.check(want) })
			a.stop(t)
			if tc.delete != "" {
				admin := r.cl.NewClient(t)
				topic := scaleout.TopicName("rigjob", "count", tc.delete)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := admin.DeleteTopic(ctx, topic, "")
				cancel()
				if err != nil {
					t.Fatalf("delete %s: %v", topic, err)
				}
			}
			r.produce(200, want)
			r.out.mu.Lock()
			before := r.out.n
			r.out.mu.Unlock()
			b := r.start("lB", filepath.Join(t.TempDir(), "b"), "count")
			if tc.delete == "" {
				testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return r.out.check(want) })
				st := workerStatus(t, <-b.addr)
				if len(st.Tasks) != 8 {
					t.Fatalf("the replacement owns %d of 8 tasks", len(st.Tasks))
				}
				for _, tk := range st.Tasks {
					if tk.Restore == nil || tk.Restore.Reused || tk.Restore.Checkpoint == 0 || tk.Restore.Segments+btoi(tk.Restore.FromSnapshot) == 0 {
						t.Fatalf("task %s restored %+v: want its state rebuilt from the broker", tk.Task, tk.Restore)
					}
				}
				b.stop(t)
				return
			}
			var err error
			deadline := time.After(90 * time.Second)
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
		wait:
			for {
				select {
				case err = <-b.done:
					break wait
				case <-tick.C:
					r.out.mu.Lock()
					n := r.out.n
					r.out.mu.Unlock()
					if n != before {
						t.Fatalf("the replacement started the keyed tasks without their state: %d records written (%v)", n-before, r.out.check(want))
					}
				case <-deadline:
					t.Fatalf("the worker kept running with the keyed stage's state gone (outputs: %v)", r.out.check(want))
				}
			}
			if !errors.Is(err, pipeline.ErrTaskStateLost) {
				t.Fatalf("RunWorker returned %v, want ErrTaskStateLost", err)
			}
			msg := err.Error()
			for _, s := range []string{"task count@", tc.missing, "will not start it empty", "To recover"} {
				if !strings.Contains(msg, s) {
					t.Fatalf("the error does not say %q: %v", s, err)
				}
			}
			t.Logf("%v", err)
			r.out.mu.Lock()
			after := r.out.n
			r.out.mu.Unlock()
			if after != before {
				t.Fatalf("the replacement wrote %d records with the keyed state gone (%v)", after-before, r.out.check(want))
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
