package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// timerFn registers one processing-time timer per key, delay after the
// key's first record, emits (key, 0) for that record and (key, 1) when the
// timer fires.
type timerFn struct {
	delay time.Duration
	armed *state.Value[int64]
}

func (f *timerFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.armed, err = state.NewValue(ctx.Backend(), "armed", state.Int64Codec())
	return err
}

func (f *timerFn) ProcessElement(ctx *pipeline.KeyedContext[string, keyCount], _ string) error {
	if _, ok, err := f.armed.Get(); err != nil || ok {
		return err
	}
	if err := f.armed.Set(1); err != nil {
		return err
	}
	if err := ctx.RegisterProcessingTimer(ctx.Now().Add(f.delay)); err != nil {
		return err
	}
	return ctx.Emit(keyCount{Key: ctx.Key(), Count: 0})
}

func (f *timerFn) OnTimer(ctx *pipeline.KeyedContext[string, keyCount], _ pipeline.Timer) error {
	return ctx.Emit(keyCount{Key: ctx.Key(), Count: 1})
}

// TestWorkerTimersMoveWithKeys: timers are keyed state and move with their
// keys. Worker A registers a processing-time timer for each of 40 keys,
// due well after A leaves; a worker on an empty directory inherits every
// task and fires each key's timer exactly once (a timer left behind with
// A's disk would never fire).
func TestWorkerTimersMoveWithKeys(t *testing.T) {
	cl := testutil.RunCluster(t)
	admin := cl.NewClient(t)
	const topic, keys = "wt_in", 40
	testutil.CreateTopic(t, admin, cl.BrokerAddr, topic, 2)
	var mu sync.Mutex
	fired := map[string][]string{} // key → workers that fired its timer
	seen := map[string]int{}
	start := func(name string, delay time.Duration) (context.CancelFunc, chan error) {
		c := cl.NewClient(t, client.WithInstanceName(name))
		build := func(j *pipeline.Job) error {
			src, err := srcmq.New(c, topic)
			if err != nil {
				return err
			}
			lines := pipeline.FromBytes(j, "src", src.Bytes(), state.StringCodec())
			out := pipeline.Process(pipeline.KeyBy(lines, func(s string) string { return s }).WithCodec(state.StringCodec()), "timers",
				func() pipeline.KeyedProcessFunc[string, string, keyCount] { return &timerFn{delay: delay} })
			pipeline.To(out, "out", sink.NewFunc(func(_ context.Context, kc keyCount) error {
				mu.Lock()
				defer mu.Unlock()
				if kc.Count == 0 {
					seen[kc.Key]++
				} else {
					fired[kc.Key] = append(fired[kc.Key], name)
				}
				return nil
			}, nil))
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		opts := []pipeline.JobOption{pipeline.CheckpointDir(filepath.Join(t.TempDir(), name)), pipeline.Ranges(2),
			pipeline.CheckpointInterval(200 * time.Millisecond), pipeline.Logger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: workerLogLevel})))}
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			done <- pipeline.RunWorker(ctx, c, "wtjob", build, opts...)
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case <-exited:
			case <-time.After(60 * time.Second):
				t.Error("worker did not stop")
			}
		})
		return cancel, done
	}
	stop := func(cancel context.CancelFunc, done chan error) {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("worker: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("worker did not stop")
		}
	}
	// A's timers are due 10 s after each key's record, after A has left: only
	// a worker that inherits them can fire them. B gets the same
	// timers from A's checkpoints (it registers none itself: every key is
	// armed already), so its own delay does not matter.
	cancelA, doneA := start("tA", 10*time.Second)
	p := testutil.NewProducer(t, admin, "wt_producer")
	for i := range keys {
		if _, err := p.Send(context.Background(), &client.Message{Topic: topic, Body: fmt.Appendf(nil, "k%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != keys {
			return fmt.Errorf("%d of %d keys seen", len(seen), keys)
		}
		return nil
	})
	stop(cancelA, doneA)
	mu.Lock()
	early := len(fired)
	mu.Unlock()
	if early != 0 {
		t.Fatalf("%d timers fired on A before it left (the test needs them pending)", early)
	}
	cancelB, doneB := start("tB", time.Hour)
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(fired) != keys {
			return fmt.Errorf("%d of %d timers fired", len(fired), keys)
		}
		return nil
	})
	time.Sleep(time.Second) // a timer fired twice would show by now
	stop(cancelB, doneB)
	mu.Lock()
	defer mu.Unlock()
	for k, by := range fired {
		if len(by) != 1 || by[0] != "tB" {
			t.Fatalf("key %s: timer fired by %v, want once by tB", k, by)
		}
		if seen[k] != 1 {
			t.Fatalf("key %s: first record seen %d times", k, seen[k])
		}
	}
}
