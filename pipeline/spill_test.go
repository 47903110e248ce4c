package pipeline_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

type kc struct{ K, N int64 }

// cpCount counts completed periodic (not final) checkpoints.
type cpCount struct {
	mu       sync.Mutex
	periodic int
	failed   int
	changes  int
}

func (c *cpCount) OnCheckpointEnd(_ string, info runtime.CheckpointInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case info.Err != nil:
		c.failed++
	case info.Kind == runtime.CheckpointPeriodic:
		c.periodic++
		c.changes += info.StateChanges
	}
}

// TestStateWriteBufferSpills: with periodic checkpoints off, a keyed count
// whose write-back buffer is bounded at 16 KiB takes checkpoints of its own
// (the spill), each bounded in size, while the same job without the bound
// takes none (the bound is soft: changes made while a checkpoint is in
// flight wait for the next one); the counts stay exact, also across a second run that
// continues from the spilled state.
func TestStateWriteBufferSpills(t *testing.T) {
	const keys, per = 1000, 10_000 // per split, 2 splits
	run := func(t *testing.T, dir string, per int64, opts ...pipeline.JobOption) (map[int64]int64, *cpCount) {
		t.Helper()
		cps := &cpCount{}
		job := pipeline.New("spill", append([]pipeline.JobOption{pipeline.CheckpointDir(dir), pipeline.DefaultParallelism(2),
			pipeline.Hooks(cps)}, opts...)...)
		src := pipeline.FromSource(job, "gen", source.NewGenerator(2, per, func(split int, seq uint64) int64 {
			return int64((seq*7 + uint64(split)*3) % keys)
		}))
		pairs := pipeline.Map(src, "pair", func(_ context.Context, k int64) (kc, error) { return kc{K: k, N: 1}, nil })
		counts := pipeline.ReduceCodec(pipeline.KeyBy(pairs, func(v kc) int64 { return v.K }), "count",
			func(_ context.Context, acc, v kc) (kc, error) { return kc{K: v.K, N: acc.N + v.N}, nil },
			state.JSONCodec[kc]())
		var c collect[kc]
		pipeline.To(counts, "sink", c.sink())
		if err := job.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		last := make(map[int64]int64)
		for _, v := range c.all() {
			if v.N <= last[v.K] {
				t.Fatalf("key %d: count %d after %d", v.K, v.N, last[v.K])
			}
			last[v.K] = v.N
		}
		if cps.failed > 0 {
			t.Fatalf("%d checkpoints failed", cps.failed)
		}
		return last, cps
	}
	want := func(per int64) map[int64]int64 {
		m := make(map[int64]int64)
		for split := range 2 {
			for seq := range uint64(per) {
				m[int64((seq*7+uint64(split)*3)%keys)]++
			}
		}
		return m
	}
	check := func(t *testing.T, got, want map[int64]int64) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%d keys counted, want %d", len(got), len(want))
		}
		for k, n := range want {
			if got[k] != n {
				t.Fatalf("key %d: count %d, want %d", k, got[k], n)
			}
		}
	}

	_, plain := run(t, t.TempDir(), per)
	if plain.periodic != 0 {
		t.Fatalf("without a buffer bound: %d checkpoints before the final one, want 0", plain.periodic)
	}
	dir := t.TempDir()
	got, spilled := run(t, dir, per, pipeline.StateWriteBuffer(16<<10))
	check(t, got, want(per))
	if spilled.periodic < 2 {
		t.Fatalf("with a 16 KiB buffer: %d checkpoints before the final one, want several", spilled.periodic)
	}
	t.Logf("%d spill checkpoints, %d state changes in all", spilled.periodic, spilled.changes)
	// A second run continues from the offsets and the spilled state.
	got, _ = run(t, dir, 2*per, pipeline.StateWriteBuffer(16<<10))
	w := want(2 * per)
	for k, n := range got {
		if w[k] != n {
			t.Fatalf("second run, key %d: count %d, want %d", k, n, w[k])
		}
	}
	if len(got) != len(w) {
		t.Fatalf("second run counted %d keys, want %d", len(got), len(w))
	}
}

// notifyCount records the HookSourceNotify calls of a job.
type notifyCount struct {
	mu     sync.Mutex
	ok     int
	failed map[string]int // by split
}

func (c *notifyCount) OnSourceNotify(_, _, split string, _ uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.ok++
		return
	}
	if c.failed == nil {
		c.failed = make(map[string]int)
	}
	c.failed[split]++
}

// failNotify is a Slice source whose split "1" fails every checkpoint
// notification and whose polls are slow enough for periodic checkpoints to
// complete while it runs.
type failNotify struct{ *source.Slice[int64] }

func (s failNotify) Open(ctx context.Context, sp source.Split, off []byte) (source.SplitReader[int64], error) {
	r, err := s.Slice.Open(ctx, sp, off)
	return failNotifyReader{r, sp.ID == "1"}, err
}

type failNotifyReader struct {
	source.SplitReader[int64]
	fail bool
}

func (r failNotifyReader) Poll(ctx context.Context, max int) ([]source.Record[int64], error) {
	time.Sleep(time.Millisecond)
	return r.SplitReader.Poll(ctx, min(max, 10))
}

func (r failNotifyReader) NotifyCheckpointComplete(ctx context.Context, id uint64) error {
	if r.fail {
		return errors.New("offset report refused")
	}
	return r.SplitReader.NotifyCheckpointComplete(ctx, id)
}

// TestSourceNotifyFailureCounted: a split reader whose checkpoint
// notifications fail does not fail the job (every record arrives), and each
// failure reaches HookSourceNotify with its split, beside the other
// split's successful ones.
func TestSourceNotifyFailureCounted(t *testing.T) {
	vals := make([]int64, 2000)
	for i := range vals {
		vals[i] = int64(i)
	}
	nc, cps := &notifyCount{}, &cpCount{}
	job := pipeline.New("notify", pipeline.CheckpointDir(t.TempDir()), pipeline.CheckpointInterval(10*time.Millisecond),
		pipeline.Hooks(nc, cps))
	var c collect[int64]
	pipeline.To(pipeline.FromSource[int64](job, "src", failNotify{source.NewSlice(vals, 2)}), "sink", c.sink())
	if err := job.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := len(c.all()); got != len(vals) {
		t.Fatalf("%d records, want %d", got, len(vals))
	}
	nc.mu.Lock()
	defer nc.mu.Unlock()
	cps.mu.Lock()
	defer cps.mu.Unlock()
	if cps.periodic == 0 {
		t.Fatal("no periodic checkpoint completed while the job ran")
	}
	if nc.failed["1"] == 0 || nc.ok == 0 || len(nc.failed) != 1 {
		t.Fatalf("notifications: %d ok, failed by split %v; want failures of split 1 only, and successes", nc.ok, nc.failed)
	}
}
