package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// The crash test re-executes this test binary as the job process.
const (
	envChild   = "RUNNEL_E2E_CRASH_CHILD"
	envDir     = "RUNNEL_E2E_DIR"
	envControl = "RUNNEL_E2E_CONTROL"
	envPar     = "RUNNEL_E2E_PARALLELISM"

	crashSplits   = 4
	crashPerSplit = 25_000 // 100k records
	crashKeys     = 1000
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(crashChild())
	}
	goleak.VerifyTestMain(m)
}

// crashKey is the deterministic key of record seq of split.
func crashKey(split int, seq uint64) uint64 {
	x := uint64(split)*1_000_003 + seq*7919
	return x % crashKeys
}

type counted struct {
	Key   uint64
	Count int64
}

// crashChild runs the keyed-count job until it finishes (exit 0) or is
// killed. It throttles itself so that the parent's kills land mid-run.
func crashChild() int {
	dir := os.Getenv(envDir)
	par, _ := strconv.Atoi(os.Getenv(envPar))
	opts := []pipeline.JobOption{
		pipeline.CheckpointDir(filepath.Join(dir, "job")),
		pipeline.CheckpointInterval(100 * time.Millisecond),
		pipeline.DefaultParallelism(max(par, 1)),
		pipeline.Hooks(&checkpointMarker{path: markerPath(dir)}),
	}
	if os.Getenv(envControl) != "" {
		opts = append(opts, jobFaults(failpoint.Pipeline{OffsetsBeforeState: true})...)
	}
	opts = append(opts, savepointChildOptions()...) // savepoint_test.go
	job := pipeline.New("crash-count", opts...)
	gen := source.NewGenerator(crashSplits, crashPerSplit, func(split int, seq uint64) uint64 {
		if seq%6 == 5 {
			time.Sleep(time.Millisecond) // throttle: about 4 s per full run
		}
		return crashKey(split, seq)
	})
	keys := pipeline.FromSource(job, "gen", gen)
	counts := pipeline.Process(pipeline.KeyBy(keys, func(k uint64) uint64 { return k }), "count",
		func() pipeline.KeyedProcessFunc[uint64, uint64, counted] { return &countFn{} })
	kv, err := sink.NewKV(filepath.Join(dir, "kv"), func(c counted) []byte {
		return binary.BigEndian.AppendUint64(nil, c.Key)
	}, func(dst []byte, c counted) ([]byte, error) {
		return binary.BigEndian.AppendUint64(dst, uint64(c.Count)), nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pipeline.To(counts, "kv", kv)
	if err := job.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "job:", err)
		return 1
	}
	return 0
}

// countFn counts records per key in a state.Value and emits each new count.
type countFn struct{ n *state.Value[int64] }

func (f *countFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.n, err = state.NewValue(ctx.Backend(), "n", state.Int64Codec())
	return err
}

func (f *countFn) ProcessElement(ctx *pipeline.KeyedContext[uint64, counted], _ uint64) error {
	n, _, err := f.n.Get()
	if err != nil {
		return err
	}
	n++
	if err := f.n.Set(n); err != nil {
		return err
	}
	return ctx.Emit(counted{Key: ctx.Key(), Count: n})
}

func (f *countFn) OnTimer(*pipeline.KeyedContext[uint64, counted], pipeline.Timer) error { return nil }

// runCrashSchedule kills the child kills times at random points, then lets it
// finish, and returns the per-key counts found in the KV sink.
func runCrashSchedule(t *testing.T, seed uint64, kills int, control bool) map[uint64]int64 {
	t.Helper()
	if control {
		requireFailpoints(t)
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(seed, 1))
	start := func() *exec.Cmd {
		return startChildTest(t, "^$", control, envControl, envChild+"=1", envDir+"="+dir, envPar+"="+strconv.Itoa(1+rng.IntN(3)))
	}
	killLoop(t, kills, start, func() time.Duration { return time.Duration(100+rng.IntN(400)) * time.Millisecond }, nil, markerPath(dir))
	return readCounts(t, filepath.Join(dir, "kv"))
}

func expectedCounts() map[uint64]int64 {
	want := make(map[uint64]int64)
	for s := range crashSplits {
		for seq := range uint64(crashPerSplit) {
			want[crashKey(s, seq)]++
		}
	}
	return want
}

// diffCounts compares per-key counts (see diffMaps).
func diffCounts(got, want map[uint64]int64) (diffs int, example string) {
	return diffMaps(got, want, func(v int64) string { return fmt.Sprint(v) })
}

// diffMaps returns how many keys differ between got and want (a different
// or missing value, or a key want does not have) and a description of the
// first difference found, with values shown by show.
func diffMaps[K, V comparable](got, want map[K]V, show func(V) string) (n int, example string) {
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			if n == 0 {
				example = fmt.Sprintf("key %v: got %s (present %v), want %s", k, show(g), ok, show(w))
			}
			n++
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			if n == 0 {
				example = fmt.Sprintf("unexpected key %v", k)
			}
			n++
		}
	}
	return n, example
}

func crashKills() int {
	if testing.Short() {
		return 5
	}
	return 10
}

func TestE2ECrashExactlyOnce(t *testing.T) {
	seed := testSeed(t)
	got := runCrashSchedule(t, seed, crashKills(), false)
	if n, ex := diffCounts(got, expectedCounts()); n != 0 {
		t.Fatalf("seed %d: %d keys differ after crashes (%s)", seed, n, ex)
	}
}

// TestE2ECrashControl proves the check above can fail: with source offsets
// checkpointed behind the state, restores count records twice.
func TestE2ECrashControl(t *testing.T) {
	seed := testSeed(t)
	got := runCrashSchedule(t, seed, crashKills(), true)
	n, ex := diffCounts(got, expectedCounts())
	if n == 0 {
		t.Fatalf("seed %d: the faulty job passed the exactly-once check: the check cannot fail", seed)
	}
	t.Logf("control run failed the check as it must: %d keys differ (%s)", n, ex)
}
