package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/windows/clicks"
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// The windows crash test runs the windows example's job (clicks per user
// per minute and per session, late clicks to side outputs) in a child
// process — this test binary re-executed with -test.run selecting
// TestWindowsChild — and kills it with SIGKILL at random points. The window
// results (every firing, keyed by kind, user, window and firing index) and
// the late clicks go to idempotent KV sinks; after the final run they must
// equal those of an uninterrupted run. One source split: with several, the
// interleaving of splits decides which records are late, in any run.
const (
	envWinChild   = "RUNNEL_E2E_WINDOWS_CHILD"
	envWinControl = "RUNNEL_E2E_WINDOWS_CONTROL"
	winClicks     = 16_000 // about 67 minutes of event time
)

// buildWindowsJob builds the example job writing to KV sinks under dir.
func buildWindowsJob(dir string, par int, throttle, control bool) (*pipeline.Job, func() error, error) {
	opts := []pipeline.JobOption{
		pipeline.CheckpointDir(filepath.Join(dir, "job")),
		pipeline.CheckpointInterval(50 * time.Millisecond),
		pipeline.DefaultParallelism(par),
		pipeline.Hooks(&checkpointMarker{path: markerPath(dir)}),
	}
	if control {
		opts = append(opts, jobFaults(failpoint.Pipeline{OffsetsBeforeState: true})...)
	}
	job := pipeline.New("windows-crash", opts...)
	gen := clicks.Gen
	if throttle {
		gen = func(split int, seq uint64) clicks.Click {
			if seq%8 == 7 {
				time.Sleep(time.Millisecond) // about 2 s per full run
			}
			return clicks.Gen(split, seq)
		}
	}
	out := clicks.Build(job, source.NewGenerator(1, winClicks, gen), clicks.DefaultOptions())
	results, err := sink.NewKV(filepath.Join(dir, "results"), func(r resultKV) []byte { return r.key },
		func(dst []byte, r resultKV) ([]byte, error) {
			return binary.BigEndian.AppendUint64(dst, uint64(r.count)), nil
		})
	if err != nil {
		return nil, nil, err
	}
	late, err := sink.NewKV(filepath.Join(dir, "late"), func(k []byte) []byte { return k },
		func(dst []byte, _ []byte) ([]byte, error) { return append(dst, 1), nil })
	if err != nil {
		return nil, nil, errors.Join(err, results.Close())
	}
	asResult := func(kind string) func(context.Context, resultOf) (resultKV, error) {
		return func(_ context.Context, r resultOf) (resultKV, error) {
			return resultKV{key: clicks.ResultKey(kind, r), count: r.Value}, nil
		}
	}
	asLate := func(kind string) func(context.Context, clicks.Click) ([]byte, error) {
		return func(_ context.Context, c clicks.Click) ([]byte, error) { return clicks.LateKey(kind, c), nil }
	}
	rs := pipeline.Union(pipeline.Map(out.PerMinute, "kv-minute", asResult("minute")),
		pipeline.Map(out.Sessions, "kv-session", asResult("session")))
	pipeline.To(rs, "results", results)
	ls := pipeline.Union(pipeline.Map(out.LateForMinute, "kv-late-minute", asLate("minute")),
		pipeline.Map(out.LateForSession, "kv-late-session", asLate("session")))
	pipeline.To(ls, "late", late)
	// The job closes its sinks when it ends (KV.Close is idempotent);
	// closeSinks is for the paths where it never ran.
	return job, func() error { return errors.Join(results.Close(), late.Close()) }, nil
}

type resultOf = window.Result[string, int64]

type resultKV struct {
	key   []byte
	count int64
}

// TestWindowsChild is the job process of the windows crash test; it does
// nothing unless started by runWindowsCrash.
func TestWindowsChild(t *testing.T) {
	if os.Getenv(envWinChild) == "" {
		t.Skip("the windows crash test's child process")
	}
	par, _ := strconv.Atoi(os.Getenv(envPar))
	job, closeSinks, err := buildWindowsJob(os.Getenv(envDir), max(par, 1), true, os.Getenv(envWinControl) != "")
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(job.Run(context.Background()), closeSinks()); err != nil {
		t.Fatal(err)
	}
}

