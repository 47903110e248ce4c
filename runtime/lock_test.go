package runtime

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestEngineCheckpointDirLocked runs an engine on a checkpoint directory
// in a child process (this test binary re-executed), then starts another
// one on the same directory here: New must fail with ErrDirLocked and a
// message saying what is wrong (a job already running on the directory),
// not with the bare "resource temporarily unavailable" of the OS lock.
func TestEngineCheckpointDirLocked(t *testing.T) {
	if dir := os.Getenv("RUNNEL_TEST_HOLD_DIR"); dir != "" {
		e, err := New(Config{Name: "holder", Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("holding\n")
		_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes stdin
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		return
	}
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^TestEngineCheckpointDirLocked$")
	child.Env = append(os.Environ(), "RUNNEL_TEST_HOLD_DIR="+dir)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = stdin.Close()
		if err := child.Wait(); err != nil {
			t.Errorf("holder process: %v", err)
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "holding\n" {
		t.Fatalf("holder process: %q, %v", line, err)
	}
	_, err = New(Config{Name: "second", Dir: dir})
	if err == nil {
		t.Fatal("New on a directory another process holds succeeded")
	}
	if !errors.Is(err, ErrDirLocked) || !strings.Contains(err.Error(), "already running on it") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("error %q: want ErrDirLocked naming the directory and the likely cause", err)
	}
	t.Logf("error: %v", err)
}
