package pipeline_test

import (
	"context"
	"testing"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// ctxSplits is a source whose Splits fails with the context's error, as a
// network source does when the job is stopped during its start-up lookup.
type ctxSplits struct{ source.Source[int] }

func (ctxSplits) Splits(ctx context.Context) ([]source.Split, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestRunStoppedWhileStarting: a job asked to stop (ctx cancelled) before
// its sources listed their splits stops cleanly: Run returns nil, as it does
// for a stop after start, instead of reporting the cancellation as a failure.
func TestRunStoppedWhileStarting(t *testing.T) {
	job := pipeline.New("stop-at-start", pipeline.CheckpointDir(t.TempDir()))
	src := pipeline.FromSource[int](job, "src", ctxSplits{source.NewSlice([]int{1}, 1)})
	pipeline.To(src, "out", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := job.Run(ctx); err != nil {
		t.Fatalf("Run after a stop during start-up: %v, want nil", err)
	}
}
