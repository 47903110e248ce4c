package pipeline_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// reasonHook records the reason classes runtime.HookDeadLetter is told,
// which are also the status page's.
type reasonHook struct {
	mu  sync.Mutex
	got []string // operator:reason:policy
}

func (h *reasonHook) OnDeadLetter(_, operator, reason, policy string) {
	h.mu.Lock()
	h.got = append(h.got, operator+":"+reason+":"+policy)
	h.mu.Unlock()
}

// TestPipelineDeadLetterReasons rejects one record of each kind — JSON that
// does not decode, a decoded record that fails validation, a record a Map
// fails on, one it panics on — and checks each dead letter's reason class
// (the Reason's prefix, and what hooks and the status page are told):
// decode, validate, process, panic. A JSON decode failure names the
// record's type, not the state package ("state: cannot decode value").
func TestPipelineDeadLetterReasons(t *testing.T) {
	raw := [][]byte{
		[]byte(`{"id":"a","amount":1}`),
		[]byte(`{"id":"b","amount":`),  // truncated JSON
		[]byte(`{"id":"","amount":2}`), // fails "required"
		[]byte(`{"id":"fail","amount":3}`),
		[]byte(`{"id":"panic","amount":4}`),
	}
	var dlq collect[sink.DeadLetter]
	var out collect[order]
	hook := &reasonHook{}
	job := pipeline.New("reasons", pipeline.CheckpointDir(t.TempDir()), pipeline.Hooks(hook))
	dl := pipeline.DeadLetter("dlq", dlq.sink())
	orders := pipeline.FromBytes(job, "orders", source.NewSlice(raw, 1), pipeline.JSON[order](), pipeline.OnBadRecord(dl))
	checked := pipeline.Map(orders, "check", func(_ context.Context, o order) (order, error) {
		switch o.ID {
		case "fail":
			return o, errors.New("order fail refused")
		case "panic":
			panic("order panic")
		}
		return o, nil
	}, pipeline.OnError(dl))
	pipeline.To(checked, "out", out.sink())
	runJob(t, job)
	if ids := idsOf(out.all()); !slices.Equal(ids, []string{"a"}) {
		t.Fatalf("good records %v", ids)
	}
	want := []struct{ operator, prefix string }{
		{"orders", "decode: cannot decode JSON into pipeline_test.order: unexpected end of JSON input"},
		{"orders", "validate: Key: 'order.ID' Error:Field validation for 'ID' failed on the 'required' tag"},
		{"check", "process: order fail refused"},
		{"check", "panic: pipeline: panic in user function: order panic"},
	}
	got := dlq.all()
	if len(got) != len(want) {
		t.Fatalf("%d dead letters, want %d: %+v", len(got), len(want), got)
	}
	for i, d := range got {
		if d.Operator != want[i].operator || !strings.HasPrefix(d.Reason, want[i].prefix) || strings.Contains(d.Reason, "state:") {
			t.Errorf("dead letter %d: operator %q reason %q, want %q %q…", i, d.Operator, d.Reason, want[i].operator, want[i].prefix)
		}
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	wantHooks := []string{"orders:decode:dead-letter", "orders:validate:dead-letter", "check:process:dead-letter", "check:panic:dead-letter"}
	if !slices.Equal(hook.got, wantHooks) {
		t.Errorf("hook reasons %v, want %v", hook.got, wantHooks)
	}
}