// readKV returns the contents of the KV sink in dir.
func readKV(t *testing.T, dir string) map[string]string {
	t.Helper()
	kv, err := sink.NewKV(dir, func([]byte) []byte { return nil }, func(dst []byte, _ []byte) ([]byte, error) { return dst, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	got := make(map[string]string)
	for k, v := range kv.All() {
		got[string(k)] = string(v)
	}
	return got
}

// windowsReference runs the job uninterrupted in this process.
func windowsReference(t *testing.T) (results, late map[string]string) {
	t.Helper()
	dir := t.TempDir()
	job, closeSinks, err := buildWindowsJob(dir, 2, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(job.Run(context.Background()), closeSinks()); err != nil {
		t.Fatal(err)
	}
	return readKV(t, filepath.Join(dir, "results")), readKV(t, filepath.Join(dir, "late"))
}

// runWindowsCrash kills the child kills times, lets it finish, and returns
// its sinks' contents.
func runWindowsCrash(t *testing.T, seed uint64, kills int, control bool) (results, late map[string]string) {
	t.Helper()
	if control {
		requireFailpoints(t)
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(seed, 2))
	start := func() *exec.Cmd {
		return startChildTest(t, "^TestWindowsChild$", control, envWinControl, envWinChild+"=1", envDir+"="+dir, envPar+"="+strconv.Itoa(1+rng.IntN(3)))
	}
	killLoop(t, kills, start, func() time.Duration { return time.Duration(150+rng.IntN(500)) * time.Millisecond }, nil, markerPath(dir))
	return readKV(t, filepath.Join(dir, "results")), readKV(t, filepath.Join(dir, "late"))
}

// diffKV compares key/value results whose values are binary (see diffMaps).
func diffKV(got, want map[string]string) (n int, example string) {
	return diffMaps(got, want, func(v string) string { return fmt.Sprintf("%x", v) })
}

func windowsKills() int {
	if testing.Short() {
		return 2
	}
	return 4
}

// TestE2EWindowsCrashExactlyOnce: the windows job under repeated SIGKILL
// (with parallelism changing between restarts) emits exactly the window
// firings and late clicks of an uninterrupted run.
func TestE2EWindowsCrashExactlyOnce(t *testing.T) {
	seed := testSeed(t)
	wantR, wantL := windowsReference(t)
	if len(wantR) == 0 || len(wantL) == 0 {
		t.Fatalf("reference run: %d results, %d late clicks: the data should have both", len(wantR), len(wantL))
	}
	gotR, gotL := runWindowsCrash(t, seed, windowsKills(), false)
	if n, ex := diffKV(gotR, wantR); n != 0 {
		t.Fatalf("seed %d: %d of %d window results differ after crashes (%s)", seed, n, len(wantR), ex)
	}
	if n, ex := diffKV(gotL, wantL); n != 0 {
		t.Fatalf("seed %d: %d of %d late clicks differ after crashes (%s)", seed, n, len(wantL), ex)
	}
	t.Logf("%d window firings and %d late clicks identical to the uninterrupted run", len(wantR), len(wantL))
}

// TestE2EWindowsCrashControl proves the comparison can fail: with offsets
// checkpointed behind the state, restores count clicks twice.
func TestE2EWindowsCrashControl(t *testing.T) {
	seed := testSeed(t)
	wantR, _ := windowsReference(t)
	gotR, _ := runWindowsCrash(t, seed, windowsKills(), true)
	n, ex := diffKV(gotR, wantR)
	if n == 0 {
		t.Fatalf("seed %d: the faulty job passed the check: the check cannot fail", seed)
	}
	t.Logf("control run failed the check as it must: %d results differ (%s)", n, ex)
}
