package window_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
)

// lateInput has one late record, a@2s after the watermark passed 10s, and
// a record without a timestamp (0 s after the Unix epoch, as a missing
// "ts" field decodes), far behind.
func lateInput() []ev {
	return []ev{{"a", 1, 0}, {"a", 11, 0}, {"a", 2, 0}, {"b", -1_700_000_040, 0}, {"a", 13, 0}}
}

// syncBuf is a goroutine-safe log buffer.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func operatorStatus(t *testing.T, job *pipeline.Job, uid string) (in, out, rejected, late int64) {
	t.Helper()
	for _, o := range job.Status().Operators {
		if o.UID == uid {
			return o.In, o.Out, o.Errors, o.Late
		}
	}
	t.Fatalf("no operator %q in the status", uid)
	return
}

// TestWindowLateRecordsCounted: records behind the watermark whose windows
// expired never vanish uncounted. Without a side output and without a
// dead-letter policy they are dropped, counted in the operator's late
// records and logged once; with LateRecords they reach the side output;
// with a dead-letter policy they become dead letters with reason "late".
// The late count is the same in all three (and was 0, with the records
// gone, before late records were counted).
func TestWindowLateRecordsCounted(t *testing.T) {
	build := func(t *testing.T, logs *syncBuf, opts ...window.Option) (*pipeline.Job, *pipeline.Stream[window.Result[string, int64]], *collect[window.Result[string, int64]]) {
		job := newJob(t, "late", pipeline.Logger(slog.New(slog.NewTextHandler(logs, nil))))
		src := pipeline.FromSource(job, "src", &scripted{splits: [][]ev{lateInput()}})
		counts := window.Apply(pipeline.KeyBy(src, key), "w", window.Tumbling(10*time.Second), window.Count[ev](), opts...)
		var out collect[window.Result[string, int64]]
		pipeline.To(counts, "out", out.sink())
		return job, counts, &out
	}
	check := func(t *testing.T, job *pipeline.Job, out *collect[window.Result[string, int64]]) {
		t.Helper()
		equal(t, "results", byKey(fmtResults(out.all())), []string{"a [0s,10s) 1 #0", "a [10s,20s) 2 #0"})
		in, _, rejected, late := operatorStatus(t, job, "w")
		if in != 5 || late != 2 || rejected != 0 {
			t.Errorf("window operator: in %d, late %d, rejected %d; want 5, 2, 0", in, late, rejected)
		}
	}

	t.Run("dropped", func(t *testing.T) {
		var logs syncBuf
		job, _, out := build(t, &logs)
		runJob(t, job)
		check(t, job, out)
		if n := strings.Count(logs.String(), "dropped a late record"); n < 1 || n > 2 { // once per subtask that dropped one
			t.Errorf("%d warnings about dropped late records, want 1 or 2:\n%s", n, logs.String())
		}
		if !strings.Contains(logs.String(), "behind the watermark") {
			t.Errorf("the warning does not say how late:\n%s", logs.String())
		}
	})
	t.Run("side-output", func(t *testing.T) {
		var logs syncBuf
		tag := pipeline.NewOutputTag[ev]("late")
		job, counts, out := build(t, &logs, window.LateRecords(tag))
		var late collect[ev]
		pipeline.To(pipeline.SideOutput(counts, tag), "late-out", late.sink())
		runJob(t, job)
		check(t, job, out)
		var got []string
		for _, e := range late.all() {
			got = append(got, e.String())
		}
		equal(t, "side output", sorted(got), []string{"a@2s", "b@-1.70000004e+09s"})
		if strings.Contains(logs.String(), "dropped a late record") {
			t.Errorf("late records sent to the side output were reported dropped:\n%s", logs.String())
		}
	})
	t.Run("dead-letter", func(t *testing.T) {
		var logs syncBuf
		var dlq collect[sink.DeadLetter]
		job, _, out := build(t, &logs, window.OperatorOptions(pipeline.OnError(pipeline.DeadLetter("dlq", dlq.sink()))))
		runJob(t, job)
		check(t, job, out)
		var reasons []string
		for _, d := range dlq.all() {
			if d.Operator != "w" || !strings.HasPrefix(d.Reason, "late: event time ") {
				t.Errorf("dead letter %+v", d)
			}
			reasons = append(reasons, d.Value)
		}
		equal(t, "dead-lettered late records", sorted(reasons), []string{"a@2s", "b@-1.70000004e+09s"})
		if strings.Contains(logs.String(), "dropped a late record") {
			t.Errorf("late records sent to dead letters were reported dropped:\n%s", logs.String())
		}
	})
}
