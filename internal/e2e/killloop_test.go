package e2e

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// killLoop starts child runs with start and SIGKILLs each after delay() unless
// it finished first, until kills kills have landed (at most 4*kills runs);
// then it runs the child once more to completion. output, if not nil, is
// appended to failure messages (the child's captured stdout/stderr).
func killLoop(t *testing.T, kills int, start func() *exec.Cmd, delay func() time.Duration, output func() string) {
	t.Helper()
	out := func() string {
		if output == nil {
			return ""
		}
		return "\n" + output()
	}
	hit := 0
	for i := 0; hit < kills && i < 4*kills; i++ {
		cmd := start()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("child run %d failed: %v%s", i, err, out())
			}
			// Finished before the kill: later runs restore a finished job.
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
