package e2e

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/runtime"
)

// killLoop starts child runs with start and SIGKILLs each after delay() unless
// it finished first, until kills kills have landed (at most 4*kills runs);
// then it runs the child once more to completion. output, if not nil, is
// appended to failure messages (the child's captured stdout/stderr).
//
// marker, if not empty, is the file a child creates once its first
// checkpoint completed (checkpointMarker). Every other run (the first,
// third, ...) is then killed delay() after the marker appears rather than
// after its start, so that some kills surely land after a checkpoint that
// the next run restores, however slowly a loaded machine starts children;
// the runs between keep kills that may land before any checkpoint (during
// a restore, say).
func killLoop(t *testing.T, kills int, start func() *exec.Cmd, delay func() time.Duration, output func() string, marker string) {
	t.Helper()
	out := func() string {
		if output == nil {
			return ""
		}
		return "\n" + output()
	}
	hit := 0
	for i := 0; hit < kills && i < 4*kills; i++ {
		armed := marker != "" && i%2 == 0
		if armed {
			if err := os.Remove(marker); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
		}
		cmd := start()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		finished := func(err error) {
			if err != nil {
				t.Fatalf("child run %d failed: %v%s", i, err, out())
			}
			// Finished before the kill: later runs restore a finished job.
		}
		if armed && !waitMarker(t, marker, done, finished) {
			continue
		}
		select {
		case err := <-done:
			finished(err)
		case <-time.After(delay()):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
			hit++
		}
	}
	if hit < kills {
		t.Fatalf("only %d of %d kills landed while the child ran", hit, kills)
	}
	if err := start().Wait(); err != nil {
		t.Fatalf("final child run: %v%s", err, out())
	}
}

// waitMarker waits until the marker file exists (true) or the child ended
// (false, after finished); it fails the test after a minute of neither.
func waitMarker(t *testing.T, marker string, done chan error, finished func(error)) bool {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(marker); err == nil {
			return true
		}
		select {
		case err := <-done:
			finished(err)
			return false
		case <-time.After(5 * time.Millisecond): // poll
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child completed no checkpoint within a minute")
		}
	}
}

// checkpointMarker is a job hook that creates the file path once a
// checkpoint completed (see killLoop). A failure to create it is reported
// on stderr: the parent then times out naming the missing checkpoint.
type checkpointMarker struct {
	path string
	once sync.Once
}

func (m *checkpointMarker) OnCheckpointEnd(_ string, info runtime.CheckpointInfo) {
	if info.Err != nil {
		return
	}
	m.once.Do(func() {
		if err := os.WriteFile(m.path, nil, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "checkpoint marker:", err)
		}
	})
}

// markerPath is the checkpoint marker of the child runs sharing dir.
func markerPath(dir string) string { return filepath.Join(dir, "checkpointed") }

// startChildTest starts this test binary again as a child running the
// tests that match run, with env added to this process's environment (and
// controlEnv=1 for a control variant); its stderr is this process's.
func startChildTest(t *testing.T, run string, control bool, controlEnv string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+run)
	cmd.Env = append(os.Environ(), env...)
	if control {
		cmd.Env = append(cmd.Env, controlEnv+"=1")
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// readCounts returns the per-key counts that a job wrote to the KV sink in
// dir as big-endian uint64 keys and values.
func readCounts(t *testing.T, dir string) map[uint64]int64 {
	t.Helper()
	got := make(map[uint64]int64)
	for k, v := range readKV(t, dir) {
		got[binary.BigEndian.Uint64([]byte(k))] = int64(binary.BigEndian.Uint64([]byte(v)))
	}
	return got
}
