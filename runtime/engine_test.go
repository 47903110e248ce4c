package runtime

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// offsetTask acknowledges triggers with a growing offset and finishes after
// finishAfter acknowledgements.
func offsetTask(finishAfter int) func(ctx context.Context, h *Handle) error {
	return func(ctx context.Context, h *Handle) error {
		acks := 0
		for {
			closing := h.Closing()
			h.Notes(nil)
			if id, _, ok := h.Trigger(); ok {
				acks++
				h.Ack(id, Ack{Offsets: map[string][]byte{"src\x00s": {byte(acks)}}})
				if acks == finishAfter {
					h.Finish()
				}
				continue
			}
			if closing {
				return nil
			}
			select {
			case <-h.Wake():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

func TestEngineCheckpointsAndFinalCheckpoint(t *testing.T) {
	dir := t.TempDir()
	e, err := New(Config{Name: "t", Dir: dir, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.AddTask("a", SourceTask, offsetTask(3)); err != nil {
		t.Fatal(err)
	}
	if err := e.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := e.Status()
	if st.State != "finished" || len(st.Checkpoints) != 4 { // 3 periodic + final
		t.Fatalf("status %+v", st)
	}
	e2, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	if off := e2.RestoredOffset("src", "s"); len(off) != 1 || off[0] != 4 {
		t.Fatalf("restored offset %v", off)
	}
}

func TestEngineCheckpointTimeoutFailsJob(t *testing.T) {
	e, err := New(Config{Interval: time.Millisecond, Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = e.AddTask("silent", OperatorTask, func(ctx context.Context, h *Handle) error {
		<-ctx.Done() // never acknowledges
		return ctx.Err()
	})
	if err := e.Run(context.Background()); !errors.Is(err, ErrCheckpointFailed) {
		t.Fatalf("Run = %v, want ErrCheckpointFailed", err)
	}
}

func TestEngineTaskErrorIsFatal(t *testing.T) {
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	_, _ = e.AddTask("bad", SourceTask, func(context.Context, *Handle) error { return boom })
	_, _ = e.AddTask("ok", SourceTask, offsetTask(1000))
	if err := e.Run(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Run = %v", err)
	}
}

func TestEngineInvalidConfig(t *testing.T) {
	if _, err := New(Config{Interval: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatal(err)
	}
}
